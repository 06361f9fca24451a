"""Static seeds: control addresses contacted directly where multicast does not reach,
again at every heartbeat while no live peer answers there."""

from __future__ import annotations

from collections.abc import Iterable

from .._protocol.addresses import endpoint
from ..config import parse_seed
from .base import Found, Report


def seed_endpoints(seeds: Iterable[str]) -> list[str]:
    """``"host:port"`` seeds as tcp endpoints."""
    return [endpoint(*parse_seed(s)) for s in seeds]


class StaticSeeds:
    """Reports the configured seeds at start and at every heartbeat."""

    def __init__(self, seeds: Iterable[str]) -> None:
        self._found = [Found(ep, seed=True) for ep in seed_endpoints(seeds)]
        self._report: Report | None = None

    def start(self, report: Report) -> None:
        self._report = report
        self.beat()

    def beat(self) -> None:
        if self._report is not None:
            for found in self._found:
                self._report(found)

    def close(self) -> None:
        self._report = None
