"""Publishes on their way into a producer's outbox (IO thread only).

Publishes arrive as staged commands, are written to LMDB in the loop's one transaction,
and only then join their lanes, so nothing is sent before it is stored. A commit that
fails gives back what its staging allocated. A topic with no group known yet stages to
its unclaimed lane, whose messages go to the first groups learned.
"""

from __future__ import annotations

import heapq
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate, repeat
from operator import add, attrgetter, itemgetter
from typing import TYPE_CHECKING, TypeVar

from .._numbers import fitting_array
from .._store.store import WriteBatch, pack, pend_key, u32, u64
from .lane import Lane, PlainRun
from .publishes import AnyPublish, Publish, PublishMany, joined, message_count
from .retention import log_entry, partition_prefix, retains
from .runs import (
    RUN_ENTRY_BYTES,
    RUN_MAX_BYTES,
    RUN_MAX_MESSAGES,
    Run,
    lane_entry,
    run_entry,
    run_record,
)
from .seqqueue import round_robin, round_robin_parts

if TYPE_CHECKING:
    from .._receipt import Receipt
    from .producer import Producer

UNCLAIMED = ""  # lane name of a topic's messages published before any group was known
# What a ``memory`` message held in RAM costs beyond its payload, key and headers: its
# fields tuple, the floats and ints in it, and its slot in the producer's dict.
MEM_RECORD_OVERHEAD = 200


def mem_size(fields: tuple) -> int:
    """The bytes a ``memory`` message's fields count against ``memory_budget_bytes``."""
    key, headers = fields[2], fields[3]
    return (len(fields[8]) + MEM_RECORD_OVERHEAD + (len(key) if key else 0)
            + (len(pack(headers)) if headers else 0))


_keys, _headers, _payloads = itemgetter(2), itemgetter(3), itemgetter(8)
_stage = attrgetter("stage")


def mem_run_size(record: list) -> int:
    """What a ``memory`` run (its decoded record) counts against ``memory_budget_bytes``."""
    _t, partitions, keys, headers, _at, payloads, _i = record
    return (sum(map(len, payloads)) + RUN_ENTRY_BYTES * len(partitions)
            + (sum(map(len, filter(None, keys))) if keys else 0)
            + (len(pack(headers)) if headers else 0))


def mem_total(many: list[tuple]) -> int:
    """``mem_size`` summed over ``many`` fields, with no Python call per message."""
    return (sum(map(len, map(_payloads, many))) + MEM_RECORD_OVERHEAD * len(many)
            + sum(map(len, filter(None, map(_keys, many))))
            + sum(len(pack(h)) for h in filter(None, map(_headers, many))))


K = TypeVar("K")  # a map's keys (sequences, mostly)
F = TypeVar("F")  # what it keeps per key


def oldest(kept: dict[K, F], excess: int, size: Callable[[F], int]) -> tuple[list[K], int]:
    """The first (oldest) keys of ``kept`` whose sizes reach ``excess``, and their total,
    found in one pass: taking them one by one from the front of the dict would walk the
    slots of every one taken before (quadratic in what is taken)."""
    keys: list[K] = []
    total = 0
    for key, value in kept.items():
        if total >= excess:
            break
        total += size(value)
        keys.append(key)
    return keys, total


def mono_offset() -> float:
    """monotonic - wall clock, from two adjacent readings: what turns a UNIX time into a
    monotonic one. (Pairing the loop's ``now`` with a later wall reading would move every
    schedule earlier by the time in between.)"""
    return time.monotonic() - time.time()


def mono_at(wall_at: float | None, offset: float) -> float:
    """A wall-clock instant on the monotonic clock (0.0 when unset)."""
    return wall_at + offset if wall_at else 0.0


class Staging:
    """Staging the publishes of one producer, and owing them to its lanes once stored."""

    def __init__(self, producer: Producer, next_seq: int, memory_budget_bytes: int) -> None:
        self.p = producer
        self.memory_budget_bytes = memory_budget_bytes
        # Spilled by the last stage(), for unstage(): messages, and runs with their
        # record and size.
        self._spilled: list[tuple[int, tuple]] = []
        self._spilled_runs: list[tuple[Run, list, int]] = []
        self._seq_written = next_seq  # next_seq as last staged: it never goes back
        self.duplicates: list[tuple[str, int, Receipt]] = []  # (topic, original seq, receipt)
        # What the last ``stage`` allocated, for ``unstage`` to give back: per topic the first
        # index of each partition (the retained entries and bytes are in ``Retained.staged``).
        self._staged_first: dict[str, dict[int, int]] = {}
        self._runs: list[Run] = []  # staged by the last ``stage``, known once stored

    def prepare_lanes(self, pubs: list[AnyPublish], batch: WriteBatch, now: float) -> None:
        """Create the lanes ``pubs`` need before staging them, so a publish that must be
        staged again later (a full map) never finds a lane that was not stored."""
        for p in pubs:
            if not self.p.by_topic.get(p.topic):
                self.p.ensure_lane(p.topic, UNCLAIMED, "", "unclaimed", batch, now)

    def _lanes(self, topic: str) -> list[Lane]:
        """The lanes that owe a topic's new messages (``prepare_lanes`` made the unclaimed
        lane of a topic with no group yet)."""
        return self.p.by_topic.get(topic) or [self.p.lanes[(topic, UNCLAIMED)]]

    def unstage(self, pubs: list[AnyPublish]) -> None:
        """Undo ``stage`` in memory after its commit failed: nothing of it was stored."""
        producer = self.p
        for topic, firsts in self._staged_first.items():
            for partition, first in firsts.items():
                producer.indexes.release(topic, partition, first)
        producer.retained.unstage()
        self._staged_first.clear()
        new = {run.first for run in self._runs}
        producer.decoded.forget_runs(new)
        producer.forget_mem_runs(new)
        self._runs.clear()
        seqs = [seq for p in pubs for seq in p.seqs]
        producer.forget_mem(seqs)
        producer.decoded.forget(seqs)
        for seq, fields in self._spilled:
            producer._mem[seq] = fields
            producer._mem_bytes += mem_size(fields)
        self._spilled.clear()
        for run, record, size in self._spilled_runs:
            if run.first not in new:  # (older runs: in RAM again, as before the spill)
                run.stored = False
                producer.decoded.forget_runs([run.first])
                producer.mem_runs[run.first] = (record, size)
                producer._mem_bytes += size
        self._spilled_runs.clear()

    def _suppress_duplicates(self, pubs: list[AnyPublish],
                             batch: WriteBatch) -> list[AnyPublish]:
        """Drop publishes whose msg_id this node already published within the window."""
        ids = [p.msg_id.encode() for p in pubs if p.msg_id is not None]
        if not ids:
            return pubs
        known = self.p.store.lookup_ids(ids)
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
            self.p.counters.add("duplicates_suppressed", 1)
            if p.receipt is not None:
                p.receipt._seq = original
                self.duplicates.append((p.topic, original, p.receipt))
        return fresh

    def stage(self, pubs: list[AnyPublish], batch: WriteBatch) -> list[AnyPublish]:
        """Write publishes into the batch (after ``prepare_lanes``); returns those to add to
        lanes after commit."""
        producer = self.p
        self._spilled.clear()
        self._spilled_runs.clear()
        self._runs.clear()
        first_index = self._staged_first
        first_index.clear()
        retained = producer.retained.staged
        retained.clear()
        pubs = self._suppress_duplicates(self._expanded(pubs), batch)
        msgs_put, mem = batch.msgs_put, producer._mem
        # Kept decoded for the dispatch that follows, when some member is there to take
        # them and the map has room (the oldest of a backlog, those sent next, stay in it).
        decoded = producer.decoded
        # What is the same for every publish of a topic, looked up once per topic and stage:
        # durability, retention, next indexes, first indexes staged, whether a lane has a
        # member, its lanes, and the keys and values their pending entries are made of.
        topics: dict[str, tuple[str, bool, dict[int, int], dict[int, int], bool, list[Lane],
                                list[bytes], list[bytes]]] = {}
        # The pending value of a message without expiry or schedule, per (partition, priority).
        plain: dict[tuple[int, int], bytes] = {}
        record_bytes = 0
        kept_in_mem: list[tuple] = []
        last_topic = None
        for p in joined(pubs, RUN_MAX_MESSAGES, RUN_MAX_BYTES):  # (fewer, longer runs)
            topic = p.topic
            if topic != last_topic:  # (publishes mostly come in runs of one topic)
                known = topics.get(topic)
                if known is None:
                    cfg = producer.topic_config(topic)
                    lanes = self._lanes(topic)
                    first_index[topic] = {}
                    known = topics[topic] = (
                        cfg.durability, retains(cfg), producer.indexes.parts(topic),
                        first_index[topic], any(ln.members for ln in lanes), lanes, [], [])
                (durability, keep, next_index, firsts, live, lanes, pend_seqs,
                 pend_values) = known
                last_topic = topic
            if isinstance(p, PublishMany):  # (of run topics: see ``_expanded``)
                # Runs of at most RUN_MAX_MESSAGES and RUN_MAX_BYTES of payloads each (by
                # count alone when all of them fit in RUN_MAX_BYTES: no payload looked at).
                ends = list(accumulate(map(len, p.payloads))) if p.nbytes > RUN_MAX_BYTES \
                    else None
                start = 0
                while start < p.count:
                    end = min(p.count, start + RUN_MAX_MESSAGES) if ends is None else \
                        max(start + 1, bisect_right(
                            ends, (ends[start - 1] if start else 0) + RUN_MAX_BYTES, start,
                            min(p.count, start + RUN_MAX_MESSAGES)))
                    record_bytes += self._stage_run(
                        p, start, end, lanes, next_index, firsts, live,
                        durability == "memory", batch,
                        p.nbytes if ends is None else
                        ends[end - 1] - (ends[start - 1] if start else 0))
                    start = end
                if durability == "fsync":
                    batch.fsync = True
                continue
            partition = p.partition
            index = next_index.get(partition, 0)  # Indexes.allocate, inline
            next_index[partition] = index + 1
            if partition not in firsts:
                firsts[partition] = index
            fields = (topic, partition, p.key, p.headers, p.priority, p.published_at,
                      p.expires_at, p.deliver_at, p.payload, index)
            # A memory message stays as its fields: packed only if it spills.
            record = None if durability == "memory" else pack(fields)
            if keep:  # what replay reads and retention reclaims
                size = len(pack(fields) if record is None else record)
                batch.log_put.append(log_entry(topic, partition, index, p.seq,
                                               p.published_at, size))
                totals = retained.setdefault(topic, [0, 0])
                totals[0] += 1
                totals[1] += size
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
                        [partition, p.priority, 0, None, None])
            else:
                value = pack([partition, p.priority, 0, p.expires_at, p.deliver_at])
            pend_seqs.append(seq_b)
            pend_values.append(value)
            if durability == "fsync":
                batch.fsync = True
        batch.msgs_bytes += record_bytes
        producer._mem_bytes += mem_total(kept_in_mem)
        # One pending entry per lane and message, lane by lane: each lane's keys are
        # adjacent in LMDB, so each put lands next to the one before it.
        for topic, (*_, lanes, pend_seqs, pend_values) in topics.items():
            for lane in lanes if pend_seqs else ():
                batch.pend_runs.append((u32(producer.lane_ids[(topic, lane.name)]),
                                        pend_seqs, pend_values))
        for topic, firsts in first_index.items():
            next_index = producer.indexes.parts(topic)
            for partition in firsts:
                batch.log_next.append((partition_prefix(topic, partition),
                                       next_index[partition]))
        producer.retained.count_staged()
        if producer._mem_bytes > self.memory_budget_bytes:
            self._spill(batch, kept_in_mem)
        top = max(map(attrgetter("seq"), pubs), default=0) + 1
        if self._runs:  # (a PublishMany's sequences go beyond its first)
            top = max(top, max(run.first + run.count for run in self._runs))
        if top > self._seq_written:  # held publishes retried later have lower sequences
            self._seq_written = top
            batch.meta_put[b"next_seq"] = u64(top)
        return pubs

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
        cfg = self.p.topic_config(topic)
        return not retains(cfg) and not cfg.latest_wins and topic in self.p.by_topic

    def _stage_run(self, pm: PublishMany, start: int, end: int, lanes: list[Lane],
                   next_index: dict[int, int], firsts: dict[int, int], live: bool,
                   memory: bool, batch: WriteBatch, nbytes: int) -> int:
        """Write messages ``start:end`` of ``pm`` as a run (see runs.py): one record, one
        pending entry per lane; ``memory``: keep it in RAM instead, written only if it
        spills. ``nbytes``: their payloads' bytes (or more). Returns the size of the
        record written."""
        producer = self.p
        first, count, topic = pm.seq + start, end - start, pm.topic
        whole = start == 0 and end == pm.count
        partitions = pm.partitions if whole else pm.partitions[start:end]
        keys = pm.keys if whole or pm.keys is None else pm.keys[start:end]
        payloads = pm.payloads if whole else pm.payloads[start:end]
        published_at = pm.published_at  # (an array, one per message, from a stretch)
        if not whole and not isinstance(published_at, float):
            published_at = published_at[start:end]
        indexes, cycle = _allocate(first, partitions, next_index, firsts, pm.rounds)
        parts = round_robin_parts(first, count, cycle) if cycle else \
            fitting_array("BH", partitions)
        fields = [topic, parts, keys, pm.headers, published_at, payloads, indexes]
        lane_ids = producer.lane_ids
        run = Run(first, count, topic, parts, count,
                  {lane_ids[(topic, lane.name)]: count for lane in lanes}, not memory, nbytes)
        self._runs.append(run)
        if memory:  # (its record is never packed unless it spills)
            size = mem_run_size(fields)
            producer.mem_runs[first] = (fields, size)
            producer._mem_bytes += size
            return 0
        record = run_record(fields)
        batch.runs_put.append((u64(first), record))  # (its bytes counted by the caller)
        decoded = producer.decoded
        if live and decoded.bytes < decoded.limit:
            decoded.keep_run(first, fields, len(record) + RUN_ENTRY_BYTES * count)
        entry = run_entry(parts)
        batch.prun_put.extend((pend_key(lane_id, first), entry) for lane_id in run.owed)
        return len(record)

    def added(self, pubs: list[AnyPublish], now: float, batch: WriteBatch) -> None:
        """After commit: the publishes are stored; owe them to their lanes.

        ``batch`` is the next iteration's: what this supersedes is deleted there.
        """
        producer = self.p
        if pubs:
            for new in self._runs:
                producer.runs.add(new)
        self._runs.clear()
        offset = mono_offset()
        topics: dict[str, tuple[list[Lane], bool]] = {}  # topic -> (lanes, latest_wins)
        i, n = 0, len(pubs)
        while i < n:
            p = pubs[i]
            topic = p.topic
            known = topics.get(topic)
            if known is None:
                known = topics[topic] = (self._lanes(topic),
                                         producer.topic_config(topic).latest_wins)
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
                rounds = 0  # (while every one is a batch spread round-robin over as many)
                if many:
                    group = pubs[i:j]
                    partitions: list[int] = []
                    end = first = group[0].seq  # (one range while each follows the last)
                    rounds = group[0].rounds
                    for q in group:
                        end = end + q.count if end == q.seq else -1
                        if q.rounds != rounds:
                            rounds = 0
                        if isinstance(q, PublishMany):
                            partitions.extend(q.partitions)
                        else:
                            partitions.append(q.partition)
                    seqs = range(first, end) if end >= 0 else \
                        [seq for q in group for seq in q.seqs]
                else:
                    seqs = [q.seq for q in pubs[i:j]]
                    partitions = [q.partition for q in pubs[i:j]]  # type: ignore[union-attr]
                run = PlainRun(seqs, partitions, rounds)
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
                    producer._supersede(lane, p.key, p.seq, batch)
            i += 1
        producer.stored.extend(map(_stage, pubs))  # (a batch's stage once per message)
        count = message_count(pubs)
        producer.depth += count
        producer.counters.add("published", count)
        for topic, original, receipt in self.duplicates:
            if producer.owed(topic, original):
                producer._followers.setdefault(original, []).append(receipt)
                producer.stored.append(receipt._stage)
            else:
                producer.acked.append(receipt)
        self.duplicates.clear()

    def _spill(self, batch: WriteBatch, staged: list[tuple]) -> None:
        """Memory durability over budget: write the oldest messages and runs to LMDB (a
        record and pending entries each, as ``process`` stores them) until half the budget
        is left. ``staged``: the fields of the messages this ``stage`` kept in memory, which
        no lane owes yet (every lane of their topic will)."""
        producer = self.p
        mem, mem_runs = producer._mem, producer.mem_runs
        excess = producer._mem_bytes - self.memory_budget_bytes // 2
        singles: list[int] = []
        runs: list[int] = []
        freed = 0
        # Oldest first across both (each in the order kept: by sequence, mostly).
        for first, is_run in heapq.merge(zip(mem, repeat(False)), zip(mem_runs, repeat(True))):
            if freed >= excess:
                break
            if is_run:
                runs.append(first)
                freed += mem_runs[first][1]
            else:
                singles.append(first)
                freed += mem_size(mem[first])
        producer._mem_bytes -= freed
        new_fields = set(map(id, staged)) if singles else set()
        for seq in singles:
            fields = mem.pop(seq)
            self._spilled.append((seq, fields))
            topic, partition, _k, _h, priority, _p, expires_at, deliver_at, _pl, _i = fields
            record = pack(fields)
            batch.msgs_put.append((u64(seq), record))
            batch.msgs_bytes += len(record)
            owing = self._lanes(topic) if id(fields) in new_fields \
                else producer._owing(topic, seq)
            for lane in owing:
                batch.pend_put.append((pend_key(producer.lane_ids[(topic, lane.name)], seq),
                                       pack([partition, priority, lane.attempt(seq),
                                             expires_at, deliver_at])))
        new = {run.first: run for run in self._runs}  # (staged by this stage(): owed whole)
        for first in runs:
            decoded, size = mem_runs.pop(first)
            run = new.get(first) or producer.runs.by_first[first]
            run.stored = True
            self._spilled_runs.append((run, decoded, size))
            record = run_record(decoded)
            batch.runs_put.append((u64(first), record))
            batch.msgs_bytes += len(record)
            producer.decoded.keep_run(first, decoded, len(record) + RUN_ENTRY_BYTES * run.count)
            by_id = {producer.lane_ids[(run.topic, lane.name)]: lane
                     for lane in self._lanes(run.topic)}
            whole = run_entry(decoded[1]) if first in new else None
            for lane_id, owed in run.owed.items():
                entry = whole or lane_entry(by_id[lane_id], run, owed)
                if entry is not None:
                    batch.prun_put.append((pend_key(lane_id, first), entry))
        producer.counters.add("spilled", len(singles) + sum(
            run.count for run, _f, _s in self._spilled_runs))


def _allocate(first: int, partitions: list[int], next_index: dict[int, int],
              firsts: dict[int, int], rounds: int = 0) -> tuple[array[int], int]:
    """``Indexes.allocate`` of the consecutive messages from ``first``, inline (``firsts``:
    each partition's first index of the transaction), as an array (of "I", or of "q" if
    one is not below 2**32); and ``round_robin`` of them (``rounds``: the partition count
    they are known to be spread over round-robin, which needs no check once they wrap
    around). Spread round-robin, the message at place ``k`` gets its partition's next
    index plus ``k // count``, made with no step per message (see ``_cycle_indexes``)."""
    n = len(partitions)
    count = rounds if 0 < rounds < n else round_robin(first, partitions)
    if count:
        cycle = partitions[:count]
        get = next_index.get
        base = [get(partition, 0) for partition in cycle]
        indexes = _cycle_indexes(base, n)
        rows, rest = divmod(n, count)
        next_index.update(zip(cycle, map(add, base, [rows + 1] * rest
                                         + [rows] * (count - rest)), strict=True))
        if len(firsts) < count or not firsts.keys() >= set(cycle):
            for partition, index in zip(cycle, base, strict=True):
                if partition not in firsts:
                    firsts[partition] = index
        return indexes, count
    each = []
    for partition in partitions:
        index = next_index.get(partition, 0)
        next_index[partition] = index + 1
        each.append(index)
        if partition not in firsts:
            firsts[partition] = index
    return fitting_array("Iq", each), 0


def _index_code(top: int) -> str:
    """The array type of indexes up to ``top``."""
    return "I" if top < 1 << 32 else "q"


def _cycle_indexes(base: list[int], n: int) -> array[int]:
    """The indexes of ``n`` messages spread round-robin over a cycle of ``count``
    partitions whose next indexes are ``base`` (in the cycle's order): ``base[k % count]
    + k // count`` for the message at place ``k``.

    A topic published round-robin all along (the usual case) has ``base`` of ``m`` for
    the cycle's first partitions and ``m + 1`` for its last ``s``: the indexes are then
    ``m + (k + s) // count``, each value ``count`` times in a row (``m`` only ``count -
    s`` times), made a row at a time. Another ``base`` sets each partition's indexes as
    one range, a slice assignment per partition."""
    count, low = len(base), base[0]
    s = count - base.count(low)
    if base[count - s:].count(low + 1) == s:
        top = low + (n + s - 1) // count  # (the last message's)
        indexes = array(_index_code(top), (low,)) * (count - s)
        row = array(indexes.typecode, (0,))
        extend = indexes.extend
        for index in range(low + 1, top + 1):
            row[0] = index
            extend(row * count)
        del indexes[n:]
        return indexes
    ends = [index + len(range(k, n, count)) for k, index in enumerate(base)]
    indexes = array(_index_code(max(ends) - 1), (0,)) * n
    for k, index in enumerate(base):
        indexes[k::count] = array(indexes.typecode, range(index, ends[k]))
    return indexes
