"""A dead producer's lanes taken over by a replica, and given back when it returns (IO
thread only).

A copy is the producer's outbox in the producer's own format (writes.py), so the taker
opens it as an ``Outbox`` under the producer's id: its lanes, each message READY again,
dispatched to the live members, each partition to its home as the producer's lane
records keep it (lane/assignment.py), so to the member it went to before, in data batches
that carry the producer's id and the message's own sequence: consumers drop by their
dedupe window what they handled already. The batches carry ``TAKEN_INCARNATION`` (a
consumer tells a taker's batches from the producer's by it) and a floor of 0: consumers
forget nothing of the producer's dedupe window while its lanes are taken over, so
another replica taking over after this one still finds what they acked. Settlements for
the producer reach the taker relayed (``Ack.producer``) and are written to the copy.

When the producer speaks again, the taker stops sending, waits until nothing it sent is
in flight (at most the lanes' ack timeout), then hands back what it settled since it took
over, per lane and outcome (``Handback``), with the dead letters it parked; the producer
applies it before it sends anything (it holds its dispatch while a node serves it), acks
it, and the taker lets go.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any

import lmdb
import msgpack

from ..._protocol.frames import Ack, Fail, Handback, HandbackLane, Nack, Touch, random_token
from ..._protocol.replication import MAX_HANDBACK_INTS
from ..._store.keys import u32
from ..._store.store import WriteBatch, pack, pend_key
from ...config import NodeConfig, TopicConfig
from ...errors import ConfigError, StoreError
from ..lane.lane import Lane
from ..outbox.dispatch import Send
from ..outbox.outbox import Outbox
from ..outbox.outcomes import Outcome, Outcomes, seq_runs
from ..stats import Counters
from .copies import Copy

log = logging.getLogger(__name__)

# The incarnation a taker's data batches carry for the producer it serves: above any a
# node reaches by restarting.
TAKEN_INCARNATION = 1 << 62
# Ids of lanes a taker makes for groups new to it: above any the producer made.
TAKEN_LANE_IDS = 1 << 30
HANDBACK_DEAD_BYTES = 512 << 10  # dead letters' bytes per hand-back part
_TAKEN_META = b"taken"  # the copy's meta: what each lane owed when it was taken over

Settlement = Ack | Nack | Fail | Touch


def is_settlement(msg: object, me: bytes) -> bool:
    """A settlement relayed for another producer's lanes."""
    return isinstance(msg, Settlement) and bool(msg.producer) and msg.producer != me


class Taken:
    """One producer's lanes served by this node from its copy."""

    def __init__(self, copy: Copy, config: NodeConfig, now: float) -> None:
        self.copy = copy
        self.producer = copy.producer
        self.store = copy.store
        self.counters = Counters()
        self.outcomes = Outcomes()
        topics = {name: _topic_config(fields) for name, fields in copy.topics.items()}
        self.outbox = Outbox(
            copy.store,
            copy.producer,
            0,
            TAKEN_LANE_IDS,
            topics,
            config.memory_budget_bytes,
            config.max_message_bytes,
            self.counters,
            self.outcomes,
        )
        self.wb = WriteBatch()
        self.outbox.load(now, self.wb)
        for c in self.store.take_corrupt():
            self.outbox.records.set_aside(c.db, c.key, c.value, c.reason, self.wb)
        # What each lane owed when it was taken over (kept in the copy: a taker restarted
        # hands back what it settled before too): lane id -> [lo, hi) ranges.
        with (
            self.store.health.reading("the meta database", "meta"),
            self.store.env.begin(db=self.store.meta) as txn,
        ):
            raw = txn.get(_TAKEN_META)
        if raw is not None:
            self.start: dict[int, list[tuple[int, int]]] = {
                int(k): [tuple(r) for r in v]
                for k, v in msgpack.unpackb(raw, raw=False, strict_map_key=False).items()
            }
        else:
            self.start = {lane.id: seq_runs(lane.seqs()) for lane in self.outbox.lanes.all.values()}
            self.wb.meta_put[_TAKEN_META] = pack(self.start)
        self.commit()
        self.since = now
        self.dispatch_from = now + config.heartbeat_interval_s  # (peers hear of it first)
        self.token = 0  # the hand-back under way (0: none)
        self.back_since = 0.0  # when the producer was seen back
        self.sent_at = 0.0  # when the hand-back was last sent
        self.idle_since = 0.0  # since when its lanes owe nothing (0: they owe some)
        self.fresher_since = 0.0  # since when a holder has a later life's copy (0: none)

    # -- serving --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self.outbox.depth

    def settle(self, msg: Settlement, now: float) -> None:
        settler, wb = self.outbox.settler, self.wb
        if isinstance(msg, Ack):
            settler.on_ack(msg.topic, msg.lane, msg.seqs, wb)
        elif isinstance(msg, Nack):
            delay = None if msg.delay_s < 0 else msg.delay_s
            settler.on_nack(msg.topic, msg.lane, msg.seqs, delay, wb, now)
        elif isinstance(msg, Fail):
            settler.on_fail(msg.topic, msg.lane, msg.seq, msg.reason, wb)
        else:
            settler.on_touch(msg.topic, msg.lane, msg.seqs, msg.node_id, now)

    def next_wakeup(self) -> float | None:
        return self.outbox.lanes.next_wakeup()

    def tick(self, now: float) -> None:
        due = self.outbox.lanes.next_wakeup()
        if due is not None and due <= now:
            self.outbox.settler.tick(now, self.wb)

    def dispatch(self, now: float, send: Send) -> None:
        if not self.back_since and now >= self.dispatch_from:
            self.outbox.dispatcher.dispatch(now, send, self.wb)

    def commit(self) -> None:
        if not self.wb:
            return
        wb, self.wb = self.wb, WriteBatch()
        try:
            self.store.commit(wb)
        except StoreError as exc:
            self.counters.add("store_errors", 1)
            log.error("the copy of %s could not commit: %s", self.producer.hex()[:12], exc)

    # -- handing back ----------------------------------------------------------------------

    def holds_dead_letters(self) -> bool:
        """The copy holds dead letters (or cannot tell: its store cannot be read)."""
        try:
            with (
                self.store.health.reading("the dead database", "dead"),
                self.store.env.begin(db=self.store.dead) as txn,
            ):
                return bool(txn.stat(self.store.dead)["entries"])
        except StoreError:
            return True

    def in_flight(self) -> int:
        return sum(lane.in_flight_count() for lane in self.outbox.lanes.all.values())

    def ready_to_hand_back(self, now: float) -> bool:
        """Nothing sent is in flight any more, or the longest ack timeout has passed."""
        if not self.in_flight():
            return True
        timeout = max(
            (cfg.ack_timeout_s for cfg in self.outbox.lanes.topics.values()), default=30.0
        )
        return now - self.back_since >= timeout

    def handback(self, me: bytes) -> list[Handback]:
        """What this node settled of the producer's lanes since it took them over, in
        parts (a new ``token`` the first time)."""
        if not self.token:
            self.token = random_token() + 1
        parts: list[HandbackLane] = []
        for lane in self.outbox.lanes.all.values():
            owed_then = self.start.get(lane.id)
            if not owed_then:
                continue
            now_owed = set(lane.seqs())
            settled = sorted(s for lo, hi in owed_then for s in range(lo, hi) if s not in now_owed)
            if not settled:
                continue
            # The dead letters the copy holds are told by their records, not by the
            # outcomes in memory: those of a taker restarted since are gone.
            dead = self._dead(lane.id, settled)
            acked = set(settled).difference(seq for seq, _v in dead)
            for outcome, ranges in self.outcomes.of_lane(lane.name).items():
                seqs = [
                    s
                    for lo, hi in ranges
                    for s in settled[bisect_left(settled, lo) : bisect_left(settled, hi)]
                    if s in acked
                ]
                if not seqs:
                    continue
                acked.difference_update(seqs)
                parts += _parts(lane.topic, lane.name, outcome, seqs, [])
            if dead:
                seqs = [seq for seq, _v in dead]
                parts += _parts(lane.topic, lane.name, Outcome.DEAD_LETTERED, seqs, dead)
            parts += _parts(lane.topic, lane.name, Outcome.ACKED, sorted(acked), [])
        if not parts:
            return [Handback(me, self.producer, self.token, (), True)]
        return [
            Handback(me, self.producer, self.token, (part,), i == len(parts) - 1)
            for i, part in enumerate(parts)
        ]

    def _dead(self, lane_id: int, seqs: list[int]) -> list[tuple[int, bytes]]:
        """The dead letters of ``seqs`` (ascending) this copy holds, ascending (those it
        cannot read, in a damaged store, are handed back by the outcomes in memory)."""
        out = []
        wanted = set(seqs)
        prefix = u32(lane_id)
        try:
            with (
                self.store.health.reading("the dead database", "dead"),
                self.store.env.begin(db=self.store.dead) as txn,
            ):
                cur = txn.cursor()
                more = cur.set_range(prefix)
                while more and cur.key()[:4] == prefix:
                    seq = int.from_bytes(cur.key()[4:12], "big")
                    if seq in wanted:
                        out.append((seq, bytes(cur.value())))
                    more = cur.next()
        except StoreError as exc:
            log.error(
                "dead letters of %s's lane %d are handed back without their records: %s",
                self.producer.hex()[:12],
                lane_id,
                exc,
            )
        return out

    def close(self) -> None:
        """Let go of the lanes (the copy stays, as it is, until the producer replaces it)."""
        self.commit()
        try:
            with self.store.env.begin(write=True, db=self.store.meta) as txn:
                txn.delete(_TAKEN_META)
        except lmdb.Error as exc:  # (a taker of this copy again resumes where this one was)
            log.error(
                "the copy of %s cannot forget its takeover: %s", self.producer.hex()[:12], exc
            )


def _parts(
    topic: str, lane: str, outcome: str, seqs: list[int], dead: list[tuple[int, bytes]]
) -> list[HandbackLane]:
    """``seqs`` (ascending) as hand-back lanes of bounded size: the dead letters first
    (the producer parks them as they were), then the ranges of every one of them."""
    out = []
    part: list[tuple[int, bytes]] = []
    size = 0
    for seq, value in dead:
        if part and size + len(value) > HANDBACK_DEAD_BYTES:
            out.append(HandbackLane(topic, lane, outcome, (), tuple(part)))
            part, size = [], 0
        part.append((seq, value))
        size += len(value)
    if part:
        out.append(HandbackLane(topic, lane, outcome, (), tuple(part)))
    flat = [bound for lo, hi in seq_runs(seqs) for bound in (lo, hi)]
    step = MAX_HANDBACK_INTS
    for i in range(0, len(flat), step):
        out.append(HandbackLane(topic, lane, outcome, tuple(flat[i : i + step])))
    return out


def _topic_config(fields: dict[str, Any]) -> TopicConfig:
    """The producer's configuration of a topic, as its sync carried it (the default one
    when it does not make one here)."""
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    try:
        return TopicConfig(**values)
    except (ConfigError, TypeError) as exc:
        log.warning("a replicated topic's configuration is not valid here (%s)", exc)
        return TopicConfig()


def apply_handback(outbox: Outbox, msg: Handback, wb: WriteBatch) -> int:
    """The producer's side: settle what the taker settled (its dead letters parked here
    too). Returns the messages settled."""
    settled_total = 0
    for part in msg.lanes:
        lane = outbox.lanes.get(part.topic, part.lane)
        if lane is None:
            continue
        try:
            outcome = Outcome(part.outcome)
        except ValueError:
            continue
        if part.dead:
            owed = set(lane.owed_among(sorted(seq for seq, _v in part.dead)))
            wb.dead_put.extend(
                (pend_key(lane.id, seq), value) for seq, value in part.dead if seq in owed
            )
            seqs: list[int] = sorted(owed)
        else:
            seqs = _owed_in_ranges(lane, part.ranges)
        if not seqs:
            continue
        settled = lane.ack(seqs)
        outbox.settler.settled(lane, settled, wb, None if outcome == Outcome.ACKED else outcome)
        outbox.lanes.count(lane, "handed_back", len(settled))
        settled_total += len(settled)
    return settled_total


def _owed_in_ranges(lane: Lane, bounds: tuple[int, ...]) -> list[int]:
    """What ``lane`` owes of the ``[lo, hi)`` ranges ``bounds`` (flat pairs). A range
    longer than what the lane owes is not walked (a frame may name 2**63 sequences): the
    lane's own sequences are looked at instead."""
    seqs: list[int] = []
    for i in range(0, len(bounds), 2):
        lo, hi = bounds[i], bounds[i + 1]
        if hi - lo > 2 * len(lane):
            seqs += sorted(s for s in lane.seqs() if lo <= s < hi)
        else:
            seqs += lane.owed_among(range(lo, hi))
    return seqs
