"""Reopening a producer's outbox at a start: its lanes rebuilt from LMDB (IO thread).

Everything unacked is pending again. A pending entry that cannot be decoded is rebuilt
from its outbox record (attempt 0) when that record is sound; the damaged value itself is
set aside by the engine.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._store.damage import decode_record
from .._store.store import WriteBatch, pack
from .lane import Lane
from .staging import mono_at, mono_offset

if TYPE_CHECKING:
    from .producer import Producer

log = logging.getLogger(__name__)


def load_outbox(producer: Producer, now: float, batch: WriteBatch) -> None:
    """Rebuild the lanes of ``producer`` and its outbox depth from LMDB after a start."""
    by_id: dict[int, Lane] = {}
    for topic, name, lane_id, group, mode in producer.store.iter_lanes():
        by_id[lane_id] = producer._add_lane(topic, name, lane_id, group, mode)
    offset = mono_offset()
    for lane in by_id.values():
        lane.begin_bulk()
    for lane_id, seq, (partition, priority, attempt, expires_at, deliver_at) in \
            producer.store.iter_pending():
        owing = by_id.get(lane_id)
        if owing is None:
            log.error("pending entry %d of unknown lane %d is skipped", seq, lane_id)
            continue
        owing.add(seq, partition, priority, attempt, now=now,
                  not_before=mono_at(deliver_at, offset),
                  expires_at=mono_at(expires_at, offset))
    for c in producer.store.corrupt:
        if c.db == "pend" and len(c.key) == 12:
            _rebuild_pending(producer, by_id, c.key, now, offset, batch)
    of_topic: dict[str, list[Lane]] = {}
    for lane in by_id.values():
        lane.end_bulk()
        of_topic.setdefault(lane.topic, []).append(lane)
    # Retained messages stay in ``msgs`` after they are settled: the outbox is what some
    # lane still owes, each message counted once (a topic's lanes owe the same ones).
    producer.depth = len(producer._mem) + sum(
        len(lanes[0]) if len(lanes) == 1 else len(set().union(*(ln.seqs() for ln in lanes)))
        for lanes in of_topic.values())
    producer.dead.load()
    if producer.depth:
        log.info("outbox reopened with %d unacknowledged messages", producer.depth)


def _rebuild_pending(producer: Producer, by_id: dict[int, Lane], key: bytes, now: float,
                     offset: float, batch: WriteBatch) -> None:
    lane_id, seq = int.from_bytes(key[:4], "big"), int.from_bytes(key[4:], "big")
    lane = by_id.get(lane_id)
    raw = producer.store.get_messages([seq]).get(seq)
    fields = None if raw is None else decode_record(raw)
    if lane is None or fields is None:
        log.error("pending entry %d of lane %d is damaged and cannot be rebuilt", seq,
                  lane_id)
        return
    _t, partition, _k, _h, priority, _p, expires_at, deliver_at, _pl, _i = fields
    lane.add(seq, partition, priority, 0, now=now, not_before=mono_at(deliver_at, offset),
             expires_at=mono_at(expires_at, offset))
    batch.pend_put.append((key, pack([partition, priority, 0, expires_at, deliver_at])))
    log.warning("pending entry %d of lane %s/%s rebuilt from its outbox record", seq,
                lane.topic, lane.name)
