"""Message indexes and retention: which index a message gets, and what is reclaimed when.

Every message of a topic gets the next index of its (topic, partition) at this producer:
0, 1, 2, ... The index is kept in the message's record, the next one per partition in
``rnext``; indexes are never reused. With ``retention_s`` or ``retention_bytes`` a message
also gets ``rlog``/``rtime`` entries and stays in the store after every group settled it,
so readers can replay it, until it is older than ``retention_s`` or the topic's records
exceed ``retention_bytes`` (oldest first).

Pure: no I/O; the wall-clock time is passed in, so the rules are tested without a clock.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from ...config import TopicConfig

RECLAIM_CHUNK = 1000  # index entries looked at (and at most deleted) per topic per pass
RECLAIM_INTERVAL_S = 0.5  # between passes while nothing is left to reclaim
RECLAIM_BUSY_S = 0.01  # between passes while a pass stopped at its chunk limit

_PUBLISHED = struct.Struct(">d")


def retains(cfg: TopicConfig) -> bool:
    """Settled messages of this topic stay for replay, or as values kept per key (until
    retention reclaims them)."""
    return cfg.retention_s > 0 or cfg.retention_bytes > 0 or cfg.keep_last > 0


def retains_by_age(cfg: TopicConfig) -> bool:
    """Settled messages of this topic stay until ``retention_s`` or ``retention_bytes``
    lets them go."""
    return cfg.retention_s > 0 or cfg.retention_bytes > 0


def topic_prefix(topic: str) -> bytes:
    return topic.encode() + b"\0"


def partition_prefix(topic: str, partition: int) -> bytes:
    return topic_prefix(topic) + partition.to_bytes(2, "big")


def log_entry(
    topic: str, partition: int, index: int, seq: int, published_at: float, size: int
) -> tuple[bytes, bytes, bytes, bytes]:
    """(rlog key, rlog value, rtime key, rtime value) of one message."""
    stamp = _PUBLISHED.pack(published_at)
    seq_b = seq.to_bytes(8, "big")
    index_b = index.to_bytes(8, "big")
    return (
        partition_prefix(topic, partition) + index_b,
        seq_b + stamp,
        topic_prefix(topic) + seq_b,
        partition.to_bytes(2, "big") + index_b + size.to_bytes(4, "big") + stamp,
    )


@dataclass(frozen=True, slots=True)
class Head:
    """One index entry in publish order, as retention sees it."""

    seq: int
    partition: int
    index: int
    size: int
    published_at: float

    @classmethod
    def decode(cls, seq: int, value: bytes) -> Head:
        return cls(
            seq,
            int.from_bytes(value[:2], "big"),
            int.from_bytes(value[2:10], "big"),
            int.from_bytes(value[10:14], "big"),
            _PUBLISHED.unpack(value[14:22])[0],
        )


class Indexes:
    """The next index of every (topic, partition) of this producer."""

    def __init__(self, stored: dict[bytes, int] | None = None) -> None:
        self._next: dict[str, dict[int, int]] = {}
        for key, n in (stored or {}).items():
            topic = key[:-3].decode()
            self._next.setdefault(topic, {})[int.from_bytes(key[-2:], "big")] = n

    def parts(self, topic: str) -> dict[int, int]:
        """partition -> next index of ``topic``, to allocate from in a loop."""
        return self._next.setdefault(topic, {})

    def allocate(self, topic: str, partition: int) -> int:
        parts = self.parts(topic)
        index = parts.get(partition, 0)
        parts[partition] = index + 1
        return index

    def release(self, topic: str, partition: int, index: int) -> None:
        """``index`` and those after it were never stored (a failed commit): reuse them."""
        parts = self._next.get(topic, {})
        parts[partition] = min(parts.get(partition, 0), index)

    def partitions(self, topic: str) -> dict[int, int]:
        """partition -> next index, for every partition that has had a message."""
        return dict(self._next.get(topic, {}))

    def topics(self) -> list[str]:
        return list(self._next)


def reclaimable(
    heads: list[Head],
    *,
    wall: float,
    cfg: TopicConfig,
    retained_bytes: int,
    owed: Callable[[int], bool],
    stepped: Callable[[int], float] = lambda _seq: 0.0,
) -> int:
    """How many of ``heads`` (a topic's oldest entries, in publish order) may go now.

    Reclamation goes in order and stops at the first message some group still owes (it is
    still in the outbox) or that retention still keeps: younger than ``retention_s``, and
    not pushed out by ``retention_bytes``. Without retention a settled message goes at once.
    (A topic that keeps values per key passes only the values no longer kept.)
    A message's age is the time the wall clock moved since its publish less how far it
    stepped since (``stepped(seq)``, wallclock.py): a step never ages it.
    """
    keep_all = retains_by_age(cfg)
    n = 0
    for head in heads:
        if owed(head.seq):
            break
        if keep_all:
            age = wall - head.published_at - stepped(head.seq)
            expired = cfg.retention_s > 0 and age >= cfg.retention_s
            over = cfg.retention_bytes > 0 and retained_bytes > cfg.retention_bytes
            if not (expired or over):
                break
        retained_bytes -= head.size
        n += 1
    return n
