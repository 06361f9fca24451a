"""Stable hashing: keys to partitions, (producer, partition) to group members."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from hashlib import blake2b


def partition_for(key: str | None, partitions: int, seq: int) -> int:
    """The partition of a message: a stable hash of its key, or round-robin without one.

    crc32 is stable across processes and machines, unlike Python's salted ``hash()``.
    """
    if key is None:
        return seq % partitions
    return zlib.crc32(key.encode()) % partitions


def round_robin_partitions(first: int, n: int, partitions: int) -> list[int]:
    """``partition_for`` without a key of the ``n`` consecutive sequences from ``first``:
    one cycle of partitions, tiled (no step per message)."""
    start = first % partitions
    return (list(range(partitions)) * ((start + n) // partitions + 1))[start : start + n]


def _score(member: bytes, producer: bytes, partition: int) -> bytes:
    return blake2b(member + producer + partition.to_bytes(4, "big"), digest_size=8).digest()


def rendezvous(members: Iterable[bytes], producer: bytes, partition: int) -> bytes | None:
    """The member that owns (producer, partition): highest random weight wins.

    When a member leaves, only the partitions it owned move; when it returns they move
    back, so one key's messages stay on one member while membership is stable.
    """
    best: bytes | None = None
    best_score = b""
    for member in members:
        score = _score(member, producer, partition)
        if best is None or score > best_score:
            best, best_score = member, score
    return best
