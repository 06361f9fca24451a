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

import time
from array import array
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..._receipt import Stage
from ..lane.blocks import Blocks, joined_blocks

if TYPE_CHECKING:
    from ..._receipt import Receipt


@dataclass(slots=True)
class Publish:
    """A publish staged by a user thread for the IO thread to store."""

    seq: int
    topic: str
    partition: int
    key: str | None
    headers: dict[str, Any] | None
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

    Without keys (``keyless``: the topic's partition count) all its messages take one
    partition, which the IO thread picks when it stages them (``Staging``'s ``_spread``:
    the partitions in turn, batch by batch), so a member of a shared group gets whole
    batches; ``partitions`` is empty until then.

    A ``Stretch`` of ``publish()`` calls becomes one too: ``receipt`` None and
    ``stage`` the stretch. Publishes joined into one run (``joined``) have an array of
    doubles as ``published_at``, each message's time."""

    seq: int
    topic: str
    partitions: list[int]
    keys: list[str | None] | None  # None: no message has a key
    headers: dict[str, Any] | None
    payloads: list[bytes]
    published_at: float | array[float]
    receipt: Receipt | None
    stage: Stage
    count: int
    nbytes: int
    keyless: int = 0  # the topic's partition count while no partition is picked yet, else 0
    found: Blocks | None = None  # the ``Blocks`` of ``partitions``, when known

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
        times = repeat(at, n) if isinstance(at, float) else at
        topic, headers, receipt, stage = self.topic, self.headers, self.receipt, self.stage
        return [
            Publish(
                seq,
                topic,
                partition,
                key,
                headers,
                payload,
                0,
                published_at,
                None,
                None,
                receipt,
                stage,
            )
            for seq, partition, key, payload, published_at in zip(
                self.seqs,
                self.partitions,
                self.keys or repeat(None, n),
                self.payloads,
                times,
                strict=True,
            )
        ]


AnyPublish = Publish | PublishMany


class Stretch(Stage):
    """``publish()`` calls with every option at their defaults, of one topic, with
    consecutive sequences from ``seq``: the publishing threads append to its columns
    under the allocation lock while it is the open one (``Commands._open``), and the IO
    thread takes it whole (``staged``). It is also the ``Stage`` of their receipts,
    which its one ``stored`` resolves together.

    ``at``: the time of its first call, the ``published_at`` of all its messages (the
    calls of one loop of the IO thread: a clock read per stretch, not per call, and one
    time in its run's record).

    ``keyless``: the topic's partition count when no message has a key (the IO thread
    picks their one partition when it stages them: see ``PublishMany``), else 0 and
    ``partitions`` and ``keys`` hold each message's."""

    __slots__ = (
        "seq",
        "topic",
        "next",
        "keyless",
        "partitions",
        "keys",
        "payloads",
        "at",
        "nbytes",
    )

    def __init__(self, seq: int, topic: str, keyless: int) -> None:
        super().__init__()
        self.seq = self.next = seq
        self.topic = topic
        self.keyless = keyless
        self.nbytes = 0  # of its payloads, counted as they join (the IO thread reads none)
        self.partitions: list[int] = []
        self.keys: list[str | None] = []
        self.payloads: list[bytes] = []
        self.at = time.time()

    def staged(self) -> AnyPublish:
        """What the IO thread stages, once the stretch is closed: a ``PublishMany``, or a
        ``Publish`` for a lone message (stored on its own, not as a run). The columns go
        with it: the receipts, which the application may keep, keep only the stage."""
        payloads, keys, partitions = self.payloads, self.keys, self.partitions
        self.payloads, self.keys, self.partitions = [], [], []
        n, first, keyless = len(payloads), self.seq, self.keyless
        if n == 1:
            return Publish(
                first,
                self.topic,
                first % keyless if keyless else partitions[0],
                None if keyless else keys[0],
                None,
                payloads[0],
                0,
                self.at,
                None,
                None,
                None,
                self,
            )
        return PublishMany(
            first,
            self.topic,
            partitions,
            None if keyless else keys,
            None,
            payloads,
            self.at,
            None,
            self,
            n,
            self.nbytes,
            keyless,
        )


def joined(pubs: list[AnyPublish], max_count: int, max_bytes: int) -> list[AnyPublish]:
    """``pubs`` with ``PublishMany`` objects that follow one another (one topic,
    consecutive sequences, the same headers, keys in every one or in none, their
    partitions picked) joined into one, up to ``max_count`` messages and ``max_bytes`` of
    payloads together (what one run holds): a publisher of small batches gets longer
    runs, each run's work shared by more messages. Only their columns are joined: the
    receipts and stages stay with the publishes themselves."""
    out: list[AnyPublish] = []
    group: list[PublishMany] = []
    count = nbytes = 0
    for p in pubs:
        if group and not (
            type(p) is PublishMany
            and _follows(group[-1], p)
            and count + p.count <= max_count
            and nbytes + p.nbytes <= max_bytes
        ):
            out.append(_join(group))
            group = []
            count = nbytes = 0
        if type(p) is PublishMany:
            group.append(p)
            count += p.count
            nbytes += p.nbytes
        else:
            out.append(p)
    if group:
        out.append(_join(group))
    return out


def _follows(a: PublishMany, b: PublishMany) -> bool:
    return (
        b.seq == a.seq + a.count
        and b.topic == a.topic
        and not (a.keyless or b.keyless)
        and (b.keys is None) == (a.keys is None)
        and b.headers == a.headers
    )


def _join(group: list[PublishMany]) -> PublishMany:
    if len(group) == 1:
        return group[0]
    first = group[0]
    partitions: list[int] = []
    found = joined_blocks([(p.found, p.count) for p in group])
    keys: list[str | None] | None = None if first.keys is None else []
    payloads: list[bytes] = []
    times = array("d")
    count = nbytes = 0
    for p in group:  # (each column extended by a copy of the other's: no step per message)
        partitions += p.partitions
        if keys is not None:
            keys += p.keys  # type: ignore[arg-type]
        payloads += p.payloads
        at = p.published_at
        times += array("d", (at,)) * p.count if isinstance(at, float) else at
        count += p.count
        nbytes += p.nbytes
    return PublishMany(
        first.seq,
        first.topic,
        partitions,
        keys,
        first.headers,
        payloads,
        times,
        None,
        first.stage,
        count,
        nbytes,
        0,
        found,
    )


def message_count(pubs: list[AnyPublish]) -> int:
    return sum(map(_count, pubs))


def payload_bytes(pubs: list[AnyPublish]) -> int:
    if PublishMany in map(type, pubs):
        return sum(map(_nbytes, pubs))
    return sum(map(len, map(_payload, pubs)))  # (no property call per publish)


_count, _nbytes, _payload = attrgetter("count"), attrgetter("nbytes"), attrgetter("payload")
