"""What became of messages for the groups they were owed to, when that was not an ack.

Every message ends in one outcome per group (lane) that was owed it: ``acked``, or
``dead_lettered``, ``expired``, ``superseded``, ``group_deleted`` (or ``lost``: a record
that was damaged or missing). Acks are the usual case and cost nothing here: a settled
message with no record for a lane was acked by it. The IO thread records the others, as
ranges of sequences per (lane, outcome), so that a group deleted with a million messages
pending, or a backlog that expired in order, is a few ranges; receipts read them from
application threads (``Receipt.outcomes``), under the table's lock.

The table is bounded (``MAX_RANGES``): past it the ranges of the oldest sequences are
forgotten (a tenth of the table at once), and a receipt of a message at or below what
was forgotten reports ``unknown`` for a lane it has no record of, rather than a guess.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from enum import StrEnum

from ..._seqs import consecutive

__all__ = ["Outcome", "Outcomes"]

MAX_RANGES = 100_000  # ranges of sequences kept, over every lane and outcome
MAX_CLAIMS = 10_000  # claims of messages stored before any group was known, kept
# Topics whose claims are kept (the oldest topic's forgotten first: topics come and go,
# one per device, each first published before its groups said hello).
MAX_CLAIM_TOPICS = 4096


class Outcome(StrEnum):
    """How a group was done with a message (``Receipt.outcomes``)."""

    ACKED = "acked"
    DEAD_LETTERED = "dead_lettered"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    GROUP_DELETED = "group_deleted"
    LOST = "lost"  # its record was damaged or missing
    PENDING = "pending"  # not settled yet
    UNKNOWN = "unknown"  # settled, but its record was forgotten (see ``MAX_RANGES``)


class _Ranges:
    """Disjoint ranges of sequences, ``[starts[i], ends[i])``, in ascending order."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, lo: int, hi: int) -> int:
        """Add ``[lo, hi)``, joined with the ranges it touches; returns the change in the
        number of ranges."""
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, lo - 1)  # the first range that ends at or after lo
        j = bisect_right(starts, hi)  # past the last range that starts at or before hi
        if i < j:
            lo, hi = min(lo, starts[i]), max(hi, ends[j - 1])
        starts[i:j] = [lo]
        ends[i:j] = [hi]
        return 1 - (j - i)

    def remove(self, lo: int, hi: int) -> int:
        """Take ``[lo, hi)`` out (a range it falls inside is split); returns the change in
        the number of ranges."""
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, lo)  # the first range that ends past lo
        j = bisect_left(starts, hi)  # past the last range that starts before hi
        if i >= j:
            return 0
        kept = [(s, e) for s, e in ((starts[i], lo), (hi, ends[j - 1])) if s < e]
        starts[i:j] = [s for s, _ in kept]
        ends[i:j] = [e for _, e in kept]
        return len(kept) - (j - i)

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether a sequence of ``[lo, hi)`` is in a range."""
        i = bisect_right(self.ends, lo)
        return i < len(self.starts) and self.starts[i] < hi

    def drop_through(self, start: int) -> tuple[int, int]:
        """Forget the ranges that start at or below ``start``; returns how many, and the
        end of the last one (0: none)."""
        k = bisect_right(self.starts, start)
        end = self.ends[k - 1] if k else 0
        del self.starts[:k], self.ends[:k]
        return k, end


def seq_runs(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """``seqs`` as ``[lo, hi)`` runs of consecutive sequences (a ``range`` is one)."""
    if type(seqs) is range and seqs.step == 1:
        return [(seqs.start, seqs.stop)] if len(seqs) else []
    ordered = sorted(set(seqs))
    if not ordered:
        return []
    if consecutive(ordered):
        return [(ordered[0], ordered[-1] + 1)]
    runs = []
    lo = prev = ordered[0]
    for seq in ordered[1:]:
        if seq != prev + 1:
            runs.append((lo, prev + 1))
            lo = seq
        prev = seq
    runs.append((lo, prev + 1))
    return runs


class Outcomes:
    """The outcomes of one producer's messages other than acks, shared by its IO thread
    (which records them) and its receipts (which read them)."""

    def __init__(self, max_ranges: int = MAX_RANGES) -> None:
        self._lock = threading.Lock()
        # lane name -> outcome -> its ranges (in the order each outcome was first met)
        self._ranges: dict[str, dict[Outcome, _Ranges]] = {}
        self._count = 0
        self._max = max_ranges
        self.horizon = 0  # sequences below it may have had a record forgotten
        # Messages stored while their topic had no group: the lanes that claimed them,
        # per topic as (lo, hi, lane names), oldest first.
        self._claims: dict[str, list[tuple[int, int, tuple[str, ...]]]] = {}

    def record(self, lane: str, outcome: Outcome, seqs: Iterable[int]) -> None:
        """``lane`` settled ``seqs`` with ``outcome`` (IO thread)."""
        runs = seq_runs(seqs)
        if not runs:
            return
        with self._lock:
            of_lane = self._ranges.setdefault(lane, {})
            ranges = of_lane.get(outcome)
            if ranges is None:
                ranges = of_lane[outcome] = _Ranges()
            for lo, hi in runs:
                self._count += ranges.add(lo, hi)
            if self._count > self._max:
                self._forget_oldest()

    def forget(self, lane: str, seqs: Iterable[int]) -> None:
        """``lane`` owes ``seqs`` again (dead letters replayed): no outcome of theirs yet."""
        with self._lock:
            for ranges in self._ranges.get(lane, {}).values():
                for lo, hi in seq_runs(seqs):
                    self._count += ranges.remove(lo, hi)

    def _forget_oldest(self) -> None:
        """Forget the ranges of the lowest sequences, a tenth of the table at once: one
        pass over every lane's ranges for thousands of them, where one range at a time
        looked at every (lane, outcome) each time (thousands of groups come and gone)."""
        starts = sorted(
            s for lane in self._ranges.values() for r in lane.values() for s in r.starts
        )
        through = starts[self._count - (self._max - self._max // 10) - 1]
        for name, of_lane in list(self._ranges.items()):
            for outcome, ranges in list(of_lane.items()):
                dropped, end = ranges.drop_through(through)
                self._count -= dropped
                self.horizon = max(self.horizon, end)
                if not ranges:
                    del of_lane[outcome]
            if not of_lane:
                del self._ranges[name]

    def of_lane(self, lane: str) -> dict[Outcome, list[tuple[int, int]]]:
        """The ranges ``[lo, hi)`` of ``lane``'s sequences settled otherwise than acked,
        per outcome (a taker's hand-back)."""
        with self._lock:
            return {
                outcome: list(zip(r.starts, r.ends, strict=True))
                for outcome, r in self._ranges.get(lane, {}).items()
            }

    def claim(self, topic: str, seqs: Sequence[int], lanes: Sequence[str]) -> None:
        """Messages stored before any group of ``topic`` was known went to ``lanes``."""
        if not seqs:
            return
        with self._lock:
            claims = self._claims.pop(topic, [])  # (last in the dict's order: the newest)
            self._claims[topic] = claims
            if len(self._claims) > MAX_CLAIM_TOPICS:
                del self._claims[next(iter(self._claims))]
            claims.append((min(seqs), max(seqs) + 1, tuple(lanes)))
            if len(claims) > MAX_CLAIMS:
                del claims[0]

    def claimed(self, topic: str, seq: int) -> tuple[str, ...]:
        """The lanes that claimed ``seq``, stored before ``topic`` had a group (none yet:
        an empty tuple)."""
        with self._lock:
            for lo, hi, lanes in reversed(self._claims.get(topic, ())):
                if lo <= seq < hi:
                    return lanes
        return ()

    def of(self, first: int, count: int, lanes: Sequence[str], settled: bool) -> dict[str, Outcome]:
        """The outcome of messages ``first .. first + count - 1`` for each of ``lanes``:
        the first recorded one that is not an ack, else ``acked`` once ``settled`` (else
        ``pending``); ``unknown`` for a settled message whose record may be forgotten."""
        hi = first + count
        done = Outcome.ACKED if settled else Outcome.PENDING
        out: dict[str, Outcome] = {}
        with self._lock:
            for lane in lanes:
                found = next(
                    (
                        outcome
                        for outcome, ranges in self._ranges.get(lane, {}).items()
                        if ranges.overlaps(first, hi)
                    ),
                    None,
                )
                if found is None:
                    found = Outcome.UNKNOWN if settled and first < self.horizon else done
                out[lane] = found
        return out
