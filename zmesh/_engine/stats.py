"""Counters the IO thread keeps and other threads read as snapshots."""

from __future__ import annotations

from collections import Counter


class Counters:
    """Monotonic event counters (written by the IO thread only)."""

    def __init__(self) -> None:
        self._c: Counter[str] = Counter()

    def add(self, name: str, n: int = 1) -> None:
        if n:
            self._c[name] += n

    def get(self, name: str) -> int:
        return self._c.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._c)
