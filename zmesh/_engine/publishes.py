"""What an application thread hands the IO thread to publish: a ``Publish`` per message,
or one ``PublishMany`` for a ``publish_many`` batch of plain messages."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, cast

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

    Staging also gathers plain ``publish()`` calls of one loop iteration into one, to store
    them as a run (``Staging._gathered``): ``published_at`` is then a list, each message's
    own time, and ``receipt`` None (each publish keeps its own). Those are never
    expanded."""

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

    # What staging asks of every publish, the same for all of these.
    priority = 0
    expires_at = None
    deliver_at = None
    msg_id = None

    @property
    def seqs(self) -> range:
        return range(self.seq, self.seq + self.count)

    def expand(self) -> list[Publish]:
        """A ``Publish`` per message, as ``publish_many`` made them before."""
        n, receipt = self.count, self.receipt
        published_at = cast(float, self.published_at)  # (a publish_many's: one time)
        return [Publish(seq, self.topic, partition, key, self.headers, payload, 0,
                        published_at, None, None, receipt)
                for seq, partition, key, payload in zip(
                    self.seqs, self.partitions, self.keys or repeat(None, n), self.payloads,
                    strict=True)]


AnyPublish = Publish | PublishMany


def message_count(pubs: list[AnyPublish]) -> int:
    return sum(map(_count, pubs))


def payload_bytes(pubs: list[AnyPublish]) -> int:
    if PublishMany in map(type, pubs):
        return sum(map(_nbytes, pubs))
    return sum(map(len, map(_payload, pubs)))  # (no property call per publish)


_count, _nbytes, _payload = attrgetter("count"), attrgetter("nbytes"), attrgetter("payload")
