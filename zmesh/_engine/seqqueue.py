"""A first-in first-out queue of sequence numbers that costs the garbage collector nothing.

A lane keeps every sequence it owes in such queues. A ``deque`` of ints would do, but the
collector walks every item of a deque at each full collection, and a backlog of millions
made those collections take tens of milliseconds each. An ``array`` holds plain 8-byte
values, no objects, and is never walked.
"""

from __future__ import annotations

from array import array
from bisect import insort
from collections.abc import Callable

COMPACT_AFTER = 4096  # popped slots kept before they are dropped (at most half the array)


class SeqQueue:
    """Sequences in ascending order: appended at the end, taken from the front."""

    __slots__ = ("_a", "_head")

    def __init__(self) -> None:
        self._a = array("q")
        self._head = 0

    def __len__(self) -> int:
        return len(self._a) - self._head

    def append(self, seq: int) -> None:
        self._a.append(seq)

    def insort(self, seq: int) -> None:
        """Put ``seq`` in its place (rare: an old sequence owed again)."""
        insort(self._a, seq, lo=self._head)

    def last(self) -> int | None:
        return self._a[-1] if len(self._a) > self._head else None

    def first(self, keep: Callable[[int], bool]) -> int | None:
        """The first sequence ``keep`` accepts, dropping those before it; None if none."""
        a, head = self._a, self._head
        end = len(a)
        while head < end and not keep(a[head]):
            head += 1
        head = self._set_head(head)
        return a[head] if head < len(a) else None

    def first_in(self, owned: dict[int, int]) -> int | None:
        """``first`` for the common test, membership in one dict (no call per item)."""
        a, head = self._a, self._head
        end = len(a)
        while head < end and a[head] not in owned:
            head += 1
        head = self._set_head(head)
        return a[head] if head < len(a) else None

    def popleft(self) -> None:
        """Drop the first sequence."""
        self._set_head(self._head + 1)

    def _set_head(self, head: int) -> int:
        """Move the front to ``head`` (dropping the popped slots now and then); the new
        index of the front."""
        if head >= COMPACT_AFTER and head * 2 >= len(self._a):
            del self._a[:head]
            head = 0
        self._head = head
        return head
