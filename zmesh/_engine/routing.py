"""Stable hashing: keys to partitions, and a producer's partitions to a group's members."""

from __future__ import annotations

import zlib
from _blake2 import blake2b  # (hashlib's own, without OpenSSL: 3.5 MB)
from collections import Counter
from collections.abc import Callable, Collection, Sequence


def partition_for(key: str | None, partitions: int, seq: int) -> int:
    """The partition of a message published alone: a stable hash of its key, or
    round-robin by sequence without one (a keyless batch takes one partition for all its
    messages: ``Staging``'s ``_spread``).

    crc32 is stable across processes and machines, unlike Python's salted ``hash()``.
    """
    if key is None:
        return seq % partitions
    return zlib.crc32(key.encode()) % partitions


def _score(member: bytes, producer: bytes, partition: int) -> bytes:
    return blake2b(member + producer + partition.to_bytes(4, "big"), digest_size=8).digest()


def _rank(member: bytes, producer: bytes) -> bytes:
    """A member's place in a producer's order for the one extra partition some members
    get (a digest apart from every partition's score)."""
    return blake2b(member + producer, digest_size=8, person=b"zmesh-extra").digest()


def assign(
    current: Sequence[bytes | None],
    members: Collection[bytes],
    producer: bytes,
    home: Sequence[bytes | None] | None = None,
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

    ``home`` (a member per partition, or None) is where each partition belongs when its
    member is here: the extra ones go to the members more belongs to, a partition goes
    back to its home member when that one has room, a member over its share gives up
    first what belongs to another member here, then what it holds for a member away,
    and a free partition goes first to the member it belongs to. So members back after
    an absence get back what they had.
    """
    total = len(current)
    if not members:
        return [None] * total
    ordered = sorted(members)
    base, extra = divmod(total, len(ordered))
    here = set(ordered)
    out: list[bytes | None] = [o if o in here else None for o in current]
    # Where each partition belongs now: its home if that member is here, else where it is.
    rightful = out
    if home is not None:
        rightful = [h if h in here else o for h, o in zip(home, out, strict=True)]
    claim = Counter(m for m in rightful if m is not None)
    by_claim = sorted(ordered, key=lambda m: (-min(claim[m], base + 1), _rank(m, producer)))
    quota = {m: base + (i < extra) for i, m in enumerate(by_claim)}
    held = Counter(out)
    for partition, (owner, belongs) in enumerate(zip(out, rightful, strict=True)):
        if belongs != owner and belongs is not None and held[belongs] < quota[belongs]:
            held[owner] -= 1  # (back home)
            held[belongs] += 1
            out[partition] = belongs
    owned: dict[bytes, list[int]] = {m: [] for m in ordered}
    for partition, owner in enumerate(out):
        if owner is not None:
            owned[owner].append(partition)
    room: dict[bytes, int] = {}
    for m, mine in owned.items():
        surplus = len(mine) - quota[m]
        if surplus > 0:
            for partition in sorted(mine, key=_giving_up(m, producer, home, here))[:surplus]:
                out[partition] = None
        room[m] = max(0, -surplus)
    for partition, owner in enumerate(out):
        if owner is None:
            belongs = rightful[partition]
            if belongs is not None and room[belongs]:
                best = belongs
            else:
                best = max((m for m in ordered if room[m]), key=_by_score(producer, partition))
            out[partition] = best
            room[best] -= 1
    return out


def _giving_up(
    member: bytes,
    producer: bytes,
    home: Sequence[bytes | None] | None,
    here: Collection[bytes],
) -> Callable[[int], tuple[int, bytes]]:
    """The order in which ``member`` gives up partitions (a sort key over partitions):
    first those that belong to another member here, then those it holds for a member
    away, then its own, lowest scores first."""

    def key(partition: int) -> tuple[int, bytes]:
        belongs = None if home is None else home[partition]
        mine = belongs is None or belongs == member
        rank = 2 if mine else 0 if belongs in here else 1
        return (rank, _score(member, producer, partition))

    return key


def _by_score(producer: bytes, partition: int) -> Callable[[bytes], bytes]:
    """A member's score for ``partition`` (a sort key over members)."""
    return lambda member: _score(member, producer, partition)
