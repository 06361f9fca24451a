"""New plain messages of a topic as runs: prepared once for all its lanes (``PlainRun``),
or held as they are by a lane that has no member yet (``HeldRuns``)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import add

from ..routing import round_robin_partitions
from .seqqueue import by_partition, consecutive_array, round_robin, round_robin_slots


class PlainRun:
    """New plain messages of one topic in publish order, prepared once for all its lanes."""

    __slots__ = ("seqs", "partitions", "ascending", "order", "split", "slots", "rounds")

    def __init__(self, seqs: list[int] | range, partitions: list[int], rounds: int = 0) -> None:
        """``rounds``: the partition count ``seqs`` are known to be spread over round-robin
        (publishes without keys: ``PublishMany.rounds``), else 0; taken when ``seqs`` is a
        range that wraps around it."""
        self.seqs = seqs
        self.partitions = partitions
        # (not so from publishers on several threads; a range is)
        self.ascending = type(seqs) is range or seqs == sorted(seqs)
        # As arrays, which each lane's arrays copy whole (no conversion per sequence).
        self.order = consecutive_array(seqs) if type(seqs) is range else array("q", seqs)
        first, n = seqs[0], len(seqs)
        count = (
            rounds
            if 0 < rounds < n and type(seqs) is range
            else round_robin(first, partitions)
            if self.ascending and seqs[-1] - first == n - 1
            else 0
        )  # (in order, no keys)
        self.rounds = count
        self.split = by_partition(self.order, partitions, count)
        # A window's slot values (partition + 1); of a round-robin, one cycle tiled.
        self.slots = (
            round_robin_slots(first, n, count)
            if count
            else array("H", map(add, partitions, repeat(1)))
        )


class HeldRuns:
    """Consecutive plain messages a lane owes while it has no member, a tuple per run:
    (sequences, partitions or None when spread round-robin, the partition count they are
    spread over). An offline group's backlog costs no bytes per message until a member
    comes and the lane makes its arrays of them (``release``)."""

    __slots__ = ("_runs", "_count")

    def __init__(self) -> None:
        self._runs: list[tuple[range, Sequence[int] | None, int]] = []
        self._count = 0  # messages held

    def __bool__(self) -> bool:
        return bool(self._runs)

    def __len__(self) -> int:
        return self._count

    @property
    def first(self) -> int:
        """The first sequence held (some are)."""
        return self._runs[0][0].start

    def hold(self, seqs: range, partitions: Sequence[int] | None, rounds: int) -> None:
        """Hold ``seqs`` (above every one held) with their partitions, or None when they
        are spread over ``rounds`` partitions round-robin."""
        self._runs.append((seqs, partitions, rounds))
        self._count += len(seqs)

    def release(self) -> Iterator[PlainRun]:
        """Every run held, in order, as a ``PlainRun`` made when it is taken: one run's
        columns at a time beside the lane's arrays (all of them made first would be 23 MB
        more for 1M held); none is held after."""
        runs, self._runs, self._count = self._runs, [], 0
        return (
            PlainRun(
                seqs,
                round_robin_partitions(seqs.start, len(seqs), rounds)
                if parts is None
                else list(parts),
                rounds,
            )
            for seqs, parts, rounds in runs
        )
