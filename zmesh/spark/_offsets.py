"""Offset arithmetic of the data source: pure functions, unit-tested without Spark.

An offset is a dict ``{"topic/partition": next offset to read}``; a range is
``(stream, start, end)`` with ``end`` exclusive. A stream missing from a start offset
(one that appeared after the query began) is read from offset 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from ..errors import ArgumentError
from ._errors import BridgeError

Bounds = Mapping[str, tuple[int, int]]
Range = tuple[str, int, int]


def topic_of(stream: str) -> str:
    return stream.rpartition("/")[0]


def select(bounds: Bounds, topics: Iterable[str] | None) -> dict[str, tuple[int, int]]:
    """The streams of ``topics`` (all when None)."""
    wanted = None if topics is None else set(topics)
    return {s: b for s, b in bounds.items() if wanted is None or topic_of(s) in wanted}


def parse_spec(value: str | None, default: str, what: str) -> str | dict[str, int]:
    """``earliest``, ``latest`` or a JSON object of offsets."""
    if value is None:
        return default
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ArgumentError(f"{what} must be 'earliest', 'latest' or a JSON object like "
                            f'{{"metrics/0": 42}}, got {value!r}') from exc
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and "/" in k and isinstance(v, int) and v >= 0
            for k, v in data.items()):
        raise ArgumentError(f'{what} must map "topic/partition" to offsets >= 0, got {value!r}')
    return data


def resolve(spec: str | Mapping[str, int], bounds: Bounds,
            missing: str = "earliest") -> dict[str, int]:
    """Concrete offsets for every stream: ``earliest`` is the head, ``latest`` the end;
    streams a JSON spec leaves out get ``missing`` (earliest or latest)."""
    if spec == "latest" or (spec != "earliest" and missing == "latest"):
        out = {s: end for s, (_head, end) in bounds.items()}
    else:
        out = {s: head for s, (head, _end) in bounds.items()}
    if isinstance(spec, Mapping):
        out.update(spec)
    return out


def advance(start: Mapping[str, int], ends: Mapping[str, int],
            max_rows: int | None = None) -> dict[str, int]:
    """The next end offset: everything up to ``ends``, or at most ``max_rows`` records
    shared among streams in proportion to what each has waiting."""
    out = dict(start)
    avail: dict[str, int] = {}
    for s, e in ends.items():
        b = start.get(s, 0)
        if e < b:
            raise BridgeError(f"the bridge log ends at {s} offset {e}, behind the query's "
                              f"offset {b}: was the bridge log deleted or replaced?")
        out.setdefault(s, b)
        if e > b:
            avail[s] = e - b
    total = sum(avail.values())
    if max_rows is None or total <= max_rows:
        for s, n in avail.items():
            out[s] = start.get(s, 0) + n
        return out
    alloc = {s: n * max_rows // total for s, n in avail.items()}
    left = max_rows - sum(alloc.values())
    for s in sorted(avail, key=lambda s: (alloc[s] - avail[s], s)):
        if left <= 0:
            break
        if alloc[s] < avail[s]:
            alloc[s] += 1
            left -= 1
    for s, n in alloc.items():
        out[s] = start.get(s, 0) + n
    return out


def cap(offsets: Mapping[str, int], target: Mapping[str, int]) -> dict[str, int]:
    """``offsets`` no further than ``target`` (Trigger.AvailableNow); streams unknown to
    the target stay where they are."""
    return {s: min(o, target[s]) if s in target else o for s, o in offsets.items()}


def count(start: Mapping[str, int], end: Mapping[str, int]) -> int:
    return sum(max(0, e - start.get(s, 0)) for s, e in end.items())


def plan(start: Mapping[str, int], end: Mapping[str, int], *, min_partitions: int = 1,
         max_per_partition: int = 50_000) -> list[tuple[Range, ...]]:
    """Cut [start, end) into Spark partitions of about equal size; each partition is one
    or more ranges, in stream order, so a plan is the same every time it is made."""
    ranges = [(s, start.get(s, 0), e) for s, e in sorted(end.items()) if e > start.get(s, 0)]
    total = sum(e - b for _s, b, e in ranges)
    if total == 0:
        return []
    k = min(total, max(min_partitions, math.ceil(total / max_per_partition)))
    size = math.ceil(total / k)
    parts: list[tuple[Range, ...]] = []
    cur: list[Range] = []
    room = size
    for s, b, e in ranges:
        while b < e:
            take = min(room, e - b)
            cur.append((s, b, b + take))
            b += take
            room -= take
            if room == 0:
                parts.append(tuple(cur))
                cur, room = [], size
    if cur:
        parts.append(tuple(cur))
    return parts
