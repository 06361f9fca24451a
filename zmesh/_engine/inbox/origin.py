"""What the messages of one delivered batch share (``Origin``): where their settlements
go, their batch's columns, how the application settled each, and what the IO thread
knows the application still holds.

Application threads write ``next``, ``acks``, ``queued`` and ``state``; the IO thread
``taken``, ``left`` and ``apart`` (see the class).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import length_hint
from typing import Any, Protocol

from ..._seqs import span
from ...errors import MessageStateError

# How a message was settled, as its origin's ``state`` keeps it: one byte per message.
STATES: tuple[str | None, ...] = (None, "acked", "nacked", "failed", "released", "transacted")
ACKED = STATES.index("acked")
RELEASED = STATES.index("released")  # (set by the IO thread when its subscription closed)
# Taken by an open transaction's ``ack``: acked by its commit (on the IO thread), back to
# None if it aborts; released, like one not settled, when its subscription closes first.
TRANSACTED = STATES.index("transacted")
_OPEN = (0, TRANSACTED)


def settled_error(msg_id: object, how: str | None) -> MessageStateError:
    """The error for settling message ``msg_id`` again, ``how`` (a ``STATES`` name) it was
    settled, or while a transaction holds it."""
    if how == "transacted":
        return MessageStateError(
            f"message {msg_id} is acked by a transaction that has not committed or aborted"
        )
    why = " when its subscription closed" if how == "released" else ""
    return MessageStateError(f"message {msg_id} was already {how}{why}")


class Queue(Protocol):
    """Where a message's settlement goes: the node's command queue."""

    state: str  # "running" while it takes commands

    def submit(self, cmd: Any) -> None: ...

    def check_running(self) -> None: ...


class Origin:
    """What every message of one delivered batch shares: the command queue its
    settlement goes to (``queue``, None for messages nothing settles), its source
    (producer id, topic, lane), its group and the producer id in hex (made once per
    batch), the batch's sequences, and its columns of what a message is seldom
    asked for (its headers, attempt, partition, publish time and index: a ``Message``
    reads them by its place in the batch). One reference per message instead of ten
    fields to set.

    It also collects the batch's acks. Acked in order (the message at place ``next``),
    ``msg.ack()`` only moves ``next`` on: the IO thread takes those as one slice of the
    batch's sequences (a range when they are consecutive), with no step per message.
    Others are appended to ``acks``. The origin is queued for the IO thread only when it
    is not queued already, so acking a batch's messages one by one sends one command per
    batch, not one per message. The IO thread clears ``queued`` before it takes the acks
    (``take_acks``): an ack made after that queues the origin again.

    The IO thread keeps, per source, the origins with messages it has not seen settled
    (``left``): their sequences from ``taken`` on, less those settled out of order
    (``apart``), are what a local subscription still holds (``held``).

    ``state`` holds how each message was settled by the application (a byte each, an
    index of ``STATES``): acking a run of the batch's messages checks and marks them
    with two operations on it, none per message. It holds no ``Message``: those refer to
    it, and are made one at a time as the application takes them (see ``Subscription``)."""

    __slots__ = (
        "queue",
        "source",
        "topic",
        "group",
        "producer",
        "seqs",
        "lo",
        "hi",
        "next",
        "acks",
        "queued",
        "taken",
        "left",
        "apart",
        "state",
        "headers",
        "attempts",
        "partitions",
        "published_ats",
        "indexes",
        "sub",
        "places",
        "replied",
    )

    def __init__(
        self,
        queue: Queue | None,
        source: tuple[bytes, str, str],
        group: str | None,
        seqs: Sequence[int],
        headers: Sequence[dict[str, Any] | None],
        attempts: Sequence[int],
        partitions: Sequence[int],
        published_ats: Sequence[float],
        indexes: Sequence[int | None],
    ) -> None:
        self.queue = queue
        self.source = source
        self.topic = source[1]
        self.group = group
        self.producer = source[0].hex()
        self.seqs = seqs
        self.lo, self.hi = span(seqs)
        self.next = 0  # (application threads) the places before it were acked in order
        self.acks: list[int] = []  # (application threads) acked out of order
        self.queued = False
        self.taken = 0  # (IO thread) ``next`` as last taken
        self.left = len(seqs)  # (IO thread) messages it has not seen settled
        self.apart: set[int] = set()  # (IO thread) settled out of order, seen
        self.state = bytearray(len(seqs))  # (application threads) see above
        self.headers = headers
        self.attempts = attempts
        self.partitions = partitions
        self.published_ats = published_ats
        self.indexes = indexes
        self.sub: object = None  # (set by the subscription it is queued in)
        self.places: Iterator[int] | None = None  # (its places not taken yet, ditto)
        self.replied: set[int] | None = None  # (application threads) places replied to

    def take_acks(self) -> Sequence[int]:
        """The sequences acked since the last take (IO thread): those acked in order as
        a slice of ``seqs``, then the others. Deleting only the part of ``acks`` read
        keeps what another thread appends meanwhile for the next take. (A message whose
        lease ran out, delivered again since, is no longer held here but its ack still
        goes: it is counted once in ``left``.)"""
        self.queued = False
        upto = self.next
        taken: Sequence[int] = self.seqs[self.taken : upto]
        self.taken = upto
        apart = self.apart
        seen = len(apart.intersection(taken)) if apart and taken else 0
        acks = self.acks
        if acks:
            n = len(acks)
            out_of_order = acks[:n]
            del acks[:n]
            seen += sum(map(apart.__contains__, out_of_order))
            apart.update(out_of_order)
            taken = [*taken, *out_of_order]
        self.left -= len(taken) - seen
        return taken

    def settled_apart(self, seqs: Sequence[int]) -> None:
        """Messages nacked, failed, released or acked in a transaction, or no longer held
        here (IO thread)."""
        apart = self.apart
        fresh = [seq for seq in seqs if seq not in apart]
        apart.update(fresh)
        self.left -= len(fresh)

    def held(self) -> dict[int, int]:
        """The sequences still held, as the IO thread knows (for redeliveries), with
        their places."""
        apart, seqs = self.apart, self.seqs
        return {seqs[i]: i for i in range(self.taken, len(seqs)) if seqs[i] not in apart}

    def taken_by_application(self, place: int) -> bool:
        """Whether the application took the message at ``place`` from its subscription
        (places are taken in order; what is left is still queued)."""
        places = self.places
        return places is None or place < len(self.seqs) - length_hint(places)

    def unsettled(self) -> list[int]:
        """The places of messages the application has not settled (IO thread; read from
        ``state``, which application threads write)."""
        apart, seqs, state = self.apart, self.seqs, self.state
        return [
            i for i in range(self.taken, len(seqs)) if state[i] in _OPEN and seqs[i] not in apart
        ]
