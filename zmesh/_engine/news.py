"""Membership's news: what is said of nodes (facts), and how often each piece is retold.

A fact is spread by putting it on frames: each goes on ``RETRANSMIT_MULT * log10(N + 1)``
of them (rounded up, N the members known), which gets it to every member with high
probability (SWIM's infection-style dissemination), and a newer fact of a node replaces
the older one.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .limits import RETRANSMIT_MULT

ALIVE, SUSPECT, DEAD = 0, 1, 2
STATES = ("alive", "suspect", "dead")


class Fact(NamedTuple):
    """What is believed of one node: its state in one of its lives, ordered by
    (incarnation, refuted); ``by``: who suspected it or declared it dead."""

    node_id: bytes
    incarnation: int
    refuted: int
    state: int
    by: bytes = b""


class News:
    """Facts waiting to be retold, each with the times it was."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[bytes, list[Any]] = {}  # node id -> [fact, times told]

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, fact: Fact) -> None:
        self._items[fact.node_id] = [fact, 0]

    def drop(self, node_id: bytes) -> None:
        self._items.pop(node_id, None)

    def take(self, limit: int, about: bytes | None, members: int) -> list[Fact]:
        """Up to ``limit`` facts for one frame: the one of ``about`` (the frame's target,
        so it can refute what is said of it) first, then those told least often."""
        items = self._items
        if not items:
            return []
        times = RETRANSMIT_MULT * max(1, math.ceil(math.log10(members + 2)))
        first = items.get(about) if about is not None else None
        picked = [first] if first is not None else []
        for item in sorted(items.values(), key=lambda item: item[1]):
            if len(picked) >= limit:
                break
            if item is not first:
                picked.append(item)
        for item in picked:
            item[1] += 1
            if item[1] >= times:
                del items[item[0].node_id]
        return [item[0] for item in picked]
