"""The IO thread: it owns every ZeroMQ socket and does every LMDB write of a node.

Other threads talk to it only through its command queue (``Submitter``, submit.py: a
deque plus a wake-up byte on an inproc PAIR socket). One loop iteration: poll, apply
commands (commands.py), receive data and control (listener.py), run timers, commit one
LMDB transaction, then send what that commit allows (receipts, acks, data batches).

This module is long because the loop and its timers are one sequence that reads from top
to bottom; every part it composes lives in a module of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from operator import itemgetter
from typing import Any

import zmq

from .._discovery.base import Discovery, Found
from .._discovery.static import StaticSeeds
from .._malloc import tune as tune_malloc
from .._protocol.codec import (
    MAX_BATCH_HEADER_BYTES,
    encode_control,
    encode_lane_batch,
    pack_columns,
)
from .._protocol.frames import Bye, GroupDel
from .._requests import Requests
from .._security import Keys, load_keys
from .._store.lock import own
from .._store.store import Store, WriteBatch
from ..config import NodeConfig
from ..errors import NodeStateError, StoreError, StoreFullError, ZMeshError
from .commands import Call, Contact
from .commit import Committer
from .drain import Commands
from .held import Held
from .inbox.consumer import Consumer
from .lane.delivery import Taken
from .lane.lane import Lane
from .listener import Listener
from .mesh import Mesh
from .outbox.cache import Packed
from .outbox.dispatch import Send
from .outbox.ephemeral import send_ephemeral
from .outbox.outbox import Outbox
from .outbox.outcomes import Outcomes
from .outbox.publishes import AnyPublish
from .outbox.record import Columns
from .outbox.retention import RECLAIM_BUSY_S, RECLAIM_INTERVAL_S
from .outbox.wallclock import boot_id
from .replica.replication import Replication
from .stats import Counters
from .status import node_status
from .submit import Submitter

log = logging.getLogger(__name__)

START_TIMEOUT_S = 15.0
SEND_RETRY_S = 0.005

# Plain ints: pyzmq's Flag enums cost an enum operation per use on the data path.
_NOBLOCK = int(zmq.NOBLOCK)


class _Room:
    """What publishes wait for room in: this node's outbox, its LMDB map and its disk;
    and whether its store is still there to take them."""

    def __init__(self, outbox: Outbox, held: Held, store: Store, counters: Counters) -> None:
        self._outbox, self._held, self._store, self._counters = outbox, held, store, counters

    @property
    def depth(self) -> int:
        return self._outbox.depth

    @property
    def full(self) -> bool:
        return self._held.full

    def full_error(self, waited_s: float) -> StoreFullError:
        self._counters.add("publish_store_full", 1)
        return self._store.full_error(waited_s)

    def refusal(self, n: int) -> StoreError | None:
        error = self._store.lost_error()
        if error is not None:
            self._counters.add("publishes_refused_store_lost", n)
        return error


class Engine:
    """One node's IO thread and everything it owns."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.keys = load_keys(config.secret_key_file, config.trusted_keys_dir, config.trusted_keys)
        tune_malloc()  # (before the store's first transaction)
        self.store = Store(config.data_dir, config.map_size_bytes)
        own(config.data_dir, self.store.snapshot)  # (zmesh.snapshot of it, in this process)
        try:
            self.node_id, self.incarnation, next_seq, next_lane = self.store.open_identity()
            clock_state = self.store.meta_value(b"wall_clock")  # (outbox/wallclock.py)
        except Exception:
            self.store.close()
            raise
        _warn_if_open(self.keys, config.mesh)  # (once the store opened: not before its error)
        self.counters = Counters()
        outcomes = Outcomes()
        self.outbox = Outbox(
            self.store,
            self.node_id,
            next_seq,
            next_lane,
            dict(config.topics),
            config.memory_budget_bytes,
            config.max_message_bytes,
            self.counters,
            outcomes,
            config.dedupe_window_s,
        )
        self.held = Held()  # publishes a full map holds back
        # (a step of the wall clock since the node last ran)
        mono, wall = time.monotonic(), time.time()
        if self.outbox.clock.start(clock_state, wall, mono, boot_id(), next_seq):
            self.counters.add("clock_steps", 1)
        self.queue = Submitter(
            config,
            self.node_id,
            next_seq,
            _Room(self.outbox, self.held, self.store, self.counters),
            outcomes,
        )
        self.consumer = Consumer(self.node_id, self.queue, self.store, self.counters)
        self.requests = Requests(self.counters)  # (requests waiting for replies)
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._discoveries: list[Discovery] = []
        self._wb = WriteBatch()
        self.commits = Committer(
            self.store,
            self.outbox.staging,
            self.consumer,
            self.counters,
            config.max_map_size_bytes,
            self.held,
        )
        self.commands = Commands(self.queue, self.consumer, self.outbox, self.commits)
        self.replication = Replication(
            config, self.node_id, self.incarnation, self.store, self.outbox, self.counters
        )
        self.commits.committed = self.replication.committed
        self.listener = Listener(self)
        self._next_beat = 0.0
        self._awaiting: set[bytes] = set()
        self._hold_until = 0.0
        self._send_retry_at = 0.0
        self._next_reclaim = 0.0
        self._expire_from = 0.0  # when idle lanes may expire (set at start)
        self._packed = Packed()
        self.mesh: Mesh | None = None
        self.ctrl_port = 0
        self.data_port = 0
        # The node's HTTP endpoints, as they start: http_address and metrics_address ->
        # host:port (the ports chosen for port 0), for its status.
        self.http_endpoints: dict[str, str] = {}

    # == application threads: start and close (what else they call is the queue's) ======

    def start(self) -> None:
        queue = self.queue
        if queue.state != "new":
            raise NodeStateError(f"node {self.config.name!r} was already started")
        queue.run()
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"zmesh-io-{self.config.name}"
        )
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise NodeStateError(
                f"node {self.config.name!r} IO thread did not start within {START_TIMEOUT_S:g}s"
            )
        if queue.failure is not None:
            self._thread.join()
            queue.state = "closed"
            self.store.close()
            failure = queue.failure
            if isinstance(failure, ZMeshError):
                raise failure
            raise NodeStateError(
                f"node {self.config.name!r} failed to start: {failure}"
            ) from failure

    def close(self) -> None:
        queue = self.queue
        if queue.state in ("new", "closed"):
            if queue.state == "new":
                self.store.close()
            queue.state = "closed"
            return
        if queue.state == "running" and self._thread is not None and self._thread.is_alive():
            queue.stop()
        queue.state = "closing"
        if self._thread is not None:
            self._thread.join()
        queue.state = "closed"
        with queue.cond:
            queue.cond.notify_all()

    # == IO thread =======================================================================

    def _run(self) -> None:
        try:
            self._setup()
        except BaseException as exc:  # reported by start()
            self.queue.failure = exc
            self._teardown_sockets()
            self._ready.set()
            return
        self._ready.set()
        try:
            while self._loop_once():
                pass
        except BaseException as exc:
            log.exception("zmesh IO thread of %s stopped on an internal error", self.config.name)
            self.queue.failure = exc
            self.queue.closing()
        finally:
            self._teardown()

    def _setup(self) -> None:
        cfg = self.config
        self.ctx = zmq.Context()
        self._wake_rx = self.ctx.socket(zmq.PAIR)
        wake_ep = f"inproc://zmesh-wake-{self.node_id.hex()}-{self.incarnation}"
        self._wake_rx.bind(wake_ep)
        wake_tx = self.ctx.socket(zmq.PAIR)
        wake_tx.connect(wake_ep)
        self.queue.attach(wake_tx)
        inproc = f"inproc://zmesh-{self.node_id.hex()}-{self.incarnation}"
        self.data_port, self.ctrl_port = self.listener.open(self.ctx, inproc)
        mesh = self.mesh = self.commands.mesh = Mesh(
            self.ctx,
            cfg,
            self.node_id,
            self.incarnation,
            self.outbox,
            self.counters,
            lambda: self.commands.local,
            self.keys,
        )
        mesh.ctrl_port, mesh.data_port = self.ctrl_port, self.data_port
        mesh.hosts = tuple(cfg.interfaces) or ("*",)
        mesh.self_peer = mesh.make_peer(
            self.node_id,
            cfg.name,
            self.incarnation,
            inproc + "-ctrl",
            inproc + "-data",
            time.monotonic(),
            self.keys.public if self.keys else b"",
        )
        mesh.self_peer.is_self = True
        mesh.liveness.start(time.monotonic())
        self.replication.start(mesh, time.monotonic())
        self.poller = zmq.Poller()
        self.poller.register(self._wake_rx, zmq.POLLIN)
        self.listener.register(self.poller)
        now = time.monotonic()
        self._expire_from = now + cfg.dead_after_s
        self.outbox.load(now, self._wb)
        known = self.store.known_peers()
        for c in self.store.take_corrupt():  # what the restart could not decode
            self.outbox.records.set_aside(c.db, c.key, c.value, c.reason, self._wb)
        self.commits.commit(self._wb, [])
        self._wb = WriteBatch()
        for ep, key in known.values():
            mesh.contact(ep, key=key)
        if known and self.outbox.depth:
            # Hold the reopened backlog until the peers we knew are back (or presumed dead):
            # handing all of a group's partitions to whichever member says hello first
            # would redeliver what the others acked just before our crash.
            self._awaiting = set(known)
            self._hold_until = now + cfg.dead_after_s
        self._discoveries.append(StaticSeeds(cfg.seeds))
        if cfg.mdns:
            # (imported here: zeroconf, with the asyncio and ssl it brings, is about 6 MB
            # of RSS a node without mDNS has no use for)
            from .._discovery.mdns import MdnsDiscovery

            self._discoveries.append(
                MdnsDiscovery(
                    name=cfg.name,
                    mesh=cfg.mesh,
                    node_id=self.node_id,
                    ctrl_port=self.ctrl_port,
                    data_port=self.data_port,
                    interfaces=cfg.interfaces,
                    public_key=self.keys.public if self.keys else b"",
                )
            )
        for discovery in self._discoveries:
            discovery.start(self._found)
        log.info(
            "node %s (%s) of mesh %s up: control %s data %s",
            cfg.name,
            self.node_id.hex()[:12],
            cfg.mesh,
            self.ctrl_port,
            self.data_port,
        )

    def heard(self, node_id: bytes) -> None:
        """A peer said hello: a reopened backlog no longer waits for it (IO thread)."""
        self._awaiting.discard(node_id)

    def _found(self, found: Found) -> None:
        """A discovery reports a control endpoint (from any thread): contacted on the IO
        thread."""
        if self.queue.state == "running":
            self.queue.submit(Contact(found))

    # -- the loop ------------------------------------------------------------------------

    def _loop_once(self) -> bool:
        now = time.monotonic()
        timeout_ms = self._poll_timeout_ms(now)
        events = dict(self.poller.poll(timeout_ms))
        now = time.monotonic()
        wb = self._wb
        self._wb = WriteBatch()
        pubs: list[AnyPublish] = []
        calls: list[Call] = []
        stop = False
        if self._wake_rx in events:
            # Consume the wake-up first, then re-arm: a wake-up sent after this point stays
            # in the socket, and a command queued before it is drained below. One byte per
            # iteration: the flag lets a second one in only rarely (a race, close()), and it
            # brings one more iteration, where reading until the pipe is empty would raise
            # zmq.Again (several microseconds) on every wake-up.
            self._wake_rx.recv(_NOBLOCK)
            self.queue.woken()
        if self.queue.waiting():
            stop = self.commands.drain(wb, pubs, calls, now)
        self.listener.receive(events, wb, now)
        self._timers(now, wb)
        mesh = self.mesh
        assert mesh is not None
        if mesh.unready and mesh.ready_data():  # (a data connection still on its way)
            self._send_retry_at = self._send_retry_at or now + SEND_RETRY_S
        done, stored = self.commits.store_pubs(wb, pubs, calls, now, self._wb)
        if stored and mesh.ephemeral:
            send_ephemeral(mesh, stored, self.node_id, self.incarnation, self.counters)
        watches = self.commands.watches
        if watches:
            self.outbox.receipts.watch(watches, self.outbox.lanes)
            watches.clear()
        for call in calls:
            call.done.set()
        # (after watch(): it resolves receipts already settled)
        self.queue.notify(self.outbox.receipts, *done)
        if mesh.ctrl_backlog and mesh.flush_ctrl_backlog():
            self._send_retry_at = self._send_retry_at or now + SEND_RETRY_S
        self.consumer.flush(mesh.send_ctrl)
        if self._awaiting and now >= self._hold_until:
            self._awaiting.clear()
        if now >= self._send_retry_at and not self._awaiting:
            self._send_retry_at = 0.0
            if not self.replication.holding:  # (a node serves our lanes: it hands back first)
                self.outbox.dispatcher.dispatch(now, self._send_data, self._wb)
            if self.replication.taken:
                self.replication.dispatch(now, self._sender)
        # (after the data: what replicas copy waits a little, a consumer does not)
        if self.replication.after_store(now):
            self._send_retry_at = self._send_retry_at or now + SEND_RETRY_S
        return not stop

    def _poll_timeout_ms(self, now: float) -> int:
        if self.queue.waiting() or self._wb:
            return 0
        wake = self._next_beat
        nxt = self.outbox.lanes.next_wakeup()
        if nxt is not None:
            wake = min(wake, nxt)
        if self.replication.taken:
            nxt = self.replication.next_wakeup()
            if nxt is not None:
                wake = min(wake, nxt)
        if self._send_retry_at:
            wake = min(wake, self._send_retry_at)
        if self._awaiting:
            wake = min(wake, self._hold_until)
        wake = min(wake, self._next_reclaim)
        assert self.mesh is not None
        wake = min(wake, self.mesh.liveness.next_wakeup())
        retry = self.held.next_retry()
        if retry is not None:
            wake = min(wake, retry)
        return max(0, int((wake - now) * 1000) + 1)

    # -- peers ---------------------------------------------------------------------------

    def _timers(self, now: float, wb: WriteBatch) -> None:
        nxt = self.outbox.lanes.next_wakeup()
        if nxt is not None and nxt <= now:
            self.outbox.settler.tick(now, wb)
        assert self.mesh is not None
        if now >= self.mesh.liveness.next_wakeup():
            self.mesh.liveness.tick(now, wb)  # probes, suspicions, gossip (membership.py)
        if now >= self._next_beat:
            self._next_beat = now + self.config.heartbeat_interval_s
            clock = self.outbox.clock
            mono, wall = time.monotonic(), time.time()  # (adjacent: what a step is seen by)
            if clock.beat(wall, mono, self.queue.next_seq()):
                self.counters.add("clock_steps", 1)
            observed = clock.observed(wall)
            wb.ids_prune_before = observed - self.config.dedupe_window_s
            if not self.store.disk.full:  # (what a beat writes waits for room)
                if (saved := clock.changed()) is not None:
                    wb.meta_put[b"wall_clock"] = saved
                self.consumer.forget_silent(observed, self.config.dedupe_window_s, wb)
            assert self.mesh is not None
            self.mesh.beat(now, wb)
            self.replication.beat(now)
            for discovery in self._discoveries:
                discovery.beat()
            self.commits.check_store(self.outbox.depth)  # (its data dir still there?)
            # (none retired before the members had time to say hello again)
            self.outbox.groups.expire_idle(observed, wb, retire=now >= self._expire_from)
        if now >= self._next_reclaim:
            more = self.outbox.retained.reclaim(wb, time.time())
            self._next_reclaim = now + (RECLAIM_BUSY_S if more else RECLAIM_INTERVAL_S)

    # -- sending -------------------------------------------------------------------------

    def _send_data(self, member: bytes, lane: Lane, out: Taken, columns: Columns) -> int:
        # The other lanes of the topic send the same messages, mostly in the same batches.
        packed = self._packed if len(self.outbox.lanes.of_topic(lane.topic)) > 1 else None
        floor = self.replication.floor(lane)
        producer = (self.node_id, self.incarnation, floor)
        return self._send_lane(producer, packed, member, lane, out, columns)

    def _sender(self, producer: bytes, incarnation: int, floor: int, _outbox: Outbox) -> Send:
        """Sending the lanes of a producer this node serves (replica/takeover.py)."""
        return partial(self._send_lane, (producer, incarnation, floor), None)

    def _send_lane(
        self,
        producer: tuple[bytes, int, int],
        packed: Packed | None,
        member: bytes,
        lane: Lane,
        out: Taken,
        columns: Columns,
    ) -> int:
        """Send ``out`` to ``member`` in batches of ``lane`` from ``producer`` (its id,
        incarnation and the lane's floor to tell)."""
        assert self.mesh is not None
        peer = self.mesh.peer(member)
        if peer is None or not peer.alive:
            return 0
        batch_size = lane.frame_size(lane.members[member].batch_size)
        sent = 0
        start, n = 0, len(out.seqs)
        while start < n:
            end = min(start + batch_size, n)
            frames = self._encode(producer, lane, out, columns, start, end, packed)
            while len(frames[0]) > MAX_BATCH_HEADER_BYTES and end - start > 1:
                # Long keys and large headers: a consumer decodes a header this large at
                # most (a message's own are bounded at publish, far below it).
                end = start + (end - start) // 2
                frames = self._encode(producer, lane, out, columns, start, end, packed)
            try:
                peer.send_batch(frames)
            except zmq.Again:
                self._send_retry_at = time.monotonic() + SEND_RETRY_S
                self.counters.add("data_send_blocked", 1)
                break
            lane.note_sent(end - start, sum(map(len, frames)))
            sent += end - start
            start = end
        self.counters.add("sent", sent)
        return sent

    def _encode(
        self,
        producer: tuple[bytes, int, int],
        lane: Lane,
        out: Taken,
        columns: Columns,
        start: int,
        end: int,
        packed: Packed | None,
    ) -> list[bytes]:
        """The frames of one batch: ``out``'s messages ``start:end``, from their columns
        (packed once for every lane of a topic with several: ``packed``)."""
        whole = start == 0 and end == len(out.seqs)  # (the columns as they are, no copies)
        seqs = out.seqs if whole else out.seqs[start:end]
        key = seqs if type(seqs) is range else tuple(seqs)  # (a range's slice is a range)
        done = packed.get(key) if packed is not None else None
        if done is None:
            cut: Callable[[Sequence[Any]], Sequence[Any]] = (
                _as_is if whole else itemgetter(slice(start, end))
            )
            done = pack_columns(
                key,
                cut(out.partitions),
                cut(columns.keys),
                cut(columns.headers),
                cut(columns.published_ats),
                cut(columns.indexes),
                cut(columns.payloads),
                columns.inline,
            )
            if packed is not None:
                packed.keep(key, done)
        node_id, incarnation, floor = producer
        return encode_lane_batch(
            node_id,
            incarnation,
            lane.topic,
            lane.name,
            floor,
            out.attempts if whole else out.attempts[start:end],
            done,
        )

    # -- groups --------------------------------------------------------------------------

    def delete_group(
        self, topic: str, group: str, wb: WriteBatch, now: float, announce: bool
    ) -> dict[str, int]:
        """Retire ``group`` of ``topic`` here (and, ``announce``, at every live peer): its
        lanes and what they owe. Members still subscribed are members of a new lane of it
        at once. Returns what was dropped here and how many peers were told."""
        mesh = self.mesh
        assert mesh is not None
        dropped = self.outbox.groups.delete(topic, group, wb)
        mesh.renew_lanes(topic, group, wb, now)
        told = mesh.send_to_peers(GroupDel(self.node_id, topic, group)) if announce else 0
        return {"dropped": dropped, "peers_told": told}

    # -- status and teardown -------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """A snapshot for status displays (IO thread)."""
        return node_status(self)

    def _teardown(self) -> None:
        try:
            # What was submitted before close() is stored and settled, not dropped.
            now = time.monotonic()
            wb, self._wb = self._wb, WriteBatch()
            pubs: list[AnyPublish] = []
            calls: list[Call] = []
            self.commands.drain(wb, pubs, calls, now, max_pubs=1 << 62)
            self.held.freed()  # one last try for the held publishes
            done, _stored = self.commits.store_pubs(wb, pubs, calls, now, self._wb)
            for call in calls:
                call.done.set()
            receipts = self.outbox.receipts
            self.queue.notify(receipts, *done)
            self.commits.commit(self._wb, [])
            self.replication.after_store(now)
            self.queue.notify(receipts, *self.commits.fail_held(self.config.name))
            mesh = self.mesh
            assert mesh is not None
            mesh.flush_ctrl_backlog()
            self.consumer.flush(mesh.send_ctrl)
            lost = self.outbox.records.in_ram_only()
            if lost:  # (nothing is dropped without a word: docs/operations.md)
                self.counters.add("memory_lost_on_close", lost)
                log.warning(
                    "node %s closes with %d messages of memory topics not settled by "
                    "every group: they were kept in RAM only and are dropped now "
                    "(durability='process' would keep them)",
                    self.config.name,
                    lost,
                )
            bye = encode_control(Bye(self.node_id, self.incarnation))
            for peer in mesh.peers.values():
                if peer.alive and peer.connected:  # (the others learn it from them)
                    mesh.send_raw(peer.dealer, bye)
        except Exception:
            log.exception("error while closing node %s", self.config.name)
        finally:
            for sub in list(self.commands.local):
                sub._drain_unsettled()
            self.requests.end_all()
            self._teardown_sockets()
            self.replication.close()
            self.store.close()
            self.queue.state = "closed"
            self.queue.end()

    def _teardown_sockets(self) -> None:
        for discovery in self._discoveries:
            try:
                discovery.close()
            except Exception:
                log.exception("closing %s failed", type(discovery).__name__)
        self._discoveries.clear()
        if self.mesh is not None:
            self.mesh.close()
        self.listener.close()
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            self.queue.attach(None)  # (under the lock wake-ups are sent under)
            wake_rx = getattr(self, "_wake_rx", None)
            if wake_rx is not None:
                wake_rx.close(linger=0)
            ctx.term()


_open_warned: set[str] = set()


def _warn_if_open(keys: Keys | None, mesh: str) -> None:
    """Say once per mesh and process that a mesh without keys admits anyone."""
    if keys is None and mesh not in _open_warned:
        _open_warned.add(mesh)
        log.warning(
            "mesh %r is open: no CURVE keys are configured, so anyone on the "
            "network can join it (set secret_key_file and trusted keys)",
            mesh,
        )


def _as_is(column: Sequence[Any]) -> Sequence[Any]:
    return column
