"""Allocating the indexes of a run's messages (see retention.py's ``Indexes``): each
message gets its partition's next index, a range of them per block of one partition (a
keyless batch's messages share one), with no Python step per message."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from ..._numbers import fitting_array
from ..lane.blocks import Blocks, blocks


def allocate(
    partitions: Sequence[int],
    next_index: dict[int, int],
    firsts: dict[int, int],
    found: Blocks | None = None,
) -> tuple[array[int], Blocks | None]:
    """``Indexes.allocate`` of consecutive messages of ``partitions``, inline (``firsts``:
    each partition's first index of the transaction), as an array (of "I", or of "q" if
    one is not below 2**32); and the ``Blocks`` of ``partitions`` (``found``, when the
    caller knows them; None: they were taken one by one)."""
    if found is None:
        found = blocks(partitions)
    if found is None:
        each = []
        for partition in partitions:
            index = next_index.get(partition, 0)
            next_index[partition] = index + 1
            each.append(index)
            if partition not in firsts:
                firsts[partition] = index
        return fitting_array("Iq", each), None
    ranges = []
    for partition, start, end in found:
        index = next_index.get(partition, 0)
        next_index[partition] = index + end - start
        ranges.append(range(index, index + end - start))
        if partition not in firsts:
            firsts[partition] = index
    indexes = array("I" if max(r.stop for r in ranges) <= 1 << 32 else "q")
    for r in ranges:
        indexes.extend(r)
    return indexes, found
