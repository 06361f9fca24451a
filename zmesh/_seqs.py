"""Sequences as the engine, the codec and the store pass them: a ``range`` when they are
known to be consecutive and ascending, else a list or a tuple."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from operator import lt


def consecutive(seqs: Sequence[int]) -> bool:
    """True when ``seqs`` are consecutive and ascending and not empty: a ``range`` of step
    1 is, with no look at each; any other sequence is checked in one pass at C speed."""
    if type(seqs) is range:
        return seqs.step == 1 and len(seqs) > 0
    n = len(seqs)
    return n > 0 and seqs[-1] - seqs[0] == n - 1 and all(map(lt, seqs, islice(seqs, 1, None)))


def span(seqs: Sequence[int]) -> tuple[int, int]:
    """The lowest and highest of ``seqs`` (of a ``range``, its ends: no look at each);
    (0, -1) when there are none."""
    if not seqs:
        return 0, -1
    if type(seqs) is range:
        return seqs[0], seqs[-1]
    return min(seqs), max(seqs)
