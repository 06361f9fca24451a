"""Allocating the indexes of a run's messages (see retention.py's ``Indexes``): each
message gets its partition's next index, made with no Python step per message when the
run is spread round-robin over the partitions (no keys), as most runs are."""

from __future__ import annotations

from array import array
from operator import add

from ..._numbers import fitting_array
from ..lane.seqqueue import round_robin


def allocate(
    first: int,
    partitions: list[int],
    next_index: dict[int, int],
    firsts: dict[int, int],
    rounds: int = 0,
) -> tuple[array[int], int]:
    """``Indexes.allocate`` of the consecutive messages from ``first``, inline (``firsts``:
    each partition's first index of the transaction), as an array (of "I", or of "q" if
    one is not below 2**32); and ``round_robin`` of them (``rounds``: the partition count
    they are known to be spread over round-robin, which needs no check once they wrap
    around). Spread round-robin, the message at place ``k`` gets its partition's next
    index plus ``k // count``, made with no step per message (see ``_cycle_indexes``)."""
    n = len(partitions)
    count = rounds if 0 < rounds < n else round_robin(first, partitions)
    if count:
        cycle = partitions[:count]
        get = next_index.get
        base = [get(partition, 0) for partition in cycle]
        indexes = _cycle_indexes(base, n)
        rows, rest = divmod(n, count)
        next_index.update(
            zip(cycle, map(add, base, [rows + 1] * rest + [rows] * (count - rest)), strict=True)
        )
        if len(firsts) < count or not firsts.keys() >= set(cycle):
            for partition, index in zip(cycle, base, strict=True):
                if partition not in firsts:
                    firsts[partition] = index
        return indexes, count
    each = []
    for partition in partitions:
        index = next_index.get(partition, 0)
        next_index[partition] = index + 1
        each.append(index)
        if partition not in firsts:
            firsts[partition] = index
    return fitting_array("Iq", each), 0


def _index_code(top: int) -> str:
    """The array type of indexes up to ``top``."""
    return "I" if top < 1 << 32 else "q"


def _cycle_indexes(base: list[int], n: int) -> array[int]:
    """The indexes of ``n`` messages spread round-robin over a cycle of ``count``
    partitions whose next indexes are ``base`` (in the cycle's order): ``base[k % count]
    + k // count`` for the message at place ``k``.

    A topic published round-robin all along (the usual case) has ``base`` of ``m`` for
    the cycle's first partitions and ``m + 1`` for its last ``s``: the indexes are then
    ``m + (k + s) // count``, each value ``count`` times in a row (``m`` only ``count -
    s`` times), made a row at a time. Another ``base`` sets each partition's indexes as
    one range, a slice assignment per partition."""
    count, low = len(base), base[0]
    s = count - base.count(low)
    if base[count - s :].count(low + 1) == s:
        top = low + (n + s - 1) // count  # (the last message's)
        indexes = array(_index_code(top), (low,)) * (count - s)
        row = array(indexes.typecode, (0,))
        extend = indexes.extend
        for index in range(low + 1, top + 1):
            row[0] = index
            extend(row * count)
        del indexes[n:]
        return indexes
    ends = [index + len(range(k, n, count)) for k, index in enumerate(base)]
    indexes = array(_index_code(max(ends) - 1), (0,)) * n
    for k, index in enumerate(base):
        indexes[k::count] = array(indexes.typecode, range(index, ends[k]))
    return indexes
