"""What a bridge answers on its ROUTER: stream bounds and reader watermarks (``info``),
runs of offset ranges (``fetch``), sink rows to publish (``publish``, see
``_publisher.py``) and ``drop``. Runs on the bridge thread, which owns the socket and the
log's writes.
"""

from __future__ import annotations

import logging
import time

import zmq

from .._engine.stats import Counters
from ..errors import DecodeError, ZMeshError
from ..node import Node
from ._log import BridgeLog
from ._options import MAX_FETCH_RECORDS
from ._publisher import SinkPublisher
from ._wire import Reply, Request, decode_request, encode_reply

log = logging.getLogger(__name__)

RECV_BURST = 64
_ERRORS = (ZMeshError, ValueError, TypeError, KeyError)


class Service:
    """Request handlers of one bridge (bridge thread only)."""

    def __init__(
        self,
        blog: BridgeLog,
        node: Node,
        counters: Counters,
        topics: tuple[str, ...],
        publish_timeout_s: float,
    ) -> None:
        self.log = blog
        self.counters = counters
        self.topics = topics  # (the bridge consumes them: readers check theirs against them)
        self.publisher = SinkPublisher(blog, node, counters, publish_timeout_s)

    @property
    def busy(self) -> bool:
        """Whether publishes wait for the node to store their rows."""
        return self.publisher.busy

    def serve(self, router: zmq.Socket[bytes]) -> None:
        """Answer up to RECV_BURST requests waiting on the ROUTER (a publish once its rows
        are stored: see ``finish``)."""
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
            rep: Reply | None
            try:
                if req.kind == "publish":
                    rep = self.publisher.start(frames[0], req)
                else:
                    rep = self.handle(req)
            except _ERRORS as exc:
                self.counters.add("request_errors", 1)
                rep = Reply(req.token, False, error=str(exc) or type(exc).__name__)
            if rep is not None:
                self._send(router, frames[0], rep)

    def finish(self, router: zmq.Socket[bytes]) -> None:
        """Answer the publishes whose rows are now stored."""
        for route, rep in self.publisher.finished(time.monotonic()):
            self._send(router, route, rep)

    def _send(self, router: zmq.Socket[bytes], route: bytes, rep: Reply) -> None:
        try:
            router.send_multipart([route, *encode_reply(rep)], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.counters.add("replies_dropped", 1)

    def handle(self, req: Request) -> Reply:
        args = req.args
        if req.kind == "fetch":
            stream, start, end = str(args["stream"]), int(args["start"]), int(args["end"])
            limit = max(1, min(int(args.get("max", MAX_FETCH_RECORDS)), MAX_FETCH_RECORDS))
            first, runs = self.log.read(stream, start, end, limit)
            self.counters.add("fetches", 1)
            self.counters.add("runs_served", len(runs))
            return Reply(
                req.token,
                True,
                {"first": first, "starts": [s for s, _r in runs]},
                parts=tuple(r for _s, r in runs),
            )
        if req.kind == "info":
            reader = args.get("reader")
            if reader is not None:
                topics = args.get("topics")
                wm = {str(k): int(v) for k, v in dict(args.get("wm") or {}).items()}
                self.log.set_watermark(
                    str(reader),
                    None if topics is None else [str(t) for t in topics],
                    wm,
                    time.time(),
                )
            streams = {k: list(v) for k, v in self.log.stream_sizes().items()}
            return Reply(
                req.token,
                True,
                {"log": self.log.log_id, "streams": streams, "topics": list(self.topics)},
            )
        return Reply(req.token, True, {"dropped": self.log.drop_reader(str(args["reader"]))})
