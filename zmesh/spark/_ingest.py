"""What the bridge took from its subscriptions, as runs to append: one per (stream,
producer), in the order the messages came.

Messages of one delivered batch share its columns (``Message._origin``: sequences,
partitions, publish times, headers), so a stretch of them is read as slices of those
columns instead of a property call per message; keys and payloads are read at C speed.
A batch spread over several partitions is split with one pass over its partitions.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import groupby
from operator import attrgetter
from typing import Any

from .._engine.lane.blocks import blocks
from .._seqs import consecutive
from ..subscription import Message
from ._runs import Run

_origin_of, _place_of = attrgetter("_origin"), attrgetter("_i")
_key_of, _payload_of = attrgetter("key"), attrgetter("payload")


class _Builder:
    """The columns of one run as they grow."""

    __slots__ = ("seqs", "ats", "payloads", "keys", "headers")

    def __init__(self) -> None:
        # (numbers as arrays: a batch's columns, arrays mostly, are copied in at C speed)
        self.seqs = array("q")
        self.ats = array("d")
        self.payloads: list[bytes] = []
        self.keys: list[str | None] = []
        self.headers: list[dict[str, Any] | None] = []

    def add(
        self,
        seqs: Sequence[int],
        ats: Sequence[float],
        payloads: Sequence[bytes],
        keys: Sequence[str | None],
        headers: Sequence[dict[str, Any] | None],
    ) -> None:
        self.seqs.extend(seqs)
        self.ats.extend(ats)
        self.payloads.extend(payloads)
        self.keys.extend(keys)
        self.headers.extend(headers)

    def run(self, producer: bytes) -> Run:
        return Run(producer, _as_range(self.seqs), self.ats, self.payloads, self.keys, self.headers)


def _as_range(seqs: array[int]) -> Sequence[int]:
    """``seqs`` as a range when they step evenly up (a batch's, or a partition's share of
    one dealt round-robin: the log's dedupe marks a range with no step per sequence)."""
    if consecutive(seqs):
        return range(seqs[0], seqs[-1] + 1)
    step = seqs[1] - seqs[0]
    if step > 0 and seqs[-1] - seqs[0] == step * (len(seqs) - 1):
        stepped = range(seqs[0], seqs[-1] + 1, step)
        if seqs == array("q", stepped):
            return stepped
    return seqs


def _period(parts: Sequence[int]) -> int:
    """How many partitions a batch deals its messages round-robin to (keyless messages
    published alone: the message at place i goes to ``parts[i % period]``), or 0 when it
    does not. Checked with one count per partition, at C speed."""
    n = len(parts)
    try:
        period = parts.index(parts[0], 1)
    except ValueError:
        return 0
    if len(set(parts[:period])) != period:
        return 0
    for k in range(period):
        if parts[k::period].count(parts[k]) != len(range(k, n, period)):
            return 0
    return period


def _by_partition(parts: Sequence[int]) -> dict[int, list[int]]:
    """The places of each partition in ``parts``."""
    places: dict[int, list[int]] = {}
    for i, p in enumerate(parts):
        got = places.get(p)
        if got is None:
            places[p] = [i]
        else:
            got.append(i)
    return places


def runs_of(msgs: list[Message]) -> list[tuple[str, Run]]:
    """``msgs`` as runs ``(stream, run)``, each stream's messages in their order."""
    builders: dict[tuple[str, bytes], _Builder] = {}
    for origin, stretch in groupby(msgs, _origin_of):
        group = list(stretch)
        lo, hi = group[0]._i, group[-1]._i + 1
        cols: list[Sequence[Any]]
        if hi - lo == len(group):  # (the usual case: places lo..hi-1, read as slices)
            cols = [
                origin.seqs[lo:hi],
                origin.published_ats[lo:hi],
                origin.partitions[lo:hi],
                origin.headers[lo:hi],
            ]
        else:
            taken = list(map(_place_of, group))
            cols = [
                list(map(col.__getitem__, taken))
                for col in (origin.seqs, origin.published_ats, origin.partitions, origin.headers)
            ]
        seqs, ats, parts, headers = cols
        keys, payloads = list(map(_key_of, group)), list(map(_payload_of, group))
        producer, topic = origin.source[0], origin.topic
        found = blocks(parts)
        if found is not None:  # (keyless batches, a partition each: a slice per block)
            for part, lo, hi in found:
                _builder(builders, f"{topic}/{part}", producer).add(
                    seqs[lo:hi], ats[lo:hi], payloads[lo:hi], keys[lo:hi], headers[lo:hi]
                )
            continue
        period = _period(parts)
        if period:  # (dealt round-robin: each partition's messages are a strided slice)
            for k in range(period):
                _builder(builders, f"{topic}/{parts[k]}", producer).add(
                    seqs[k::period],
                    ats[k::period],
                    payloads[k::period],
                    keys[k::period],
                    headers[k::period],
                )
            continue
        for part, where in _by_partition(parts).items():
            pick = where.__iter__
            _builder(builders, f"{topic}/{part}", producer).add(
                list(map(seqs.__getitem__, pick())),
                list(map(ats.__getitem__, pick())),
                list(map(payloads.__getitem__, pick())),
                list(map(keys.__getitem__, pick())),
                list(map(headers.__getitem__, pick())),
            )
    return [(stream, b.run(producer)) for (stream, producer), b in builders.items()]


def _builder(builders: dict[tuple[str, bytes], _Builder], stream: str, producer: bytes) -> _Builder:
    b = builders.get((stream, producer))
    if b is None:
        b = builders[(stream, producer)] = _Builder()
    return b
