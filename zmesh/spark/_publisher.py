"""Sink rows published by the bridge thread, without waiting for the node to store them.

A publish request carries a chunk of consecutive rows of one sink task. The rows the
bridge has not published before are handed to the node (``Node.publish_many``; a row
with headers of its own alone), and the request waits, as a ``Publishing``, while the
bridge goes on serving others; once its rows are stored, the bridge remembers them in its
log (as ranges of the task's rows, or by their ids with ``idColumns``) and only then
answers. A request for rows that another one is publishing waits for that one to end,
so no row is published twice. A chunk is checked whole first, as the node checks a
publish, so a row the node would refuse fails the request with none of its rows published;
rows stored before a later failure (no room in the outbox) are remembered all the same, so
a retry publishes only the rest.

Rows with ids of their own also give the id to ``Node.publish`` as ``msg_id``, so the
node itself drops a row stored before a crash kept the bridge from remembering it;
positional rows, published a chunk at a time, are remembered once stored: a bridge killed
in between publishes them again when Spark retries the task.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .._engine.stats import Counters
from .._protocol.codec import MAX_KEY_CHARS, MAX_MSG_ID_BYTES
from .._receipt import Receipt
from ..config import check_name, checked_headers
from ..errors import ArgumentError, ZMeshError
from ..errors import TimeoutError as ZTimeoutError
from ..node import Node
from . import _sinkrows
from ._log import BridgeLog
from ._wire import Reply, Request

log = logging.getLogger(__name__)

PUBLISH_FRAMES = 5  # payloads, topics, keys, headers, ids (see _rows.Chunk)


def gaps(first: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [first, end) outside the ranges ``covered`` (in order)."""
    out, at = [], first
    for a, b in sorted(covered):
        if a > at:
            out.append((at, min(a, end)))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return [(a, b) for a, b in out if a < b]


class _Rows:
    """The columns of a publish's rows."""

    __slots__ = ("topic", "payloads", "topics", "keys", "headers")

    def __init__(
        self,
        topic: str | None,
        payloads: list[bytes],
        topics: list[str] | None,
        keys: list[str | None] | None,
        headers: list[dict[str, Any] | None] | None,
    ) -> None:
        self.topic = topic
        self.payloads = payloads
        self.topics = topics
        self.keys = keys
        self.headers = headers

    def topic_of(self, i: int) -> str:
        return str(self.topic if self.topic is not None else self.topics[i])  # type: ignore[index]

    def key(self, i: int) -> str | None:
        return None if self.keys is None else self.keys[i]

    def headers_of(self, i: int) -> dict[str, Any] | None:
        return None if self.headers is None else self.headers[i] or None

    def segments(self, i: int, j: int) -> Iterator[tuple[int, int]]:
        """Rows i..j-1 in stretches of one topic, each row with headers a stretch alone."""
        if self.topic is not None and self.headers is None:
            yield i, j
            return
        start = i
        for k in range(i + 1, j + 1):
            if (
                k == j
                or self.topic_of(k) != self.topic_of(start)
                or (self.headers_of(k) or self.headers_of(start))
            ):
                yield start, k
                start = k


def _first(values: list[Any], bad: Callable[[Any], bool]) -> int:
    return next(i for i, v in enumerate(values) if bad(v))


def refusal(rows: _Rows, ids: list[Any] | None, max_bytes: int) -> tuple[int, str] | None:
    """The first row of a chunk the node would refuse, by its checks and limits, and why;
    None when it takes them all. (Each column is checked whole, a row at a time only to
    find the row.)"""
    topics: list[Any] = [rows.topic] if rows.topics is None else rows.topics
    for topic in set(topics):
        try:
            check_name("topic", topic)
        except ZMeshError as exc:
            return topics.index(topic), str(exc)
    payloads = rows.payloads
    if not all(type(p) is bytes or type(p) is str for p in payloads):
        i = _first(payloads, lambda p: not isinstance(p, bytes | str))
        return i, f"payload must be bytes or str, got {type(payloads[i]).__name__}"
    if payloads and max(map(len, payloads)) > max_bytes:
        i = _first(payloads, lambda p: len(p) > max_bytes)
        return i, f"payload of {len(payloads[i])} bytes exceeds max_message_bytes {max_bytes}"
    keys: list[Any] = rows.keys or []
    if not all(k is None or type(k) is str for k in keys):
        i = _first(keys, lambda k: not (k is None or isinstance(k, str)))
        return i, f"key must be a str or None, got {type(keys[i]).__name__}"
    if max((len(k) for k in keys if k is not None), default=0) > MAX_KEY_CHARS:
        i = _first(keys, lambda k: k is not None and len(k) > MAX_KEY_CHARS)
        return i, f"key of {len(keys[i])} characters exceeds {MAX_KEY_CHARS}"
    if ids is not None and not all(map(_msg_id, ids)):
        i = _first(ids, lambda r: not _msg_id(r))
        return i, f"msg_id must be a non-empty str of at most {MAX_MSG_ID_BYTES} bytes in UTF-8"
    for i, headers in enumerate(rows.headers or ()):
        if headers:
            try:
                checked_headers(headers)
            except ZMeshError as exc:
                return i, str(exc)
    return None


@dataclass(slots=True)
class Publishing:
    """A publish request whose rows are on their way into the node's outbox."""

    route: bytes
    token: int
    task: bytes
    ranges: list[tuple[int, int, Receipt]]  # positional rows: [a, b) and its receipt
    ids: list[tuple[bytes, Receipt]]  # rows with ids of their own
    receipts: list[Receipt]
    deadline: float
    rows: int
    published: int = 0
    error: str = ""
    done: bool = field(default=False)


def _msg_id(row_id: Any) -> bool:
    """Whether ``row_id`` is a msg_id ``Node.publish`` takes."""
    return type(row_id) is str and 0 < len(row_id.encode(errors="replace")) <= MAX_MSG_ID_BYTES


def _decode(req: Request) -> tuple[bytes, int, _Rows, list[str] | None]:
    """(task, first row, rows, ids) of a publish request; ArgumentError if malformed."""
    if len(req.parts) != PUBLISH_FRAMES:
        raise ArgumentError(f"a publish carries {PUBLISH_FRAMES} frames, got {len(req.parts)}")
    try:
        payloads, topics, keys, headers, ids = (msgpack.unpackb(p, raw=False) for p in req.parts)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ArgumentError(f"a publish's rows do not decode: {exc}") from exc
    args = req.args
    n, topic, task = int(args["n"]), args.get("topic"), str(args["task"]).encode()
    if len(task) > _sinkrows.MAX_TASK_BYTES:
        raise ArgumentError(
            f"sink task name of {len(task)} bytes exceeds the {_sinkrows.MAX_TASK_BYTES} "
            "the bridge remembers published rows under (a writeId that long?)"
        )
    if len(payloads) != n or any(
        col is not None and len(col) != n for col in (topics, keys, headers, ids)
    ):
        raise ArgumentError(f"publish of {n} rows carried columns of other lengths")
    if topic is None and topics is None:
        raise ArgumentError("a publish needs a topic, or one per row")
    return (
        task,
        int(args["first"]),
        _Rows(topic, payloads, topics, keys, headers),
        ids,
    )


def _stored_ranges(ranges: list[tuple[int, int, Receipt]]) -> list[tuple[int, int, str, int]]:
    """The ranges of rows stored, those that meet joined: (first, end, producer, seq)."""
    out: list[tuple[int, int, str, int]] = []
    for a, b, r in ranges:
        if not r.stored:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b, *out[-1][2:])
        else:
            out.append((a, b, r.id.producer, r.id.seq))
    return out


class SinkPublisher:
    """Publish requests in progress (bridge thread only)."""

    def __init__(self, blog: BridgeLog, node: Node, counters: Counters, timeout_s: float) -> None:
        self.log = blog
        self.node = node
        self.counters = counters
        self.timeout_s = timeout_s
        self._publishing: list[Publishing] = []
        self._deferred: deque[tuple[bytes, Request]] = deque()
        self._ranges: dict[bytes, list[tuple[int, int]]] = {}  # task -> rows in flight
        self._ids: set[bytes] = set()  # row ids in flight

    @property
    def busy(self) -> bool:
        """Whether publishes wait for the node (the bridge then looks again soon)."""
        return bool(self._publishing)

    def start(self, route: bytes, req: Request) -> Reply | None:
        """Begin a publish: its reply now (nothing new to publish, or a row the node would
        refuse: then none is published), or None (it is under way, or waits for another
        publishing some of its rows)."""
        task, first, rows, ids = _decode(req)
        # (at most the wait the writer asks for: beyond it, it would not see the answer)
        timeout_s = max(0.0, min(self.timeout_s, float(req.args.get("wait") or self.timeout_s)))
        refused = refusal(rows, ids, self.node.config.max_message_bytes)
        if refused is not None:
            raise ArgumentError(f"row {first + refused[0]} of {task.decode()}: {refused[1]}")
        n = len(rows.payloads)
        p = Publishing(route, req.token, task, [], [], [], 0.0, n)
        try:
            if ids is not None:
                encoded = [str(r).encode() for r in ids]
                if self._ids.intersection(encoded):
                    self._defer(route, req)
                    return None
                seen = self.log.sink_filter(encoded)
                for i, rid in enumerate(encoded):
                    if rid not in seen:
                        seen.add(rid)
                        receipt = self.node.publish(
                            rows.topic_of(i),
                            rows.payloads[i],
                            msg_id=ids[i],
                            key=rows.key(i),
                            headers=rows.headers_of(i),
                            timeout=timeout_s,
                        )
                        p.ids.append((rid, receipt))
            else:
                flying = self._ranges.get(task, [])
                if any(a < first + n and first < b for a, b in flying):
                    self._defer(route, req)
                    return None
                covered = self.log.sink_covered(task, first, first + n)
                for a, b in gaps(first, first + n, covered):
                    for i, j in rows.segments(a - first, b - first):
                        p.ranges.append((first + i, first + j, self._send(rows, i, j, timeout_s)))
        except ZMeshError as exc:  # (the rows sent before it are remembered once stored)
            p.error = str(exc)
        p.deadline = time.monotonic() + timeout_s
        p.receipts = [r for _a, _b, r in p.ranges] + [r for _rid, r in p.ids]
        self._ids.update(rid for rid, _r in p.ids)
        if p.ranges:
            self._ranges.setdefault(task, []).extend((a, b) for a, b, _r in p.ranges)
        p.published = sum(b - a for a, b, _r in p.ranges) + len(p.ids)
        if not p.receipts:
            return self._reply(p)
        self._publishing.append(p)
        return None

    def _defer(self, route: bytes, req: Request) -> None:
        self.counters.add("publishes_waited", 1)
        self._deferred.append((route, req))

    def _send(self, rows: _Rows, i: int, j: int, timeout_s: float) -> Receipt:
        """Publish rows i..j-1, of one topic and none with headers but a first alone."""
        if j - i == 1 or rows.headers_of(i):
            return self.node.publish(
                rows.topic_of(i),
                rows.payloads[i],
                key=rows.key(i),
                headers=rows.headers_of(i),
                timeout=timeout_s,
            )
        keys = None if rows.keys is None else rows.keys[i:j]
        return self.node.publish_many(
            rows.topic_of(i), rows.payloads[i:j], keys=keys, timeout=timeout_s
        )

    def finished(self, now: float) -> list[tuple[bytes, Reply]]:
        """The replies of publishes whose rows are stored (remembered first, in one write)
        or failed, and of those that waited for them and could now begin."""
        for p in self._publishing:
            p.done = all(map(self._settled, p.receipts)) or now > p.deadline
            if (
                p.done
                and not p.error
                and now > p.deadline
                and not all(r.stored for r in p.receipts)
            ):
                p.error = (
                    "rows not stored in time (publish_timeout_s, or half the writer's timeout)"
                )
        ended = [p for p in self._publishing if p.done]
        if not ended:
            return []
        self._publishing = [p for p in self._publishing if not p.done]
        entries: list[_sinkrows.Entry] = []
        stamp = time.time()
        for p in ended:  # (what was stored, also of a publish that failed after it)
            entries += _sinkrows.range_entries(p.task, _stored_ranges(p.ranges), stamp)
            entries += _sinkrows.id_entries(
                [(rid, r.id.producer, r.id.seq) for rid, r in p.ids if r.stored], stamp
            )
        if entries:
            try:
                self.log.sink_write(entries, stamp)
            except ZMeshError as exc:  # (published, but a retry will publish them again)
                log.error("sink rows published but not remembered: %s", exc)
                for p in ended:
                    p.error = p.error or f"rows published but not remembered: {exc}"
        out = []
        for p in ended:
            self._forget(p)
            out.append((p.route, self._reply(p)))
        for _ in range(len(self._deferred)):  # each waited for some of these: begin again
            route, req = self._deferred.popleft()
            try:
                rep = self.start(route, req)
            except (ZMeshError, ValueError, TypeError, KeyError) as exc:
                rep = Reply(req.token, False, error=str(exc) or type(exc).__name__)
            if rep is not None:
                out.append((route, rep))
        return out

    def _settled(self, receipt: Receipt) -> bool:
        """Whether a receipt is stored, or failed (it then says why in its publishing)."""
        if receipt.stored:
            return True
        try:
            receipt.wait_stored(0)
        except ZTimeoutError:
            return False
        except ZMeshError as exc:
            for p in self._publishing:
                if receipt in p.receipts:
                    p.error = p.error or str(exc)
        return True

    def _forget(self, p: Publishing) -> None:
        flying = self._ranges.get(p.task)
        if flying is not None:
            for a, b, _r in p.ranges:
                flying.remove((a, b))
            if not flying:
                del self._ranges[p.task]
        self._ids.difference_update(rid for rid, _r in p.ids)

    def _reply(self, p: Publishing) -> Reply:
        if p.error:
            self.counters.add("request_errors", 1)
            return Reply(p.token, False, error=p.error)
        dups = p.rows - p.published
        self.counters.add("published", p.published)
        self.counters.add("publish_duplicates", dups)
        return Reply(p.token, True, {"published": p.published, "duplicates": dups})
