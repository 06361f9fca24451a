"""What a bridge answers on its ROUTER: stream bounds and reader watermarks (``info``),
runs of offset ranges (``fetch``), sink rows to publish (``publish``) and ``drop``. Runs
on the bridge thread, which owns the socket and the log's writes.

A publish carries a chunk of consecutive rows of one sink task. The bridge publishes the
rows it has not published before with ``Node.publish_many`` (rows with headers of their
own one by one), answers only once they are stored in the node's outbox, and then
remembers the task's rows it published as ranges. Rows with ids of their own
(``idColumns``) are remembered by id, and the id is also given to ``Node.publish`` as
``msg_id``, so the node itself drops a row stored before a crash kept the bridge from
remembering it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import zmq

from .._engine.stats import Counters
from .._receipt import Receipt
from ..errors import ArgumentError, DecodeError, ZMeshError
from ..node import Node
from ._log import BridgeLog
from ._wire import Reply, Request, decode_request, encode_reply

log = logging.getLogger(__name__)

RECV_BURST = 64
FETCH_MAX_RECORDS = 1_000_000
PUBLISH_FRAMES = 5  # payloads, topics, keys, headers, ids (see _rows.Chunk)


def gaps(first: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [first, end) outside the ordered, disjoint ranges ``covered``."""
    out, at = [], first
    for a, b in covered:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out


class Service:
    """Request handlers of one bridge (bridge thread only)."""

    def __init__(self, blog: BridgeLog, node: Node, counters: Counters,
                 publish_timeout_s: float) -> None:
        self.log = blog
        self.node = node
        self.counters = counters
        self.publish_timeout_s = publish_timeout_s

    def serve(self, router: zmq.Socket) -> None:
        """Answer up to RECV_BURST requests waiting on the ROUTER."""
        for _ in range(RECV_BURST):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                req = decode_request(frames[1:])
            except DecodeError as exc:
                self.counters.add("decode_errors", 1)
                log.debug("dropped a bad bridge request: %s", exc)
                continue
            try:
                rep = self.handle(req)
            except (ZMeshError, ValueError, TypeError, KeyError) as exc:
                self.counters.add("request_errors", 1)
                rep = Reply(req.token, False, error=str(exc) or type(exc).__name__)
            try:
                router.send_multipart([frames[0], *encode_reply(rep)], zmq.NOBLOCK)
            except zmq.ZMQError:
                self.counters.add("replies_dropped", 1)

    def handle(self, req: Request) -> Reply:
        args = req.args
        if req.kind == "fetch":
            stream, start, end = str(args["stream"]), int(args["start"]), int(args["end"])
            limit = max(1, min(int(args.get("max", FETCH_MAX_RECORDS)), FETCH_MAX_RECORDS))
            first, runs = self.log.read(stream, start, end, limit)
            self.counters.add("fetches", 1)
            self.counters.add("runs_served", len(runs))
            return Reply(req.token, True, {"first": first, "starts": [s for s, _r in runs]},
                         parts=tuple(r for _s, r in runs))
        if req.kind == "info":
            reader = args.get("reader")
            if reader is not None:
                topics = args.get("topics")
                wm = {str(k): int(v) for k, v in dict(args.get("wm") or {}).items()}
                self.log.set_watermark(str(reader), None if topics is None
                                       else [str(t) for t in topics], wm, time.time())
            streams = {k: list(v) for k, v in self.log.stream_sizes().items()}
            return Reply(req.token, True, {"log": self.log.log_id, "streams": streams})
        if req.kind == "publish":
            return Reply(req.token, True, self._publish(args, req.parts))
        return Reply(req.token, True, {"dropped": self.log.drop_reader(str(args["reader"]))})

    def _publish(self, args: dict[str, Any], parts: tuple[bytes, ...]) -> dict[str, int]:
        """Publish the chunk's rows not published before; reply once they are stored."""
        if len(parts) != PUBLISH_FRAMES:
            raise ArgumentError(f"a publish carries {PUBLISH_FRAMES} frames, got {len(parts)}")
        try:
            payloads, topics, keys, headers, ids = (msgpack.unpackb(p, raw=False)
                                                    for p in parts)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ArgumentError(f"a publish's rows do not decode: {exc}") from exc
        task, first, n = str(args["task"]).encode(), int(args["first"]), int(args["n"])
        topic = args.get("topic")
        if len(payloads) != n or any(col is not None and len(col) != n
                                     for col in (topics, keys, headers, ids)):
            raise ArgumentError(f"publish of {n} rows carried columns of other lengths")
        if topic is None and topics is None:
            raise ArgumentError("a publish needs a topic, or one per row")
        rows = _Rows(topic, payloads, topics, keys, headers)
        if ids is not None:
            return self._publish_ids(rows, ids)
        todo = gaps(first, first + n, self.log.sink_covered(task, first, first + n))
        done: list[tuple[int, int, Receipt]] = []
        for a, b in todo:
            receipts = [self._send(rows, i, j) for i, j in rows.segments(a - first, b - first)]
            done.append((a, b, receipts[0]))
            self._wait(receipts)
        published = sum(b - a for a, b, _r in done)
        if done:
            self.log.sink_put_ranges(task, [(a, b, r.id.producer, r.id.seq)
                                            for a, b, r in done], time.time())
        self.counters.add("published", published)
        self.counters.add("publish_duplicates", n - published)
        return {"published": published, "duplicates": n - published}

    def _send(self, rows: _Rows, i: int, j: int) -> Receipt:
        """Publish rows i..j-1, of one topic and none with headers but the first."""
        topic = rows.topic_of(i)
        headers = None if rows.headers is None else rows.headers[i]
        if j - i == 1 or headers:
            key = None if rows.keys is None else rows.keys[i]
            return self.node.publish(topic, rows.payloads[i], key=key, headers=headers or None)
        keys = None if rows.keys is None else rows.keys[i:j]
        return self.node.publish_many(topic, rows.payloads[i:j], keys=keys)

    def _wait(self, receipts: list[Receipt]) -> None:
        deadline = time.monotonic() + self.publish_timeout_s
        for receipt in receipts:
            receipt.wait_stored(max(0.0, deadline - time.monotonic()))

    def _publish_ids(self, rows: _Rows, ids: list[str]) -> dict[str, int]:
        """Rows with ids of their own: each published once per id, with the id as
        ``msg_id`` (the node's own idempotency window covers a crash in between)."""
        encoded = [str(r).encode() for r in ids]
        seen = self.log.sink_filter(encoded)
        receipts: list[tuple[bytes, Receipt]] = []
        for i, rid in enumerate(encoded):
            if rid in seen:
                continue
            seen.add(rid)
            receipts.append((rid, self.node.publish(
                rows.topic_of(i), rows.payloads[i], msg_id=ids[i],
                key=None if rows.keys is None else rows.keys[i],
                headers=None if rows.headers is None else rows.headers[i] or None)))
        self._wait([r for _rid, r in receipts])
        if receipts:
            self.log.sink_put([(rid, r.id.producer, r.id.seq) for rid, r in receipts],
                              time.time())
        dups = len(ids) - len(receipts)
        self.counters.add("published", len(receipts))
        self.counters.add("publish_duplicates", dups)
        return {"published": len(receipts), "duplicates": dups}


class _Rows:
    """The columns of a publish's rows."""

    __slots__ = ("topic", "payloads", "topics", "keys", "headers")

    def __init__(self, topic: str | None, payloads: list[bytes], topics: list[str] | None,
                 keys: list[str | None] | None, headers: list[dict | None] | None) -> None:
        self.topic = topic
        self.payloads = payloads
        self.topics = topics
        self.keys = keys
        self.headers = headers

    def topic_of(self, i: int) -> str:
        return str(self.topic if self.topic is not None else self.topics[i])  # type: ignore[index]

    def segments(self, i: int, j: int) -> Iterator[tuple[int, int]]:
        """Rows i..j-1 in stretches of one topic, each row with headers a stretch alone."""
        if self.topic is not None and self.headers is None:
            yield i, j
            return
        start = i
        for k in range(i + 1, j + 1):
            if k == j or self.topic_of(k) != self.topic_of(start) or (
                    self.headers is not None and (self.headers[k] or self.headers[start])):
                yield start, k
                start = k
