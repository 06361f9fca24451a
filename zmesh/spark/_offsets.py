"""Offset arithmetic of the data source: pure functions, unit-tested without Spark.

A source reads one bridge or several, so its streams are named by the bridge log's id and
the stream's name there: ``"<log id>:topic/partition"``. An offset is a dict
``{stream: next offset to read}``; a range is ``(stream, start, end)`` with ``end``
exclusive.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

from ..errors import ArgumentError
from ._errors import BridgeError

Bounds = Mapping[str, tuple[int, ...]]  # (head, end), or (head, end, bytes appended)
Range = tuple[str, int, int]
B = TypeVar("B")


def topic_of(stream: str) -> str:
    """The topic of a stream, named with its bridge log's id or not."""
    return stream.rpartition("/")[0].rpartition(":")[2]


def qualify(log_id: str, stream: str) -> str:
    """A bridge's stream ``topic/partition`` as a source names it."""
    return f"{log_id}:{stream}"


def split(stream: str) -> tuple[str, str]:
    """(log id, ``topic/partition``) of a source's stream name."""
    log_id, sep, name = stream.partition(":")
    if not sep:
        raise BridgeError(f"stream {stream!r} does not name its bridge log")
    return log_id, name


def qualify_all(offsets: Mapping[str, int], log_ids: Iterable[str]) -> dict[str, int]:
    """``offsets`` with every stream named by its bridge: a stream named without one
    (by a user's startingOffsets, or a checkpoint of a source of one bridge from before
    streams named bridges) is the only bridge's; with several, that is an error."""
    plain = [s for s in offsets if ":" not in s]
    if not plain:
        return dict(offsets)
    ids = sorted(set(log_ids))
    if len(ids) != 1:
        raise ArgumentError(
            f"offsets {plain} do not say which of the bridges {ids} they are "
            'of: name them "<log id>:topic/partition" (Bridge.log_id)'
        )
    return {s if ":" in s else qualify(ids[0], s): o for s, o in offsets.items()}


def select(bounds: Mapping[str, B], topics: Iterable[str] | None) -> dict[str, B]:
    """The streams of ``topics`` (all when None)."""
    wanted = None if topics is None else set(topics)
    return {s: b for s, b in bounds.items() if wanted is None or topic_of(s) in wanted}


def parse_spec(value: str, what: str) -> str | dict[str, int]:
    """``earliest``, ``latest`` or a JSON object of offsets."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ArgumentError(
            f"{what} must be 'earliest', 'latest' or a JSON object like "
            f'{{"metrics/0": 42}}, got {value!r}'
        ) from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and "/" in k and type(v) is int and v >= 0 for k, v in data.items()
    ):
        raise ArgumentError(
            f'{what} must map "topic/partition" (or, of several bridges, '
            f'"<log id>:topic/partition") to offsets >= 0, got {value!r}'
        )
    return data


def check_spec(
    offsets: Mapping[str, int],
    bounds: Bounds,
    log_ids: Iterable[str],
    what: str,
    *,
    past_end: bool = False,
) -> None:
    """ArgumentError unless every stream ``offsets`` names is one of ``bounds`` (the
    streams the source reads, of the bridge logs ``log_ids``) and, unless ``past_end``,
    no offset is beyond its stream's end."""
    ids = sorted(set(log_ids))
    for stream, offset in sorted(offsets.items()):
        log_id = split(stream)[0]
        if log_id not in ids:
            raise ArgumentError(
                f"{what} names {stream}, of log {log_id}: the source's bridges' logs are {ids}"
            )
        if stream not in bounds:
            raise ArgumentError(
                f"{what} names {stream}, a stream the source does not read; "
                f"it reads {sorted(bounds)}"
            )
        end = bounds[stream][1]
        if offset > end and not past_end:
            raise ArgumentError(
                f"{what} puts {stream} at {offset}, beyond the end of its log ({end})"
            )


def check_order(start: Mapping[str, int], end: Mapping[str, int]) -> None:
    """ArgumentError when a batch read's startingOffsets put a stream past its
    endingOffsets (as Kafka's source refuses it), rather than reading nothing there."""
    for stream, offset in sorted(start.items()):
        if stream in end and offset > end[stream]:
            raise ArgumentError(
                f"a batch read would start {stream} at {offset} (by startingOffsets), after "
                f"where endingOffsets ends it ({end[stream]}): the start must not be after the end"
            )


def resolve(
    spec: str | Mapping[str, int], bounds: Bounds, missing: str = "earliest"
) -> dict[str, int]:
    """Concrete offsets for every stream: ``earliest`` is the head, ``latest`` the end;
    streams a JSON spec leaves out get ``missing`` (earliest or latest)."""
    if spec == "latest" or (spec != "earliest" and missing == "latest"):
        out = {s: end for s, (_head, end) in bounds.items()}
    else:
        out = {s: head for s, (head, _end) in bounds.items()}
    if isinstance(spec, Mapping):
        out.update(spec)
    return out


def advance(
    start: Mapping[str, int], ends: Mapping[str, int], max_rows: int | None = None
) -> dict[str, int]:
    """The next end offset: everything up to ``ends``, or at most ``max_rows`` records
    shared among streams in proportion to what each has waiting."""
    out = dict(start)
    avail: dict[str, int] = {}
    for s, e in ends.items():
        b = start.get(s, 0)
        if e < b:
            raise BridgeError(
                f"the bridge log ends at {s} offset {e}, behind the query's "
                f"offset {b}: was the bridge log deleted or replaced?"
            )
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


def rows_for_bytes(
    max_bytes: int, start: Mapping[str, int], sizes: Mapping[str, tuple[int, int, int]]
) -> int:
    """About how many of the records waiting after ``start`` make ``max_bytes``, by each
    stream's average record size (``sizes``: stream -> (head, end, bytes appended)); at
    least one."""
    waiting = {
        s: end - start.get(s, 0) for s, (_h, end, _b) in sizes.items() if end > start.get(s, 0)
    }
    total = sum(waiting.values())
    if not total:
        return 1
    avg = sum(n * sizes[s][2] / max(1, sizes[s][1]) for s, n in waiting.items()) / total
    return max(1, int(max_bytes / max(avg, 1.0)))


def plan(
    start: Mapping[str, int],
    end: Mapping[str, int],
    *,
    min_partitions: int = 1,
    max_per_partition: int = 1_000_000,
    cut_into: int | None = None,
) -> list[tuple[Range, ...]]:
    """Cut [start, end) into Spark partitions of about equal size; each partition is one
    or more ranges, in stream order, so a plan is the same every time it is made. More
    than ``min_partitions`` partitions (the cores the query has) are a multiple of it, so
    no core idles through a last, partial wave of tasks. ``cut_into``: that many
    partitions instead (a replayed batch's, as it was first planned)."""
    ranges = [(s, start.get(s, 0), e) for s, e in sorted(end.items()) if e > start.get(s, 0)]
    total = sum(e - b for _s, b, e in ranges)
    if total == 0:
        return []
    if cut_into is not None:
        k = min(total, max(1, cut_into))
    else:
        k = max(min_partitions, math.ceil(total / max_per_partition))
        k = min(total, math.ceil(k / min_partitions) * min_partitions)
    sizes = [total // k + (i < total % k) for i in range(k)]  # (differing by one at most)
    parts: list[tuple[Range, ...]] = []
    cur: list[Range] = []
    room = sizes[0]
    for s, b, e in ranges:
        while b < e:
            take = min(room, e - b)
            cur.append((s, b, b + take))
            b += take
            room -= take
            if room == 0:
                parts.append(tuple(cur))
                cur = []
                room = sizes[len(parts)] if len(parts) < k else 0
    return parts
