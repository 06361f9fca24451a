"""The lifecycle of a producer's lanes (IO thread only): a lane is made when its group is
first learned (taking the messages published before any group was known), retired when
an operator deletes its group or when it had no member for its topic's
``group_inactive_expiry_s``, forgotten when a pattern group makes it again at its
topic's next publish and it has been quiet (owed nothing, and nothing new) for
``QUIET_LANE_FORGET_S``, and listed for operators.

Retiring settles what the lane owes as ``group_deleted`` (a message no other lane owes
leaves the outbox) and deletes the lane's entries and dead letters with it: nothing is
dropped without a count. Groups subscribed by pattern are remembered by ``PatternGroups``
(patterns.py), which makes their lanes here, one per topic.
"""

from __future__ import annotations

import logging
from typing import Any

from ..._store.store import WriteBatch, pack, pend_key
from ..._subjects import is_pattern, matcher
from ..lane.lane import Lane
from ..limits import QUIET_LANE_FORGET_S
from ..stats import Counters
from .deadletters import DeadLetters
from .kept import Kept
from .lanes import UNCLAIMED, Lanes
from .outcomes import Outcome, Outcomes
from .patterns import PatternGroups
from .records import Records
from .settle import Settler
from .wallclock import WallClock

log = logging.getLogger(__name__)


class Groups:
    """Making, retiring and listing one producer's lanes."""

    def __init__(
        self,
        lanes: Lanes,
        records: Records,
        settler: Settler,
        dead: DeadLetters,
        outcomes: Outcomes,
        counters: Counters,
        kept: Kept,
        clock: WallClock,
    ) -> None:
        self.lanes = lanes
        self.records = records
        self.settler = settler
        self.dead = dead
        self.outcomes = outcomes
        self.counters = counters
        self.kept = kept
        self.clock = clock
        self.patterns = PatternGroups(lanes, self, counters)
        # Lanes that owe nothing: their floor (the sequence past the last they were owed)
        # and the observed time (wallclock.py) it was first seen so.
        self._quiet: dict[tuple[str, str], tuple[int, float]] = {}

    # -- making ---------------------------------------------------------------------------

    def ensure(
        self,
        topic: str,
        name: str,
        group: str,
        mode: str,
        batch: WriteBatch,
        now: float,
        seed: str | None = None,
    ) -> Lane:
        """The lane of (topic, name), made and remembered durably when new; a new lane of
        a ``seed="last_per_key"`` subscription first owes the values the topic keeps."""
        lane = self.lanes.get(topic, name)
        if lane is not None:
            return lane
        lane = self.lanes.add(topic, name, group, mode, batch)
        if name != UNCLAIMED:
            self._claim(topic, batch, now)
            if seed == "last_per_key":
                self.kept.seed(lane, batch, now)
        log.info("lane %s/%s (%s %s) is new at this producer", topic, name, mode, group)
        return lane

    def _claim(self, topic: str, batch: WriteBatch, now: float) -> None:
        """Messages published before any group was known go to the first groups learned."""
        unclaimed = self.lanes.get(topic, UNCLAIMED)
        if unclaimed is None or not len(unclaimed):
            return
        lanes = self.lanes.of_topic(topic)
        seqs = sorted(unclaimed.seqs())
        names = [lane.name for lane in lanes]
        log.info(
            "%d messages of %s published before any group was known go to %s",
            len(seqs),
            topic,
            names,
        )
        self.outcomes.claim(topic, seqs, names)
        mem = self.records.mem
        for seq in seqs:
            entry = unclaimed.entry(seq)
            assert entry is not None
            value = pack([entry.partition, entry.priority, 0, None, None])
            for target in lanes:
                target.add(
                    seq,
                    entry.partition,
                    entry.priority,
                    0,
                    now=now,
                    not_before=entry.not_before,
                    expires_at=entry.expires_at,
                )
                if seq not in mem:
                    batch.pend_put.append((pend_key(target.id, seq), value))
            if seq not in mem:
                batch.pend_del.append(pend_key(unclaimed.id, seq))
        unclaimed.ack(seqs)

    # -- retiring -------------------------------------------------------------------------

    def retire(self, lane: Lane, batch: WriteBatch, why: str) -> int:
        """Drop ``lane`` (a group deleted or expired) and what it owes: counted in
        ``dropped_group_deleted``, its receipts' outcome ``group_deleted``; its stored
        entries and dead letters go with it. Returns the messages it owed."""
        owed = lane.seqs()
        if owed:
            settled = lane.ack(sorted(owed))
            self.settler.settled(lane, settled, batch, Outcome.GROUP_DELETED)
            self.counters.add("dropped_group_deleted", len(settled))
        self._drop(lane, batch)
        parked = self.dead.forget_lane(lane)
        if parked:
            self.counters.add("dead_letters_dropped", parked)
        self.counters.add("lanes_retired", 1)
        log.warning(
            "lane %s/%s retired (%s): %d pending messages and %d dead letters dropped",
            lane.topic,
            lane.name,
            why,
            len(owed),
            parked,
        )
        return len(owed)

    def _drop(self, lane: Lane, batch: WriteBatch) -> None:
        self.lanes.remove(lane, batch)
        self._quiet.pop((lane.topic, lane.name), None)
        # (its next publish makes the lanes of the pattern groups still remembered again)
        self.patterns.checked.discard(lane.topic)
        self.settler.forget_lane(lane)

    def _quiet_long(self, key: tuple[str, str], lane: Lane, wall: float) -> bool:
        """Whether ``lane`` owed nothing, and was owed nothing new, for
        ``QUIET_LANE_FORGET_S`` (noting when it is first seen owing nothing, and again
        when it is found so: a lane kept is looked at again a period later)."""
        if len(lane):
            self._quiet.pop(key, None)
            return False
        floor = lane.floor()
        noted = self._quiet.get(key)
        if noted is None or noted[0] != floor or wall - noted[1] >= QUIET_LANE_FORGET_S:
            self._quiet[key] = (floor, wall)
            return noted is not None and noted[0] == floor
        return False

    def _forget_quiet(self, lane: Lane, batch: WriteBatch) -> bool:
        """Forget a quiet lane that a pattern group makes again at its topic's next
        publish (none of its members has it by name, its group is not declared on the
        topic, no dead letter is parked in it); returns whether it was."""
        declared = self.lanes.topics.get(lane.topic)
        if (declared is not None and lane.group in declared.groups) or self.dead.parked(lane):
            return False
        if not self.patterns.remade(lane):
            return False
        self._drop(lane, batch)
        self.patterns.lane_forgotten(lane)
        self.dead.forget_lane(lane)
        self.counters.add("lanes_forgotten", 1)
        log.debug(
            "lane %s/%s forgotten (quiet; its pattern group makes it again)", lane.topic, lane.name
        )
        return True

    def delete(self, topic: str, group: str, batch: WriteBatch) -> int:
        """Retire every lane of ``group`` on ``topic`` (the shared one and broadcast
        members' own; a pattern: the pattern group, and its lanes of every topic it
        matches); returns the pending messages dropped."""
        if is_pattern(topic):
            return self.patterns.delete(topic, group, batch)
        lanes = [lane for lane in self.lanes.of_topic(topic) if lane.group == group]
        return sum(self.retire(lane, batch, "group deleted") for lane in lanes)

    def expire_idle(self, wall: float, batch: WriteBatch, retire: bool = True) -> int:
        """Note which lanes have members (``Lanes.idle_since``, kept in their ``lanes``
        entries) and (``retire``) retire those that had none for their topic's
        ``group_inactive_expiry_s`` (0: never; groups declared on the topic never
        expire), and forget the quiet lanes of pattern groups and the unclaimed lanes
        that owe nothing (the first groups claimed what they held). ``wall``: the time now on
        the node's observed clock (wallclock.py: steps of the wall clock left out, so a
        step never expires a group, nor keeps one). Returns how many were retired."""
        retired = 0
        idle_since = self.lanes.idle_since
        for key, lane in list(self.lanes.all.items()):
            if lane.name == UNCLAIMED:
                if not len(lane):  # (claimed, or expired: made again by the next publish)
                    self._drop(lane, batch)
                continue
            if retire and self._quiet_long(key, lane, wall) and self._forget_quiet(lane, batch):
                continue
            idle = idle_since.get(key)
            if lane.members:
                if idle is not None:
                    self.lanes.note_idle(lane, None, batch)
                continue
            if idle is None:
                self.lanes.note_idle(lane, wall, batch)
                continue
            cfg = self.lanes.config(lane.topic)
            expiry = cfg.group_inactive_expiry_s
            if not retire or not expiry or self._declared(lane) or wall - idle < expiry:
                continue
            self.retire(
                lane,
                batch,
                f"no member for {wall - idle:.0f}s, past the topic's "
                f"group_inactive_expiry_s of {expiry:g}s",
            )
            self.counters.add("groups_expired", 1)
            retired += 1
        return retired + self.patterns.expire_idle(wall, batch, retire)

    def _seen(self, key: tuple[str, str]) -> float | None:
        """When a lane without members last had one, on the wall clock as it is now."""
        idle = self.lanes.idle_since.get(key)
        return None if idle is None else self.clock.to_wall(idle)

    def _declared(self, lane: Lane) -> bool:
        return lane.mode == "shared" and lane.group in self.lanes.config(lane.topic).groups

    # -- listing --------------------------------------------------------------------------

    def listing(self, topic: str | None, wall: float) -> list[dict[str, Any]]:
        """The lanes (of ``topic``, or all) for operators: group, mode, pending, in
        flight, members, last seen (wall clock), oldest message's age."""
        out = []
        covers = None if topic is None else matcher(topic)
        for key, lane in self.lanes.all.items():
            if lane.name == UNCLAIMED or (covers is not None and not covers(lane.topic)):
                continue
            cfg = self.lanes.config(lane.topic)
            pending = len(lane)
            oldest = self.records.published_at(lane.floor()) if pending else None
            out.append(
                {
                    "topic": lane.topic,
                    "group": lane.group,
                    "mode": lane.mode,
                    "lane": lane.name,
                    "pending": pending,
                    "in_flight": lane.in_flight_count(),
                    "members": [m.hex() for m in lane.members],
                    "last_seen": wall if lane.members else self._seen(key),
                    "oldest_age_s": None if oldest is None else max(0.0, wall - oldest),
                    "declared": self._declared(lane),
                    "expires_after_s": cfg.group_inactive_expiry_s or None,
                    "dead_letters": self.dead.parked(lane),
                }
            )
        return out
