"""What an application thread hands the IO thread to publish: a ``Publish`` per message,
one ``PublishMany`` for a ``publish_many`` batch of plain messages, and for a ``publish()``
with every option at its default a bare tuple (``PLAIN``), which the IO thread gathers.

A ``publish()`` costs the publishing thread an object to build and the IO thread a step to
read each of its fields: a tuple builds several times faster than a dataclass, and the
plain publishes the IO thread drains together are transposed into columns at C speed
(``gathered``), a ``PublishMany`` per stretch of one topic with consecutive sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice, repeat
from operator import attrgetter, lt
from typing import TYPE_CHECKING

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
    msg_id: str | None = None

    count = 1  # (messages: a PublishMany holds several)
    receipts = None  # (a PublishMany gathered from publish() calls holds one per message)

    @property
    def seqs(self) -> range:
        return range(self.seq, self.seq + 1)

    @property
    def nbytes(self) -> int:
        return len(self.payload)

    def plain(self) -> PLAIN | None:
        """This publish as a ``PLAIN`` tuple when every option is at its default."""
        if self.headers is None and not self.priority and self.expires_at is None \
                and self.deliver_at is None and self.msg_id is None:
            assert self.receipt is not None
            return (self.seq, self.topic, self.partition, self.key, self.payload,
                    self.published_at, self.receipt)
        return None


@dataclass(slots=True)
class PublishMany:
    """The publishes of one ``publish_many`` of plain messages (priority 0, no expiry or
    schedule), staged as one object: consecutive sequences from ``seq``, one receipt. A
    topic that stores them as runs (runs.py) takes the columns as they are; any other
    ``expand``s them into a ``Publish`` each.

    Plain ``publish()`` calls drained together are gathered into one too (``gathered``):
    ``published_at`` is then a list, each message's own time, ``receipt`` None and
    ``receipts`` each message's own."""

    seq: int
    topic: str
    partitions: list[int]
    keys: list[str | None] | None  # None: no message has a key
    headers: dict | None
    payloads: list[bytes]
    published_at: float | list[float]
    receipt: Receipt | None
    count: int
    nbytes: int
    receipts: list[Receipt] | None = None  # gathered publishes: one per message

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
        times = at if type(at) is list else repeat(at, n)
        receipts = self.receipts or repeat(self.receipt, n)
        return [Publish(seq, self.topic, partition, key, self.headers, payload, 0,
                        published_at, None, None, receipt)
                for seq, partition, key, payload, published_at, receipt in zip(
                    self.seqs, self.partitions, self.keys or repeat(None, n), self.payloads,
                    times, receipts, strict=True)]


AnyPublish = Publish | PublishMany

# A plain publish() as queued: (seq, topic, partition, key, payload, published_at, receipt).
PLAIN = tuple[int, str, int, "str | None", bytes, float, "Receipt"]


def gathered(plain: list[PLAIN]) -> list[AnyPublish]:
    """Plain publishes as the IO thread stages them: each stretch of two or more of one
    topic with consecutive sequences a ``PublishMany`` (their columns, each message's own
    time and receipt), any other a ``Publish``. (Publishers on several threads interleave
    their sequences in the queue, each one's in order: stretches break where they meet.)"""
    n = len(plain)
    if n > 1:
        # Transposed once, at C speed (every PLAIN has 7 fields: no check of lengths).
        columns = list(zip(*plain, strict=False))
        seqs, topics = columns[0], columns[1]
        if seqs[-1] - seqs[0] == n - 1 and topics.count(topics[0]) == n \
                and all(map(lt, seqs, islice(seqs, 1, None))):
            return [_many(columns)]  # (the usual case: one publisher, one topic)
    out: list[AnyPublish] = []
    i = 0
    while i < n:
        seq, topic = plain[i][0], plain[i][1]
        j = i + 1
        while j < n and plain[j][0] == seq + (j - i) and plain[j][1] == topic:
            j += 1
        if j - i > 1:
            out.append(_many(list(zip(*plain[i:j], strict=False))))
        else:
            _s, _t, partition, key, payload, published_at, receipt = plain[i]
            out.append(Publish(seq, topic, partition, key, None, payload, 0, published_at,
                               None, None, receipt))
        i = j
    return out


def _many(columns: list[tuple]) -> PublishMany:
    """A stretch of plain publishes (one topic, consecutive sequences), as its columns."""
    seqs, topics, partitions, keys, payloads, times, receipts = columns
    return PublishMany(seqs[0], topics[0], list(partitions),
                       None if keys.count(None) == len(keys) else list(keys), None,
                       list(payloads), list(times), None, len(seqs), sum(map(len, payloads)),
                       list(receipts))


def receipts_of(p: AnyPublish) -> list[Receipt]:
    """The receipts ``p`` resolves (one, one per gathered publish, or none)."""
    if p.receipts:
        return p.receipts
    return [] if p.receipt is None else [p.receipt]


def message_count(pubs: list[AnyPublish]) -> int:
    return sum(map(_count, pubs))


def payload_bytes(pubs: list[AnyPublish]) -> int:
    if PublishMany in map(type, pubs):
        return sum(map(_nbytes, pubs))
    return sum(map(len, map(_payload, pubs)))  # (no property call per publish)


_count, _nbytes, _payload = attrgetter("count"), attrgetter("nbytes"), attrgetter("payload")
