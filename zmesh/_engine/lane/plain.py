"""New plain messages of a topic as runs: prepared once for all its lanes (``PlainRun``),
or held as they are by a lane that has no member yet (``HeldRuns``)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

from .blocks import Blocks, block_parts, blocks, by_partition, slots_of
from .seqqueue import consecutive_array


class PlainRun:
    """New plain messages of one topic in publish order, prepared once for all its lanes."""

    __slots__ = ("seqs", "partitions", "ascending", "order", "found", "split", "slots")

    def __init__(
        self, seqs: list[int] | range, partitions: Sequence[int], found: Blocks | None = None
    ) -> None:
        """``found``: the ``Blocks`` of ``partitions`` when known (else looked for)."""
        self.seqs = seqs
        self.partitions = partitions
        # (not so from publishers on several threads; a range is)
        self.ascending = type(seqs) is range or seqs == sorted(seqs)
        # As arrays, which each lane's arrays copy whole (no conversion per sequence):
        # a keyless batch's messages share a partition, so these are made a block of one
        # partition at a time (see ``blocks``).
        self.order = consecutive_array(seqs) if type(seqs) is range else array("q", seqs)
        if found is None:
            found = blocks(partitions)
        self.found = found
        self.split = by_partition(self.order, partitions, found)
        self.slots = slots_of(partitions, found)  # (a window's slot values: partition + 1)

    def held(self) -> Blocks | bytes | array[int]:
        """Its partitions as a lane holds them while it has no member (``compact``)."""
        return compact(self.partitions, self.found)


def compact(partitions: Sequence[int], found: Blocks | None = None) -> Blocks | bytes | array[int]:
    """``partitions`` in little memory: their ``Blocks`` (keyless batches: a few tuples,
    whatever their length; ``found`` when known), else a byte each, else two."""
    if found is None:
        found = blocks(partitions)
    if found is not None:
        return found
    if type(partitions) is bytes:
        return partitions
    if type(partitions) is array:  # (as a run entry is read back: "B", or "H" past 255)
        return partitions.tobytes() if partitions.typecode == "B" else array("H", partitions)
    try:
        return bytes(partitions)
    except ValueError:
        return array("H", partitions)


class HeldRuns:
    """Consecutive plain messages a lane owes while it has no member, a pair per run:
    (sequences, their partitions as ``compact`` keeps them). An offline group's backlog
    of keyless batches costs no bytes per message until a member comes and the lane makes
    its arrays of them (``release``)."""

    __slots__ = ("_runs", "_count")

    def __init__(self) -> None:
        self._runs: list[tuple[range, Blocks | bytes | array[int]]] = []
        self._count = 0  # messages held

    def __bool__(self) -> bool:
        return bool(self._runs)

    def __len__(self) -> int:
        return self._count

    @property
    def first(self) -> int:
        """The first sequence held (some are)."""
        return self._runs[0][0].start

    def hold(self, seqs: range, partitions: Blocks | bytes | array[int]) -> None:
        """Hold ``seqs`` (above every one held) with their partitions (``compact``)."""
        self._runs.append((seqs, partitions))
        self._count += len(seqs)

    def release(self) -> Iterator[PlainRun]:
        """Every run held, in order, as a ``PlainRun`` made when it is taken: one run's
        columns at a time beside the lane's arrays (all of them made first would be 23 MB
        more for 1M held); none is held after."""
        runs, self._runs, self._count = self._runs, [], 0
        return (
            PlainRun(seqs, block_parts(parts), parts)
            if isinstance(parts, list)
            else PlainRun(seqs, parts)
            for seqs, parts in runs
        )
