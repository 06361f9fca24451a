"""Publish receipts: what a producer can wait on after publish()."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from threading import TIMEOUT_MAX
from typing import NamedTuple

from ._engine.outbox.outcomes import Outcome, Outcomes
from ._waits import check_timeout
from .errors import NodeClosedError, NodeStateError, NotDeliveredError, TimeoutError, ZMeshError

__all__ = ["MessageId", "Receipt"]


class MessageId(NamedTuple):
    """(producer node id in hex, sequence): unique across the mesh."""

    producer: str
    seq: int

    def __str__(self) -> str:
        return f"{self.producer}:{self.seq}"


class Stage:
    """Whether publishes are stored: ``stored`` or ``error`` is set by the IO thread once
    the commit that took them is done (``stored``: the number of the notification that
    told it, counted from 1; 0 until then). The receipts of a stretch of plain
    ``publish()`` calls share one (the stretch itself: the IO thread resolves them all
    with one write); any other receipt has its own.

    ``lanes``: the lanes (groups) its messages were owed to when they were stored, set by
    the IO thread before ``stored`` (None until then; empty when the topic had no group
    yet: the first groups learned claim them)."""

    __slots__ = ("stored", "error", "lanes")

    def __init__(self) -> None:
        self.stored = 0
        self.error: ZMeshError | None = None
        self.lanes: tuple[str, ...] | None = None


class Signal(threading.Condition):
    """The condition the IO thread notifies when receipts change or the outbox makes room,
    and once more when the node has closed (``closed``: the error then, for waiters to
    raise instead of waiting on). Each notification also calls the ``wakers``: how an
    event loop waits on it without a thread of its own (zmesh.aio)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed: NodeStateError | None = None  # (NodeClosedError; in a forked process,
        # the error that says so)
        self.wakers: tuple[Callable[[], None], ...] = ()  # (replaced, never changed in place)

    def notify_all(self) -> None:
        super().notify_all()
        for wake in self.wakers:
            wake()


class Publisher:
    """What every receipt of one node shares: its id, the condition the IO thread
    notifies when receipts change, how a receipt asks for its acks to be tracked, and
    ``settled``: (floor, notification) -- every message stored by that notification with
    a sequence below the floor is settled, so a receipt of one needs no question to the
    IO thread (which sets it when it answers one); and ``outcomes``, what the node's
    messages became for each group when that was not an ack."""

    __slots__ = ("producer", "cond", "watch", "settled", "outcomes")

    def __init__(
        self,
        producer: str,
        cond: Signal,
        watch: Callable[[Receipt], None] | None = None,
        outcomes: Outcomes | None = None,
    ) -> None:
        self.producer = producer  # (hex: the ids are made when asked for, most never are)
        self.cond = cond
        self.watch = watch
        self.settled: tuple[float, int] = (0, 0)
        self.outcomes = Outcomes() if outcomes is None else outcomes


class Receipt:
    """Tracks one published message: stored in the outbox, then acked by every group."""

    __slots__ = ("_publisher", "_seq", "count", "topic", "_stage", "_unacked", "_watched")

    def __init__(
        self, publisher: Publisher, seq: int, stage: Stage, count: int = 1, topic: str = ""
    ) -> None:
        self._publisher = publisher
        self._seq = seq
        self._stage = stage
        self.count = count
        self.topic = topic
        self._unacked = count  # messages not settled yet, counted once acks are tracked
        self._watched = False

    @property
    def id(self) -> MessageId:
        """The id of the (first) message. A publish with a msg_id published before is
        that message: its id once the receipt is stored (before, the id it was given)."""
        return MessageId(self._publisher.producer, self._seq)

    @property
    def ids(self) -> list[MessageId]:
        """Every message this receipt covers (one, or a publish_many batch in order)."""
        producer = self._publisher.producer
        return [MessageId(producer, self._seq + i) for i in range(self.count)]

    @property
    def stored(self) -> bool:
        """True once the message is in the outbox (per the topic's durability)."""
        return bool(self._stage.stored) or self._unacked <= 0

    @property
    def acked(self) -> bool:
        """True once every group owed the message has acked it (or it was settled).

        A message not stored yet (held for room, in an open transaction, or failed) is
        not acked. Acks of a stored one are tracked from the first time this is asked
        (or ``wait_acked`` is called), so the first answer may lag by one loop of the
        node; the answer to one tells the receipts of older messages without a question.
        """
        if self._unacked <= 0:
            return True
        stored = self._stage.stored
        if not stored:
            return False
        floor, told = self._publisher.settled
        if stored <= told and self._seq + self.count <= floor:
            self._unacked = 0  # (the IO thread's count for it, if it tracks it, ends <= 0)
            return True
        watch = self._publisher.watch
        if not self._watched and watch is not None:
            self._watched = True
            watch(self)
        return self._unacked <= 0

    def _done(self, acked: bool) -> bool:
        """Whether a wait for the message stored (``acked``: settled) is over; raises the
        store's error, or NodeClosedError once the node closed without it."""
        stage = self._stage
        if self._unacked <= 0 or (not acked and stage.stored):
            if stage.error is not None and not acked:
                raise stage.error
            return True
        if stage.error is not None:
            raise stage.error
        closed = self._publisher.cond.closed
        if closed is not None:
            if not isinstance(closed, NodeClosedError):
                raise closed
            what = "acknowledged" if acked else "stored"
            raise NodeClosedError(closed.node, f"message {self.id} was not {what}")
        return False

    def _wait(self, acked: bool, deadline: float | None, timeout: float | None) -> None:
        cond = self._publisher.cond
        with cond:
            while not self._done(acked):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise self._late(acked, timeout)
                cond.wait(None if remaining is None else min(remaining, TIMEOUT_MAX))

    def _late(self, acked: bool, timeout: float | None) -> TimeoutError:
        what = "acknowledged" if acked else "stored"
        return TimeoutError(f"message {self.id} not {what} within {timeout:g}s")

    def wait_stored(self, timeout: float | None = None) -> None:
        """Block until the message is in the outbox; raise TimeoutError, the store's error,
        or NodeClosedError when the node closes first."""
        timeout = check_timeout(timeout)
        self._wait(False, None if timeout is None else time.monotonic() + timeout, timeout)

    def wait_acked(self, timeout: float | None = None) -> None:
        """Block until every group owed the message (each message of a batch) settled it
        (acked it, or it was dead-lettered, expired, superseded or its group deleted:
        ``outcomes`` says which); raise TimeoutError, the store's error if it was never
        stored, or NodeClosedError when the node closes first."""
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait(False, deadline, timeout)  # (acks are tracked once it is stored)
        if not self.acked:
            self._wait(True, deadline, timeout)

    def wait_delivered(self, timeout: float | None = None) -> None:
        """``wait_acked``, then raise NotDeliveredError (naming each group and its
        outcome) unless every group acked the message (each message of a batch)."""
        self.wait_acked(timeout)
        self.check_delivered()

    def check_delivered(self) -> None:
        """Raise NotDeliveredError unless every group acked the message (a settled one)."""
        outcomes = self.outcomes
        if not outcomes or any(o != Outcome.ACKED for o in outcomes.values()):
            raise NotDeliveredError(self.id, outcomes)

    @property
    def outcomes(self) -> dict[str, Outcome]:
        """Per group (lane) the message was owed to, how it was done with it: ``acked``,
        ``dead_lettered``, ``expired``, ``superseded``, ``group_deleted`` (or ``lost``),
        ``pending`` until then; empty until the message is stored and, for a topic that
        had no group when it was stored, until one claims it. For a batch, a group's
        outcome is the first that is not ``acked`` among its messages."""
        lanes = self._stage.lanes
        if lanes is None:
            return {}
        table = self._publisher.outcomes
        if not lanes:
            lanes = table.claimed(self.topic, self._seq)
        return table.of(self._seq, self.count, lanes, self.acked)

    def __repr__(self) -> str:
        state = "acked" if self._unacked <= 0 else "stored" if self._stage.stored else "staged"
        more = f" (+{self.count - 1})" if self.count > 1 else ""
        return f"<Receipt {self.id}{more} {state}>"
