"""A client of one bridge: request/reply over a DEALER, bounded in time and attempts.

Every request is idempotent (info moves watermarks forward only, fetch reads, publish is
deduplicated by row id), so a request that times out is simply sent again.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import zmq

from ..errors import DecodeError
from ._errors import BridgeError
from ._options import check_endpoint
from ._wire import Reply, Request, decode_reply, encode_request

if TYPE_CHECKING:
    from ._rows import Chunk

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_ATTEMPTS = 3


class LogInfo(NamedTuple):
    """What a bridge says of its log: its id, its streams ``topic/partition`` -> (head,
    end, record bytes ever appended), and the topics it consumes (None: a bridge of an
    older zmesh does not say)."""

    log_id: str
    streams: dict[str, tuple[int, int, int]]
    topics: tuple[str, ...] | None


class BridgeClient:
    """Talks to the bridge at ``endpoint``; one per thread (ZeroMQ sockets are not shared)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self._token = secrets.randbelow(1 << 30)
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            if self._ctx is None:
                self._ctx = zmq.Context()
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def close(self) -> None:
        self._reset()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> BridgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, kind: str, args: dict[str, Any], parts: tuple[bytes, ...] = ()) -> Reply:
        """Send a request and return the bridge's reply; BridgeError when it fails."""
        return next(self.calls(kind, [(args, parts)], window=1))

    def calls(
        self, kind: str, requests: Iterable[tuple[dict[str, Any], tuple[bytes, ...]]], window: int
    ) -> Iterator[Reply]:
        """Send ``requests`` keeping up to ``window`` of them unanswered, and yield their
        replies in their order. A request unanswered within the timeout is sent again,
        with those after it (on a new socket: what the old one receives is lost), up to
        ``attempts`` times; BridgeError when it fails."""
        pending: deque[tuple[int, list[bytes]]] = deque()  # (token, frames), oldest first
        replies: dict[int, Reply] = {}
        todo = iter(requests)
        attempt, deadline = 1, 0.0
        try:
            while True:
                while len(pending) < window and (req := next(todo, None)) is not None:
                    self._token += 1
                    pending.append((self._token, encode_request(Request(kind, self._token, *req))))
                    self._socket().send_multipart(pending[-1][1], copy=False)
                    if len(pending) == 1:
                        deadline = time.monotonic() + self.timeout_s
                if not pending:
                    return
                token = pending[0][0]
                while token not in replies and (left := deadline - time.monotonic()) > 0:
                    sock = self._socket()
                    if not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                        continue
                    try:
                        rep = decode_reply(sock.recv_multipart())
                    except DecodeError:
                        continue
                    if any(rep.token == t for t, _f in pending):  # (else: of an attempt
                        replies[rep.token] = rep  # given up on)
                answer = replies.pop(token, None)
                if answer is None:
                    if attempt >= self.attempts:
                        raise BridgeError(
                            f"bridge {self.endpoint} did not answer {kind!r} "
                            f"within {self.timeout_s:g}s, {self.attempts} times"
                        )
                    attempt += 1
                    self._reset()
                    for _t, frames in pending:
                        self._socket().send_multipart(frames, copy=False)
                    deadline = time.monotonic() + self.timeout_s
                    continue
                if not answer.ok:
                    raise BridgeError(f"bridge {self.endpoint} refused {kind}: {answer.error}")
                pending.popleft()
                attempt, deadline = 1, time.monotonic() + self.timeout_s
                yield answer
        except zmq.ZMQError as exc:
            raise BridgeError(f"bridge {self.endpoint}: {exc}") from exc

    # -- requests -------------------------------------------------------------------------

    def bounds(
        self,
        *,
        reader: str | None = None,
        topics: list[str] | None = None,
        watermark: dict[str, int] | None = None,
    ) -> LogInfo:
        """The bridge log's id, streams and topics; with ``reader``, also registers it and
        moves its watermarks up to ``watermark``."""
        args: dict[str, Any] = {}
        if reader is not None:
            args = {"reader": reader, "topics": topics, "wm": dict(watermark or {})}
        result = self.call("info", args).result
        streams = result.get("streams", {})
        consumed = result.get("topics")
        return LogInfo(
            str(result.get("log", "")),
            {
                name: (int(b[0]), int(b[1]), int(b[2]) if len(b) > 2 else 0)
                for name, b in streams.items()
            },
            None if consumed is None else tuple(map(str, consumed)),
        )

    def info(self, **kwargs: Any) -> dict[str, tuple[int, int]]:
        """Stream bounds ``topic/partition`` -> (head, end) (arguments as ``bounds``)."""
        return {name: (b[0], b[1]) for name, b in self.bounds(**kwargs).streams.items()}

    def fetch(
        self, stream: str, start: int, end: int, max_records: int
    ) -> tuple[int, list[tuple[int, bytes]]]:
        """(the first offset retained from ``start`` on, [(a run's first offset, its
        record)]) of ``stream`` in [start, end): see ``BridgeLog.read``."""
        rep = self.call("fetch", {"stream": stream, "start": start, "end": end, "max": max_records})
        starts = rep.result["starts"]
        if len(starts) != len(rep.parts):
            raise BridgeError(
                f"bridge {self.endpoint} sent {len(rep.parts)} records for {len(starts)} runs"
            )
        return int(rep.result["first"]), list(zip(map(int, starts), rep.parts, strict=True))

    def publish(
        self, task: str, chunks: Iterable[Chunk], topic: str | None, window: int = 1
    ) -> Iterator[dict[str, int]]:
        """Publish chunks of the sink task ``task``'s rows, up to ``window`` of them
        unanswered; yields each one's counts once its rows are stored. The bridge waits
        for room in its node's outbox at most half this client's timeout (``wait``), so
        that its answer, an error if no room came, arrives in time."""
        wait = self.timeout_s / 2
        requests = (
            (
                {
                    "task": task,
                    "first": c.first,
                    "n": len(c.payloads),
                    "topic": topic,
                    "wait": wait,
                },
                c.frames(),
            )
            for c in chunks
        )
        for rep in self.calls("publish", requests, window):
            yield {k: int(v) for k, v in rep.result.items()}

    def drop_reader(self, reader: str) -> bool:
        return bool(self.call("drop", {"reader": reader}).result.get("dropped"))
