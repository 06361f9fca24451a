"""What a bridge answers on its ROUTER: stream bounds and reader watermarks (``info``),
offset ranges (``fetch``), sink rows to publish (``publish``) and ``drop``. Runs on the
bridge thread, which owns the socket and the log's writes.

A publish is answered only once every new row is stored in the node's outbox; its row ids
are then remembered in the log, and also given to ``Node.publish`` as ``msg_id`` so the
node itself drops a row stored before a crash kept the bridge from remembering it.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

import zmq

from .._engine.stats import Counters
from ..errors import ArgumentError, DecodeError, ZMeshError
from ..node import Node
from ._log import BridgeLog
from ._wire import Reply, Request, decode_request, encode_reply

log = logging.getLogger(__name__)

RECV_BURST = 64
FETCH_MAX_RECORDS = 50_000
_PUBLISH_TAKES_MSG_ID = "msg_id" in inspect.signature(Node.publish).parameters


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
            first, records = self.log.read(stream, start, end, limit)
            self.counters.add("fetches", 1)
            self.counters.add("records_served", len(records))
            return Reply(req.token, True, {"first": first}, parts=tuple(records))
        if req.kind == "info":
            reader = args.get("reader")
            if reader is not None:
                topics = args.get("topics")
                wm = {str(k): int(v) for k, v in dict(args.get("wm") or {}).items()}
                self.log.set_watermark(str(reader), None if topics is None
                                       else [str(t) for t in topics], wm, time.time())
            streams = {k: list(v) for k, v in self.log.streams().items()}
            return Reply(req.token, True, {"streams": streams})
        if req.kind == "publish":
            return Reply(req.token, True, self._publish(args["rows"], req.parts))
        return Reply(req.token, True, {"dropped": self.log.drop_reader(str(args["reader"]))})

    def _publish(self, rows: list, payloads: tuple[bytes, ...]) -> dict[str, int]:
        """Publish sink rows not published before; reply only once they are stored."""
        if len(rows) != len(payloads):
            raise ArgumentError(f"publish of {len(rows)} rows carried {len(payloads)} payloads")
        seen = self.log.sink_filter([str(r[0]).encode() for r in rows])
        receipts = []
        dups = 0
        for (rid, topic, key, headers), payload in zip(rows, payloads, strict=True):
            rid_b = str(rid).encode()
            if rid_b in seen:
                dups += 1
                continue
            seen.add(rid_b)
            kw: dict[str, Any] = {"key": key, "headers": headers}
            if _PUBLISH_TAKES_MSG_ID:
                kw["msg_id"] = str(rid)
            receipts.append((rid_b, self.node.publish(str(topic), payload, **kw)))
        deadline = time.monotonic() + self.publish_timeout_s
        for _rid, receipt in receipts:
            receipt.wait_stored(max(0.0, deadline - time.monotonic()))
        if receipts:
            self.log.sink_put([(rid, r.id.producer, r.id.seq) for rid, r in receipts],
                              time.time())
        self.counters.add("published", len(receipts))
        self.counters.add("publish_duplicates", dups)
        return {"published": len(receipts), "duplicates": dups}
