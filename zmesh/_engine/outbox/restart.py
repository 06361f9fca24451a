"""Reopening a producer's outbox at a start: its lanes rebuilt from LMDB (IO thread).

Everything unacked is pending again. A pending entry that cannot be decoded is rebuilt
from its outbox record (attempt 0) when that record is sound; the damaged value itself is
set aside by the engine.
"""

from __future__ import annotations

import logging

from ..._store.damage import decode_run
from ..._store.store import Store, WriteBatch
from ..._subjects import is_pattern
from ..lane.lane import Lane
from .deadletters import DeadLetters
from .lanes import Lanes
from .owing import mono_at, mono_offset, owe_record
from .patterns import PatternGroups
from .records import Records
from .runs import Run, run_entry

log = logging.getLogger(__name__)


def load_outbox(
    store: Store,
    lanes: Lanes,
    records: Records,
    dead: DeadLetters,
    patterns: PatternGroups,
    now: float,
    batch: WriteBatch,
) -> None:
    """Rebuild a producer's lanes (and the groups it knows by pattern) and its outbox
    depth from LMDB after a start."""
    by_id: dict[int, Lane] = {}
    for topic, name, lane_id, group, mode, idle_since, assigned in store.iter_lanes():
        if is_pattern(topic):  # (a pattern group: no message is owed under its id)
            patterns.load(topic, name, lane_id, group, mode, idle_since)
            continue
        by_id[lane_id] = lanes.add(topic, name, group, mode, None, lane_id, idle_since, assigned)
    offset = mono_offset()
    for lane in by_id.values():
        lane.begin_bulk()
    for lane_id, seq, (
        partition,
        priority,
        attempt,
        expires_at,
        deliver_at,
    ) in store.iter_pending():
        owing = by_id.get(lane_id)
        if owing is None:
            log.error("pending entry %d of unknown lane %d is skipped", seq, lane_id)
            continue
        owing.add(
            seq,
            partition,
            priority,
            attempt,
            now=now,
            not_before=mono_at(deliver_at, offset),
            expires_at=mono_at(expires_at, offset),
        )
    _load_runs(store, records, by_id, now)
    for c in store.corrupt:
        if c.db == "pend" and len(c.key) == 12:
            _rebuild_pending(records, by_id, c.key, now, offset, batch)
        elif c.db == "pruns" and len(c.key) == 12:
            _rebuild_run_entry(store, records, by_id, c.key, now, batch)
    of_topic: dict[str, list[Lane]] = {}
    for lane in by_id.values():
        lane.end_bulk()
        of_topic.setdefault(lane.topic, []).append(lane)
    # Retained messages stay in ``msgs`` after they are settled: the outbox is what some
    # lane still owes, each message counted once (a topic's lanes owe the same ones).
    records.depth = len(records.mem) + sum(
        len(lanes[0]) if len(lanes) == 1 else len(set().union(*(ln.seqs() for ln in lanes)))
        for lanes in of_topic.values()
    )
    dead.load()
    if records.depth:
        log.info("outbox reopened with %d unacknowledged messages", records.depth)


def _rebuild_pending(
    records: Records,
    by_id: dict[int, Lane],
    key: bytes,
    now: float,
    offset: float,
    batch: WriteBatch,
) -> None:
    lane_id, seq = int.from_bytes(key[:4], "big"), int.from_bytes(key[4:], "big")
    lane = by_id.get(lane_id)
    r = records.read([seq]).get(seq)
    if lane is None or r is None:
        log.error("pending entry %d of lane %d is damaged and cannot be rebuilt", seq, lane_id)
        return
    owe_record(lane, seq, r, now, offset, batch)
    log.warning(
        "pending entry %d of lane %s/%s rebuilt from its outbox record", seq, lane.topic, lane.name
    )


def _load_runs(store: Store, records: Records, by_id: dict[int, Lane], now: float) -> None:
    """Owe each lane what its ``pruns`` entries say, and know the runs again. A run a lane
    owes whole, at its first attempt, joins it as a ``PlainRun``: no step per message (a
    lane's entries come in sequence order)."""
    runs: dict[int, Run] = {}
    in_outbox: dict[int, set[int] | None] = {}  # first -> offsets some lane owes (None: all)
    for lane_id, first, (partitions, offsets, attempts) in store.iter_pruns():
        owing = by_id.get(lane_id)
        if owing is None:
            log.error("run entry %d of unknown lane %d is skipped", first, lane_id)
            continue
        run = runs.get(first)
        if run is None:
            run = runs[first] = Run(first, len(partitions), owing.topic, partitions, 0, {})
            in_outbox[first] = set()
        owed = range(run.count) if offsets is None else offsets
        if not attempts and type(owed) is range:  # (whole, or its tail: joins at once)
            owing.add_stored(range(first + owed.start, first + owed.stop), partitions[owed.start :])
        else:
            for i, offset in enumerate(owed):
                owing.add(
                    first + offset, partitions[offset], 0, attempts[i] if attempts else 0, now=now
                )
        run.owed[lane_id] = len(owed)
        known = in_outbox[first]
        if offsets is None or known is None:
            in_outbox[first] = None
        else:
            known.update(offsets)
    for first, run in runs.items():
        known = in_outbox[first]
        run.left = run.count if known is None else len(known)
        records.runs.add(run)


def _rebuild_run_entry(
    store: Store,
    records: Records,
    by_id: dict[int, Lane],
    key: bytes,
    now: float,
    batch: WriteBatch,
) -> None:
    """A damaged ``pruns`` entry: the lane owes the whole run again (what it had acked
    comes again, and the consumers' dedupe window drops it), rebuilt from the record."""
    lane_id, first = int.from_bytes(key[:4], "big"), int.from_bytes(key[4:], "big")
    lane = by_id.get(lane_id)
    raw = store.get_runs([first]).get(first)
    fields = None if raw is None else decode_run(raw)
    if lane is None or fields is None:
        log.error("run entry %d of lane %d is damaged and cannot be rebuilt", first, lane_id)
        return
    partitions = fields[1]
    run = records.runs.find(first)
    if run is None:
        run = Run(first, len(partitions), lane.topic, partitions, 0, {})
        records.runs.add(run)
    run.left = run.count
    run.owed[lane_id] = run.count
    for seq, partition in zip(run.seqs(), partitions, strict=True):
        lane.add(seq, partition, now=now)  # (the lanes are loading: see load_outbox)
    batch.prun_put.append((key, run_entry(partitions)))
    log.warning("run entry %d of lane %s/%s rebuilt from its record", first, lane.topic, lane.name)
