"""Groups that subscribe by pattern, at one producer (IO thread only).

A subscription to ``plant.*.temp`` in group ``agg`` makes ``agg`` one group across every
topic the pattern matches: the producer keeps a lane ``(topic, agg)`` per concrete topic,
as for a group subscribed to that topic by name (a group is its name: members that reach
a topic by name or by pattern are members of the same lane). So a message goes to one
member per the usual shared or broadcast rules, key affinity holds per (topic, key), and
acks, retries, dead letters and receipts are those of plain lanes.

What the producer remembers is the pattern group itself, under ``[pattern, lane]`` in the
``lanes`` db (a pattern never names a published topic, so the key is its own): a topic
first published after the group was learned gets the group's lane at once, while its
members are offline too. The lanes of a pattern are found with a token trie of the
patterns known (``SubjectTrie``), so a new topic costs one walk of its tokens whatever the
number of patterns; the live members of a new topic's lanes come from a trie of the live
peers' pattern subscriptions, rebuilt only after one of them changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._protocol.frames import SubInfo
from ..._store.store import WriteBatch, pack
from ..._subjects import SubjectTrie, is_pattern, matcher
from ..peers import lane_name
from ..stats import Counters
from .lanes import Lanes

if TYPE_CHECKING:
    from ..lane.lane import Lane
    from ..peers import Peer
    from .groups import Groups

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PatternGroup:
    """A group (or a broadcast member's own copy: ``name``) subscribed by ``pattern``."""

    pattern: str
    name: str  # the lane name of each topic's lane
    group: str
    mode: str
    lane_id: int  # (its ``lanes`` entry's id: no message is ever owed under it)
    idle_since: float | None = None


def _no_peers() -> Iterable[Peer]:
    return ()


class PatternGroups:
    """The pattern groups one producer knows, and the lanes they own per topic."""

    def __init__(self, lanes: Lanes, groups: Groups, counters: Counters) -> None:
        self.lanes = lanes
        self.groups = groups
        self.counters = counters
        self.known: dict[tuple[str, str], PatternGroup] = {}
        self._trie: SubjectTrie[PatternGroup] = SubjectTrie()
        # The live peers (this node included), set by the mesh; their pattern
        # subscriptions, as a trie made again when one of them changed.
        self.peers: Callable[[], Iterable[Peer]] = _no_peers
        self._live: SubjectTrie[tuple[Peer, SubInfo]] | None = None
        # Topics published (or asked) here since the start whose pattern groups' lanes
        # were made: a lane a topic got otherwise (by a group subscribed to it by name)
        # does not make those.
        self.checked: set[str] = set()

    # -- remembering ----------------------------------------------------------------------

    def load(
        self, pattern: str, name: str, lane_id: int, group: str, mode: str, idle: float | None
    ) -> None:
        """A pattern group read back from the store at a start."""
        self._add(PatternGroup(pattern, name, group, mode, lane_id, idle))

    def _add(self, pg: PatternGroup) -> None:
        self.known[(pg.pattern, pg.name)] = pg
        self._trie.add(pg.pattern, pg)

    def remember(
        self,
        groups: Sequence[tuple[str, str, str, str, str | None]],
        batch: WriteBatch,
        now: float,
        expand: bool = True,
    ) -> None:
        """Pattern groups ``(pattern, lane name, group, mode, seed)``, each remembered
        durably when new; ``expand``: with the lanes of the topics known here each
        matches made (they owe what is published from now on, a topic's messages
        published before any group was known, and, ``seed`` ``"last_per_key"``, the
        values it keeps). One pass over the known topics for all of them."""
        new: SubjectTrie[tuple[str, str, str, str | None]] = SubjectTrie()
        for pattern, name, group, mode, seed in groups:
            if (pattern, name) in self.known:
                continue
            pg = PatternGroup(pattern, name, group, mode, self.lanes.new_id(batch))
            batch.lanes_put.append((pack([pattern, name]), pack([pg.lane_id, group, mode])))
            self._add(pg)
            new.add(pattern, (name, group, mode, seed))
            log.info("group %s (%s) of pattern %s is new at this producer", group, mode, pattern)
        if expand and len(new):
            for topic in self._known_topics():
                for name, group, mode, seed in new.match(topic):
                    self.groups.ensure(topic, name, group, mode, batch, now, seed)

    def _known_topics(self) -> list[str]:
        """The topics known here: with a lane, or published or asked for."""
        return list(dict.fromkeys((*self.lanes.topic_names(), *self.checked)))

    # -- members --------------------------------------------------------------------------

    def wanted(
        self, member: bytes, subs: Iterable[SubInfo], batch: WriteBatch, now: float
    ) -> dict[tuple[str, str], SubInfo]:
        """The lanes ``(topic, lane name)`` a node's subscriptions make it a member of:
        those it names, and those of every known topic its patterns match (the pattern
        groups remembered on the way)."""
        out: dict[tuple[str, str], SubInfo] = {}
        patterns: SubjectTrie[SubInfo] = SubjectTrie()
        remembered = []
        for s in subs:
            if s.mode == "ephemeral":
                continue
            name = lane_name(s, member)
            if is_pattern(s.topic):
                remembered.append((s.topic, name, s.group, s.mode, s.deliver))
                patterns.add(s.topic, s)
            else:
                out[(s.topic, name)] = s
        # (their lanes of the known topics are made by the caller, from what this returns)
        self.remember(remembered, batch, now, expand=False)
        if len(patterns):
            for topic in self._known_topics():
                for s in patterns.match(topic):
                    out.setdefault((topic, lane_name(s, member)), s)
        self._live = None
        return out

    def changed(self) -> None:
        """A peer's subscriptions or liveness changed."""
        self._live = None

    def _live_subs(self) -> SubjectTrie[tuple[Peer, SubInfo]]:
        live = self._live
        if live is None:
            live = self._live = SubjectTrie()
            for peer in self.peers():
                for s in peer.subs:
                    if s.mode != "ephemeral" and is_pattern(s.topic):
                        live.add(s.topic, (peer, s))
        return live

    def new_topic(self, topic: str, batch: WriteBatch, now: float) -> bool:
        """``topic`` is published here for the first time since the start: the lanes of
        the pattern groups matching it, with their live members. Returns whether it has
        any."""
        self.checked.add(topic)
        found = self._trie.match(topic)
        if not found:
            return False
        for pg in found:
            self.groups.ensure(topic, pg.name, pg.group, pg.mode, batch, now)
        for peer, s in self._live_subs().match(topic):
            if not peer.alive:
                continue
            name = lane_name(s, peer.node_id)
            lane = self.groups.ensure(topic, name, s.group, s.mode, batch, now)
            lane.set_member(peer.node_id, s.max_in_flight, s.batch_size, s.max_message_bytes)
            peer.lanes[(topic, name)] = s
        return True

    # -- lifecycle ------------------------------------------------------------------------

    def remade(self, lane: Lane) -> bool:
        """Whether ``lane`` is the lane of a pattern group here that no live member has by
        name: its topic's next publish makes it again, with its members (``new_topic``)."""
        if not any(pg.name == lane.name for pg in self._trie.match(lane.topic)):
            return False
        key = (lane.topic, lane.name)
        return not any(
            (s := peer.lanes.get(key)) and not is_pattern(s.topic) for peer in self.peers()
        )

    def lane_forgotten(self, lane: Lane) -> None:
        """``lane`` (``remade``) was forgotten: no live member counts it among its own."""
        key = (lane.topic, lane.name)
        for peer in self.peers():
            peer.lanes.pop(key, None)

    def forget(self, pg: PatternGroup, batch: WriteBatch, why: str) -> None:
        """Drop a pattern group (its topics' lanes are retired on their own)."""
        del self.known[(pg.pattern, pg.name)]
        self._trie.remove(pg.pattern, pg)
        batch.lanes_del.append((pack([pg.pattern, pg.name]), pg.lane_id))
        self.counters.add("pattern_groups_retired", 1)
        log.warning("group %s of pattern %s retired (%s)", pg.group, pg.pattern, why)

    def delete(self, pattern: str, group: str, batch: WriteBatch) -> int:
        """An operator deleted ``group`` of ``pattern``: the pattern group and its
        topics' lanes go. Returns the pending messages dropped."""
        for pg in [pg for pg in self.known.values() if pg.pattern == pattern and pg.group == group]:
            self.forget(pg, batch, "group deleted")
        covers = matcher(pattern)
        lanes = [
            lane for lane in self.lanes.all.values() if lane.group == group and covers(lane.topic)
        ]
        return sum(self.groups.retire(lane, batch, "group deleted") for lane in lanes)

    def expire_idle(self, wall: float, batch: WriteBatch, retire: bool) -> int:
        """Note which pattern groups have a live member, and (``retire``) forget those
        without one for their pattern's ``group_inactive_expiry_s`` (declared groups
        never expire). Returns how many were forgotten."""
        live = {(s.topic, lane_name(s, peer.node_id)) for peer, s in self._live_entries()}
        retired = 0
        for key, pg in list(self.known.items()):
            if key in live:
                if pg.idle_since is not None:
                    pg.idle_since = None
                    self._note(pg, batch)
                continue
            if pg.idle_since is None:
                pg.idle_since = wall
                self._note(pg, batch)
                continue
            cfg = self.lanes.config(pg.pattern)
            expiry = cfg.group_inactive_expiry_s
            declared = pg.mode == "shared" and pg.group in cfg.groups
            if not retire or not expiry or declared or wall - pg.idle_since < expiry:
                continue
            self.forget(pg, batch, f"no member for {wall - pg.idle_since:.0f}s")
            retired += 1
        return retired

    def _live_entries(self) -> Iterable[tuple[Peer, SubInfo]]:
        for peer in self.peers():
            for s in peer.subs:
                if s.mode != "ephemeral" and is_pattern(s.topic):
                    yield peer, s

    def _note(self, pg: PatternGroup, batch: WriteBatch) -> None:
        batch.lanes_put.append(
            (pack([pg.pattern, pg.name]), pack([pg.lane_id, pg.group, pg.mode, pg.idle_since]))
        )

    def listing(self) -> list[dict[str, Any]]:
        """The pattern groups, for operators, with how many topics each has a lane of."""
        topics = dict.fromkeys(self.known, 0)
        for lane in self.lanes.all.values():
            for pg in self._trie.match(lane.topic):
                if pg.name == lane.name:
                    topics[(pg.pattern, pg.name)] += 1
        return [
            {
                "pattern": pg.pattern,
                "group": pg.group,
                "mode": pg.mode,
                "lane": pg.name,
                "topics": topics[key],
                "idle_since": pg.idle_since,
            }
            for key, pg in self.known.items()
        ]
