"""Parking, listing, replaying and purging dead letters (IO thread only).

``dead`` values are msgpack ``[state, reason, attempts, failed_at, history, record]``;
state PARKED is listed and never delivered; state REPLAYED is kept only to carry the
history until the replayed message is settled again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator
from typing import Any

from ..._receipt import MessageId
from ..._store.damage import decode_record
from ..._store.store import Store, WriteBatch, pack, pend_key, u64, unpackb
from ...deadletters import DeadLetter
from ...errors import StoreError
from ..lane.delivery import Entry
from ..lane.lane import Lane
from .lanes import UNCLAIMED, Lanes
from .outcomes import Outcomes
from .owing import mono_at, mono_offset
from .records import Records
from .retained import Retained
from .retention import retains

log = logging.getLogger(__name__)

PARKED = 0
REPLAYED = 1


class DeadLetters:
    """The dead-letter store of one producer."""

    def __init__(
        self,
        store: Store,
        lanes: Lanes,
        records: Records,
        retained: Retained,
        outcomes: Outcomes,
        node_id: bytes,
    ) -> None:
        self.store = store
        self.lanes = lanes
        self.records = records
        self.retained = retained
        self.outcomes = outcomes
        self.producer = node_id.hex()
        self.replayed: set[tuple[int, int]] = set()  # (lane id, seq)

    def load(self) -> None:
        for lane_id, seq, value in self.store.iter_all_dead():
            if value[0] == REPLAYED:
                self.replayed.add((lane_id, seq))

    def park(self, lane: Lane, entry: Entry, reason: str, batch: WriteBatch) -> None:
        try:
            old = self.store.get_dead(lane.id, entry.seq)
        except StoreError:  # (a damaged store, said by its health: parked without history)
            old = None
        history = list(old[4]) if old else []
        now = time.time()
        history.append([now, entry.attempt, reason])
        self.replayed.discard((lane.id, entry.seq))
        batch.dead_put.append(
            (
                pend_key(lane.id, entry.seq),
                pack([PARKED, reason, entry.attempt, now, history, self.records.packed(entry.seq)]),
            )
        )
        self.lanes.count(lane, "dead_lettered", 1)
        log.warning(
            "message %d of %s parked in dead letters of %s: %s",
            entry.seq,
            lane.topic,
            lane.name,
            reason,
        )

    def settled(self, lane: Lane, seqs: Collection[int], batch: WriteBatch) -> None:
        """Replayed messages were settled: their history is no longer needed."""
        for seq in seqs:
            if (lane.id, seq) in self.replayed:
                self.replayed.discard((lane.id, seq))
                batch.dead_del.append(pend_key(lane.id, seq))

    def forget_lane(self, lane: Lane) -> int:
        """A retired lane's dead letters go with it (deleted with its entries): returns
        how many were parked."""
        parked = self.parked(lane) or 0  # (before its replayed ones are forgotten)
        self.replayed = {(lid, seq) for lid, seq in self.replayed if lid != lane.id}
        return parked

    def parked(self, lane: Lane) -> int | None:
        """How many dead letters of ``lane`` are parked: its ``dead`` entries, counted by
        their keys alone (no value decoded: every status reply asks), less those replayed
        and not yet settled again, which ``replayed`` holds. None when the store cannot
        count them (it is damaged: its status says so)."""
        try:
            count = self.store.count_dead(lane.id)
        except StoreError:
            return None
        return count - sum(1 for lid, _seq in self.replayed if lid == lane.id)

    def _lanes(self, topic: str, group: str) -> list[Lane]:
        return [
            lane
            for lane in self.lanes.of_topic(topic)
            if lane.name != UNCLAIMED and lane.group == group
        ]

    def list(self, topic: str, group: str, limit: int) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for lane in self._lanes(topic, group):
            for seq, value in self.store.iter_dead(lane.id):
                state, reason, attempts, failed_at, history, record = value
                if state != PARKED:
                    continue
                key: str | None = None
                headers: dict[str, Any] | None = None
                payload = b""
                fields = decode_record(record) if record else None
                if fields is not None:
                    key, headers, payload = fields[2], fields[3], fields[8]
                out.append(
                    DeadLetter(
                        MessageId(self.producer, seq),
                        topic,
                        group,
                        lane.name,
                        key,
                        payload,
                        headers or {},
                        reason,
                        attempts,
                        failed_at,
                        tuple((float(h[0]), int(h[1]), str(h[2])) for h in history),
                    )
                )
                if len(out) >= limit:
                    return out
        return out

    def _select(
        self, topic: str, group: str, seqs: Collection[int] | None, batch: WriteBatch
    ) -> Iterator[tuple[Lane, int, Any]]:
        # A replay or purge taken earlier in this iteration wrote to ``batch``, not yet to
        # the store: what it replayed or purged is no longer parked.
        written = {key for key, _value in batch.dead_put}.union(batch.dead_del)
        for lane in self._lanes(topic, group):
            for seq, value in list(self.store.iter_dead(lane.id)):
                if (
                    value[0] == PARKED
                    and (seqs is None or seq in seqs)
                    and pend_key(lane.id, seq) not in written
                ):
                    yield lane, seq, value

    def replay(
        self, topic: str, group: str, seqs: Collection[int] | None, batch: WriteBatch, now: float
    ) -> int:
        """Make parked messages owed to their lane again; returns how many."""
        count = 0
        records = self.records
        offset = mono_offset()
        for lane, seq, value in self._select(topic, group, seqs, batch):
            _state, reason, attempts, failed_at, history, record = value
            if record is None:
                log.error("dead letter %d of %s/%s has no record; purge it", seq, topic, lane.name)
                continue
            fields = unpackb(record)
            partition, priority, expires_at = fields[1], fields[4], fields[6]
            in_outbox = self.lanes.owed(topic, seq)
            if not in_outbox:
                records.depth += 1
            # (its ttl still holds, as the pend entry below keeps it for a restart)
            lane.add(seq, partition, priority, 0, now=now, expires_at=mono_at(expires_at, offset))
            batch.dead_put.append(
                (
                    pend_key(lane.id, seq),
                    pack([REPLAYED, reason, attempts, failed_at, history, None]),
                )
            )
            if not records.runs.owe_again(lane, lane.id, seq, in_outbox, batch):
                if not in_outbox:  # (a run still stored holds its record)
                    if retains(self.lanes.config(topic)) and not self._stored(seq):
                        self.retained.index_again(topic, seq, fields, len(record), batch)
                    batch.msgs_put.append((u64(seq), record))
                    batch.msgs_bytes += len(record)
                batch.pend_put.append(
                    (pend_key(lane.id, seq), pack([partition, priority, 0, expires_at, None]))
                )
            self.replayed.add((lane.id, seq))
            self.outcomes.forget(lane.name, (seq,))  # (pending again, not dead-lettered)
            self.lanes.count(lane, "dead_replayed", 1)
            count += 1
        return count

    def _stored(self, seq: int) -> bool:
        """Whether the record of ``seq`` is still stored: a settled message of a topic
        that retains keeps it until retention reclaims it, with its index entry."""
        return seq in self.records.mem or bool(self.store.get_messages([seq]))

    def purge(self, topic: str, group: str, seqs: Collection[int] | None, batch: WriteBatch) -> int:
        """Delete parked messages for good; returns how many (counted as purged)."""
        count = 0
        for lane, seq, _value in self._select(topic, group, seqs, batch):
            batch.dead_del.append(pend_key(lane.id, seq))
            count += 1
        self.lanes.counters.add("dead_purged", count)
        return count
