"""The application threads' side of a node's command queue (``Submitter``): commands
appended to a deque, the IO thread woken, sequences allocated and room in the outbox
waited for, receipts resolved and waiters woken after each loop iteration.

An application thread appends a command to a deque and, unless a wake-up is already
pending, sends one wake-up byte on an inproc PAIR socket. A publish gets its sequences on
the caller's thread, and waits while the outbox, the LMDB map or the IO thread's backlog
has no room for it. The IO thread (engine.py) takes the commands at the start of a loop
iteration (``take``; commands.py applies them) and, after that iteration's commit,
``notify`` resolves receipts and wakes the waiters.

This module is long because every wait of an application thread (room in the outbox,
receipts, the node's state) shares its one lock and its one wake-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from itertools import repeat
from threading import TIMEOUT_MAX
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from .._protocol.codec import MAX_SUBSCRIPTION_BYTES, MAX_SUBSCRIPTIONS, announced_bytes
from .._receipt import Publisher, Receipt, Signal, Stage
from ..errors import (
    ArgumentError,
    NodeClosedError,
    NodeStateError,
    OutboxFullError,
    StoreError,
    StoreFullError,
)
from .commands import (
    STOP,
    Abandon,
    Call,
    Command,
    Subscribe,
    Tx,
    Unsubscribe,
    Watch,
)
from .limits import MAX_AHEAD_BYTES, MAX_AHEAD_MSGS
from .outbox.outcomes import Outcomes
from .outbox.publishes import AnyPublish, Publish, PublishMany, Stretch
from .peers import announced_group
from .routing import partition_for

if TYPE_CHECKING:
    from .._store.store import WriteBatch
    from ..config import NodeConfig
    from ..subscription import Message, Subscription
    from .outbox.receipts import Receipts

log = logging.getLogger(__name__)


class Room(Protocol):
    """What a publish waits for room in: the outbox (its depth), and the LMDB map and the
    disk (``full``, and the error to give up with)."""

    @property
    def depth(self) -> int: ...

    @property
    def full(self) -> bool: ...

    def full_error(self, waited_s: float) -> StoreFullError: ...

    def refusal(self, n: int) -> StoreError | None:
        """The error refusing ``n`` publishes (counted) once the store's files are found
        gone (_store/place.py); None while they are there."""
        ...


class Submitter:
    """The application threads' side of one node's command queue, and the state both
    sides of it share (under its locks)."""

    def __init__(
        self, config: NodeConfig, node_id: bytes, next_seq: int, room: Room, outcomes: Outcomes
    ) -> None:
        self.config = config
        self.node_id = node_id
        # new -> running -> closing -> closed (the engine moves it); "forked" in a process
        # forked from this one while it ran (``_after_fork_in_child``)
        self.state = "new"
        self._pid = 0  # the process it runs in
        self.failure: BaseException | None = None  # why the IO thread stopped, if it did
        self._room = room
        self.cond = Signal()  # (receipts, room in the outbox, and the node's close)
        self._next_seq = next_seq
        self.publisher = Publisher(node_id.hex(), self.cond, self.watch, outcomes)
        self._told = 0  # notifications that told stages they are stored (Stage.stored)
        # Sequence allocation (application threads). Reentrant only for ``_is_owned``: a
        # signal's handler runs after any call, acquire() too, so a thread interrupted
        # there holds it with no flag of its own to say so (``publish_one``).
        self._alloc = threading.RLock()
        # The stretch plain publish() calls join (under _alloc) until the IO thread takes
        # it: see publishes.Stretch.
        self._open: Stretch | None = None
        self._submitted = 0  # messages prepared by application threads (under _alloc)
        self._done = 0  # of those, stored or failed (IO thread)
        # Payload bytes of the same: publishes may run ahead of the IO thread by at most
        # MAX_AHEAD_BYTES (the memory queued publishes hold), and an eighth of the map, so
        # a map that fills up stops them soon after.
        self._submitted_bytes = 0
        self._done_bytes = 0
        self._ahead_limit = min(MAX_AHEAD_BYTES, config.map_size_bytes // 8)
        # What publish_one may take without _fits's checks until the IO thread looks again
        # (``_refill``, under _alloc): the room _fits would find for as many single
        # publishes, and their payload bytes; none while the node is not running or the
        # LMDB map is full. Every allocation takes its part (under _alloc).
        self._credit = 0
        self._credit_bytes = 0
        self._depth_seen = 0  # the outbox depth and map state at the last notify
        self._full_seen = False
        self._cmds: deque[Command] = deque()
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._wake_tx: zmq.Socket[bytes] | None = None  # application threads' end of the wake pipe
        # What this node's hello announces: (topic, group, mode) -> its Subscription
        # objects (the hello names each once), and the bytes of them.
        self._subs_lock = threading.Lock()
        self._announced: dict[tuple[str, str, str], set[Subscription]] = {}
        self._announced_bytes = 0
        self._ephemeral = 0  # ephemeral subscriptions named so far

    def next_seq(self) -> int:
        """The sequence the next publish gets (a read of one int: no lock)."""
        return self._next_seq

    def subscriptions(self) -> list[Subscription]:
        """This node's open subscriptions."""
        with self._subs_lock:
            return [sub for subs in self._announced.values() for sub in subs]

    def closing(self) -> None:
        """The node closes: under the allocation lock, so a publish that found it running
        has queued itself already, and no later one takes room."""
        with self._alloc:
            self.state = "closing"
            self._credit = self._credit_bytes = 0

    def run(self) -> None:
        """The IO thread runs: calls are taken from now on (in this process only)."""
        self.state = "running"
        self._pid = os.getpid()
        _RUNNING.add(self)

    def forked(self) -> None:
        """This is a process forked from the one the node runs in (``_after_fork_in_child``):
        its IO thread and sockets stayed there, so calls are refused here, where nothing
        would take what they queue, and its subscriptions end here holding nothing."""
        if self.state not in ("running", "closing"):
            return
        self.state = "forked"
        self._credit = self._credit_bytes = 0  # (every publish checks the state)
        # Locks a thread of the parent held at the fork stay held here, by nobody: new
        # ones, and the condition's waits end with the error that says why.
        self._alloc = threading.RLock()
        self._subs_lock = threading.Lock()
        self._wake_lock = threading.Lock()
        Signal.__init__(self.cond)
        self.cond.closed = self._forked_error()
        for subs in list(self._announced.values()):  # (no lock: this process's only thread)
            for sub in list(subs):
                sub._forked()

    def ended(self, detail: str) -> NodeStateError:
        """What a wait that ended with the node raises: NodeClosedError, or in a forked
        process the error that says so."""
        if self.state == "forked":
            return self._forked_error()
        return NodeClosedError(self.config.name, detail)

    def _forked_error(self) -> NodeStateError:
        return NodeStateError(
            f"node {self.config.name!r} runs in process {self._pid}, and this process was "
            "forked from it: its IO thread and sockets stay there. Start a Node of its own "
            "in this process (on a data dir of its own), or fork before starting nodes"
        )

    def check_running(self) -> None:
        if self.state != "running":
            if self.state == "forked":
                raise self._forked_error()
            if self.failure is not None:
                raise NodeClosedError(
                    self.config.name, f"it stopped after an internal error: {self.failure!r}"
                )
            if self.state in ("closing", "closed"):
                raise NodeClosedError(self.config.name)
            raise NodeStateError(
                f"node {self.config.name!r} is {self.state}; use it inside 'with' or after start()"
            )

    def submit(self, cmd: Command) -> None:
        """Queue a command for the IO thread (commands.py): a publish, a list of
        publishes, the ``Origin`` of a delivered batch whose messages were acked (one
        command per batch, whatever the number of its acks; see ``Message.ack``), or another
        command.

        A plain ``publish()`` made later may still join a stretch queued before it, and be
        staged with it (sooner, never later): what a command changes applies from the
        loop iteration that drains it to every publish that iteration stages."""
        if self.state != "running":
            self.check_running()
        self._cmds.append(cmd)
        self._wake_once()

    def _wake_once(self) -> None:
        """Wake the IO thread unless a wake-up is pending already."""
        if not self._wake_pending:
            self._wake_pending = True
            try:
                woke = self._wake()
            except BaseException:  # (a signal's: the next command sends the wake-up)
                self._wake_pending = False
                raise
            if not woke:
                self.check_running()  # the IO thread stopped meanwhile: say why

    def _wake(self) -> bool:
        """Wake the IO thread; False when it has already closed its wake pipe."""
        with self._wake_lock:
            if self._wake_tx is None:
                return False
            with contextlib.suppress(zmq.Again):  # the pipe is full of wake-ups already
                self._wake_tx.send(b"", zmq.NOBLOCK)
            return True

    def prepare(
        self,
        topic: str,
        payloads: list[bytes],
        keys: list[str | None],
        headers: dict[str, Any] | None,
        priority: int,
        expires_at: float | None,
        deliver_at: float | None,
        partitions: int,
        timeout_s: float,
        msg_id: str | None = None,
        paced: bool = True,
        nbytes: int | None = None,
        submit: bool = False,
    ) -> list[AnyPublish]:
        """Allocate consecutive sequences and one receipt for ``payloads``, waiting up to
        ``timeout_s`` for outbox room: a ``Publish`` each, or one ``PublishMany`` for
        several plain messages. ``submit``: queue them for the IO thread too (one
        command); else the caller must submit them (or ``abandon`` them).

        ``paced``: also wait while MAX_AHEAD_MSGS publishes (or MAX_AHEAD_BYTES of them)
        wait for the IO thread (not for a transaction, whose publishes are submitted only
        when it commits). ``nbytes``:
        the payloads' bytes, when the caller counted them.
        """
        n = len(payloads)
        if nbytes is None:
            nbytes = sum(map(len, payloads)) if n > 1 else len(payloads[0])
        taken: list[int] = []
        queued = False
        try:  # (a signal's KeyboardInterrupt once room is taken: it is given back)
            self._reserve(n, nbytes, timeout_s, paced, taken)
            first = taken[0]
            stage = Stage()
            receipt = Receipt(self.publisher, first, stage, n, topic)
            now = time.time()
            seqs = range(first, first + n)
            pubs: list[AnyPublish]
            if n == 1:  # publish(): no comprehension to set up for one message
                key = keys[0]
                pubs = [
                    Publish(
                        first,
                        topic,
                        partition_for(key, partitions, first),
                        key,
                        headers,
                        payloads[0],
                        priority,
                        now,
                        expires_at,
                        deliver_at,
                        receipt,
                        stage,
                        msg_id,
                    )
                ]
            elif priority or expires_at is not None or deliver_at is not None or msg_id is not None:
                pubs = [
                    Publish(
                        seq,
                        topic,
                        partition_for(key, partitions, seq),
                        key,
                        headers,
                        payload,
                        priority,
                        now,
                        expires_at,
                        deliver_at,
                        receipt,
                        stage,
                        msg_id,
                    )
                    for seq, payload, key in zip(seqs, payloads, keys, strict=True)
                ]
            # Plain messages: one object for the batch, no Python step per message but the
            # partition of a key.
            elif keys.count(None) < n:
                parts = list(map(partition_for, keys, repeat(partitions), seqs))
                pubs = [
                    PublishMany(
                        first, topic, parts, keys, headers, payloads, now, receipt, stage, n, nbytes
                    )
                ]
            else:
                pubs = [
                    PublishMany(
                        first,
                        topic,
                        [],  # (one partition for all, picked when staged)
                        None,
                        headers,
                        payloads,
                        now,
                        receipt,
                        stage,
                        n,
                        nbytes,
                        partitions,
                    )
                ]
            if submit:
                if self.state != "running":
                    self.check_running()
                # Set first: no signal is handled between it and the append (a C call).
                queued = True
                self._cmds.append(pubs[0] if n == 1 else pubs)
        except BaseException:
            if taken and not queued:
                self.abandon(n, nbytes)
            raise
        if submit:
            self._wake_once()
        return pubs

    def publish_one(
        self,
        topic: str,
        payload: bytes,
        key: str | None,
        partitions: int,
        timeout_s: float | None = None,
    ) -> Receipt:
        """``publish()`` with every option at its default (checked by the caller;
        ``timeout_s`` None: ``publish_timeout_s``): its sequence, then a place in the open
        stretch of ``topic`` (or a new one, queued now). The usual case of ``_reserve`` is
        inline: the node running and room at once (``_fits`` for one message)."""
        nbytes = len(payload)
        alloc = self._alloc
        taken: list[int] | None = None  # (the slow path's sequence, as _reserve took it)
        first = -1
        queued = False
        stretch: Stretch | None = None
        try:  # (from acquire() on: see _alloc)
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
                timeout = self.config.publish_timeout_s if timeout_s is None else timeout_s
                taken = []
                self._reserve(1, nbytes, timeout, True, taken)
                first = taken[0]
                alloc.acquire()  # (to join a stretch: the open one, if it ends just before)
                if self.state != "running":  # closed while it waited: never queued after that
                    self.check_running()
            part = 0 if key is None else partition_for(key, partitions, first)
            stretch = self._open
            keyless = 0 if key is not None else partitions
            if (
                stretch is None
                or stretch.next != first
                or stretch.topic != topic
                or stretch.keyless != keyless
            ):
                stretch = Stretch(first, topic, keyless)
                new = True
            else:
                new = False
            if key is not None:
                stretch.partitions.append(part)
                stretch.keys.append(key)
            # Queued from the payload's append to a stretch queued already, or a new one's
            # own queueing (with its first payload, before any later publish). A signal's
            # handler runs only after a call: ``queued`` is set just before the one that
            # queues it, and nothing above it here has changed a queued stretch.
            stretch.next = first + 1
            stretch.nbytes += nbytes
            if new:
                stretch.payloads.append(payload)
                queued = True
                self._cmds.append(stretch)
                self._open = stretch
            else:
                queued = True
                stretch.payloads.append(payload)
            alloc.release()
        except BaseException:
            if alloc._is_owned():  # type: ignore[attr-defined]  # (see _alloc)
                if first >= 0 and not queued:  # (its room given back: never stored)
                    self._submitted -= 1
                    self._submitted_bytes -= nbytes
                    if stretch is not None:  # (what it appended before the payload goes too)
                        del stretch.keys[len(stretch.payloads) :]
                        del stretch.partitions[len(stretch.payloads) :]
                alloc.release()
            elif taken and not queued:  # (taken by _reserve, the lock let go of since)
                self.abandon(1, nbytes)
            raise
        if new:
            self._wake_once()
        return Receipt(self.publisher, first, stretch, 1, topic)

    def _reserve(
        self, n: int, nbytes: int, timeout_s: float, paced: bool, taken: list[int]
    ) -> None:
        """Take ``n`` sequences once the outbox has room for them: the first is appended
        to ``taken`` as they are taken (a signal after that, even as this returns, finds
        it there: the caller gives their room back)."""
        if self.state != "running":
            self.check_running()
        refused = self._room.refusal(n)
        if refused is not None:
            raise refused
        deadline = 0.0
        alloc = self._alloc
        while True:
            with alloc:
                if self._fits(n, nbytes, paced):
                    first = self._next_seq
                    self._next_seq = first + n
                    self._submitted += n
                    self._submitted_bytes += nbytes
                    self._credit -= n  # (the short path's room is taken too)
                    self._credit_bytes -= nbytes
                    taken.append(first)
                    return
            # Full: wait for acks (or stores) to make room, up to the timeout.
            deadline = deadline or time.monotonic() + timeout_s
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                limit = self.config.max_outbox_messages
                depth = self._room.depth + self._submitted - self._done
                if (depth + n <= limit or depth == 0) and self._room.full:
                    # the outbox has room, the LMDB map (or the disk) has not
                    raise self._room.full_error(timeout_s)
                raise OutboxFullError(depth, limit, timeout_s)
            with self.cond:
                # Checked again under the lock the IO thread makes room under (notify):
                # room made since the check above is seen here, later room wakes the wait.
                if not self._fits(n, nbytes, paced):
                    self.cond.wait(min(remaining, TIMEOUT_MAX))  # (inf: no end)
            self.check_running()

    def _fits(self, n: int, nbytes: int, paced: bool) -> bool:
        """There is room for ``n`` more publishes of ``nbytes``: in the outbox, in the LMDB
        map, and (``paced``) among the publishes waiting for the IO thread (a transaction's
        wait in it until it commits: room they hold would never come back before)."""
        waiting = self._submitted - self._done
        if paced and waiting and waiting + n > MAX_AHEAD_MSGS:
            return False  # (the wait a fast publisher meets most)
        depth = self._room.depth + waiting
        ahead = self._submitted_bytes - self._done_bytes
        return (
            (depth + n <= self.config.max_outbox_messages or depth == 0)
            and not self._room.full
            and (not paced or ahead + nbytes <= self._ahead_limit or ahead == 0)
        )

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
        self._cmds.append(Abandon(count, nbytes))

    def watch(self, receipt: Receipt) -> None:
        """Someone waits for ``receipt`` to be acked: have the IO thread track it."""
        if self.state == "running":
            self.submit(Watch(receipt))

    def transact(self, pubs: list[Publish], acks: list[Message], timeout_s: float) -> None:
        """Store ``pubs`` and settle ``acks`` in one LMDB transaction, or none of it."""
        done = Call(lambda _wb, _now: None, tx=True)
        tx = Tx(pubs, acks, done)
        self.submit(tx)
        if not done.done.wait(min(timeout_s, TIMEOUT_MAX)):
            if tx.withdraw():  # (the IO thread never takes it now: nothing of it happens)
                error = NodeStateError(
                    f"transaction not committed within {timeout_s:g}s: nothing of it was "
                    f"stored or settled"
                )
                for pub in pubs:
                    pub.stage.error = error
                self.abandon(len(pubs), sum(len(p.payload) for p in pubs))
                raise error
            while not done.done.wait(1.0):  # its commit is under way: its outcome answers
                if self.state == "closed":  # (the IO thread ended before it told)
                    raise NodeClosedError(
                        self.config.name, "it closed while a transaction was committing"
                    )
        if done.error is not None:
            raise done.error

    def subscribe(self, sub: Subscription) -> None:
        """Add ``sub``; ArgumentError when this node's hello could not announce it."""
        key = (sub.topic, announced_group(sub), sub.mode)
        with self._subs_lock:
            subs = self._announced.get(key)
            if subs is None:
                size = announced_bytes(sub.topic, announced_group(sub))
                if (
                    len(self._announced) >= MAX_SUBSCRIPTIONS
                    or self._announced_bytes + size > MAX_SUBSCRIPTION_BYTES
                ):
                    raise ArgumentError(
                        f"node {self.config.name!r} announces {len(self._announced)} "
                        f"subscriptions ({self._announced_bytes} bytes) in its hello, which "
                        f"holds at most {MAX_SUBSCRIPTIONS} and {MAX_SUBSCRIPTION_BYTES} "
                        f"bytes of them: close some, or spread them over more nodes"
                    )
                self._announced_bytes += size
                subs = self._announced[key] = set()
            subs.add(sub)
        try:
            self.submit(Subscribe(sub))
        except BaseException:
            self._forget_announced(sub)
            raise

    def unsubscribe(self, sub: Subscription, wait: bool = True) -> None:
        """Close ``sub``: once this returns (``wait``), the IO thread has released what it
        held unsettled (settling one of those raises MessageStateError from then on)."""
        self._forget_announced(sub)
        sub._drain_unsettled()
        self.submit(Unsubscribe(sub))
        if wait:
            self.call(lambda _wb, _now: None, writes=False)  # (commands run in order)

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

    def call(
        self, fn: Callable[[WriteBatch, float], Any], timeout_s: float = 10.0, writes: bool = True
    ) -> Any:
        """Run ``fn(write_batch, now)`` on the IO thread and return its result.

        What ``fn`` adds to the write batch is committed in that loop iteration, before the
        result is returned (``writes=False``: it adds nothing, and a failed commit of that
        iteration does not fail it).
        """
        call = Call(fn, writes=writes)
        self.submit(call)
        if not call.done.wait(min(timeout_s, TIMEOUT_MAX)):
            raise NodeStateError(f"node {self.config.name!r} did not answer within {timeout_s:g}s")
        if call.error is not None:
            raise call.error
        return call.result

    def notify(self, receipts: Receipts, staged_done: int, staged_bytes: int = 0) -> None:
        """Resolve receipts and wake waiting publishers when this iteration made room:
        publishes stored or failed, messages settled (a shallower outbox), the LMDB map
        no longer full. Counters publishers check are changed under ``cond`` only."""
        depth, full = self._room.depth, self._room.full
        room = depth < self._depth_seen or (self._full_seen and not full)
        self._depth_seen, self._full_seen = depth, full
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
                    self.publisher.settled = (floor, self._told)
                receipts.told()
                self.cond.notify_all()
        with self._alloc:
            self._refill()

    def _refill(self) -> None:
        """Set what publish_one may take without checks (under _alloc): as many single
        publishes as ``_fits`` would let in now, one by one."""
        if self.state != "running" or self._room.full or self._room.refusal(0) is not None:
            self._credit = self._credit_bytes = 0  # (each publish goes through _reserve)
            return
        waiting = self._submitted - self._done
        self._credit = min(
            MAX_AHEAD_MSGS - waiting, self.config.max_outbox_messages - self._room.depth - waiting
        )
        self._credit_bytes = self._ahead_limit - (self._submitted_bytes - self._done_bytes)

    def take(self) -> Command | None:
        """The next queued command (IO thread), or None; a stretch taken is closed: no
        publish joins it any more."""
        try:
            cmd = self._cmds.popleft()
        except IndexError:
            return None
        if type(cmd) is Stretch:
            with self._alloc:
                if self._open is cmd:
                    self._open = None
        return cmd

    def waiting(self) -> bool:
        """Whether commands wait for the IO thread."""
        return bool(self._cmds)

    def attach(self, wake_tx: zmq.Socket[bytes] | None) -> None:
        """The application threads' end of the wake pipe (None: closed, at teardown)."""
        with self._wake_lock:
            old, self._wake_tx = self._wake_tx, wake_tx
        if old is not None:
            old.close(linger=0)

    def woken(self) -> None:
        """The IO thread consumed a wake-up: the next command sends another."""
        self._wake_pending = False

    def stop(self) -> None:
        """Ask the IO thread to stop (after what is queued)."""
        self.closing()
        self._cmds.append(STOP)
        self._wake()

    def end(self) -> None:
        """The node closed: every waiter wakes for good (receipts, publishes waiting for
        room), and calls or transactions queued too late for the last drain fail with
        NodeClosedError."""
        why = (
            "" if self.failure is None else f"it stopped after an internal error: {self.failure!r}"
        )
        closed = NodeClosedError(self.config.name, why)
        while self._cmds:
            cmd = self._cmds.popleft()
            done = cmd if type(cmd) is Call else cmd.done if type(cmd) is Tx else None
            if done is not None:
                done.error = NodeClosedError(self.config.name, why)
                done.done.set()
        with self.cond:
            self.cond.closed = closed
            self.cond.notify_all()


# Nodes running in this process: a child forked from it gets them in the "forked" state.
_RUNNING: weakref.WeakSet[Submitter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for submitter in list(_RUNNING):
        submitter.forked()
    _RUNNING.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
