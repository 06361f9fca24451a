"""What an application thread hands the IO thread to publish: a ``Publish`` per message,
one ``PublishMany`` for a ``publish_many`` batch of plain messages, and for ``publish()``
calls with every option at their defaults a ``Stretch``, which they fill as columns.

A ``publish()`` call on its own would cost the publishing thread an object to build and
the IO thread a step to read each of its fields, and the IO thread would touch objects
the publishing thread made (on another core: each a cache line to fetch). A stretch is
one object for many publishes: each appends its payload and time to lists under the
allocation lock, and the IO thread takes the lists whole, as a ``PublishMany``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING

from .._receipt import Stage
from .routing import round_robin_partitions

if TYPE_CHECKING:
    from .._receipt import Receipt


@dataclass(slots=True)
class Publish:
    """A publish staged by a user thread for the IO thread to store."""

    seq: int
    topic: str
    partition: int
    key: str | None
    headers: dict | None
    payload: bytes
    priority: int
    published_at: float
    expires_at: float | None
    deliver_at: float | None
    receipt: Receipt | None
    stage: Stage  # (its receipt's, shared by the messages of one receipt)
    msg_id: str | None = None

    count = 1  # (messages: a PublishMany holds several)

    @property
    def seqs(self) -> range:
        return range(self.seq, self.seq + 1)

    @property
    def nbytes(self) -> int:
        return len(self.payload)


@dataclass(slots=True)
class PublishMany:
    """The publishes of one ``publish_many`` of plain messages (priority 0, no expiry or
    schedule), staged as one object: consecutive sequences from ``seq``, one receipt. A
    topic that stores them as runs (runs.py) takes the columns as they are; any other
    ``expand``s them into a ``Publish`` each.

    A ``Stretch`` of ``publish()`` calls becomes one too: ``published_at`` is then a list,
    each message's own time, ``receipt`` None and ``stage`` the stretch."""

    seq: int
    topic: str
    partitions: list[int]
    keys: list[str | None] | None  # None: no message has a key
    headers: dict | None
    payloads: list[bytes]
    published_at: float | list[float]
    receipt: Receipt | None
    stage: Stage
    count: int
    nbytes: int
    rounds: int = 0  # the topic's partition count when no message has a key (each one's
    #                  partition is then its sequence modulo it), else 0

    # What staging asks of every publish, the same for all of these.
    priority = 0
    expires_at = None
    deliver_at = None
    msg_id = None

    @property
    def seqs(self) -> range:
        return range(self.seq, self.seq + self.count)

    def expand(self) -> list[Publish]:
        """A ``Publish`` per message (for a topic that stores each message on its own)."""
        n, at = self.count, self.published_at
        times = at if isinstance(at, list) else repeat(at, n)
        topic, headers, receipt, stage = self.topic, self.headers, self.receipt, self.stage
        return [Publish(seq, topic, partition, key, headers, payload, 0, published_at, None,
                        None, receipt, stage)
                for seq, partition, key, payload, published_at in zip(
                    self.seqs, self.partitions, self.keys or repeat(None, n), self.payloads,
                    times, strict=True)]


AnyPublish = Publish | PublishMany


class Stretch(Stage):
    """``publish()`` calls with every option at their defaults, of one topic, with
    consecutive sequences from ``seq``: the publishing threads append to its columns
    under the allocation lock while it is the open one (``Commands._open``), and the IO
    thread takes it whole (``staged``). It is also the ``Stage`` of their receipts,
    which its one ``stored`` resolves together.

    ``rounds``: the topic's partition count when no message has a key (each message's
    partition is then its sequence modulo it, made by the IO thread at C speed), else 0
    and ``partitions`` and ``keys`` hold each message's."""

    __slots__ = ("seq", "topic", "next", "rounds", "partitions", "keys", "payloads", "times",
                 "nbytes")

    def __init__(self, seq: int, topic: str, rounds: int) -> None:
        super().__init__()
        self.seq = self.next = seq
        self.topic = topic
        self.rounds = rounds
        self.nbytes = 0  # of its payloads, counted as they join (the IO thread reads none)
        self.partitions: list[int] = []
        self.keys: list[str | None] = []
        self.payloads: list[bytes] = []
        self.times: list[float] = []

    def staged(self) -> AnyPublish:
        """What the IO thread stages, once the stretch is closed: a ``PublishMany``, or a
        ``Publish`` for a lone message (stored on its own, not as a run). The columns go
        with it: the receipts, which the application may keep, keep only the stage."""
        payloads, times, keys, partitions = self.payloads, self.times, self.keys, \
            self.partitions
        self.payloads, self.times, self.keys, self.partitions = [], [], [], []
        n, first, rounds = len(payloads), self.seq, self.rounds
        if n == 1:
            return Publish(first, self.topic, first % rounds if rounds else partitions[0],
                           None if rounds else keys[0], None, payloads[0], 0, times[0],
                           None, None, None, self)
        if rounds:
            partitions = round_robin_partitions(first, n, rounds)
        return PublishMany(first, self.topic, partitions, None if rounds else keys, None,
                           payloads, times, None, self, n, self.nbytes, rounds)


def message_count(pubs: list[AnyPublish]) -> int:
    return sum(map(_count, pubs))


def payload_bytes(pubs: list[AnyPublish]) -> int:
    if PublishMany in map(type, pubs):
        return sum(map(_nbytes, pubs))
    return sum(map(len, map(_payload, pubs)))  # (no property call per publish)


_count, _nbytes, _payload = attrgetter("count"), attrgetter("nbytes"), attrgetter("payload")
