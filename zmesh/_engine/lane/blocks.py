"""Blocks: the stretches of one partition in a run of messages, in order.

A keyless batch's messages share one partition (``Staging._spread``), so a run of such
batches is a few blocks, and what is made of a run per partition (its indexes, a lane's
FIFOs and window slots, a member's share of a take) is made a block at a time, with no
Python step per message. Those who know a run's blocks (the batches that made it) pass
them on; ``blocks`` finds them otherwise, and gives up on runs that keys spread.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import repeat
from operator import add

MOST_BLOCKS = 64  # blocks of one partition ``blocks`` finds before it gives up

# Stretches of one partition in a run, in order: (partition, start, end). The messages of
# a keyless batch share one partition, so a run of batches is a few such blocks.
Blocks = list[tuple[int, int, int]]


def blocks(partitions: Sequence[int]) -> Blocks | None:
    """The ``Blocks`` of ``partitions`` (a list, bytes or an array of "B"), found a block at
    a time with no step per message; None when there are more than MOST_BLOCKS (keys
    spread the run's messages) or a partition is past 255: the caller then takes each
    message on its own. (Those who know a run's blocks pass them on instead.)"""
    if type(partitions) is bytes:
        raw = partitions
    elif type(partitions) is array:
        if partitions.typecode != "B":
            return None
        raw = partitions.tobytes()
    else:
        try:
            raw = bytes(partitions)
        except ValueError:
            return None
    n, i = len(raw), 0
    # (where one partition gives way to another: the non-zero bytes of the partitions
    # xor-ed with themselves one place on, counted at C speed; keys spread a run's
    # messages past MOST_BLOCKS mostly, known so without a step per block)
    if n > MOST_BLOCKS:
        shifted = int.from_bytes(raw[1:], "little") ^ int.from_bytes(raw[:-1], "little")
        if n - 1 - shifted.to_bytes(n - 1, "little").count(0) >= MOST_BLOCKS:
            return None
    found: Blocks = []
    while i < n:
        if len(found) == MOST_BLOCKS:
            return None
        end = n - len(raw[i:].lstrip(raw[i : i + 1]))  # (past this partition's stretch)
        found.append((raw[i], i, end))
        i = end
    return found


def one_block(partition: int, n: int) -> Blocks:
    """The blocks of ``n`` messages of ``partition`` (a keyless batch's)."""
    return [(partition, 0, n)]


def cut(found: Blocks, start: int, end: int) -> Blocks:
    """The blocks of places ``start`` to ``end`` of ``found``, from 0."""
    return [
        (p, max(lo, start) - start, min(hi, end) - start)
        for p, lo, hi in found
        if lo < end and hi > start
    ]


def joined_blocks(parts: list[tuple[Blocks | None, int]]) -> Blocks | None:
    """The blocks of runs one after another (each its blocks and its length); None when one
    of them does not know its blocks. A block that goes on in the next run's partition is
    joined to it."""
    out: Blocks = []
    at = 0
    for found, n in parts:
        if found is None:
            return None
        for p, lo, hi in found:
            if out and out[-1][0] == p and out[-1][2] == at + lo:
                out[-1] = (p, out[-1][1], at + hi)
            else:
                out.append((p, at + lo, at + hi))
        at += n
    return out


def block_parts(found: Blocks) -> array[int]:
    """The partitions of ``found`` as a run keeps them: "B", or "H" when one is past 255."""
    return _tiled("B" if all(p < 256 for p, _lo, _hi in found) else "H", found, 0)


def _tiled(code: str, found: Blocks, plus: int) -> array[int]:
    """An array of ``code`` holding each block's partition + ``plus`` once per message."""
    out = array(code)
    for p, lo, hi in found:
        out.extend(array(code, (p + plus,)) * (hi - lo))
    return out


def by_partition(
    seqs: array[int], partitions: Sequence[int], found: Blocks | None
) -> list[array[int]]:
    """``seqs`` split by partition (array ``p`` holds those of partition ``p``), in order:
    a slice of ``seqs`` per block of ``found`` (their ``blocks``), else (None) a step
    each."""
    if found is not None:
        split = [array("q") for _ in range(max((p for p, _s, _e in found), default=-1) + 1)]
        for p, start, end in found:
            split[p].extend(seqs[start:end])
        return split
    split = [array("q") for _ in range(max(partitions) + 1)]
    ends = [part.append for part in split]
    for seq, partition in zip(seqs, partitions, strict=True):
        ends[partition](seq)
    return split


def slots_of(partitions: Sequence[int], found: Blocks | None) -> array[int]:
    """The window slots (partition + 1, an array of "H") of ``partitions``: a block of
    ``found`` (their ``blocks``) at a time, else (None) a step each."""
    if found is None:
        return array("H", map(add, partitions, repeat(1)))
    return _tiled("H", found, 1)
