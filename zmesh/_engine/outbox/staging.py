"""Publishes on their way into a producer's outbox (IO thread only).

Publishes arrive as staged commands, are written to LMDB in the loop's one transaction,
and only then join their lanes, so nothing is sent before it is stored. A commit that
fails gives back what its staging allocated. A topic with no group known yet stages to
its unclaimed lane, whose messages go to the first groups learned.

This module is long because one transaction's staging and its undoing, when the commit
fails, must be read together.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING

from ..._numbers import fitting_array
from ..._store.store import Store, WriteBatch, pack, pend_key, u32, u64
from ...errors import StoreError
from ..lane.blocks import block_parts, cut, joined_blocks, one_block
from ..lane.lane import Lane
from ..lane.plain import PlainRun
from ..stats import Counters
from .allocate import allocate
from .lanes import UNCLAIMED, Lanes
from .owing import mono_at, mono_offset
from .publishes import AnyPublish, Publish, PublishMany, joined, message_count
from .receipts import Receipts
from .record import Record
from .records import Records, mem_run_size, mem_total
from .retained import Retained
from .retention import Head, Indexes, log_entry, partition_prefix, retains
from .runs import (
    RUN_ENTRY_BYTES,
    RUN_MAX_BYTES,
    RUN_MAX_MESSAGES,
    Run,
    run_entry,
    run_record,
)
from .settle import Settler
from .spill import Spill
from .wallclock import WallClock

if TYPE_CHECKING:
    from .patterns import PatternGroups


def _lane_names(lanes: Iterable[Lane]) -> tuple[str, ...]:
    return tuple(lane.name for lane in lanes)


class Staging:
    """Staging the publishes of one producer, and owing them to its lanes once stored."""

    def __init__(
        self,
        store: Store,
        lanes: Lanes,
        records: Records,
        receipts: Receipts,
        settler: Settler,
        indexes: Indexes,
        retained: Retained,
        counters: Counters,
        next_seq: int,
        memory_budget_bytes: int,
        patterns: PatternGroups,
        clock: WallClock,
        dedupe_window_s: float = math.inf,
    ) -> None:
        self.store = store
        self.dedupe_window_s = dedupe_window_s  # (how long a msg_id is remembered)
        self.clock = clock
        self.lanes = lanes
        self.patterns = patterns
        self.records = records
        self.receipts = receipts
        self.settler = settler
        self.indexes = indexes
        self.retained = retained
        self.counters = counters
        self.spill = Spill(lanes, records, counters, memory_budget_bytes)
        self._seq_written = next_seq  # next_seq as last staged: it never goes back
        # Publishes of an msg_id published before: (topic, the original's sequence, publish)
        self.duplicates: list[tuple[str, int, AnyPublish]] = []
        # What the last ``stage`` allocated, for ``unstage`` to give back: per topic the first
        # index of each partition (the retained entries and bytes are in ``Retained.staged``).
        self._staged_first: dict[str, dict[int, int]] = {}
        self._runs: list[Run] = []  # staged by the last ``stage``, known once stored
        self._turns: dict[str, int] = {}  # topic -> the last keyless batch's partition
        # Messages of topics that keep values per key, staged by the last ``stage``:
        # (topic, key, index entry), their keys' latest once stored.
        self._kept: list[tuple[str, str | None, Head]] = []

    def prepare_lanes(self, pubs: list[AnyPublish], batch: WriteBatch, now: float) -> None:
        """Create the lanes ``pubs`` need before staging them, so a publish that must be
        staged again later (a full map) never finds a lane that was not stored: a topic
        published for the first time gets the lanes of the pattern groups matching it,
        or its unclaimed lane."""
        lanes = self.lanes
        checked = self.patterns.checked
        for p in pubs:
            topic = p.topic
            if topic not in checked:
                self.patterns.new_topic(topic, batch, now)
            if not lanes.by_topic.get(topic) and lanes.get(topic, UNCLAIMED) is None:
                lanes.add(topic, UNCLAIMED, "", "unclaimed", batch)

    def unstage(self, pubs: list[AnyPublish]) -> list[AnyPublish]:
        """Undo ``stage`` in memory after its commit failed: nothing of it was stored.
        Returns the duplicates of ``pubs`` it set aside: they share their originals' fate
        (held with them, or failed), never following what was not stored."""
        records = self.records
        for topic, firsts in self._staged_first.items():
            for partition, first in firsts.items():
                self.indexes.release(topic, partition, first)
        self.retained.unstage()
        self._staged_first.clear()
        self._kept.clear()
        new = {run.first for run in self._runs}
        records.decoded.forget_runs(new)
        records.forget_mem_runs(new)
        self._runs.clear()
        seqs = [seq for p in pubs for seq in p.seqs]
        staged = set(seqs)
        self.spill.unspill(new, staged)
        records.forget_mem(seqs)
        records.decoded.forget(seqs)
        back = [dup for _t, original, dup in self.duplicates if original in staged]
        if back:
            self.duplicates = [d for d in self.duplicates if d[1] not in staged]
        return back

    def _suppress_duplicates(self, pubs: list[AnyPublish], batch: WriteBatch) -> list[AnyPublish]:
        """Drop publishes whose msg_id this node already published within the window."""
        ids = [p.msg_id.encode() for p in pubs if p.msg_id is not None]
        if not ids:
            return pubs
        stored_at = self.clock.observed(time.time())  # (the window counts observed time)
        try:
            known = self.store.lookup_ids(ids, stored_at - self.dedupe_window_s)
        except StoreError:
            # A damaged store (said by its health, in status): the window cannot be read,
            # and a publish is stored rather than refused for it.
            known = {}
        fresh = []
        for p in pubs:
            if p.msg_id is None:
                fresh.append(p)
                continue
            mid = p.msg_id.encode()
            original = known.get(mid)
            if original is None:
                known[mid] = p.seq
                batch.ids_put.append((mid, p.seq, stored_at))
                fresh.append(p)
                continue
            self.counters.add("duplicates_suppressed", 1)
            if p.receipt is not None:
                p.receipt._seq = original
            self.duplicates.append((p.topic, original, p))
        return fresh

    def stage(self, pubs: list[AnyPublish], batch: WriteBatch) -> list[AnyPublish]:
        """Write publishes into the batch (after ``prepare_lanes``); returns those to add to
        lanes after commit."""
        records = self.records
        self.spill.begin()
        self._runs.clear()
        first_index = self._staged_first
        first_index.clear()
        retained = self.retained.staged
        retained.clear()
        self._kept.clear()
        for p in pubs:
            if type(p) is PublishMany and p.keyless:
                self._spread(p)
        pubs = self._suppress_duplicates(self._expanded(pubs), batch)
        msgs_put, mem = batch.msgs_put, records.mem
        # Kept decoded for the dispatch that follows, when some member is there to take
        # them and the map has room (the oldest of a backlog, those sent next, stay in it).
        decoded = records.decoded
        # What is the same for every publish of a topic, looked up once per topic and stage:
        # durability, retention, next indexes, first indexes staged, whether a lane has a
        # member, its lanes, and the keys and values their pending entries are made of.
        topics: dict[
            str,
            tuple[
                str,
                bool,
                dict[int, int],
                dict[int, int],
                bool,
                list[Lane],
                list[bytes],
                list[bytes],
            ],
        ] = {}
        # The pending value of a message without expiry or schedule, per (partition, priority).
        plain: dict[tuple[int, int], bytes] = {}
        record_bytes = 0
        kept_in_mem: list[Record] = []
        last_topic = None
        for p in joined(pubs, RUN_MAX_MESSAGES, RUN_MAX_BYTES):  # (fewer, longer runs)
            topic = p.topic
            if topic != last_topic:  # (publishes mostly come in runs of one topic)
                known = topics.get(topic)
                if known is None:
                    cfg = self.lanes.config(topic)
                    lanes = self.lanes.receiving(topic)
                    first_index[topic] = {}
                    known = topics[topic] = (
                        cfg.durability,
                        retains(cfg),
                        self.indexes.parts(topic),
                        first_index[topic],
                        any(ln.members for ln in lanes),
                        lanes,
                        [],
                        [],
                    )
                (durability, keep, next_index, firsts, live, lanes, pend_seqs, pend_values) = known
                last_topic = topic
            if isinstance(p, PublishMany):  # (of run topics: see ``_expanded``)
                # Runs of at most RUN_MAX_MESSAGES and RUN_MAX_BYTES of payloads each (by
                # count alone when all of them fit in RUN_MAX_BYTES: no payload looked at).
                ends = list(accumulate(map(len, p.payloads))) if p.nbytes > RUN_MAX_BYTES else None
                start = 0
                while start < p.count:
                    end = (
                        min(p.count, start + RUN_MAX_MESSAGES)
                        if ends is None
                        else max(
                            start + 1,
                            bisect_right(
                                ends,
                                (ends[start - 1] if start else 0) + RUN_MAX_BYTES,
                                start,
                                min(p.count, start + RUN_MAX_MESSAGES),
                            ),
                        )
                    )
                    record_bytes += self._stage_run(
                        p,
                        start,
                        end,
                        lanes,
                        next_index,
                        firsts,
                        live,
                        durability == "memory",
                        batch,
                        p.nbytes
                        if ends is None
                        else ends[end - 1] - (ends[start - 1] if start else 0),
                    )
                    start = end
                if durability == "fsync":
                    batch.fsync = True
                continue
            partition = p.partition
            index = next_index.get(partition, 0)  # Indexes.allocate, inline
            next_index[partition] = index + 1
            if partition not in firsts:
                firsts[partition] = index
            fields = Record(
                topic,
                partition,
                p.key,
                p.headers,
                p.priority,
                p.published_at,
                p.expires_at,
                p.deliver_at,
                p.payload,
                index,
            )
            # A memory message stays as its fields: packed only if it spills.
            record = None if durability == "memory" else pack(fields)
            if keep:  # what replay reads, values kept per key, and retention reclaims
                size = len(pack(fields) if record is None else record)
                batch.log_put.append(
                    log_entry(topic, partition, index, p.seq, p.published_at, size)
                )
                totals = retained.setdefault(topic, [0, 0])
                totals[0] += 1
                totals[1] += size
                self._kept.append(
                    (topic, p.key, Head(p.seq, partition, index, size, p.published_at))
                )
            if record is None:
                mem[p.seq] = fields
                kept_in_mem.append(fields)
                continue
            if live and decoded.bytes < decoded.limit:
                decoded.keep(p.seq, fields)
            seq_b = u64(p.seq)
            msgs_put.append((seq_b, record))
            record_bytes += len(record)
            if p.expires_at is None and p.deliver_at is None:
                value = plain.get((partition, p.priority))
                if value is None:
                    value = plain[(partition, p.priority)] = pack(
                        [partition, p.priority, 0, None, None]
                    )
            else:
                value = pack([partition, p.priority, 0, p.expires_at, p.deliver_at])
            pend_seqs.append(seq_b)
            pend_values.append(value)
            if durability == "fsync":
                batch.fsync = True
        batch.msgs_bytes += record_bytes
        records.mem_bytes += mem_total(kept_in_mem)
        # One pending entry per lane and message, lane by lane: each lane's keys are
        # adjacent in LMDB, so each put lands next to the one before it.
        for *_, lanes, pend_seqs, pend_values in topics.values():
            for lane in lanes if pend_seqs else ():
                batch.pend_runs.append((u32(lane.id), pend_seqs, pend_values))
        for topic, firsts in first_index.items():
            next_index = self.indexes.parts(topic)
            for partition in firsts:
                batch.log_next.append((partition_prefix(topic, partition), next_index[partition]))
        self.retained.count_staged()
        if self.spill.over():
            self.spill.spill(batch, kept_in_mem, self._runs)
        top = max(map(attrgetter("seq"), pubs), default=0) + 1
        if self._runs:  # (a PublishMany's sequences go beyond its first)
            top = max(top, max(run.first + run.count for run in self._runs))
        if top > self._seq_written:  # held publishes retried later have lower sequences
            self._seq_written = top
            batch.meta_put[b"next_seq"] = u64(top)
        return pubs

    def _spread(self, p: PublishMany) -> None:
        """The one partition of a keyless batch: its topic's partitions in turn, batch by
        batch, so the members of a shared group get whole batches (a message alone goes
        by its sequence: ``partition_for``)."""
        turn = (self._turns.get(p.topic, -1) + 1) % p.keyless
        self._turns[p.topic] = turn
        p.partitions = [turn] * p.count
        p.found = one_block(turn, p.count)
        p.keyless = 0

    def _expanded(self, pubs: list[AnyPublish]) -> list[AnyPublish]:
        """``pubs`` with each ``PublishMany`` of a topic that does not store runs expanded
        into its publishes: those topics store each message on its own."""
        if PublishMany not in map(type, pubs):
            return pubs
        out: list[AnyPublish] = []
        for p in pubs:
            if type(p) is PublishMany and not self.stores_runs(p.topic):
                out.extend(p.expand())
            else:
                out.append(p)
        return out

    def stores_runs(self, topic: str) -> bool:
        """Whether ``topic`` stores a publish_many as runs (a ``memory`` topic keeps them
        in RAM): it has groups, retains nothing (the retained log indexes single records)
        and is not latest-wins (which supersedes single messages)."""
        cfg = self.lanes.config(topic)
        return not retains(cfg) and not cfg.latest_wins and topic in self.lanes.by_topic

    def _stage_run(
        self,
        pm: PublishMany,
        start: int,
        end: int,
        lanes: list[Lane],
        next_index: dict[int, int],
        firsts: dict[int, int],
        live: bool,
        memory: bool,
        batch: WriteBatch,
        nbytes: int,
    ) -> int:
        """Write messages ``start:end`` of ``pm`` as a run (see runs.py): one record, one
        pending entry per lane; ``memory``: keep it in RAM instead, written only if it
        spills. ``nbytes``: their payloads' bytes (or more). Returns the size of the
        record written."""
        records = self.records
        first, count, topic = pm.seq + start, end - start, pm.topic
        whole = start == 0 and end == pm.count
        partitions = pm.partitions if whole else pm.partitions[start:end]
        keys = pm.keys if whole or pm.keys is None else pm.keys[start:end]
        payloads = pm.payloads if whole else pm.payloads[start:end]
        published_at = pm.published_at  # (an array, one per message, from a stretch)
        if not whole and not isinstance(published_at, float):
            published_at = published_at[start:end]
        found = pm.found if pm.found is None or whole else cut(pm.found, start, end)
        indexes, found = allocate(partitions, next_index, firsts, found)
        parts = fitting_array("BH", partitions) if found is None else block_parts(found)
        one = found[0][0] if found is not None and len(found) == 1 else -1
        fields = [topic, parts, keys, pm.headers, published_at, payloads, indexes]
        run = Run(
            first,
            count,
            topic,
            None if one >= 0 else parts,  # (a byte a message kept only when they differ)
            count,
            {lane.id: count for lane in lanes},
            not memory,
            nbytes,
            one,
        )
        self._runs.append(run)
        if memory:  # (its record is never packed unless it spills)
            size = mem_run_size(fields)
            records.mem_runs[first] = (fields, size)
            records.mem_bytes += size
            return 0
        record = run_record(fields)
        batch.runs_put.append((u64(first), record))  # (its bytes counted by the caller)
        decoded = records.decoded
        if live and decoded.bytes < decoded.limit:
            decoded.keep_run(first, fields, len(record) + RUN_ENTRY_BYTES * count)
        entry = run_entry(parts)
        batch.prun_put.extend((pend_key(lane_id, first), entry) for lane_id in run.owed)
        return len(record)

    def added(self, pubs: list[AnyPublish], now: float, batch: WriteBatch) -> None:
        """After commit: the publishes are stored; owe them to their lanes.

        ``batch`` is the next iteration's: what this supersedes is deleted there.
        """
        records = self.records
        if pubs:
            for new in self._runs:
                records.runs.add(new)
        self._runs.clear()
        if self._kept:
            self.retained.kept.added(self._kept)
            self._kept.clear()
        offset = mono_offset()
        topics: dict[str, tuple[list[Lane], bool]] = {}  # topic -> (lanes, latest_wins)
        i, n = 0, len(pubs)
        while i < n:
            p = pubs[i]
            topic = p.topic
            known = topics.get(topic)
            if known is None:
                known = topics[topic] = (
                    self.lanes.receiving(topic),
                    self.lanes.config(topic).latest_wins,
                )
                each = p.nbytes / p.count if isinstance(p, PublishMany) else len(p.payload)
                for lane in known[0]:
                    lane.expect_bytes(each)
            lanes, latest_wins = known
            # A run of plain publishes of one topic joins each lane in one call.
            j = i
            many = False
            while j < n and not latest_wins:
                q = pubs[j]
                if q.topic != topic or q.priority or q.deliver_at or q.expires_at:
                    break
                many = many or type(q) is PublishMany
                j += 1
            if j > i + 1 or many:
                seqs: list[int] | range
                if many:
                    group = pubs[i:j]
                    partitions: list[int] = []
                    found = joined_blocks(
                        [
                            (q.found, q.count)
                            if isinstance(q, PublishMany)
                            else (one_block(q.partition, 1), 1)
                            for q in group
                        ]
                    )
                    end = first = group[0].seq  # (one range while each follows the last)
                    for q in group:
                        end = end + q.count if end == q.seq else -1
                        if isinstance(q, PublishMany):
                            partitions.extend(q.partitions)
                        else:
                            partitions.append(q.partition)
                    seqs = range(first, end) if end >= 0 else [seq for q in group for seq in q.seqs]
                else:
                    seqs = [q.seq for q in pubs[i:j]]
                    partitions = [q.partition for q in pubs[i:j]]  # type: ignore[union-attr]
                    found = None
                run = PlainRun(seqs, partitions, found)
                for lane in lanes:
                    lane.add_plain(run)
                i = j
                continue
            assert isinstance(p, Publish)
            nb = mono_at(p.deliver_at, offset)
            exp = mono_at(p.expires_at, offset)
            for lane in lanes:
                lane.add(p.seq, p.partition, p.priority, now=now, not_before=nb, expires_at=exp)
                if latest_wins and p.key is not None:
                    self.settler.supersede(lane, p.key, p.seq, batch)
            i += 1
        # The lanes each stage's messages are owed to, for its receipts' outcomes.
        owed_to: dict[str, tuple[str, ...]] = {}
        for p in pubs:
            names = owed_to.get(p.topic)
            if names is None:
                names = owed_to[p.topic] = _lane_names(self.lanes.of_topic(p.topic))
            p.stage.lanes = names
        self.receipts.add_stored(pubs)
        count = message_count(pubs)
        records.depth += count
        self.counters.add("published", count)
        for topic, original, dup in self.duplicates:
            receipt = dup.receipt
            if receipt is not None:
                # (the original's topic: a msg_id names one message, whatever topic a
                # duplicate of it gives; one settled and gone is acked, as below)
                record = self.records.get(original)
                if record is not None:
                    topic = receipt.topic = record.topic
                names = _lane_names(self.lanes.of_topic(topic))
                self.receipts.follow(original, receipt, self.lanes.owed(topic, original), names)
        self.duplicates.clear()
