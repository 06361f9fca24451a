"""Static seeds: control addresses contacted directly where multicast does not reach."""

from __future__ import annotations

from collections.abc import Iterable

from .._engine.peers import endpoint
from ..config import parse_seed


def seed_endpoints(seeds: Iterable[str]) -> list[str]:
    """``"host:port"`` seeds as tcp endpoints."""
    return [endpoint(*parse_seed(s)) for s in seeds]
