"""Settling what a producer's lanes owe (IO thread only): acks, nacks, fails, touches,
timers, supersession, and the message leaving the outbox once no lane owes it.

A lane's delivery state is its own (lane/lane.py); this part writes what settling means
to the store (pending entries and run entries deleted or rewritten, records deleted,
dead letters parked), records outcomes other than acks, and tells receipts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat

from ..._store.store import WriteBatch, pack, pend_key
from ..lane.delivery import IN_FLIGHT, Entry
from ..lane.lane import Lane
from ..limits import LATEST_KEYS_PRUNE
from .deadletters import DeadLetters
from .lanes import Lanes
from .outcomes import Outcome, Outcomes
from .receipts import Receipts
from .records import Records
from .retention import retains


class Settler:
    """What settling a producer's messages does to its outbox."""

    def __init__(
        self,
        lanes: Lanes,
        records: Records,
        receipts: Receipts,
        dead: DeadLetters,
        outcomes: Outcomes,
    ) -> None:
        self.lanes = lanes
        self.records = records
        self.receipts = receipts
        self.dead = dead
        self.outcomes = outcomes
        self._latest: dict[tuple[str, str], dict[str, int]] = {}  # latest_wins: key -> seq
        self._prune_latest_at: dict[tuple[str, str], int] = {}

    def settled(
        self, lane: Lane, seqs: Iterable[int], batch: WriteBatch, outcome: Outcome | None = None
    ) -> None:
        """``lane`` no longer owes ``seqs`` (``outcome``: how, when not acked); drop each
        message that nobody owes. (A ``range``, consecutive acks mostly, is kept as one:
        each step below takes it.)"""
        if not isinstance(seqs, range):
            seqs = list(seqs)
        if not seqs:
            return
        if outcome is not None:
            self.outcomes.record(lane.name, outcome, seqs)
        records = self.records
        runs, mem = records.runs, records.mem
        # What another lane of the topic still owes stays in the outbox: the runs' counts
        # settle most of a run's sequences at once, each lane is asked about the rest, and
        # only about what the lanes before it do not owe.
        others = [other for other in self.lanes.of_topic(lane.topic) if other is not lane]
        free: list[int] = []
        unowed: Sequence[int] = seqs
        if others and runs:
            free, unowed = runs.owed_elsewhere(seqs, [other.id for other in others])
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
        if runs:  # (a run's entry per lane instead of one per message)
            pend = runs.settled(lane, lane.id, pend, batch)
        batch.pend_del.extend(map(pend_key, repeat(lane.id), pend))
        if self.dead.replayed:
            self.dead.settled(lane, seqs, batch)
        if unowed:
            records.leave(unowed, retains(self.lanes.config(lane.topic)), batch)
            self.receipts.settled(unowed)

    # -- what consumers say ---------------------------------------------------------------

    def on_ack(self, topic: str, name: str, seqs: Iterable[int], batch: WriteBatch) -> int:
        lane = self.lanes.get(topic, name)
        if lane is None:
            return 0
        settled = lane.ack(seqs)
        self.settled(lane, settled, batch)
        self.lanes.count(lane, "acked", len(settled))
        return len(settled)

    def on_nack(
        self,
        topic: str,
        name: str,
        seqs: Iterable[int],
        delay_s: float | None,
        batch: WriteBatch,
        now: float,
    ) -> None:
        lane = self.lanes.get(topic, name)
        if lane is None:
            return
        seqs = list(seqs)
        exhausted = lane.nack(seqs, delay_s, now)
        self.lanes.count(lane, "nacked", len(seqs))
        self.persist_attempts(lane, seqs, batch)
        for entry in exhausted:
            self.park(lane, entry, "max attempts reached after nack", batch)

    def on_touch(
        self, topic: str, name: str, seqs: Iterable[int], member: bytes, now: float
    ) -> None:
        lane = self.lanes.get(topic, name)
        if lane is not None:
            self.lanes.count(lane, "lease_extended", lane.touch(seqs, member, now))

    def on_fail(self, topic: str, name: str, seq: int, reason: str, batch: WriteBatch) -> None:
        lane = self.lanes.get(topic, name)
        if lane is None:
            return
        entry = lane.fail(seq)
        if entry is not None:
            self.park(lane, entry, reason, batch)

    def park(self, lane: Lane, entry: Entry, reason: str, batch: WriteBatch) -> None:
        """Out of delivery for ``lane``: into its dead letters, with its record."""
        self.dead.park(lane, entry, reason, batch)
        self.settled(lane, [entry.seq], batch, Outcome.DEAD_LETTERED)

    def persist_attempts(self, lane: Lane, seqs: Iterable[int], batch: WriteBatch) -> None:
        """Write the attempts of ``seqs`` at ``lane`` (so a restart keeps counting them)."""
        records = self.records
        wanted = [s for s in seqs if s in lane and s not in records.mem]
        if wanted and records.runs:
            wanted = records.runs.rewrite(lane, lane.id, wanted, batch)
        if not wanted:
            return
        for seq, r in records.read(wanted).items():  # (a damaged one: set aside when sent)
            batch.pend_put.append(
                (
                    pend_key(lane.id, seq),
                    pack([r.partition, r.priority, lane.attempt(seq), r.expires_at, r.deliver_at]),
                )
            )

    # -- latest wins ----------------------------------------------------------------------

    def supersede(self, lane: Lane, key: str, seq: int, batch: WriteBatch) -> None:
        """latest_wins: ``seq`` replaces the lane's unsent message with the same key."""
        where = (lane.topic, lane.name)
        keys = self._latest.setdefault(where, {})
        if len(keys) >= self._prune_latest_at.get(where, LATEST_KEYS_PRUNE):
            self._prune_latest(lane, keys)
        old = keys.get(key)
        keys[key] = seq
        if old is None or old == seq:
            return
        state = lane.state(old)
        if state is not None and state != IN_FLIGHT:
            lane.ack([old])
            self.settled(lane, [old], batch, Outcome.SUPERSEDED)
            self.lanes.count(lane, "superseded", 1)

    def _prune_latest(self, lane: Lane, keys: dict[str, int]) -> None:
        """Drop the keys whose message ``lane`` no longer owes (it supersedes nothing), so
        keys that come and go do not pile up; the next prune waits until the index has
        doubled, so each key costs one look on average."""
        for key in [key for key, seq in keys.items() if lane.state(seq) is None]:
            del keys[key]
        self._prune_latest_at[(lane.topic, lane.name)] = max(LATEST_KEYS_PRUNE, 2 * len(keys))

    def index_latest(self, topic: str, batch: WriteBatch) -> None:
        """Rebuild the key index of a latest_wins topic from its stored messages, in
        sequence order, as their publishes would: an older message of a key that a lane
        still owes beside a newer one is superseded (a kill can come between the commit of
        a publish and the next one, which deletes what it superseded)."""
        wanted: dict[int, list[Lane]] = {}
        for lane in self.lanes.of_topic(topic, unclaimed=True):
            self._latest.pop((topic, lane.name), None)  # (made again in sequence order)
            for seq in lane.seqs():
                wanted.setdefault(seq, []).append(lane)
        records = self.records
        in_runs = records.run_messages(list(wanted)) if records.runs else {}
        stored = records.read([s for s in wanted if s not in records.mem and s not in in_runs])
        for seq in sorted(wanted):
            record = records.mem.get(seq) or in_runs.get(seq) or stored.get(seq)
            if record is not None and record.key is not None:
                for lane in wanted[seq]:
                    self.supersede(lane, record.key, seq, batch)

    def forget_lane(self, lane: Lane) -> None:
        self._latest.pop((lane.topic, lane.name), None)
        self._prune_latest_at.pop((lane.topic, lane.name), None)

    # -- time -----------------------------------------------------------------------------

    def tick(self, now: float, batch: WriteBatch) -> None:
        """Tick the lanes with a timer due: ready what is due, time out acks, expire."""
        for lane in self.lanes.due(now):
            result = lane.tick(now)
            if result.timed_out:
                self.lanes.count(lane, "ack_timeouts", result.timed_out)
            if result.expired:
                self.lanes.count(lane, "expired", len(result.expired))
                self.settled(lane, result.expired, batch, Outcome.EXPIRED)
            for entry in result.exhausted:
                self.park(lane, entry, "max attempts reached after ack timeouts", batch)
