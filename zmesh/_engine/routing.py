"""Stable hashing: keys to partitions, and a producer's partitions to a group's members."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Sequence
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


def _rank(member: bytes, producer: bytes) -> bytes:
    """A member's place in a producer's order for the one extra partition some members
    get (a digest apart from every partition's score)."""
    return blake2b(member + producer, digest_size=8, person=b"zmesh-extra").digest()


def assign(
    current: Sequence[bytes | None], members: Collection[bytes], producer: bytes
) -> list[bytes | None]:
    """The member of each of ``producer``'s partitions: balanced, and sticky from ``current``.

    Every member gets ``P // M`` or ``P // M + 1`` of the ``P = len(current)`` partitions
    (Kafka's assignors' bound; rendezvous hashing alone gave one of 15 members 3,766
    messages of 20,000 and six members nothing). From ``current``, only what must move
    does: a member that left frees its partitions, a member over its share gives up
    those it scores lowest, and each free partition goes to the member with room that
    scores it highest (``blake2b(member ‖ producer ‖ partition)``, as rendezvous hashing).
    The members that get one more than others are those holding more already, then an
    order of the producer's own, so over many producers the extra ones are spread.
    """
    total = len(current)
    if not members:
        return [None] * total
    ordered = sorted(members)
    base, extra = divmod(total, len(ordered))
    owned: dict[bytes, list[int]] = {m: [] for m in ordered}
    for partition, owner in enumerate(current):
        if owner is not None and owner in owned:
            owned[owner].append(partition)
    by_claim = sorted(ordered, key=lambda m: (-min(len(owned[m]), base + 1), _rank(m, producer)))
    quota = {m: base + (i < extra) for i, m in enumerate(by_claim)}
    out: list[bytes | None] = [o if o in owned else None for o in current]
    room: dict[bytes, int] = {}
    for m, mine in owned.items():
        surplus = len(mine) - quota[m]
        if surplus > 0:
            for partition in sorted(mine, key=_scores(m, producer))[:surplus]:
                out[partition] = None
        room[m] = max(0, -surplus)
    for partition, owner in enumerate(out):
        if owner is None:
            best = max((m for m in ordered if room[m]), key=_by_score(producer, partition))
            out[partition] = best
            room[best] -= 1
    return out


def _scores(member: bytes, producer: bytes) -> Callable[[int], bytes]:
    """A partition's score for ``member`` (a sort key over partitions)."""
    return lambda partition: _score(member, producer, partition)


def _by_score(producer: bytes, partition: int) -> Callable[[bytes], bytes]:
    """A member's score for ``partition`` (a sort key over members)."""
    return lambda member: _score(member, producer, partition)
