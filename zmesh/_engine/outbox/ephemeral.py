"""Sending to ephemeral subscriptions (IO thread): what a producer stores while such a
subscriber is connected is sent to it once, right after the commit, at most once.

No lane, no pending entry, no ack, nothing remembered: a subscriber that is gone, or whose
pipe has no room (a slow one), misses the messages, counted in ``ephemeral_dropped``.
Messages scheduled for later (``deliver_at``) are for groups only; an expired one is not
sent. A subscription may name a pattern (``mesh.ephemeral`` finds them by topic); one
with ``deliver="last_per_key"`` is first sent the values kept of the topics it matches
(``send_kept``), when the producer learns of it.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any

import zmq

from ..._protocol.codec import MAX_BATCH_HEADER_BYTES, encode_lane_batch, pack_columns
from ..stats import Counters
from .publishes import AnyPublish, Publish
from .record import Record

if TYPE_CHECKING:
    from ..._protocol.frames import SubInfo
    from ..mesh import Mesh
    from ..peers import Peer
    from .kept import Kept


class _Columns:
    """The messages of one topic to send, a column per field."""

    __slots__ = ("seqs", "partitions", "keys", "headers", "published_ats", "payloads")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.partitions: list[int] = []
        self.keys: list[str | None] = []
        self.headers: list[dict[str, Any] | None] = []
        self.published_ats = array("d")
        self.payloads: list[bytes] = []

    def add(self, p: AnyPublish, wall: float) -> None:
        if isinstance(p, Publish):
            if p.deliver_at is not None or (p.expires_at is not None and p.expires_at <= wall):
                return
            self.seqs.append(p.seq)
            self.partitions.append(p.partition)
            self.keys.append(p.key)
            self.headers.append(p.headers)
            self.published_ats.append(p.published_at)
            self.payloads.append(p.payload)
            return
        n = p.count
        self.seqs.extend(range(p.seq, p.seq + n))
        self.partitions.extend(p.partitions)
        self.keys.extend(repeat(None, n) if p.keys is None else p.keys)
        self.headers.extend(repeat(p.headers, n))
        at = p.published_at
        self.published_ats.extend(array("d", (at,)) * n if isinstance(at, float) else at)
        self.payloads.extend(p.payloads)

    def add_record(self, seq: int, r: Record) -> None:
        self.seqs.append(seq)
        self.partitions.append(r.partition)
        self.keys.append(r.key)
        self.headers.append(r.headers)
        self.published_ats.append(r.published_at)
        self.payloads.append(r.payload)


def send_ephemeral(
    mesh: Mesh, pubs: Iterable[AnyPublish], node_id: bytes, incarnation: int, counters: Counters
) -> None:
    """Send ``pubs`` (just stored) to the ephemeral subscriptions of their topics."""
    wall = time.time()
    by_topic: dict[str, _Columns] = {}
    subscribers = mesh.ephemeral
    for p in pubs:
        if subscribers.match(p.topic):
            columns = by_topic.get(p.topic)
            if columns is None:
                columns = by_topic[p.topic] = _Columns()
            columns.add(p, wall)
    for topic, columns in by_topic.items():
        for peer, info in subscribers.match(topic):
            sent, dropped = _send(peer, info, topic, columns, node_id, incarnation)
            counters.add("sent_ephemeral", sent)
            counters.add("ephemeral_dropped", dropped)


def send_kept(
    peer: Peer, info: SubInfo, kept: Kept, node_id: bytes, incarnation: int, counters: Counters
) -> None:
    """Send a new ``last_per_key`` subscription the values kept of the topics it
    matches (at most once, as everything sent to it)."""
    for topic in kept.topics(info.topic):
        columns = _Columns()
        for seq, record in kept.latest(topic):
            columns.add_record(seq, record)
        sent, dropped = _send(peer, info, topic, columns, node_id, incarnation)
        counters.add("sent_ephemeral", sent)
        counters.add("ephemeral_dropped", dropped)


def _send(
    peer: Peer, info: SubInfo, topic: str, c: _Columns, node_id: bytes, incarnation: int
) -> tuple[int, int]:
    """Send ``c`` to one subscription in batches; returns (sent, dropped)."""
    places = list(range(len(c.seqs)))
    too_large = [i for i in places if len(c.payloads[i]) > info.max_message_bytes]
    if too_large:
        skip = set(too_large)
        places = [i for i in places if i not in skip]
    sent = 0
    start, n = 0, len(places)
    while start < n:
        end = min(start + info.batch_size, n)
        while True:
            part = places[start:end]
            frames = encode_lane_batch(
                node_id,
                incarnation,
                topic,
                info.group,
                0,
                b"\x01" * len(part),
                pack_columns(
                    [c.seqs[i] for i in part],
                    [c.partitions[i] for i in part],
                    [c.keys[i] for i in part],
                    [c.headers[i] for i in part],
                    [c.published_ats[i] for i in part],
                    [None] * len(part),
                    [c.payloads[i] for i in part],
                ),
            )
            if len(frames[0]) <= MAX_BATCH_HEADER_BYTES or end - start == 1:
                break
            end = start + (end - start) // 2  # (long keys and large headers)
        try:
            peer.send_batch(frames)
        except zmq.Again:  # a slow subscriber (or one that is gone): at most once
            break
        sent += end - start
        start = end
    return sent, len(too_large) + n - sent
