"""The IO thread: it owns every ZeroMQ socket and does every LMDB write of a node.

Other threads talk to it only through ``submit`` (a deque plus a wake-up byte on an inproc
PAIR socket). One loop iteration: poll, drain commands, receive data and control, run
timers, commit one LMDB transaction, then send what that commit allows (receipts, acks,
data batches).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from .._discovery.mdns import MdnsDiscovery
from .._discovery.static import seed_endpoints
from .._protocol.codec import decode_batch, decode_control, encode_batch, encode_control
from .._protocol.frames import (
    Ack,
    AdminReply,
    AdminRequest,
    Batch,
    Bye,
    Fail,
    FetchHead,
    FetchItem,
    FetchReply,
    FetchRequest,
    Hello,
    Nack,
    StatusReply,
    StatusRequest,
)
from .._receipt import Receipt
from .._security import Keys, ZapHandler, load_keys, server_options
from .._store.store import Store, WriteBatch
from ..config import NodeConfig
from ..errors import (
    DecodeError,
    NodeStateError,
    OutboxFullError,
    StoreFullError,
    ZMeshError,
)
from .admin import admin
from .commit import Committer
from .consumer import Consumer
from .lane import Lane, Taken
from .mesh import Mesh
from .producer import Producer, Publish
from .retention import RECLAIM_BUSY_S, RECLAIM_INTERVAL_S
from .routing import partition_for
from .stats import Counters

if TYPE_CHECKING:
    from ..subscription import Message, Subscription

log = logging.getLogger(__name__)

RECV_BURST = 512  # control frames handled per loop iteration
# Messages received per loop iteration: a few batches, so their acks (committed at the end
# of the iteration) flow back while the producer still has credit to send more.
RECV_DATA_MSGS = 200
START_TIMEOUT_S = 15.0
DEALER_LINGER_MS = 200
CONTACT_EXPIRY_BEATS = 10
FORGET_DEAD_AFTER_S = 600.0
CTRL_BACKLOG_MAX = 10_000
SEND_RETRY_S = 0.005
MAX_PUBS_PER_LOOP = 10_000  # publishes staged in one loop iteration (one LMDB transaction)
# Publishes that may wait for the IO thread. A publisher that gets further ahead waits for
# it: this gives the IO thread the GIL, and keeps the queued publishes (memory, and the
# garbage collector's work over them) bounded.
MAX_AHEAD_MSGS = 2_000
FETCH_REPLY_BYTES = 1 << 20  # payload bytes per fetch reply (at least one message)

# Plain ints: pyzmq's Flag enums cost an enum operation per use on the data path.
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)


class _Call:
    """A function to run on the IO thread, and its result."""

    __slots__ = ("fn", "done", "result", "error", "tx")

    def __init__(self, fn: Callable[[WriteBatch, float], Any], tx: bool = False) -> None:
        self.fn = fn
        self.tx = tx  # a transaction: it fails with the commit of its publishes
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class Engine:
    """One node's IO thread and everything it owns."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.keys = load_keys(config.secret_key_file, config.trusted_keys_dir,
                              config.trusted_keys)
        _warn_if_open(self.keys, config.mesh)
        self.store = Store(config.data_dir, config.map_size_bytes)
        try:
            self.node_id, self.incarnation, next_seq, next_lane = self.store.open_identity()
        except Exception:
            self.store.close()
            raise
        self.counters = Counters()
        self.cond = threading.Condition()
        self.producer = Producer(self.store, self.node_id, next_seq, next_lane,
                                 dict(config.topics), config.memory_budget_bytes,
                                 self.counters)
        self.consumer = Consumer(self, self.store, self.counters)
        self._next_seq = next_seq
        self._node_hex = self.node_id.hex()
        self._watch_fn = self.watch  # one bound method for every receipt
        self._watches: list[Receipt] = []
        self._bad_frames: dict[str, int] = {}
        self._alloc = threading.Lock()  # sequence allocation (application threads)
        self._submitted = 0  # messages prepared by application threads (under _alloc)
        self._done = 0  # of those, stored or failed (IO thread)
        # Payload bytes of the same: publishes may run ahead of the IO thread by at most
        # an eighth of the map, so a map that fills up stops them soon after.
        self._submitted_bytes = 0
        self._done_bytes = 0
        self._ahead_limit = config.map_size_bytes // 8
        self._cmds: deque[tuple] = deque()
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._wake_tx: zmq.Socket | None = None  # application threads' end of the wake pipe
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._state = "new"  # new -> running -> closing -> closed
        self._local_subs: list[Subscription] = []
        self._mdns: MdnsDiscovery | None = None
        self._wb = WriteBatch()
        self.commits = Committer(self.store, self.producer, self.consumer, self.counters,
                                 config.max_map_size_bytes)
        self.held = self.commits.held  # publishes a full map holds back
        self._next_beat = 0.0
        self._awaiting: set[bytes] = set()
        self._hold_until = 0.0
        self._send_retry_at = 0.0
        self._next_reclaim = 0.0
        self.mesh: Mesh | None = None
        self.ctrl_port = 0
        self.data_port = 0

    # == user-thread side ================================================================

    def start(self) -> None:
        if self._state != "new":
            raise NodeStateError(f"node {self.config.name!r} was already started")
        self._state = "running"
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"zmesh-io-{self.config.name}")
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise NodeStateError(f"node {self.config.name!r} IO thread did not start within "
                                 f"{START_TIMEOUT_S:g}s")
        if self._failure is not None:
            self._thread.join()
            self._state = "closed"
            self.store.close()
            failure = self._failure
            if isinstance(failure, ZMeshError):
                raise failure
            raise NodeStateError(f"node {self.config.name!r} failed to start: "
                                 f"{failure}") from failure

    def _check_running(self) -> None:
        if self._state != "running":
            if self._failure is not None:
                raise NodeStateError(f"node {self.config.name!r} stopped after an internal "
                                     f"error: {self._failure!r}")
            raise NodeStateError(f"node {self.config.name!r} is {self._state}; use it inside "
                                 "'with' or after start()")

    def submit(self, cmd: tuple) -> None:
        self._check_running()
        self._cmds.append(cmd)
        if not self._wake_pending:
            self._wake_pending = True
            if not self._wake():
                self._check_running()  # the IO thread stopped meanwhile: say why

    def _wake(self) -> bool:
        """Wake the IO thread; False when it has already closed its wake pipe."""
        with self._wake_lock:
            if self._wake_tx is None:
                return False
            with contextlib.suppress(zmq.Again):  # the pipe is full of wake-ups already
                self._wake_tx.send(b"", zmq.NOBLOCK)
            return True

    def prepare(self, topic: str, payloads: list[bytes], keys: list[str | None],
                headers: dict | None, priority: int, expires_at: float | None,
                deliver_at: float | None, partitions: int, timeout_s: float,
                msg_id: str | None = None, paced: bool = True) -> list[Publish]:
        """Allocate consecutive sequences and one receipt for ``payloads``, waiting up to
        ``timeout_s`` for outbox room. The caller must submit them (or ``abandon`` them).

        ``paced``: also wait while MAX_AHEAD_MSGS publishes wait for the IO thread (not for
        a transaction, whose publishes are submitted only when it commits).
        """
        n = len(payloads)
        first = self._reserve(n, sum(map(len, payloads)) if n > 1 else len(payloads[0]),
                              timeout_s, paced)
        receipt = Receipt(self._node_hex, first, self.cond, n, topic, self._watch_fn)
        now = time.time()
        if n == 1:  # publish(): no comprehension to set up for one message
            key = keys[0]
            return [Publish(first, topic, partition_for(key, partitions, first), key, headers,
                            payloads[0], priority, now, expires_at, deliver_at, receipt,
                            msg_id)]
        return [Publish(seq, topic, partition_for(key, partitions, seq), key, headers, payload,
                        priority, now, expires_at, deliver_at, receipt, msg_id)
                for seq, payload, key in zip(range(first, first + n), payloads, keys,
                                             strict=True)]

    def _reserve(self, n: int, nbytes: int, timeout_s: float, paced: bool) -> int:
        """The first of ``n`` sequences, once the outbox has room for them."""
        self._check_running()
        limit = self.config.max_outbox_messages
        deadline = 0.0
        while True:
            with self._alloc:
                waiting = self._submitted - self._done
                depth = self.producer.depth + waiting
                room = depth + n <= limit or depth == 0
                ahead = self._submitted_bytes - self._done_bytes
                if room and not self.held.full and (
                        ahead + nbytes <= self._ahead_limit or ahead == 0) and (
                        not paced or waiting + n <= MAX_AHEAD_MSGS or waiting == 0):
                    first = self._next_seq
                    self._next_seq = first + n
                    self._submitted += n
                    self._submitted_bytes += nbytes
                    return first
            # Full: wait for acks (or stores) to make room, up to the timeout.
            deadline = deadline or time.monotonic() + timeout_s
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if room and self.held.full:  # the outbox has room, the LMDB map has not
                    self.counters.add("publish_store_full", 1)
                    raise StoreFullError(self.store.path, self.store.map_size_bytes,
                                         timeout_s)
                raise OutboxFullError(depth, limit, timeout_s)
            with self.cond:
                self.cond.wait(remaining)
            self._check_running()

    def abandon(self, count: int, nbytes: int) -> None:
        """Prepared publishes that will never be submitted (an aborted transaction)."""
        with self._alloc:
            self._submitted -= count
            self._submitted_bytes -= nbytes
        with self.cond:
            self.cond.notify_all()

    def watch(self, receipt: Receipt) -> None:
        """Someone waits for ``receipt`` to be acked: have the IO thread track it."""
        if self._state == "running":
            self.submit(("watch", receipt))

    def transact(self, pubs: list[Publish], acks: list[Message], timeout_s: float) -> None:
        """Store ``pubs`` and settle ``acks`` in one LMDB transaction, or none of it."""
        done = _Call(lambda _wb, _now: None, tx=True)
        self.submit(("tx", pubs, acks, done))
        if not done.done.wait(timeout_s):
            raise NodeStateError(f"transaction not committed within {timeout_s:g}s")
        if done.error is not None:
            raise done.error

    def settle(self, msg: Message, how: str, arg: object) -> None:
        self.submit(("settle", msg, how, arg))

    def subscribe(self, sub: Subscription) -> None:
        self.submit(("sub", sub))

    def unsubscribe(self, sub: Subscription) -> None:
        left = sub._drain_unsettled()
        self.submit(("unsub", sub, left))

    def call(self, fn: Callable[[WriteBatch, float], Any], timeout_s: float = 10.0) -> Any:
        """Run ``fn(write_batch, now)`` on the IO thread and return its result.

        What ``fn`` adds to the write batch is committed in that loop iteration, before the
        result is returned.
        """
        call = _Call(fn)
        self.submit(("call", call))
        if not call.done.wait(timeout_s):
            raise NodeStateError(f"node {self.config.name!r} did not answer within "
                                 f"{timeout_s:g}s")
        if call.error is not None:
            raise call.error
        return call.result

    def close(self) -> None:
        if self._state in ("new", "closed"):
            if self._state == "new":
                self.store.close()
            self._state = "closed"
            return
        if self._state == "running" and self._thread is not None and self._thread.is_alive():
            self._cmds.append(("stop",))
            self._wake()
        self._state = "closing"
        if self._thread is not None:
            self._thread.join()
        self._state = "closed"
        with self.cond:
            self.cond.notify_all()

    # == IO thread =======================================================================

    def _run(self) -> None:
        try:
            self._setup()
        except BaseException as exc:  # reported by start()
            self._failure = exc
            self._teardown_sockets()
            self._ready.set()
            return
        self._ready.set()
        try:
            while self._loop_once():
                pass
        except BaseException as exc:
            log.exception("zmesh IO thread of %s stopped on an internal error",
                          self.config.name)
            self._failure = exc
            self._state = "closing"
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
        with self._wake_lock:
            self._wake_tx = wake_tx
        max_frame = cfg.max_message_bytes + (1 << 20)
        # The ZAP handler must be bound before any server socket, or CURVE admits everyone.
        self.zap = ZapHandler(self.ctx, self.keys, self.counters)
        self.pull = self.ctx.socket(zmq.PULL)
        self.router = self.ctx.socket(zmq.ROUTER)
        for sock in (self.pull, self.router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
            server_options(sock, self.keys)
        try:
            self.data_port = self._bind(self.pull)
            self.ctrl_port = self._bind(self.router)
        except zmq.ZMQError as exc:
            raise ZMeshError(f"cannot bind on interfaces {list(cfg.interfaces) or ['*']}: "
                             f"{exc}") from exc
        inproc = f"inproc://zmesh-{self.node_id.hex()}-{self.incarnation}"
        self.pull.bind(inproc + "-data")
        self.router.bind(inproc + "-ctrl")
        mesh = self.mesh = Mesh(self.ctx, cfg, self.node_id, self.incarnation, self.producer,
                                self.counters, lambda: self._local_subs, self.keys)
        mesh.ctrl_port, mesh.data_port = self.ctrl_port, self.data_port
        mesh.hosts = tuple(cfg.interfaces) or ("*",)
        mesh.self_peer = mesh.make_peer(self.node_id, cfg.name, self.incarnation,
                                        inproc + "-ctrl", inproc + "-data", time.monotonic(),
                                        self.keys.public if self.keys else b"")
        mesh.self_peer.is_self = True
        self.poller = zmq.Poller()
        self.poller.register(self._wake_rx, zmq.POLLIN)
        self.poller.register(self.pull, zmq.POLLIN)
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.zap.sock, zmq.POLLIN)
        # Failed handshakes (a keyless node at a secured one, garbage instead of ZMTP) never
        # reach ZAP; the sockets' monitors report them.
        failed = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._monitors = [self.pull.get_monitor_socket(failed),
                          self.router.get_monitor_socket(failed)]
        for mon in self._monitors:
            self.poller.register(mon, zmq.POLLIN)
        now = time.monotonic()
        self.producer.load(now, self._wb)
        known = self.store.known_peers()
        for topic, tcfg in self.producer.topics.items():
            self.producer.set_topic(topic, tcfg, self._wb, now)
        for c in self.store.take_corrupt():  # what the restart could not decode
            self.producer.set_aside(c.db, c.key, c.value, c.reason, self._wb)
        self.commits.commit(self._wb, [])
        self._wb = WriteBatch()
        for ep in seed_endpoints(cfg.seeds):
            mesh.contact(ep, seed=True)
        for ep, key in known.values():
            mesh.contact(ep, key=key)
        if known and self.producer.depth:
            # Hold the reopened backlog until the peers we knew are back (or presumed dead):
            # handing all of a group's partitions to whichever member says hello first
            # would redeliver what the others acked just before our crash.
            self._awaiting = set(known)
            self._hold_until = now + cfg.dead_after_s
        if cfg.mdns:
            self._mdns = MdnsDiscovery(
                name=cfg.name, mesh=cfg.mesh, node_id=self.node_id, ctrl_port=self.ctrl_port,
                data_port=self.data_port, interfaces=cfg.interfaces,
                on_peer=self._cmds_from_discovery,
                public_key=self.keys.public if self.keys else b"")
            self._mdns.start()
        log.info("node %s (%s) of mesh %s up: control %s data %s", cfg.name,
                 self.node_id.hex()[:12], cfg.mesh, self.ctrl_port, self.data_port)

    def _cmds_from_discovery(self, peer_id: bytes, ep: str, key: bytes) -> None:
        if self._state == "running":
            self.submit(("contact", ep, peer_id, key))

    def _bind(self, sock: zmq.Socket) -> int:
        ifaces = list(self.config.interfaces) or ["*"]
        sock.bind(f"tcp://{_host(ifaces[0])}:*")
        port = int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        for iface in ifaces[1:]:
            sock.bind(f"tcp://{_host(iface)}:{port}")
        return port

    # -- the loop ------------------------------------------------------------------------

    def _loop_once(self) -> bool:
        now = time.monotonic()
        timeout_ms = self._poll_timeout_ms(now)
        events = dict(self.poller.poll(timeout_ms))
        now = time.monotonic()
        wb = self._wb
        self._wb = WriteBatch()
        pubs: list[Publish] = []
        calls: list[_Call] = []
        stop = False
        if self._wake_rx in events:
            # Consume the wake-ups first, then re-arm: a wake-up sent after this point
            # stays in the socket, and a command queued before it is drained below.
            try:
                while True:
                    self._wake_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                pass
            self._wake_pending = False
        if self._cmds:
            stop = self._drain_commands(wb, pubs, calls, now)
        if self.zap.sock in events:
            self.zap.handle()
        for mon in self._monitors:
            if mon in events:
                self._on_monitor(mon)
        if self.pull in events:
            self._recv_data(wb, now)
        if self.router in events:
            self._recv_control(wb, now)
        self._timers(now, wb)
        done = self.commits.store_pubs(wb, pubs, calls, now, self._wb)
        if self._watches:
            self.producer.watch(self._watches)
            self._watches.clear()
        for call in calls:
            call.done.set()
        self._notify(*done)  # after watch(): it resolves receipts already settled
        mesh = self.mesh
        assert mesh is not None
        if mesh.ctrl_backlog and mesh.flush_ctrl_backlog():
            self._send_retry_at = self._send_retry_at or now + SEND_RETRY_S
        self.consumer.flush(mesh.send_ctrl)
        if self._awaiting and now >= self._hold_until:
            self._awaiting.clear()
        if now >= self._send_retry_at and not self._awaiting:
            self._send_retry_at = 0.0
            self.producer.dispatch(now, self._send_data, self._wb)
        return not stop

    def _poll_timeout_ms(self, now: float) -> int:
        if self._cmds or self._wb:
            return 0
        wake = self._next_beat
        nxt = self.producer.next_wakeup()
        if nxt is not None:
            wake = min(wake, nxt)
        if self._send_retry_at:
            wake = min(wake, self._send_retry_at)
        if self._awaiting:
            wake = min(wake, self._hold_until)
        wake = min(wake, self._next_reclaim)
        retry = self.held.next_retry()
        if retry is not None:
            wake = min(wake, retry)
        return max(0, int((wake - now) * 1000) + 1)

    def _drain_commands(self, wb: WriteBatch, pubs: list[Publish], calls: list[_Call],
                        now: float, max_pubs: int = MAX_PUBS_PER_LOOP) -> bool:
        """Apply queued commands in order; stops once ``max_pubs`` publishes are collected
        (the rest waits for the next iteration, so one transaction stays bounded)."""
        cmds = self._cmds
        mesh = self.mesh
        assert mesh is not None
        stop = False
        while cmds and len(pubs) < max_pubs:
            cmd = cmds.popleft()
            kind = cmd[0]
            if kind == "pub":
                pubs.extend(cmd[1])
            elif kind == "settle":
                self.consumer.settle(cmd[1], cmd[2], cmd[3], wb)
            elif kind == "ack_many":
                settle = self.consumer.settle
                for msg in cmd[1]:
                    settle(msg, "acked", None, wb)
            elif kind == "watch":
                self._watches.append(cmd[1])
            elif kind == "tx":
                _, tx_pubs, acks, done = cmd
                for msg in acks:
                    self.consumer.settle(msg, "acked", None, wb)
                pubs.extend(tx_pubs)
                self.commits.tx_pubs.update(id(p) for p in tx_pubs)
                calls.append(done)
            elif kind == "contact":
                _, ep, peer_id, key = cmd
                peer = mesh.peers.get(peer_id)
                if peer is None or (not peer.alive and peer.ctrl_ep != ep):
                    mesh.contact(ep, key=key)
            elif kind == "sub":
                self._local_subs.append(cmd[1])
                self.consumer.add(cmd[1])
                mesh.subs_changed(wb, now)
            elif kind == "unsub":
                if cmd[1] in self._local_subs:
                    self._local_subs.remove(cmd[1])
                self.consumer.remove(cmd[1], cmd[2])
                mesh.subs_changed(wb, now)
            elif kind == "topic":
                self.producer.set_topic(cmd[1], cmd[2], wb, now)
            elif kind == "call":
                call: _Call = cmd[1]
                try:
                    call.result = call.fn(wb, now)
                except BaseException as exc:
                    call.error = exc
                calls.append(call)
            elif kind == "stop":
                stop = True
        return stop

    def _notify(self, staged_done: int, staged_bytes: int = 0) -> None:
        p = self.producer
        if not (staged_done or p.stored or p.acked):
            return
        self._done += staged_done
        self._done_bytes += staged_bytes
        with self.cond:
            for r in p.stored:
                r._stored = True
            for r in p.acked:
                r._unacked -= 1
                if r._unacked <= 0:
                    r._stored = True
                    r._acked = True
            p.stored.clear()
            p.acked.clear()
            self.cond.notify_all()

    # -- receiving -----------------------------------------------------------------------

    def _recv_data(self, wb: WriteBatch, now: float) -> None:
        pull = self.pull
        limit = self.config.max_message_bytes
        received = 0
        for _ in range(RECV_BURST):
            if received >= RECV_DATA_MSGS:
                return
            try:
                frames = [pull.recv(_NOBLOCK)]
            except zmq.Again:
                return
            # Usually one frame; large payloads follow as more parts of the same message,
            # which ZeroMQ delivers whole.
            while pull.getsockopt(_RCVMORE):
                frames.append(pull.recv(_NOBLOCK))
            try:
                batch = decode_batch(frames, limit)
            except DecodeError as exc:
                self.counters.add("decode_errors", 1)
                log.debug("dropped a bad data frame: %s", exc)
                continue
            if self.mesh is not None and self.mesh.peer(batch.node_id) is None:
                # Data can overtake its producer's hello; hand it back until we know the
                # producer (the nack waits for it), and never deliver a stranger's batch.
                self.counters.add("batches_from_unknown_peers", 1)
                self.consumer.release(batch)
                continue
            received += len(batch.seqs)
            self.consumer.on_batch(batch, wb, now)

    def _on_monitor(self, mon: zmq.Socket) -> None:
        while True:
            try:
                event = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            n = self.counters.get("handshakes_failed") + 1
            self.counters.add("handshakes_failed", 1)
            if n in (1, 10, 100, 1000) or n % 10_000 == 0:
                log.warning("%d failed handshakes so far (last: %s on %s); a node without "
                            "the mesh's keys, or not speaking zmesh, tries to connect", n,
                            zmq.Event(event["event"]).name, event["endpoint"])

    def _abuse(self, frame: zmq.Frame) -> None:
        """Count bad control frames per source address; ban an address past the limit."""
        limit = self.config.ban_after_bad_frames
        addr = _meta(frame, "Peer-Address")
        if not limit or addr is None:
            return
        n = self._bad_frames[addr] = self._bad_frames.get(addr, 0) + 1
        if n == limit:
            self.zap.banned.add(addr)
            self.counters.add("addresses_banned", 1)
            log.warning("banning %s: %d undecodable control frames; it can no longer "
                        "connect to this node", addr, n)

    def _recv_control(self, wb: WriteBatch, now: float) -> None:
        router = self.router
        mesh = self.mesh
        assert mesh is not None
        for _ in range(RECV_BURST):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                if len(frames) != 2:
                    raise DecodeError(f"{len(frames)} frames")
                msg = decode_control(frames[1].bytes)
            except DecodeError as exc:
                self.counters.add("decode_errors", 1)
                log.debug("dropped a bad control frame: %s", exc)
                self._abuse(frames[-1])
                continue
            try:
                self._on_control(msg, frames, wb, now)
            except Exception:
                # Input must never stop the IO thread; this is a bug to report, not a crash.
                self.counters.add("internal_errors", 1)
                log.exception("error while handling a %s; the node goes on",
                              type(msg).__name__)

    def _on_control(self, msg: object, frames: list[zmq.Frame], wb: WriteBatch,
                    now: float) -> None:
        mesh = self.mesh
        assert mesh is not None
        if isinstance(msg, Ack):
            self.producer.on_ack(msg.topic, msg.lane, msg.seqs, wb)
        elif isinstance(msg, Hello):
            mesh.on_hello(msg, _meta(frames[1], "Peer-Address"),
                          (_meta(frames[1], "User-Id") or "").encode(), wb, now)
            self._awaiting.discard(msg.node_id)
        elif isinstance(msg, Nack):
            self.producer.on_nack(msg.topic, msg.lane, msg.seqs,
                                  None if msg.delay_s < 0 else msg.delay_s, wb, now)
        elif isinstance(msg, Fail):
            self.producer.on_fail(msg.topic, msg.lane, msg.seq, msg.reason, wb)
        elif isinstance(msg, Bye):
            peer = mesh.peers.get(msg.node_id)
            if peer is not None and peer.incarnation == msg.incarnation:
                mesh.forget(peer, now, "said bye")
        elif isinstance(msg, StatusRequest):
            self._reply(frames[0], StatusReply(msg.token, self.status()))
        elif isinstance(msg, AdminRequest):
            self._reply(frames[0], admin(self, msg, wb, now))
        elif isinstance(msg, FetchRequest):
            items, heads = self.producer.fetch(msg.topic, dict(msg.cursors), msg.start,
                                               msg.max_items, FETCH_REPLY_BYTES)
            self.counters.add("fetched", len(items))
            self._reply(frames[0], FetchReply(msg.token, msg.topic,
                                              tuple(FetchItem(*i) for i in items),
                                              tuple(FetchHead(*h) for h in heads)))

    def _reply(self, identity: zmq.Frame, msg: StatusReply | AdminReply | FetchReply) -> None:
        try:
            self.router.send_multipart([identity.bytes, encode_control(msg)], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.counters.add("replies_dropped", 1)

    # -- peers ---------------------------------------------------------------------------

    def _timers(self, now: float, wb: WriteBatch) -> None:
        nxt = self.producer.next_wakeup()
        if nxt is not None and nxt <= now:
            self.producer.tick(now, wb)
        if now >= self._next_beat:
            self._next_beat = now + self.config.heartbeat_interval_s
            wb.ids_prune_before = time.time() - self.config.dedupe_window_s
            assert self.mesh is not None
            self.mesh.beat(now, wb)
        if now >= self._next_reclaim:
            more = self.producer.reclaim(wb, time.time())
            self._next_reclaim = now + (RECLAIM_BUSY_S if more else RECLAIM_INTERVAL_S)

    # -- sending -------------------------------------------------------------------------

    def _send_data(self, member: bytes, lane: Lane, out: Taken, records: list[list]) -> int:
        assert self.mesh is not None
        peer = self.mesh.peer(member)
        if peer is None or not peer.alive:
            return 0
        batch_size = lane.members[member].batch_size
        floor = lane.floor()
        sent = 0
        push = peer.push
        for start in range(0, len(out.seqs), batch_size):
            end = start + batch_size
            seqs = out.seqs[start:end]
            (_t, _p, keys, headers, _prio, published_ats, _e, _d, payloads,
             indexes) = zip(*records[start:end], strict=True)
            frames = encode_batch(Batch(
                self.node_id, self.incarnation, lane.topic, lane.name, floor, tuple(seqs),
                tuple(out.partitions[start:end]), keys, headers,
                tuple(out.attempts[start:end]), published_ats, indexes, payloads))
            try:
                if len(frames) == 1:
                    push.send(frames[0], _NOBLOCK)
                else:  # large payloads: pyzmq sends parts past its copy threshold uncopied
                    push.send_multipart(frames, _NOBLOCK, copy=False)
            except zmq.Again:
                self._send_retry_at = time.monotonic() + SEND_RETRY_S
                self.counters.add("data_send_blocked", 1)
                break
            sent += len(seqs)
        self.counters.add("sent", sent)
        return sent

    # -- status and teardown -------------------------------------------------------------

    def status(self) -> dict:
        """A snapshot for status displays (IO thread)."""
        now = time.monotonic()
        lanes = []
        for (topic, name), lane in self.producer.lanes.items():
            group, mode = self.producer.lane_meta[(topic, name)]
            lanes.append({
                "topic": topic, "lane": name, "group": group, "mode": mode,
                "members": [m.hex() for m in lane.members],
                "pending": len(lane), "ready": lane.ready_count,
                "in_flight": lane.in_flight_count(), **lane.counts,
            })
        return {
            "node": {"id": self.node_id.hex(), "name": self.config.name,
                     "mesh": self.config.mesh, "incarnation": self.incarnation,
                     "control_port": self.ctrl_port, "data_port": self.data_port},
            "outbox": self.producer.depth,
            "store": {"path": self.store.path, "map_size_bytes": self.store.map_size_bytes,
                      "full": self.held.full, "held_publishes": len(self.held)},
            "lanes": lanes,
            "subscriptions": [{"topic": s.topic, "group": s.group, "mode": s.mode,
                               "delivered": s.delivered} for s in self._local_subs],
            "peers": [p.info(now) for p in self.mesh.peers.values()] if self.mesh else [],
            "counters": self.counters.snapshot(),
        }

    def _teardown(self) -> None:
        try:
            # What was submitted before close() is stored and settled, not dropped.
            now = time.monotonic()
            wb, self._wb = self._wb, WriteBatch()
            pubs: list[Publish] = []
            calls: list[_Call] = []
            self._drain_commands(wb, pubs, calls, now, max_pubs=1 << 62)
            self.held.freed()  # one last try for the held publishes
            done = self.commits.store_pubs(wb, pubs, calls, now, self._wb)
            for call in calls:
                call.done.set()
            self._notify(*done)
            self.commits.commit(self._wb, [])
            self._notify(*self.commits.fail_held(self.config.name))
            mesh = self.mesh
            assert mesh is not None
            mesh.flush_ctrl_backlog()
            self.consumer.flush(mesh.send_ctrl)
            bye = encode_control(Bye(self.node_id, self.incarnation))
            for peer in mesh.peers.values():
                mesh.send_raw(peer.dealer, bye)
        except Exception:
            log.exception("error while closing node %s", self.config.name)
        finally:
            for sub in list(self._local_subs):
                sub._drain_unsettled()
            self._teardown_sockets()
            self.store.close()
            self._state = "closed"
            with self.cond:
                self.cond.notify_all()

    def _teardown_sockets(self) -> None:
        if self._mdns is not None:
            try:
                self._mdns.close()
            except Exception:
                log.exception("closing mDNS failed")
            self._mdns = None
        if self.mesh is not None:
            self.mesh.close()
        for name in ("pull", "router"):
            sock = getattr(self, name, None)
            if sock is not None and not sock.closed and getattr(self, "_monitors", None):
                sock.disable_monitor()
        for mon in getattr(self, "_monitors", ()):
            mon.close(linger=0)
        zap = getattr(self, "zap", None)
        if zap is not None:
            zap.close()
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            # Application threads send wake-ups under the lock: never close it under them.
            with self._wake_lock:
                if self._wake_tx is not None:
                    self._wake_tx.close(linger=0)
                    self._wake_tx = None
            for name in ("pull", "router", "_wake_rx"):
                sock = getattr(self, name, None)
                if sock is not None:
                    sock.close(linger=0)
            ctx.term()


_open_warned: set[str] = set()


def _warn_if_open(keys: Keys | None, mesh: str) -> None:
    """Say once per mesh and process that a mesh without keys admits anyone."""
    if keys is None and mesh not in _open_warned:
        _open_warned.add(mesh)
        log.warning("mesh %r is open: no CURVE keys are configured, so anyone on the "
                    "network can join it (set secret_key_file and trusted keys)", mesh)


def _meta(frame: zmq.Frame, name: str) -> str | None:
    try:
        value = frame.get(name)
        return value if isinstance(value, str) else None
    except zmq.ZMQError:
        return None


def _host(iface: str) -> str:
    if iface in ("*", "0.0.0.0", ""):
        return "*"
    return f"[{iface}]" if ":" in iface else iface

