"""The producer half of a node: the outbox, its lanes, and settling what they owe.

Runs only on the IO thread. A message leaves the outbox when no lane of its topic owes it
any more. Publishes come in through staging.py, leave through dispatch.py, and are kept
for replay by retained.py; restart.py reopens the outbox at a start.
"""

from __future__ import annotations

import heapq
import logging
import math
from array import array
from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from operator import itemgetter, lt, sub
from typing import TYPE_CHECKING

from ..._protocol.codec import INLINE_PAYLOAD_BYTES, LARGE_PAYLOAD_BYTES
from ..._store.damage import decode_record, decode_run
from ..._store.store import Store, WriteBatch, pack, pend_key, u64
from ...config import TopicConfig
from ..lane.delivery import IN_FLIGHT, Entry, Timing
from ..lane.lane import Lane
from ..stats import Counters
from .deadletters import DeadLetters
from .dispatch import Columns, Decoded
from .outcomes import Outcome, Outcomes
from .retained import Retained
from .retention import Indexes, retains
from .runs import RUN_ENTRY_BYTES, Runs, run_message
from .staging import UNCLAIMED, Staging, mem_total

if TYPE_CHECKING:
    from ..._receipt import Receipt, Stage

log = logging.getLogger(__name__)


def _timing(cfg: TopicConfig) -> Timing:
    return Timing(cfg.ack_timeout_s, cfg.retry_backoff_s, cfg.max_retry_backoff_s,
                  cfg.max_attempts)


class Producer:
    """Outbox, lanes and receipts of one node."""

    def __init__(self, store: Store, node_id: bytes, next_seq: int, next_lane: int,
                 topics: dict[str, TopicConfig], memory_budget_bytes: int,
                 max_message_bytes: int, counters: Counters,
                 outcomes: Outcomes | None = None) -> None:
        self.store = store
        # What messages became for a lane when it did not ack them (read by receipts).
        self.outcomes = Outcomes() if outcomes is None else outcomes
        self.node_id = node_id
        self.topics = topics
        self.counters = counters
        self.lanes: dict[tuple[str, str], Lane] = {}
        self.lane_ids: dict[tuple[str, str], int] = {}
        self.lane_meta: dict[tuple[str, str], tuple[str, str]] = {}  # group, mode
        # When each lane last had no member (wall clock; None while it has one, or not
        # seen yet), as its ``lanes`` entry keeps it: see ``expire_idle``.
        self.idle_since: dict[tuple[str, str], float | None] = {}
        self.by_topic: dict[str, list[Lane]] = {}  # claimed lanes only
        # The lanes with work, so that a loop iteration visits those alone (a node may have
        # thousands of lanes, most idle): each lane's timers as (at, serial, lane), the
        # earliest first, and the lanes that got ready messages (dispatch drops those with
        # none left, or no member).
        self._wakeups: list[tuple[float, int, Lane]] = []
        self._wakeup_serial = 0
        self.ready: dict[Lane, None] = {}
        self._next_lane = next_lane
        self._receipts: dict[int, Receipt] = {}  # seq -> receipt someone waits to see acked
        # The fields of memory-durability messages not spilled (a record, unpacked), and
        # their runs (runs.py) not spilled: first sequence -> (decoded run record, bytes
        # counted against the budget). ``_mem_bytes`` counts both.
        self._mem: dict[int, tuple] = {}
        self.mem_runs: dict[int, tuple[list, int]] = {}
        self._mem_bytes = 0
        self.decoded = Decoded()  # fields of stored records, kept to be sent (dispatch.py)
        # No payload in the outbox is larger: what this node publishes is bounded by its
        # max_message_bytes, and dispatch raises it for a record read back that is larger
        # (stored under an earlier config). A member accepting as much needs no check.
        self.payload_bound = max_message_bytes
        self.depth = 0  # messages in the outbox
        self.stored: list[Stage] = []  # stored since the last notify: their receipts say so
        self.acked: list[Receipt] = []
        self.settled_floor: float | None = None  # set by watch(), told by the next notify
        self._followers: dict[int, list[Receipt]] = {}  # receipts of suppressed duplicates
        self.dead = DeadLetters(self)
        self._latest: dict[tuple[str, str], dict[str, int]] = {}  # latest_wins: key -> seq
        self.indexes = Indexes(store.next_indexes())
        self.retained = Retained(self)
        self.staging = Staging(self, next_seq, memory_budget_bytes)
        self.runs = Runs()  # publish_many batches stored as one record each (runs.py)

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
        lane.on_timer = self._on_timer
        lane.on_ready = self._on_ready
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
        self.outcomes.claim(topic, seqs, [ln.name for ln in lanes])
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

    def forget_mem(self, seqs: Sequence[int]) -> list[int]:
        """Drop memory messages' fields; returns those of ``seqs`` that had none (stored in
        LMDB)."""
        fields = list(map(self._mem.pop, seqs, repeat(None)))
        self._mem_bytes -= mem_total(list(filter(None, fields)))
        if None not in fields:
            return []
        return [seq for seq, f in zip(seqs, fields, strict=True) if f is None]

    def forget_mem_runs(self, firsts: Iterable[int]) -> None:
        """Drop memory runs (settled, spilled or never stored) from RAM."""
        pop = self.mem_runs.pop
        for first in firsts:
            kept = pop(first, None)
            if kept is not None:
                self._mem_bytes -= kept[1]

    def record(self, seq: int) -> bytes | None:
        """The stored record of ``seq`` (a memory message's, or one of a run's, packed
        now); None if gone."""
        fields = self._mem.get(seq)
        if fields is None and self.runs.find(seq) is not None:
            fields = self.run_messages([seq]).get(seq)
        if fields is not None:
            return pack(fields)
        return self.store.get_messages([seq]).get(seq)

    def _decoded_runs(self, firsts: list[int], batch: WriteBatch | None = None
                      ) -> dict[int, list]:
        """The decoded records of the runs starting at ``firsts``, kept decoded whole
        (``Decoded.runs``) once read. A record that cannot be decoded is left out, and set
        aside given ``batch`` (its messages are then settled as lost)."""
        kept, mem = self.decoded.runs, self.mem_runs
        out = {first: kept[first][0] for first in firsts if first in kept}
        if mem:
            out.update((first, mem[first][0]) for first in firsts if first in mem)
        absent = [first for first in firsts if first not in out]
        records = self.store.get_runs(absent) if absent else {}
        for first in absent:
            record = records.get(first)
            fields = None if record is None else decode_run(record)
            if record is None or fields is None:
                if record is not None and batch is not None:
                    self.set_aside("runs", u64(first), record,
                                   "a run's record: its messages are settled as lost", batch)
                continue
            self.decoded.keep_run(first, fields, len(record) + RUN_ENTRY_BYTES * len(fields[1]))
            bound = max(map(len, fields[5]))
            if bound > self.payload_bound:
                self.payload_bound = bound
            out[first] = fields
        return out

    def run_messages(self, seqs: list[int], batch: WriteBatch | None = None
                     ) -> dict[int, tuple]:
        """The fields of those of ``seqs`` that runs hold (see ``_decoded_runs``)."""
        _, hits = self.runs.split(seqs)
        if not hits:
            return {}
        records = self._decoded_runs(list(hits), batch)
        out: dict[int, tuple] = {}
        for seq in seqs:
            run = self.runs.find(seq)
            if run is not None and run.first in records:
                out[seq] = run_message(records[run.first], seq - run.first)
        return out

    def run_columns(self, seqs: list[int] | range, max_message_bytes: int) -> Columns | None:
        """The columns of ``seqs`` (a take, in ascending order) when runs hold them all,
        taken from the runs' records with no Python step per message (read from LMDB
        and kept decoded if they are not); None when they are not all in runs, or a run
        cannot be read, or a payload is larger than ``max_message_bytes``: the
        per-message way then sends, sets aside or parks them."""
        if type(seqs) is not range and not all(map(lt, seqs, islice(seqs, 1, None))):
            return None
        singles, hits = self.runs.split(seqs)
        if singles:
            return None
        records = self._decoded_runs(list(hits))
        if len(records) < len(hits):
            return None
        keys: list[str | None] = []
        headers: list[dict | None] = []
        published_ats = array("d")  # (packed as it is: no conversion per message)
        indexes: array[int] | None = None  # (the runs' arrays, joined: likewise)
        payloads: list[bytes] = []
        pos = 0
        by_first = self.runs.by_first
        nbytes = 0  # the payloads' bytes, or more (-1 once a run's are not known)
        for first, n in hits.items():
            part = seqs[pos:pos + n]
            pos += n
            _t, _parts, run_keys, run_headers, published_at, run_payloads, run_indexes = \
                records[first]
            each_at = type(published_at) is array  # (else one time for the whole run)
            if part[-1] - part[0] == n - 1:  # consecutive: slices
                at = slice(part[0] - first, part[0] - first + n)
                payloads += run_payloads[at]
                part_indexes = run_indexes[at]
                keys += run_keys[at] if run_keys else repeat(None, n)
                published_ats += published_at[at] if each_at else \
                    array("d", (published_at,)) * n
            else:  # (a scatter: one member's partitions) the places picked at C speed
                pick = itemgetter(*map(sub, part, repeat(first)))  # (n > 1: tuples)
                payloads += pick(run_payloads)
                part_indexes = array(run_indexes.typecode, pick(run_indexes))
                keys += pick(run_keys) if run_keys else repeat(None, n)
                published_ats += array("d", pick(published_at)) if each_at else \
                    array("d", (published_at,)) * n
            if indexes is None:
                indexes = part_indexes
            elif indexes.typecode == part_indexes.typecode:
                indexes += part_indexes
            else:  # (an index past 2**32 in one of them: all as int64)
                indexes = array("q", indexes)
                indexes += array("q", part_indexes)
            headers += repeat(run_headers, n)
            run_bytes = by_first[first].nbytes
            if nbytes >= 0:
                nbytes = run_bytes + nbytes if 0 <= run_bytes < LARGE_PAYLOAD_BYTES else -1
        if max_message_bytes < self.payload_bound and \
                max(map(len, payloads)) > max_message_bytes:
            return None
        return Columns(keys, headers, published_ats, array("I") if indexes is None else indexes,
                       payloads, 0 <= nbytes <= INLINE_PAYLOAD_BYTES)

    def owed(self, topic: str, seq: int) -> bool:
        """Some lane of ``topic`` still owes ``seq``."""
        return bool(self._owing(topic, seq))

    def _owing(self, topic: str, seq: int) -> list[Lane]:
        lanes = [lane for lane in self.by_topic.get(topic, ()) if seq in lane]
        unclaimed = self.lanes.get((topic, UNCLAIMED))
        if unclaimed is not None and seq in unclaimed:
            lanes.append(unclaimed)
        return lanes

    # -- settling -----------------------------------------------------------------------

    def watch(self, receipts: list[Receipt]) -> None:
        """Track receipts whose acks someone waits for; those settled already resolve now,
        and ``settled_floor`` tells the application the floor below which every stored
        message is settled (receipts of those need no question; see ``Receipt.acked``).

        Runs after the loop's publishes joined their lanes; a receipt asks only once its
        message is stored, so its message is owed or settled, never unknown.
        """
        for receipt in receipts:
            first = receipt._seq
            for seq in range(first, first + receipt.count):
                if self.owed(receipt.topic, seq):
                    self._receipts[seq] = receipt
                elif seq not in self._receipts:
                    self.acked.append(receipt)
        self.settled_floor = min((lane.floor() for lane in self.lanes.values() if len(lane)),
                                 default=math.inf)

    def _settled(self, topic: str, lane: Lane, seqs: Iterable[int], batch: WriteBatch,
                 outcome: Outcome | None = None) -> None:
        """``lane`` no longer owes ``seqs`` (``outcome``: how, when not acked); drop each
        message that nobody owes. (A ``range``, consecutive acks mostly, is kept as one:
        each step below takes it.)"""
        if not isinstance(seqs, range):
            seqs = list(seqs)
        if not seqs:
            return
        if outcome is not None:
            self.outcomes.record(lane.name, outcome, seqs)
        lane_id = self.lane_ids[(topic, lane.name)]
        mem = self._mem
        # What another lane of the topic still owes stays in the outbox: the runs' counts
        # settle most of a run's sequences at once, each lane is asked about the rest, and
        # only about what the lanes before it do not owe.
        others = [other for other in self.by_topic.get(topic, ()) if other is not lane]
        free: list[int] = []
        unowed: Sequence[int] = seqs
        if others and self.runs:
            free, unowed = self.runs.owed_elsewhere(
                seqs, [self.lane_ids[(topic, other.name)] for other in others])
        for other in others:
            if not unowed:
                break
            owed = other.owed_among(unowed)
            if len(owed) == len(unowed):
                unowed = []
            elif owed:
                elsewhere = set(owed)
                unowed = [s for s in unowed if s not in elsewhere]
        if free:
            unowed = [*free, *unowed]
        pend = [s for s in seqs if s not in mem] if mem else seqs
        if self.runs:  # (a run's entry per lane instead of one per message)
            pend = self.runs.settled(lane, lane_id, pend, batch)
        batch.pend_del.extend(map(pend_key, repeat(lane_id), pend))
        if self.dead.replayed:
            for seq in seqs:
                self.dead.settled(lane_id, seq, batch)
        if not unowed:
            return
        # (what nobody owes leaves the outbox)
        if self.decoded.fields:
            self.decoded.forget(unowed)
        # (a run's record leaves with its last message)
        unowed_singles = unowed
        if self.runs:
            unowed_singles, ended = self.runs.gone(unowed, batch)
            if ended and self.decoded.runs:
                self.decoded.forget_runs(ended)
            if ended and self.mem_runs:
                self.forget_mem_runs(ended)
        if not retains(self.topic_config(topic)):  # (else retention reclaims the record)
            gone = self.forget_mem(unowed_singles) if mem else unowed_singles
            batch.msgs_del.extend(map(u64, gone))
        self.depth -= len(unowed)
        if self._receipts:
            pop = self._receipts.pop
            self.acked.extend(r for r in map(pop, unowed, repeat(None)) if r is not None)
        if self._followers:
            for seq in unowed:
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

    def on_touch(self, topic: str, name: str, seqs: Iterable[int], member: bytes,
                 now: float) -> None:
        lane = self.lanes.get((topic, name))
        if lane is not None:
            self._count(lane, "lease_extended", lane.touch(seqs, member, now))

    def on_fail(self, topic: str, name: str, seq: int, reason: str, batch: WriteBatch) -> None:
        lane = self.lanes.get((topic, name))
        if lane is None:
            return
        entry = lane.fail(seq)
        if entry is not None:
            self._park(lane, entry, reason, batch)

    def _park(self, lane: Lane, entry: Entry, reason: str, batch: WriteBatch) -> None:
        self.dead.park(lane, entry, reason, self.record(entry.seq), batch)
        self._settled(lane.topic, lane, [entry.seq], batch, Outcome.DEAD_LETTERED)

    def _persist_attempts(self, lane: Lane, seqs: Iterable[int], batch: WriteBatch) -> None:
        lane_id = self.lane_ids[(lane.topic, lane.name)]
        wanted = [s for s in seqs if s in lane and s not in self._mem]
        if wanted and self.runs:
            wanted = self.runs.rewrite(lane, lane_id, wanted, batch)
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
            self._settled(lane.topic, lane, [old], batch, Outcome.SUPERSEDED)
            self._count(lane, "superseded", 1)

    def index_latest(self, topic: str) -> None:
        """Rebuild the key index of a latest_wins topic from its stored messages."""
        wanted: dict[int, list[Lane]] = {}
        for lane in self._owing_lanes(topic):
            for seq in lane.seqs():
                wanted.setdefault(seq, []).append(lane)
        records = self.store.get_messages([s for s in wanted if s not in self._mem])
        in_runs = self.run_messages(list(wanted)) if self.runs else {}
        for seq in sorted([*records, *in_runs, *(s for s in wanted if s in self._mem)]):
            fields = self._mem.get(seq) or in_runs.get(seq) or decode_record(records[seq])
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

    # -- group lifecycle ----------------------------------------------------------------

    def retire(self, lane: Lane, batch: WriteBatch, why: str) -> int:
        """Drop ``lane`` (a group deleted or expired) and what it owes: counted in
        ``dropped_group_deleted``, its receipts' outcome ``group_deleted``; its stored
        entries and dead letters go with it. Returns the messages it owed."""
        topic, name = lane.topic, lane.name
        key = (topic, name)
        owed = lane.seqs()
        if owed:
            settled = lane.ack(sorted(owed))
            self._settled(topic, lane, settled, batch, Outcome.GROUP_DELETED)
            self.counters.add("dropped_group_deleted", len(settled))
        lane_id = self.lane_ids.pop(key)
        batch.lanes_del.append((pack([topic, name]), lane_id))
        del self.lanes[key]
        del self.lane_meta[key]
        self.idle_since.pop(key, None)
        self._latest.pop(key, None)
        self.ready.pop(lane, None)
        lanes = self.by_topic.get(topic, [])
        if lane in lanes:
            lanes.remove(lane)
            if not lanes:
                del self.by_topic[topic]
        parked = self.dead.forget_lane(lane_id)
        if parked:
            self.counters.add("dead_letters_dropped", parked)
        self.counters.add("lanes_retired", 1)
        log.warning("lane %s/%s retired (%s): %d pending messages and %d dead letters "
                    "dropped", topic, name, why, len(owed), parked)
        return len(owed)

    def delete_group(self, topic: str, group: str, batch: WriteBatch) -> int:
        """Retire every lane of ``group`` on ``topic`` (the shared one and broadcast
        members' own); returns the pending messages dropped."""
        lanes = [lane for key, lane in self.lanes.items()
                 if key[0] == topic and key[1] != UNCLAIMED and self.lane_meta[key][0] == group]
        return sum(self.retire(lane, batch, "group deleted") for lane in lanes)

    def expire_idle(self, wall: float, batch: WriteBatch, retire: bool = True) -> int:
        """Note which lanes have members (``idle_since``, kept in their ``lanes``
        entries) and (``retire``) retire those that had none for their topic's
        ``group_inactive_expiry_s`` (0: never; groups declared on the topic never
        expire). ``wall``: the wall clock now. Returns how many were retired."""
        retired = 0
        for key, lane in list(self.lanes.items()):
            topic, name = key
            if name == UNCLAIMED:
                continue
            idle = self.idle_since.get(key)
            if lane.members:
                if idle is not None:
                    self._note_idle(key, None, batch)
                continue
            if idle is None:
                self._note_idle(key, wall, batch)
                continue
            if not retire:
                continue
            cfg = self.topic_config(topic)
            group, mode = self.lane_meta[key]
            expiry = cfg.group_inactive_expiry_s
            if not expiry or (mode == "shared" and group in cfg.groups) or wall - idle < expiry:
                continue
            self.retire(lane, batch, f"no member for {wall - idle:.0f}s, past the topic's "
                                     f"group_inactive_expiry_s of {expiry:g}s")
            self.counters.add("groups_expired", 1)
            retired += 1
        return retired

    def _note_idle(self, key: tuple[str, str], since: float | None, batch: WriteBatch) -> None:
        self.idle_since[key] = since
        group, mode = self.lane_meta[key]
        batch.lanes_put.append((pack(list(key)), pack([self.lane_ids[key], group, mode, since])))

    def groups(self, topic: str | None, wall: float) -> list[dict]:
        """This producer's lanes (of ``topic``, or all) for listings: group, mode,
        pending, in flight, members, last seen (wall clock), oldest message's age."""
        out = []
        for key, lane in self.lanes.items():
            if key[1] == UNCLAIMED or (topic is not None and key[0] != topic):
                continue
            group, mode = self.lane_meta[key]
            cfg = self.topic_config(key[0])
            pending = len(lane)
            oldest = self.published_at(lane.floor()) if pending else None
            out.append({
                "topic": key[0], "group": group, "mode": mode, "lane": key[1],
                "pending": pending, "in_flight": lane.in_flight_count(),
                "members": [m.hex() for m in lane.members],
                "last_seen": wall if lane.members else self.idle_since.get(key),
                "oldest_age_s": None if oldest is None else max(0.0, wall - oldest),
                "declared": mode == "shared" and group in cfg.groups,
                "expires_after_s": cfg.group_inactive_expiry_s or None,
                "dead_letters": self.dead.parked(self.lane_ids[key]),
            })
        return out

    def published_at(self, seq: int) -> float | None:
        """When ``seq`` was published (wall clock), from its stored fields; None if gone."""
        fields = self._mem.get(seq) or self.decoded.fields.get(seq)
        if fields is None and self.runs.find(seq) is not None:
            fields = self.run_messages([seq]).get(seq)
        if fields is None:
            record = self.store.get_messages([seq]).get(seq)
            fields = None if record is None else decode_record(record)
        return None if fields is None else float(fields[5])

    def member_gone(self, member: bytes, now: float) -> int:
        moved = 0
        for lane in self.lanes.values():
            moved += lane.remove_member(member, now)
        if moved:
            self.counters.add("redelivered_member_gone", moved)
        return moved

    # -- time and damaged records -------------------------------------------------------

    def _on_ready(self, lane: Lane) -> None:
        self.ready[lane] = None  # (a dict: an ordered set)

    def _on_timer(self, lane: Lane, at: float) -> None:
        self._wakeup_serial += 1
        heapq.heappush(self._wakeups, (at, self._wakeup_serial, lane))

    def tick(self, now: float, batch: WriteBatch) -> None:
        """Tick the lanes with a timer due."""
        wakeups = self._wakeups
        due: dict[Lane, None] = {}
        while wakeups and wakeups[0][0] <= now:
            due[heapq.heappop(wakeups)[2]] = None
        for lane in due:
            if self.lanes.get((lane.topic, lane.name)) is not lane:
                continue  # retired
            lane._wake_at = math.inf  # what it was told of is due: tell again what is left
            result = lane.tick(now)
            if result.timed_out:
                self._count(lane, "ack_timeouts", result.timed_out)
            if result.expired:
                self._count(lane, "expired", len(result.expired))
                self._settled(lane.topic, lane, result.expired, batch, Outcome.EXPIRED)
            for entry in result.exhausted:
                self._park(lane, entry, "max attempts reached after ack timeouts", batch)
            nxt = lane.next_wakeup()
            if nxt is not None:
                lane._timer(nxt)

    def next_wakeup(self) -> float | None:
        """The earliest timer of any lane (maybe of work already done: a tick then finds
        nothing), or None."""
        return self._wakeups[0][0] if self._wakeups else None

    def set_aside(self, db: str, key: bytes, value: bytes, why: str,
                  batch: WriteBatch) -> None:
        """A record that cannot be decoded: move it to the ``bad`` db, count it, say so."""
        batch.quarantine.append((db, key, value))
        self.counters.add("corrupt_records", 1)
        log.error("record %s of the %r db in %s cannot be decoded (%s); it is set aside in "
                  "the 'bad' db and the node goes on without it", key.hex(), db,
                  self.store.path, why)


def lane_id_bytes(n: int) -> bytes:
    return n.to_bytes(4, "big")

