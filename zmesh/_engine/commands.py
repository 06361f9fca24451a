"""Commands from application threads to the IO thread, and how they wait for the answer.

An application thread appends a command to a deque and, unless a wake-up is already
pending, sends one wake-up byte on an inproc PAIR socket. A publish gets its sequences on
the caller's thread, and waits while the outbox, the LMDB map or the IO thread's backlog
has no room for it. The IO thread (engine.py) drains the deque at the start of a loop
iteration and, after that iteration's commit, resolves receipts and wakes the waiters.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import repeat
from threading import TIMEOUT_MAX
from typing import TYPE_CHECKING, Any

import zmq

from .._protocol.codec import MAX_SUBSCRIPTION_BYTES, MAX_SUBSCRIPTIONS, announced_bytes
from .._receipt import Publisher, Receipt, Signal, Stage
from ..errors import (
    ArgumentError,
    NodeClosedError,
    NodeStateError,
    OutboxFullError,
)
from .outbox.publishes import AnyPublish, Publish, PublishMany, Stretch, message_count
from .peers import announced_group
from .routing import partition_for, round_robin_partitions

if TYPE_CHECKING:
    from .._store.store import Store, WriteBatch
    from ..config import NodeConfig
    from ..subscription import Message, Subscription
    from .commit import Committer
    from .held import Held
    from .inbox.consumer import Consumer
    from .inbox.origin import Origin
    from .mesh import Mesh
    from .outbox.outbox import Outbox
    from .stats import Counters

log = logging.getLogger(__name__)

# Publishes that may wait for the IO thread. A publisher that gets further ahead waits for
# it: this gives the IO thread the GIL, and keeps the queued publishes (memory, and the
# garbage collector's work over them) bounded. Small enough that the IO thread gets the GIL
# every few milliseconds of publishing, to send and settle as well as store; large enough
# that the hand-offs between the threads and the loop's work per iteration are shared by
# many publishes: with members' credit as a window (lane.py) that keeps frames on their
# way, 2,000 cut a producer's CPU per message by a sixth against 500 (performance.md).
MAX_AHEAD_MSGS = 2000
MAX_PUBS_PER_LOOP = 10_000  # publishes staged in one loop iteration (one LMDB transaction)


class Call:
    """A function to run on the IO thread, and its result."""

    __slots__ = ("fn", "done", "result", "error", "tx", "writes")

    def __init__(self, fn: Callable[[WriteBatch, float], Any], tx: bool = False,
                 writes: bool = True) -> None:
        self.fn = fn
        self.tx = tx  # a transaction: it fails with the commit of its publishes
        self.writes = writes  # False: it only reads, and no failed commit fails it
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class Commands:
    """Both ends of an Engine's command queue, and the state they share."""

    # Set by Engine.__init__; the methods below use them.
    config: NodeConfig
    store: Store
    outbox: Outbox
    consumer: Consumer
    commits: Committer
    held: Held
    counters: Counters
    mesh: Mesh | None
    _local_subs: list[Subscription]
    state: str
    _failure: BaseException | None

    def __init__(self, node_id: bytes, next_seq: int, map_size_bytes: int) -> None:
        self.cond = Signal()  # (receipts, room in the outbox, and the node's close)
        self._next_seq = next_seq
        self._publisher = Publisher(node_id.hex(), self.cond, self.watch)  # (every receipt's)
        self._told = 0  # notifications that told stages they are stored (Stage.stored)
        self._alloc = threading.Lock()  # sequence allocation (application threads)
        # The stretch plain publish() calls join (under _alloc) until the IO thread takes
        # it: see publishes.Stretch.
        self._open: Stretch | None = None
        self._submitted = 0  # messages prepared by application threads (under _alloc)
        self._done = 0  # of those, stored or failed (IO thread)
        # Payload bytes of the same: publishes may run ahead of the IO thread by at most
        # an eighth of the map, so a map that fills up stops them soon after.
        self._submitted_bytes = 0
        self._done_bytes = 0
        self._ahead_limit = map_size_bytes // 8
        # What publish_one may take without _fits's checks until the IO thread looks again
        # (``_refill``, under _alloc): the room _fits would find for as many single
        # publishes, and their payload bytes; none while the node is not running or the
        # LMDB map is full. Every allocation takes its part (under _alloc).
        self._credit = 0
        self._credit_bytes = 0
        self._depth_seen = 0  # the outbox depth and map state at the last _notify
        self._full_seen = False
        self._cmds: deque[tuple | list[AnyPublish] | Publish | Stretch | Origin] = deque()
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._wake_tx: zmq.Socket | None = None  # application threads' end of the wake pipe
        self._watches: list[Receipt] = []  # receipts to track, collected by the IO thread
        # What this node's hello announces: (topic, group, mode) -> its Subscription
        # objects (the hello names each once), and the bytes of them.
        self._subs_lock = threading.Lock()
        self._announced: dict[tuple[str, str, str], set[Subscription]] = {}
        self._announced_bytes = 0
        self._ephemeral = 0  # ephemeral subscriptions named so far

    # == application threads =============================================================

    def _closing(self) -> None:
        """The node closes: under the allocation lock, so a publish that found it running
        has queued itself already, and no later one takes room."""
        with self._alloc:
            self.state = "closing"
            self._credit = self._credit_bytes = 0

    def check_running(self) -> None:
        if self.state != "running":
            if self._failure is not None:
                raise NodeClosedError(self.config.name, f"it stopped after an internal error: "
                                      f"{self._failure!r}")
            if self.state in ("closing", "closed"):
                raise NodeClosedError(self.config.name)
            raise NodeStateError(f"node {self.config.name!r} is {self.state}; use it inside "
                                 "'with' or after start()")

    def submit(self, cmd: tuple | list[AnyPublish] | Publish | Origin) -> None:
        """Queue a command for the IO thread: a tuple naming it first, a publish, a list of
        publishes, or the ``Origin`` of a delivered batch whose messages were acked (one
        command per batch, whatever the number of its acks; see ``Message.ack``).

        A plain ``publish()`` made later may still join a stretch queued before it, and be
        staged with it (sooner, never later): what a command changes applies from the
        loop iteration that drains it to every publish that iteration stages."""
        if self.state != "running":
            self.check_running()
        self._cmds.append(cmd)
        if not self._wake_pending:  # (``_wake_once``, inline)
            self._wake_pending = True
            if not self._wake():
                self.check_running()

    def _wake_once(self) -> None:
        """Wake the IO thread unless a wake-up is pending already."""
        if not self._wake_pending:
            self._wake_pending = True
            if not self._wake():
                self.check_running()  # the IO thread stopped meanwhile: say why

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
                msg_id: str | None = None, paced: bool = True,
                nbytes: int | None = None) -> list[AnyPublish]:
        """Allocate consecutive sequences and one receipt for ``payloads``, waiting up to
        ``timeout_s`` for outbox room. The caller must submit them (or ``abandon`` them):
        a ``Publish`` each, or one ``PublishMany`` for several plain messages.

        ``paced``: also wait while MAX_AHEAD_MSGS publishes wait for the IO thread (not for
        a transaction, whose publishes are submitted only when it commits). ``nbytes``:
        the payloads' bytes, when the caller counted them.
        """
        n = len(payloads)
        if nbytes is None:
            nbytes = sum(map(len, payloads)) if n > 1 else len(payloads[0])
        first = self._reserve(n, nbytes, timeout_s, paced)
        stage = Stage()
        receipt = Receipt(self._publisher, first, stage, n, topic)
        now = time.time()
        if n == 1:  # publish(): no comprehension to set up for one message
            key = keys[0]
            return [Publish(first, topic, partition_for(key, partitions, first), key, headers,
                            payloads[0], priority, now, expires_at, deliver_at, receipt,
                            stage, msg_id)]
        seqs = range(first, first + n)
        if priority or expires_at is not None or deliver_at is not None or msg_id is not None:
            return [Publish(seq, topic, partition_for(key, partitions, seq), key, headers,
                            payload, priority, now, expires_at, deliver_at, receipt, stage,
                            msg_id)
                    for seq, payload, key in zip(seqs, payloads, keys, strict=True)]
        # Plain messages: one object for the batch, no Python step per message but the
        # partition of a key.
        if keys.count(None) < n:
            parts = list(map(partition_for, keys, repeat(partitions), seqs))
            return [PublishMany(first, topic, parts, keys, headers, payloads, now, receipt,
                                stage, n, nbytes)]
        parts = round_robin_partitions(first, n, partitions)
        return [PublishMany(first, topic, parts, None, headers, payloads, now, receipt, stage,
                            n, nbytes, partitions)]

    def publish_one(self, topic: str, payload: bytes, key: str | None, partitions: int,
                    timeout_s: float | None = None) -> Receipt:
        """``publish()`` with every option at its default (checked by the caller;
        ``timeout_s`` None: ``publish_timeout_s``): its sequence, then a place in the open
        stretch of ``topic`` (or a new one, queued now). The usual case of ``_reserve`` is
        inline: the node running and room at once (``_fits`` for one message)."""
        nbytes = len(payload)
        alloc = self._alloc
        alloc.acquire()
        if self._credit > 0 and self._credit_bytes >= nbytes:
            self._credit -= 1
            self._credit_bytes -= nbytes
            first = self._next_seq
            self._next_seq = first + 1
            self._submitted += 1
            self._submitted_bytes += nbytes
        else:
            alloc.release()
            first = self._reserve(1, nbytes, self.config.publish_timeout_s if timeout_s is None
                                  else timeout_s, True)
            alloc.acquire()  # (to join a stretch: the open one, if it ends just before)
            if self.state != "running":  # closed while it waited: never queued after that
                alloc.release()
                self.check_running()
        stretch = self._open
        rounds = 0 if key is not None else partitions
        if stretch is None or stretch.next != first or stretch.topic != topic \
                or stretch.rounds != rounds:
            stretch = self._open = Stretch(first, topic, rounds)
            self._cmds.append(stretch)  # (in the queue before any later publish)
            new = True
        else:
            new = False
        if key is not None:
            stretch.partitions.append(partition_for(key, partitions, first))
            stretch.keys.append(key)
        stretch.next = first + 1
        stretch.nbytes += nbytes
        stretch.payloads.append(payload)
        stretch.times.append(time.time())
        alloc.release()
        if new:
            self._wake_once()
        return Receipt(self._publisher, first, stretch, 1, topic)

    def _reserve(self, n: int, nbytes: int, timeout_s: float, paced: bool) -> int:
        """The first of ``n`` sequences, once the outbox has room for them."""
        if self.state != "running":
            self.check_running()
        deadline = 0.0
        alloc = self._alloc
        while True:
            alloc.acquire()  # (half the cost of ``with`` here)
            try:
                if self._fits(n, nbytes, paced):
                    first = self._next_seq
                    self._next_seq = first + n
                    self._submitted += n
                    self._submitted_bytes += nbytes
                    self._credit -= n  # (the short path's room is taken too)
                    self._credit_bytes -= nbytes
                    return first
            finally:
                alloc.release()
            # Full: wait for acks (or stores) to make room, up to the timeout.
            deadline = deadline or time.monotonic() + timeout_s
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                limit = self.config.max_outbox_messages
                depth = self.outbox.depth + self._submitted - self._done
                if (depth + n <= limit or depth == 0) and self.held.full:
                    # the outbox has room, the LMDB map has not
                    self.counters.add("publish_store_full", 1)
                    raise self.store.full_error(timeout_s)
                raise OutboxFullError(depth, limit, timeout_s)
            with self.cond:
                # Checked again under the lock the IO thread makes room under (_notify):
                # room made since the check above is seen here, later room wakes the wait.
                if not self._fits(n, nbytes, paced):
                    self.cond.wait(min(remaining, TIMEOUT_MAX))  # (inf: no end)
            self.check_running()

    def _fits(self, n: int, nbytes: int, paced: bool) -> bool:
        """There is room for ``n`` more publishes of ``nbytes``: in the outbox, in the LMDB
        map, and (``paced``) among the publishes waiting for the IO thread."""
        waiting = self._submitted - self._done
        if paced and waiting and waiting + n > MAX_AHEAD_MSGS:
            return False  # (the wait a fast publisher meets most)
        depth = self.outbox.depth + waiting
        ahead = self._submitted_bytes - self._done_bytes
        return ((depth + n <= self.config.max_outbox_messages or depth == 0)
                and not self.held.full
                and (ahead + nbytes <= self._ahead_limit or ahead == 0))

    def abandon(self, count: int, nbytes: int) -> None:
        """Prepared publishes that will never be submitted (an aborted transaction)."""
        with self._alloc:
            self._submitted -= count
            self._submitted_bytes -= nbytes
        with self.cond:
            self.cond.notify_all()

    def abandon_dropped(self, count: int, nbytes: int) -> None:
        """``abandon`` for a transaction dropped without commit or abort, from wherever it
        was collected: takes no lock (the IO thread applies it at its next iteration)."""
        self._cmds.append(("abandon", count, nbytes))

    def watch(self, receipt: Receipt) -> None:
        """Someone waits for ``receipt`` to be acked: have the IO thread track it."""
        if self.state == "running":
            self.submit(("watch", receipt))

    def transact(self, pubs: list[Publish], acks: list[Message], timeout_s: float) -> None:
        """Store ``pubs`` and settle ``acks`` in one LMDB transaction, or none of it."""
        done = Call(lambda _wb, _now: None, tx=True)
        self.submit(("tx", pubs, acks, done))
        if not done.done.wait(min(timeout_s, TIMEOUT_MAX)):
            raise NodeStateError(f"transaction not committed within {timeout_s:g}s")
        if done.error is not None:
            raise done.error

    def subscribe(self, sub: Subscription) -> None:
        """Add ``sub``; ArgumentError when this node's hello could not announce it."""
        key = (sub.topic, announced_group(sub), sub.mode)
        with self._subs_lock:
            subs = self._announced.get(key)
            if subs is None:
                size = announced_bytes(sub.topic, announced_group(sub))
                if len(self._announced) >= MAX_SUBSCRIPTIONS or \
                        self._announced_bytes + size > MAX_SUBSCRIPTION_BYTES:
                    raise ArgumentError(
                        f"node {self.config.name!r} announces {len(self._announced)} "
                        f"subscriptions ({self._announced_bytes} bytes) in its hello, which "
                        f"holds at most {MAX_SUBSCRIPTIONS} and {MAX_SUBSCRIPTION_BYTES} "
                        f"bytes of them: close some, or spread them over more nodes")
                self._announced_bytes += size
                subs = self._announced[key] = set()
            subs.add(sub)
        try:
            self.submit(("sub", sub))
        except BaseException:
            self._forget_announced(sub)
            raise

    def unsubscribe(self, sub: Subscription) -> None:
        self._forget_announced(sub)
        sub._drain_unsettled()
        self.submit(("unsub", sub))

    def _forget_announced(self, sub: Subscription) -> None:
        key = (sub.topic, announced_group(sub), sub.mode)
        with self._subs_lock:
            subs = self._announced.get(key)
            if subs is None or sub not in subs:
                return  # (closed twice)
            subs.discard(sub)
            if not subs:
                del self._announced[key]
                self._announced_bytes -= announced_bytes(sub.topic, announced_group(sub))

    def ephemeral_name(self) -> str:
        """A name for a new ephemeral subscription, unique at this node (a group's name
        cannot start with '~')."""
        with self._subs_lock:
            self._ephemeral += 1
            return f"~{self._ephemeral}"

    def call(self, fn: Callable[[WriteBatch, float], Any], timeout_s: float = 10.0,
             writes: bool = True) -> Any:
        """Run ``fn(write_batch, now)`` on the IO thread and return its result.

        What ``fn`` adds to the write batch is committed in that loop iteration, before the
        result is returned (``writes=False``: it adds nothing, and a failed commit of that
        iteration does not fail it).
        """
        call = Call(fn, writes=writes)
        self.submit(("call", call))
        if not call.done.wait(min(timeout_s, TIMEOUT_MAX)):
            raise NodeStateError(f"node {self.config.name!r} did not answer within "
                                 f"{timeout_s:g}s")
        if call.error is not None:
            raise call.error
        return call.result

    # == IO thread =======================================================================

    def _drain_commands(self, wb: WriteBatch, pubs: list[AnyPublish], calls: list[Call],
                        now: float, max_pubs: int = MAX_PUBS_PER_LOOP) -> bool:
        """Apply queued commands in order; stops once ``max_pubs`` publishes are collected
        (the rest waits for the next iteration, so one transaction stays bounded)."""
        cmds = self._cmds
        mesh = self.mesh
        assert mesh is not None
        stop = subs_changed = False
        count = message_count(pubs)
        while cmds and count < max_pubs:
            cmd = cmds.popleft()
            if isinstance(cmd, Stretch):  # plain publish() calls
                with self._alloc:  # closed: no publish joins it any more
                    if self._open is cmd:
                        self._open = None
                staged = cmd.staged()
                pubs.append(staged)
                count += staged.count
                continue
            if isinstance(cmd, Publish):  # publish() with options
                pubs.append(cmd)
                count += 1
                continue
            if isinstance(cmd, list):  # publish_many()
                pubs.extend(cmd)
                count += message_count(cmd)
                continue
            if not isinstance(cmd, tuple):  # a batch's messages acked one by one
                self.consumer.acked_seqs(cmd, cmd.take_acks(), wb)
                continue
            kind = cmd[0]
            if kind == "settle":
                self.consumer.settle(cmd[1], cmd[2], cmd[3])
            elif kind == "watch":
                self._watches.append(cmd[1])
            elif kind == "tx":
                _, tx_pubs, acks, done = cmd
                self.consumer.acked(acks, wb)
                pubs.extend(tx_pubs)
                count += len(tx_pubs)
                self.commits.tx_pubs.update(id(p) for p in tx_pubs)
                calls.append(done)
            elif kind == "contact":
                found = cmd[1]
                peer = None if found.node_id is None else mesh.peers.get(found.node_id)
                if peer is None or (not peer.alive and peer.ctrl_ep != found.endpoint):
                    mesh.contact(found.endpoint, seed=found.seed, key=found.key)
            elif kind == "sub":
                self._local_subs.append(cmd[1])
                self.consumer.add(cmd[1])
                subs_changed = True
            elif kind == "unsub":
                if cmd[1] in self._local_subs:
                    self._local_subs.remove(cmd[1])
                self.consumer.remove(cmd[1])
                subs_changed = True
            elif kind == "touch":
                self.consumer.touch(cmd[1])
            elif kind == "topic":
                self.outbox.set_topic(cmd[1], cmd[2], wb, now)
            elif kind == "abandon":
                log.warning("a transaction was dropped without commit or abort: its %d "
                            "publishes were discarded", cmd[1])
                self.abandon(cmd[1], cmd[2])
            elif kind == "call":
                call: Call = cmd[1]
                try:
                    call.result = call.fn(wb, now)
                except BaseException as exc:
                    call.error = exc
                calls.append(call)
            elif kind == "stop":
                stop = True
        if subs_changed:  # one hello for any number of (un)subscribes
            mesh.subs_changed(wb, now)
        return stop

    def _notify(self, staged_done: int, staged_bytes: int = 0) -> None:
        """Resolve receipts and wake waiting publishers when this iteration made room:
        publishes stored or failed, messages settled (a shallower outbox), the LMDB map
        no longer full. Counters publishers check are changed under ``cond`` only."""
        depth, receipts = self.outbox.depth, self.outbox.receipts
        room = depth < self._depth_seen or (self._full_seen and not self.held.full)
        self._depth_seen, self._full_seen = depth, self.held.full
        floor = receipts.settled_floor
        if staged_done or receipts.stored or receipts.acked or room or floor is not None:
            with self.cond:
                self._done += staged_done
                self._done_bytes += staged_bytes
                if receipts.stored:
                    self._told += 1
                    told = self._told
                    for stage in receipts.stored:
                        stage.stored = told
                for r in receipts.acked:
                    r._unacked -= 1
                if floor is not None:  # (after this notification's stores: it counts them)
                    self._publisher.settled = (floor, self._told)
                receipts.told()
                self.cond.notify_all()
        with self._alloc:
            self._refill()

    def _refill(self) -> None:
        """Set what publish_one may take without checks (under _alloc): as many single
        publishes as ``_fits`` would let in now, one by one."""
        if self.state != "running" or self.held.full:
            self._credit = self._credit_bytes = 0
            return
        waiting = self._submitted - self._done
        self._credit = min(MAX_AHEAD_MSGS - waiting,
                           self.config.max_outbox_messages - self.outbox.depth - waiting)
        self._credit_bytes = self._ahead_limit - (self._submitted_bytes - self._done_bytes)
