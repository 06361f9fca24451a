"""The producer half of a node: the outbox, its lanes, and what to send next.

Runs only on the IO thread. Publishes arrive as staged commands, are written to LMDB in
the loop's one transaction, and only then join their lanes, so nothing is sent before it
is stored. A message leaves the outbox when no lane of its topic owes it any more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._store.damage import decode_record
from .._store.store import Store, WriteBatch, pack, pend_key, u32, u64, unpackb
from ..config import TopicConfig
from .deadletters import DeadLetters
from .lane import IN_FLIGHT, Entry, Lane, Taken, Timing
from .retention import (
    RECLAIM_CHUNK,
    Head,
    Indexes,
    log_entry,
    partition_prefix,
    reclaimable,
    retains,
    topic_prefix,
)
from .stats import Counters

if TYPE_CHECKING:
    from .._receipt import Receipt

log = logging.getLogger(__name__)

UNCLAIMED = ""  # lane name of a topic's messages published before any group was known


@dataclass(slots=True)
class Publish:
    """A publish staged by a user thread for the IO thread to store."""

    seq: int
    topic: str
    partition: int
    key: str | None
    headers: dict | None
    payload: bytes
    priority: int
    published_at: float
    expires_at: float | None
    deliver_at: float | None
    receipt: Receipt | None
    msg_id: str | None = None


def _timing(cfg: TopicConfig) -> Timing:
    return Timing(cfg.ack_timeout_s, cfg.retry_backoff_s, cfg.max_retry_backoff_s,
                  cfg.max_attempts)


def _offset() -> float:
    """monotonic - wall clock, from two adjacent readings: what turns a UNIX time into a
    monotonic one. (Pairing the loop's ``now`` with a later wall reading would move every
    schedule earlier by the time in between.)"""
    return time.monotonic() - time.time()


def _mono(wall_at: float | None, offset: float) -> float:
    """A wall-clock instant on the monotonic clock (0.0 when unset)."""
    return wall_at + offset if wall_at else 0.0


class Producer:
    """Outbox, lanes and receipts of one node."""

    def __init__(self, store: Store, node_id: bytes, next_seq: int, next_lane: int,
                 topics: dict[str, TopicConfig], memory_budget_bytes: int,
                 counters: Counters) -> None:
        self.store = store
        self.node_id = node_id
        self.topics = topics
        self.counters = counters
        self.memory_budget_bytes = memory_budget_bytes
        self.lanes: dict[tuple[str, str], Lane] = {}
        self.lane_ids: dict[tuple[str, str], int] = {}
        self.lane_meta: dict[tuple[str, str], tuple[str, str]] = {}  # group, mode
        self.by_topic: dict[str, list[Lane]] = {}  # claimed lanes only
        self.next_seq = next_seq
        self._next_lane = next_lane
        self._receipts: dict[int, Receipt] = {}  # seq -> receipt someone waits to see acked
        self._mem: dict[int, bytes] = {}  # memory-durability records not yet spilled
        self._mem_bytes = 0
        self._spilled: list[tuple[int, bytes]] = []  # by the last stage(), for unstage()
        self._seq_written = next_seq  # next_seq as last staged: it never goes back
        self.depth = 0  # messages in the outbox
        self.stored: list[Receipt] = []
        self.acked: list[Receipt] = []
        self.duplicates: list[tuple[str, int, Receipt]] = []  # (topic, original seq, receipt)
        self._followers: dict[int, list[Receipt]] = {}  # receipts of suppressed duplicates
        self.dead = DeadLetters(self)
        self._latest: dict[tuple[str, str], dict[str, int]] = {}  # latest_wins: key -> seq
        self.indexes = Indexes(store.next_indexes())
        # What the last ``stage`` allocated, for ``unstage`` to give back: per topic the first
        # index of each partition, and per retaining topic the entries and record bytes.
        self._staged_first: dict[str, dict[int, int]] = {}
        self._staged_retained: dict[str, list[int]] = {}
        # topic -> [index entries, their record bytes]: what retention_bytes is held against
        self._log_totals: dict[str, list[int]] = {
            prefix[:-1].decode(): [n, size] for prefix, (n, size) in store.log_totals().items()}

    # -- configuration ------------------------------------------------------------------

    def topic_config(self, topic: str) -> TopicConfig:
        cfg = self.topics.get(topic)
        if cfg is None:
            cfg = self.topics[topic] = TopicConfig()
        return cfg

    def set_topic(self, topic: str, cfg: TopicConfig, batch: WriteBatch, now: float) -> None:
        self.topics[topic] = cfg
        if cfg.latest_wins:
            self.index_latest(topic)
        for (t, _name), lane in self.lanes.items():
            if t == topic:
                lane.timing = _timing(cfg)
        for group in cfg.groups:
            self.ensure_lane(topic, group, group, "shared", batch, now)

    # -- lanes --------------------------------------------------------------------------

    def ensure_lane(self, topic: str, name: str, group: str, mode: str, batch: WriteBatch,
                    now: float) -> Lane:
        """The lane of (topic, name), created and remembered durably when new."""
        key = (topic, name)
        lane = self.lanes.get(key)
        if lane is not None:
            return lane
        lane_id = self._next_lane
        self._next_lane += 1
        batch.meta_put[b"next_lane"] = lane_id_bytes(self._next_lane)
        batch.lanes_put.append((pack([topic, name]), pack([lane_id, group, mode])))
        lane = self._add_lane(topic, name, lane_id, group, mode)
        if name != UNCLAIMED:
            self._claim(topic, lane, batch, now)
        log.info("lane %s/%s (%s %s) is new at this producer", topic, name, mode, group)
        return lane

    def _add_lane(self, topic: str, name: str, lane_id: int, group: str, mode: str) -> Lane:
        cfg = self.topic_config(topic)
        lane = Lane(topic, name, producer=self.node_id, partitions=cfg.partitions,
                    timing=_timing(cfg))
        key = (topic, name)
        self.lanes[key] = lane
        self.lane_ids[key] = lane_id
        self.lane_meta[key] = (group, mode)
        if name != UNCLAIMED:
            self.by_topic.setdefault(topic, []).append(lane)
        return lane

    def _claim(self, topic: str, lane: Lane, batch: WriteBatch, now: float) -> None:
        """Messages published before any group was known go to the first groups learned."""
        unclaimed = self.lanes.get((topic, UNCLAIMED))
        if unclaimed is None or not len(unclaimed):
            return
        lanes = self.by_topic[topic]
        uid = self.lane_ids[(topic, UNCLAIMED)]
        seqs = sorted(unclaimed.seqs())
        log.info("%d messages of %s published before any group was known go to %s",
                 len(seqs), topic, [ln.name for ln in lanes])
        for seq in seqs:
            entry = unclaimed.entry(seq)
            assert entry is not None
            value = pack([entry.partition, entry.priority, 0, None, None])
            for target in lanes:
                target.add(seq, entry.partition, entry.priority, 0, now=now,
                           not_before=entry.not_before, expires_at=entry.expires_at)
                if seq not in self._mem:
                    batch.pend_put.append((pend_key(self.lane_ids[(topic, target.name)], seq),
                                           value))
            if seq not in self._mem:
                batch.pend_del.append(pend_key(uid, seq))
        unclaimed.ack(seqs)

    def load(self, now: float, batch: WriteBatch) -> None:
        """Rebuild lanes from LMDB after a start: everything unacked is pending again.

        A pending entry that cannot be decoded is rebuilt from its outbox record (attempt
        0) when that record is sound; the damaged value itself is set aside by the engine.
        """
        by_id: dict[int, Lane] = {}
        for topic, name, lane_id, group, mode in self.store.iter_lanes():
            by_id[lane_id] = self._add_lane(topic, name, lane_id, group, mode)
        offset = _offset()
        for lane in by_id.values():
            lane.begin_bulk()
        for lane_id, seq, (partition, priority, attempt, expires_at, deliver_at) in \
                self.store.iter_pending():
            owing = by_id.get(lane_id)
            if owing is None:
                log.error("pending entry %d of unknown lane %d is skipped", seq, lane_id)
                continue
            owing.add(seq, partition, priority, attempt, now=now,
                     not_before=_mono(deliver_at, offset),
                     expires_at=_mono(expires_at, offset))
        for c in self.store.corrupt:
            if c.db == "pend" and len(c.key) == 12:
                self._rebuild_pending(by_id, c.key, now, offset, batch)
        of_topic: dict[str, list[Lane]] = {}
        for lane in by_id.values():
            lane.end_bulk()
            of_topic.setdefault(lane.topic, []).append(lane)
        # Retained messages stay in ``msgs`` after they are settled: the outbox is what some
        # lane still owes, each message counted once (a topic's lanes owe the same ones).
        self.depth = len(self._mem) + sum(
            len(lanes[0]) if len(lanes) == 1 else len(set().union(*(ln.seqs() for ln in lanes)))
            for lanes in of_topic.values())
        self.dead.load()
        if self.depth:
            log.info("outbox reopened with %d unacknowledged messages", self.depth)

    def _rebuild_pending(self, by_id: dict[int, Lane], key: bytes, now: float, offset: float,
                         batch: WriteBatch) -> None:
        lane_id, seq = int.from_bytes(key[:4], "big"), int.from_bytes(key[4:], "big")
        lane = by_id.get(lane_id)
        raw = self.store.get_messages([seq]).get(seq)
        fields = None if raw is None else decode_record(raw)
        if lane is None or fields is None:
            log.error("pending entry %d of lane %d is damaged and cannot be rebuilt", seq,
                      lane_id)
            return
        _t, partition, _k, _h, priority, _p, expires_at, deliver_at, _pl, _i = fields
        lane.add(seq, partition, priority, 0, now=now, not_before=_mono(deliver_at, offset),
                 expires_at=_mono(expires_at, offset))
        batch.pend_put.append((key, pack([partition, priority, 0, expires_at, deliver_at])))
        log.warning("pending entry %d of lane %s/%s rebuilt from its outbox record", seq,
                    lane.topic, lane.name)

    # -- publishing ---------------------------------------------------------------------

    def prepare_lanes(self, pubs: list[Publish], batch: WriteBatch, now: float) -> None:
        """Create the lanes ``pubs`` need before staging them, so a publish that must be
        staged again later (a full map) never finds a lane that was not stored."""
        for p in pubs:
            if not self.by_topic.get(p.topic):
                self.ensure_lane(p.topic, UNCLAIMED, "", "unclaimed", batch, now)

    def unstage(self, pubs: list[Publish]) -> None:
        """Undo ``stage`` in memory after its commit failed: nothing of it was stored."""
        for topic, firsts in self._staged_first.items():
            for partition, first in firsts.items():
                self.indexes.release(topic, partition, first)
        for topic, (n, size) in self._staged_retained.items():
            totals = self._log_totals[topic]
            totals[0] -= n
            totals[1] -= size
        self._staged_first.clear()
        self._staged_retained.clear()
        for p in pubs:
            record = self._mem.pop(p.seq, None)
            if record is not None:
                self._mem_bytes -= len(record)
        for seq, record in self._spilled:
            self._mem[seq] = record
            self._mem_bytes += len(record)
        self._spilled.clear()

    def _suppress_duplicates(self, pubs: list[Publish], batch: WriteBatch) -> list[Publish]:
        """Drop publishes whose msg_id this node already published within the window."""
        ids = [p.msg_id.encode() for p in pubs if p.msg_id is not None]
        if not ids:
            return pubs
        known = self.store.lookup_ids(ids)
        fresh = []
        for p in pubs:
            if p.msg_id is None:
                fresh.append(p)
                continue
            mid = p.msg_id.encode()
            original = known.get(mid)
            if original is None:
                known[mid] = p.seq
                batch.ids_put.append((mid, p.seq, p.published_at))
                fresh.append(p)
                continue
            self.counters.add("duplicates_suppressed", 1)
            if p.receipt is not None:
                p.receipt._seq = original
                self.duplicates.append((p.topic, original, p.receipt))
        return fresh

    def stage(self, pubs: list[Publish], batch: WriteBatch) -> list[Publish]:
        """Write publishes into the batch (after ``prepare_lanes``); returns those to add to
        lanes after commit."""
        wall = time.time()
        self._spilled.clear()
        first_index = self._staged_first
        first_index.clear()
        retained = self._staged_retained
        retained.clear()
        pubs = self._suppress_duplicates(pubs, batch)
        msgs_put, pend_put, mem = batch.msgs_put, batch.pend_put, self._mem
        # What is the same for every publish of a topic, looked up once per topic and stage:
        # durability, retention, lane key prefixes, next indexes, first indexes staged.
        topics: dict[str, tuple[str, bool, list[bytes], dict[int, int], dict[int, int]]] = {}
        # The pending value of a message without expiry or schedule, per (partition, priority).
        plain: dict[tuple[int, int], bytes] = {}
        record_bytes = 0
        last_topic = None
        for p in pubs:
            topic = p.topic
            if topic != last_topic:  # (publishes mostly come in runs of one topic)
                known = topics.get(topic)
                if known is None:
                    cfg = self.topic_config(topic)
                    # prepare_lanes made the unclaimed lane of a topic with no group yet.
                    lanes = self.by_topic.get(topic) or [self.lanes[(topic, UNCLAIMED)]]
                    first_index[topic] = {}
                    known = topics[topic] = (
                        cfg.durability, retains(cfg),
                        [u32(self.lane_ids[(topic, ln.name)]) for ln in lanes],
                        self.indexes.parts(topic), first_index[topic])
                durability, keep, lane_prefixes, next_index, firsts = known
                last_topic = topic
            partition = p.partition
            index = next_index.get(partition, 0)  # Indexes.allocate, inline
            next_index[partition] = index + 1
            if partition not in firsts:
                firsts[partition] = index
            record = pack([topic, partition, p.key, p.headers, p.priority, p.published_at,
                           p.expires_at, p.deliver_at, p.payload, index])
            if keep:  # what replay reads and retention reclaims
                batch.log_put.append(log_entry(topic, partition, index, p.seq,
                                               p.published_at, len(record)))
                totals = retained.setdefault(topic, [0, 0])
                totals[0] += 1
                totals[1] += len(record)
            if durability == "memory":
                mem[p.seq] = record
                self._mem_bytes += len(record)
                continue
            seq_b = p.seq.to_bytes(8, "big")
            msgs_put.append((seq_b, record))
            record_bytes += len(record)
            if p.expires_at is None and p.deliver_at is None:
                value = plain.get((partition, p.priority))
                if value is None:
                    value = plain[(partition, p.priority)] = pack(
                        [partition, p.priority, 0, None, None])
            else:
                value = pack([partition, p.priority, 0, p.expires_at, p.deliver_at])
            for prefix in lane_prefixes:
                pend_put.append((prefix + seq_b, value))
            if durability == "fsync":
                batch.fsync = True
        batch.msgs_bytes += record_bytes
        for topic, firsts in first_index.items():
            next_index = self.indexes.parts(topic)
            for partition in firsts:
                batch.log_next.append((partition_prefix(topic, partition),
                                       next_index[partition]))
        for topic, (n, size) in retained.items():
            totals = self._log_totals.setdefault(topic, [0, 0])
            totals[0] += n
            totals[1] += size
        if self._mem_bytes > self.memory_budget_bytes:
            self._spill(batch, wall)
        top = max((p.seq for p in pubs), default=0) + 1
        if top > self._seq_written:  # held publishes retried later have lower sequences
            self._seq_written = top
            batch.meta_put[b"next_seq"] = u64(top)
        return pubs

    def added(self, pubs: list[Publish], now: float, batch: WriteBatch) -> None:
        """After commit: the publishes are stored; owe them to their lanes.

        ``batch`` is the next iteration's: what this supersedes is deleted there.
        """
        offset = _offset()
        topics: dict[str, tuple[list[Lane], bool]] = {}  # topic -> (lanes, latest_wins)
        for p in pubs:
            known = topics.get(p.topic)
            if known is None:
                known = topics[p.topic] = (
                    self.by_topic.get(p.topic) or [self.lanes[(p.topic, UNCLAIMED)]],
                    self.topic_config(p.topic).latest_wins)
            lanes, latest_wins = known
            nb = _mono(p.deliver_at, offset)
            exp = _mono(p.expires_at, offset)
            for lane in lanes:
                lane.add(p.seq, p.partition, p.priority, now=now, not_before=nb, expires_at=exp)
                if latest_wins and p.key is not None:
                    self._supersede(lane, p.key, p.seq, batch)
            self.depth += 1
            if p.receipt is not None and p.seq == p.receipt._seq:
                self.stored.append(p.receipt)  # once per receipt, also for a batch
        self.counters.add("published", len(pubs))
        for topic, original, receipt in self.duplicates:
            if self.owed(topic, original):
                self._followers.setdefault(original, []).append(receipt)
                self.stored.append(receipt)
            else:
                self.acked.append(receipt)
        self.duplicates.clear()

    def watch(self, receipts: list[Receipt]) -> None:
        """Track receipts whose acks someone waits for; those settled already resolve now.

        Runs after the loop's publishes joined their lanes, so a message published before
        the wait is owed (or settled), never unknown.
        """
        for receipt in receipts:
            first = receipt._seq
            for seq in range(first, first + receipt.count):
                if self.owed(receipt.topic, seq) and receipt._error is None:
                    self._receipts[seq] = receipt
                elif seq not in self._receipts:
                    self.acked.append(receipt)

    def owed(self, topic: str, seq: int) -> bool:
        """Some lane of ``topic`` still owes ``seq``."""
        return bool(self._owing(topic, seq))

    def _spill(self, batch: WriteBatch, wall: float) -> None:
        """Memory durability over budget: move the oldest records to LMDB."""
        target = self.memory_budget_bytes // 2
        spilled = 0
        while self._mem_bytes > target and self._mem:
            seq = next(iter(self._mem))
            record = self._mem.pop(seq)
            self._mem_bytes -= len(record)
            self._spilled.append((seq, record))
            topic, partition, _k, _h, priority, _p, expires_at, deliver_at = unpackb(record)[:8]
            batch.msgs_put.append((u64(seq), record))
            batch.msgs_bytes += len(record)
            for lane in self._owing(topic, seq):
                batch.pend_put.append((pend_key(self.lane_ids[(topic, lane.name)], seq),
                                       pack([partition, priority, lane.attempt(seq),
                                             expires_at, deliver_at])))
            spilled += 1
        self.counters.add("spilled", spilled)

    def _owing(self, topic: str, seq: int) -> list[Lane]:
        lanes = [lane for lane in self.by_topic.get(topic, ()) if seq in lane]
        unclaimed = self.lanes.get((topic, UNCLAIMED))
        if unclaimed is not None and seq in unclaimed:
            lanes.append(unclaimed)
        return lanes

    # -- settling -----------------------------------------------------------------------

    def _settled(self, topic: str, lane: Lane, seqs: Iterable[int], batch: WriteBatch) -> None:
        """``lane`` no longer owes ``seqs``; drop each message that nobody owes."""
        lane_id = self.lane_ids[(topic, lane.name)]
        mem = self._mem
        dead = self.dead
        keep = retains(self.topic_config(topic))  # retention reclaims the record later
        seqs = list(seqs)
        # What another lane of the topic still owes stays in the outbox.
        elsewhere = {s for other in self.by_topic.get(topic, ()) if other is not lane
                     for s in other.owed_among(seqs)}
        prefix = lane_id.to_bytes(4, "big")
        pend_del, msgs_del = batch.pend_del, batch.msgs_del
        for seq in seqs:
            seq_b = seq.to_bytes(8, "big")
            if seq not in mem:
                pend_del.append(prefix + seq_b)
            if dead.replayed:
                dead.settled(lane_id, seq, batch)
            if seq in elsewhere:
                continue
            if not keep:
                record = mem.pop(seq, None)
                if record is None:
                    msgs_del.append(seq_b)
                else:
                    self._mem_bytes -= len(record)
            self.depth -= 1
            if self._receipts:
                receipt = self._receipts.pop(seq, None)
                if receipt is not None:
                    self.acked.append(receipt)
            if self._followers:
                self.acked.extend(self._followers.pop(seq, ()))

    def on_ack(self, topic: str, name: str, seqs: Iterable[int], batch: WriteBatch) -> int:
        lane = self.lanes.get((topic, name))
        if lane is None:
            return 0
        settled = lane.ack(seqs)
        self._settled(topic, lane, settled, batch)
        self._count(lane, "acked", len(settled))
        return len(settled)

    def on_nack(self, topic: str, name: str, seqs: Iterable[int], delay_s: float | None,
                batch: WriteBatch, now: float) -> None:
        lane = self.lanes.get((topic, name))
        if lane is None:
            return
        seqs = list(seqs)
        exhausted = lane.nack(seqs, delay_s, now)
        self._count(lane, "nacked", len(seqs))
        self._persist_attempts(lane, seqs, batch)
        for entry in exhausted:
            self._park(lane, entry, "max attempts reached after nack", batch)

    def on_fail(self, topic: str, name: str, seq: int, reason: str, batch: WriteBatch) -> None:
        lane = self.lanes.get((topic, name))
        if lane is None:
            return
        entry = lane.fail(seq)
        if entry is not None:
            self._park(lane, entry, reason, batch)

    def _park(self, lane: Lane, entry: Entry, reason: str, batch: WriteBatch) -> None:
        record = self._mem.get(entry.seq) or self.store.get_messages([entry.seq]).get(entry.seq)
        self.dead.park(lane, entry, reason, record, batch)
        self._settled(lane.topic, lane, [entry.seq], batch)

    def _persist_attempts(self, lane: Lane, seqs: Iterable[int], batch: WriteBatch) -> None:
        lane_id = self.lane_ids[(lane.topic, lane.name)]
        wanted = [s for s in seqs if s in lane and s not in self._mem]
        if not wanted:
            return
        records = self.store.get_messages(wanted)
        for seq, record in records.items():
            fields = decode_record(record)
            if fields is None:
                continue  # set aside when it is next sent
            _t, partition, _k, _h, priority, _p, expires_at, deliver_at, _pl, _i = fields
            batch.pend_put.append((pend_key(lane_id, seq), pack(
                [partition, priority, lane.attempt(seq), expires_at, deliver_at])))

    def _supersede(self, lane: Lane, key: str, seq: int, batch: WriteBatch) -> None:
        """latest_wins: ``seq`` replaces the lane's unsent message with the same key."""
        keys = self._latest.setdefault((lane.topic, lane.name), {})
        old = keys.get(key)
        keys[key] = seq
        if old is None or old == seq:
            return
        state = lane.state(old)
        if state is not None and state != IN_FLIGHT:
            lane.ack([old])
            self._settled(lane.topic, lane, [old], batch)
            self._count(lane, "superseded", 1)

    def index_latest(self, topic: str) -> None:
        """Rebuild the key index of a latest_wins topic from its stored messages."""
        wanted: dict[int, list[Lane]] = {}
        for lane in self._owing_lanes(topic):
            for seq in lane.seqs():
                wanted.setdefault(seq, []).append(lane)
        records = self.store.get_messages([s for s in wanted if s not in self._mem])
        records.update({s: self._mem[s] for s in wanted if s in self._mem})
        for seq in sorted(records):
            fields = decode_record(records[seq])
            key = None if fields is None else fields[2]
            if key is not None:
                for lane in wanted[seq]:
                    self._latest.setdefault((topic, lane.name), {})[key] = seq

    def _owing_lanes(self, topic: str) -> list[Lane]:
        return [lane for (t, _n), lane in self.lanes.items() if t == topic]

    def _count(self, lane: Lane, name: str, n: int) -> None:
        if n:
            lane.counts[name] += n
            self.counters.add(name, n)

    def member_gone(self, member: bytes, now: float) -> int:
        moved = 0
        for lane in self.lanes.values():
            moved += lane.remove_member(member, now)
        if moved:
            self.counters.add("redelivered_member_gone", moved)
        return moved

    # -- time and sending ---------------------------------------------------------------

    def tick(self, now: float, batch: WriteBatch) -> None:
        for (topic, _name), lane in list(self.lanes.items()):
            result = lane.tick(now)
            if result.timed_out:
                self._count(lane, "ack_timeouts", result.timed_out)
            if result.expired:
                self._count(lane, "expired", len(result.expired))
                self._settled(topic, lane, result.expired, batch)
            for entry in result.exhausted:
                self._park(lane, entry, "max attempts reached after ack timeouts", batch)

    def next_wakeup(self) -> float | None:
        times = [t for lane in self.lanes.values() if (t := lane.next_wakeup()) is not None]
        return min(times) if times else None

    def dispatch(self, now: float,
                 send: Callable[[bytes, Lane, Taken, list[list]], int],
                 batch: WriteBatch) -> int:
        """Hand ready messages (decoded records) to live members; ``send`` returns how many
        left. A record that cannot be decoded is set aside and settled, never sent."""
        sent_total = 0
        mem = self._mem
        # Records decoded in this call: the lanes of one topic mostly send the same
        # messages, each read and decoded once for all of them.
        known: dict[int, list] = {}
        for (topic, name), lane in self.lanes.items():
            if not lane.ready_count or not lane.members or name == UNCLAIMED:
                continue
            taken, expired = lane.take(now)
            if expired:
                self._count(lane, "expired", len(expired))
                self._settled(topic, lane, expired, batch)
            if not taken:
                continue
            need = [seq for t in taken.values() for seq in t.seqs
                    if seq not in known and seq not in mem]
            records = self.store.get_messages(need) if need else {}
            for member, out in taken.items():
                fields: list[list] = []
                missing = []
                for seq in out.seqs:
                    decoded = known.get(seq)
                    if decoded is not None:
                        fields.append(decoded)
                        continue
                    record = mem.get(seq) or records.get(seq)
                    decoded = None if record is None else decode_record(record)
                    if decoded is not None:
                        known[seq] = decoded
                    else:
                        if record is not None:
                            mem.pop(seq, None)
                            self.set_aside("msgs", u64(seq), record,
                                           "an outbox record: settled for every group", batch)
                        missing.append(seq)
                    fields.append(decoded)  # type: ignore[arg-type]
                if missing:
                    out = _without(out, fields)
                    fields = [f for f in fields if f is not None]
                    self._drop(topic, lane, missing, batch)
                if out.seqs:
                    sent = send(member, lane, out, fields)
                    sent_total += sent
                    if sent < len(out):
                        lane.unsend(out.seqs[sent:], now)
        return sent_total

    def set_aside(self, db: str, key: bytes, value: bytes, why: str,
                  batch: WriteBatch) -> None:
        """A record that cannot be decoded: move it to the ``bad`` db, count it, say so."""
        batch.quarantine.append((db, key, value))
        self.counters.add("corrupt_records", 1)
        log.error("record %s of the %r db in %s cannot be decoded (%s); it is set aside in "
                  "the 'bad' db and the node goes on without it", key.hex(), db,
                  self.store.path, why)

    def _drop(self, topic: str, lane: Lane, seqs: list[int], batch: WriteBatch) -> None:
        """Messages whose record is gone or damaged: settle them for every lane owing them."""
        bad = {k for db, k, _v in batch.quarantine if db == "msgs"}
        lost = [s for s in seqs if u64(s) not in bad]
        if lost:
            log.error("outbox records missing for %d messages of %s; settled as lost",
                      len(lost), topic)
            self.counters.add("lost_records", len(lost))
        for seq in seqs:
            for owing in self._owing(topic, seq):
                owing.ack([seq])
                self._settled(topic, owing, [seq], batch)

    # -- retention and replay -----------------------------------------------------------

    def reclaim(self, batch: WriteBatch, wall: float) -> bool:
        """One bounded pass of retention over every topic with index entries; True when a
        topic has more to reclaim at once (call again soon)."""
        more = False
        for topic, totals in self._log_totals.items():
            if not totals[0]:
                continue
            prefix = topic_prefix(topic)
            heads = [Head.decode(seq, v) for seq, v in self.store.log_heads(prefix,
                                                                            RECLAIM_CHUNK)]
            cfg = self.topic_config(topic)
            n = reclaimable(heads, wall=wall, cfg=cfg, retained_bytes=totals[1],
                            owed=lambda seq, t=topic: self.owed(t, seq))  # type: ignore[misc]
            if not n:
                continue
            kept = retains(cfg)
            for head in heads[:n]:
                key = head.index.to_bytes(8, "big")
                batch.log_del.append((partition_prefix(topic, head.partition) + key,
                                      prefix + u64(head.seq)))
                record = self._mem.pop(head.seq, None)
                if record is not None:
                    self._mem_bytes -= len(record)
                else:  # (gone already if it was settled while the topic did not retain)
                    batch.msgs_del.append(u64(head.seq))
                totals[0] -= 1
                totals[1] -= head.size
            if kept:
                self.counters.add("retention_reclaimed", n)
            more = more or n == RECLAIM_CHUNK
        return more

    def fetch(self, topic: str, cursors: dict[int, int], start: int | None, max_items: int,
              max_bytes: int) -> tuple[list[tuple], list[tuple[int, int, int, int]]]:
        """Stored messages of ``topic`` by index, for a reader.

        ``cursors``: partition -> first index wanted; ``start``: the first index of every
        other partition (None: only the partitions in ``cursors``). Returns items
        ``(partition, index, seq, key, headers, published_at, payload)`` in index order per
        partition, and per partition ``(partition, oldest stored index, next index, scanned
        up to)``: the reader continues at "scanned up to"; indexes it skipped are gone.
        """
        nexts = self.indexes.partitions(topic)
        wanted = set(cursors) | (set(nexts) if start is not None else set())
        items: list[tuple] = []
        heads: list[tuple[int, int, int, int]] = []
        size = 0
        for partition in sorted(wanted):
            pos = cursors.get(partition, start if start is not None else 0)
            nxt = nexts.get(partition, 0)
            budget = max_items - len(items)
            full = budget <= 0 or size >= max_bytes
            oldest, entries = self.store.log_range(partition_prefix(topic, partition), pos,
                                                   0 if full else budget)
            scanned = pos
            if not full:
                records = self.store.get_messages([s for _i, s, _p in entries
                                                   if s not in self._mem])
                stopped = False
                for index, seq, published_at in entries:
                    if size >= max_bytes and items:
                        stopped = True
                        break
                    scanned = index + 1
                    record = self._mem.get(seq) or records.get(seq)
                    fields = None if record is None else decode_record(record)
                    if fields is None:
                        continue  # settled without retention (or damaged): not replayable
                    _t, _p, key, headers, _pr, _pa, _e, _d, payload, _i = fields
                    items.append((partition, index, seq, key, headers, published_at, payload))
                    size += len(payload)
                if not stopped and len(entries) < budget:
                    scanned = max(scanned, nxt)  # the whole partition was read
            heads.append((partition, nxt if oldest is None else oldest, nxt, scanned))
        return items, heads

    def pending_for(self, topic: str) -> int:
        return sum(len(lane) for lane in self.by_topic.get(topic, ()))


def _without(out: Taken, fields: list) -> Taken:
    """``out`` without the messages whose record is missing (None in ``fields``)."""
    kept = Taken()
    for seq, partition, attempt, f in zip(out.seqs, out.partitions, out.attempts, fields,
                                          strict=True):
        if f is not None:
            kept.seqs.append(seq)
            kept.partitions.append(partition)
            kept.attempts.append(attempt)
    return kept


def lane_id_bytes(n: int) -> bytes:
    return n.to_bytes(4, "big")

