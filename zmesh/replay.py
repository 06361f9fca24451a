"""Replay: read a topic's stored messages by index, from every producer, then follow it."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

from ._engine.inbox.origin import Origin
from ._protocol.addresses import endpoint
from ._protocol.codec import decode_control, encode_control
from ._protocol.frames import FetchReply, FetchRequest, random_token
from ._security import client_options
from .config import check_max_messages
from .errors import DecodeError, NodeStateError
from .subscription import Message

if TYPE_CHECKING:
    from ._engine.engine import Engine

__all__ = ["ReplayReader"]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05  # a caught-up reader asks its producers again this often
REQUEST_TIMEOUT_S = 5.0  # a producer that does not answer within this is asked again
REFRESH_PEERS_S = 1.0  # a following reader looks for new producers this often


@dataclass(slots=True)
class _Source:
    """One producer the reader fetches from, and its cursor per partition."""

    node_id: bytes
    sock: zmq.Socket[bytes]
    ctrl_ep: str
    cursors: dict[int, int] = field(default_factory=dict)
    token: int | None = None  # of the request awaiting its reply
    sent_at: float = 0.0
    caught_up: bool = False
    failures: int = 0


class ReplayReader:
    """Messages of a topic from every producer's stored history, by index.

    Made by ``Node.replay``. Iterate it: per producer and partition, messages come in index
    order from ``from_index``; a following reader then goes on with messages published
    later, until ``close()`` (or its node closes); a reader with ``follow=False`` ends once
    it has caught up with every producer. Readers do not ack and do not affect groups.

    ``gaps``: how many indexes the reader had to skip because the producer no longer holds
    them (reclaimed by retention, or acked on a topic without retention);
    ``gap_ranges`` lists them as ``(producer id, partition, first missing, next present)``.

    The reader asks producers over their control sockets with its own sockets, which only
    the iterating thread uses; ``close()`` may be called from any thread.
    """

    def __init__(
        self,
        engine: Engine,
        topic: str,
        from_index: int,
        *,
        follow: bool,
        partitions: Collection[int] | None,
        producers: Collection[str] | None,
        batch_size: int,
    ) -> None:
        self.topic = topic
        self.from_index = from_index
        self.follow = follow
        self.gaps = 0
        self.gap_ranges: list[tuple[str, int, int, int]] = []
        self.unreachable: set[str] = set()  # producers that did not answer (follow=False)
        self._engine = engine
        self._partitions = None if partitions is None else sorted(set(partitions))
        self._producers = None if producers is None else set(producers)
        self._batch_size = batch_size
        self._ctx = zmq.Context()
        self._sources: dict[bytes, _Source] = {}
        self._poller = zmq.Poller()
        self._buffer: deque[Message] = deque()
        self._closed = threading.Event()
        self._lock = threading.Lock()  # held while the reader's sockets are in use
        self._refreshed_at = 0.0
        self._max_bytes = engine.config.max_message_bytes + (2 << 20)
        try:
            with self._lock:
                self._refresh(time.monotonic())
        except BaseException:
            self._close_sockets()
            raise

    # -- producers ----------------------------------------------------------------------

    def _refresh(self, now: float) -> None:
        """Add a source for every live producer (this node included) not yet known."""
        self._refreshed_at = now
        engine = self._engine

        def live(_wb: object, _now: float) -> list[tuple[bytes, str, str, bytes]]:
            mesh = engine.mesh
            assert mesh is not None
            out = [
                (p.node_id, p.name, p.ctrl_ep, p.public_key)
                for p in mesh.peers.values()
                if p.alive and not p.is_self
            ]
            host = next(
                (i for i in engine.config.interfaces if i not in ("*", "0.0.0.0")), "127.0.0.1"
            )
            keys = engine.keys
            out.append(
                (
                    engine.node_id,
                    engine.config.name,
                    endpoint(host, engine.ctrl_port),
                    keys.public if keys is not None else b"",
                )
            )
            return out

        for node_id, name, ctrl_ep, key in engine.queue.call(live):
            if (
                self._producers is not None
                and node_id.hex() not in self._producers
                and name not in self._producers
            ):
                continue
            source = self._sources.get(node_id)
            if source is not None:
                if source.ctrl_ep == ctrl_ep:
                    continue
                # The producer restarted on other ports: same cursors, a new connection.
                self._poller.unregister(source.sock)
                source.sock.close(linger=0)
                source.sock = self._connect(ctrl_ep, key)
                source.ctrl_ep = ctrl_ep
                source.token = None
            else:
                source = _Source(node_id, self._connect(ctrl_ep, key), ctrl_ep)
                if self._partitions is not None:
                    source.cursors = dict.fromkeys(self._partitions, self.from_index)
                self._sources[node_id] = source
            self._poller.register(source.sock, zmq.POLLIN)

    def _connect(self, ctrl_ep: str, key: bytes) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_bytes)
        client_options(sock, self._engine.keys, key)
        sock.connect(ctrl_ep)
        return sock

    # -- fetching -----------------------------------------------------------------------

    def _round(self, now: float) -> None:
        """Ask every source without an outstanding request, then take the replies that
        arrive within one poll interval."""
        start = None if self._partitions is not None else self.from_index
        for source in self._sources.values():
            if source.token is not None and now - source.sent_at < REQUEST_TIMEOUT_S:
                continue
            if source.token is not None:  # timed out: ask again (a late reply is ignored)
                source.failures += 1
                if not self.follow:
                    self.unreachable.add(source.node_id.hex())
                    source.caught_up = True
                    source.token = None
                    continue
            if source.caught_up and not self.follow:
                continue
            source.token = random_token()
            source.sent_at = now
            req = FetchRequest(
                source.token,
                self.topic,
                tuple(source.cursors.items()),
                start,
                self._batch_size,
                self._engine.config.max_message_bytes,
            )
            try:
                source.sock.send(encode_control(req), zmq.NOBLOCK)
            except zmq.Again:
                source.token = None
        by_sock = {s.sock: s for s in self._sources.values()}
        waiting = [s for s in self._sources.values() if s.token is not None]
        if not waiting:
            return
        deadline = time.monotonic() + max(POLL_INTERVAL_S, 0.0)
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            events = dict(self._poller.poll(max(1, int(remaining * 1000))))
            for sock in events:
                self._receive(by_sock[sock], start)
            waiting = [s for s in self._sources.values() if s.token is not None]

    def _receive(self, source: _Source, start: int | None) -> None:
        while True:
            try:
                frame = source.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply = decode_control(frame, self._max_bytes)
            except DecodeError as exc:
                log.debug("dropped a bad fetch reply: %s", exc)
                continue
            if isinstance(reply, FetchReply) and reply.token == source.token:
                source.token = None
                self._take(source, reply, start)

    def _take(self, source: _Source, reply: FetchReply, start: int | None) -> None:
        cursors = source.cursors
        producer = source.node_id
        # The reply's messages share the columns of what they seldom are asked for.
        headers: list[dict[str, Any] | None] = []
        partitions: list[int] = []
        published_ats: list[float] = []
        indexes: list[int | None] = []
        seqs: list[int] = []
        origin = Origin(
            None,
            (producer, self.topic, ""),
            None,
            seqs,
            headers,
            b"",
            partitions,
            published_ats,
            indexes,
        )
        default = start if start is not None else 0
        for item in reply.items:
            pos = cursors.get(item.partition, default)
            if item.index < pos:
                continue  # already seen (a reply to a request that was retried)
            if item.index > pos:
                self._gap(producer, item.partition, pos, item.index)
            cursors[item.partition] = item.index + 1
            self._buffer.append(Message(origin, len(partitions), item.key, item.payload))
            seqs.append(item.seq)
            headers.append(item.headers)
            partitions.append(item.partition)
            published_ats.append(item.published_at)
            indexes.append(item.index)
        origin.attempts = bytes(len(partitions))  # (a reader's messages: attempt 0)
        origin.state = bytearray(len(partitions))  # (made with no messages yet)
        caught_up = True
        for head in reply.heads:
            pos = cursors.get(head.partition, default)
            if head.scanned > pos:
                self._gap(producer, head.partition, pos, head.scanned)
                pos = cursors[head.partition] = head.scanned
            elif head.partition not in cursors:
                cursors[head.partition] = pos
            if pos < head.next:
                caught_up = False
        source.caught_up = caught_up

    def _gap(self, producer: bytes, partition: int, first: int, present: int) -> None:
        self.gaps += present - first
        self.gap_ranges.append((producer.hex(), partition, first, present))

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        while True:
            if self._closed.is_set():
                raise StopIteration
            if self._buffer:
                return self._buffer.popleft()
            with self._lock:
                if self._closed.is_set():
                    raise StopIteration
                now = time.monotonic()
                try:
                    if self.follow and now - self._refreshed_at >= REFRESH_PEERS_S:
                        self._refresh(now)
                except NodeStateError:
                    self._close_sockets()
                    raise StopIteration from None
                self._round(now)
                done = all(s.caught_up and s.token is None for s in self._sources.values())
            if self._buffer:
                continue
            if done and not self.follow:
                self.close()
                raise StopIteration
            if done:
                self._closed.wait(POLL_INTERVAL_S)

    def read(self, max_messages: int = 1000) -> list[Message]:
        """Up to ``max_messages`` (an int >= 1) messages (fewer at the end of a reader
        that does not follow; a following reader waits for at least one)."""
        check_max_messages(max_messages)
        out = []
        for msg in self:
            out.append(msg)
            if len(out) >= max_messages or not self._buffer:
                break
        return out

    def close(self) -> None:
        """Stop reading; safe from any thread and more than once."""
        self._closed.set()
        with self._lock:
            self._close_sockets()

    def _close_sockets(self) -> None:
        for source in self._sources.values():
            source.sock.close(linger=0)
        self._sources.clear()
        if not self._ctx.closed:
            self._ctx.term()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> ReplayReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ReplayReader {self.topic} from {self.from_index} "
            f"{'following' if self.follow else 'to the end'} gaps={self.gaps}"
            f"{' closed' if self.closed else ''}>"
        )
