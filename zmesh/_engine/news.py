"""Membership's news: what is said of nodes (facts), and how often each piece is retold.

A fact is spread by putting it on frames: each goes on ``RETRANSMIT_MULT * log10(N + 1)``
of them (rounded up, N the members known), which gets it to every member with high
probability (SWIM's infection-style dissemination), and a newer fact of a node replaces
the older one. None of those frames goes to a member told it already (but every frame to
a node names a suspicion or a death of it), nor, for a fact that a node is alive, to that
node (no news to it): a fact goes to that many members, or to every live one when fewer.
Counted whoever got them, frames to random members would leave a member of a small mesh
untold now and then, and a member that misses a node's joining never says hello to it.
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
    """Facts waiting to be retold, each with the times it was and to whom."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        # node id -> [fact, times told, the members told (or that need no telling)]
        self._items: dict[bytes, list[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, fact: Fact) -> None:
        told = {fact.node_id} if fact.state == ALIVE else set()
        self._items[fact.node_id] = [fact, 0, told]

    def drop(self, node_id: bytes) -> None:
        self._items.pop(node_id, None)

    def take(self, limit: int, about: bytes | None, members: int, live: set[bytes]) -> list[Fact]:
        """Up to ``limit`` facts for one frame: what is said of ``about`` (the frame's
        target) first, every time, so it can refute it (that it is alive, no news to it,
        never), then those told least often that it was not told yet. A fact is done
        once told to as many members as it goes to, or to every ``live`` one (when any)."""
        items = self._items
        if not items:
            return []
        times = RETRANSMIT_MULT * max(1, math.ceil(math.log10(members + 2)))
        first = items.get(about) if about is not None else None
        if first is not None and first[0].state == ALIVE:
            first = None
        picked = [first] if first is not None else []
        for item in sorted(items.values(), key=lambda item: item[1]):
            if len(picked) >= limit:
                break
            if item is not first and about not in item[2]:
                picked.append(item)
        for item in picked:
            item[1] += 1
            if about is not None:
                item[2].add(about)
        for node_id, item in list(items.items()):
            if item[1] >= times or (live and live <= item[2]):
                del items[node_id]
        return [item[0] for item in picked]
