"""A producer's topics and lanes: which lanes exist and under which ids, which of them
owe a message, and which have work (IO thread only).

A lane is what the producer owes one group of one topic (``Lane`` in lane/lane.py holds
its delivery state). Lanes are remembered in the ``lanes`` db, so an offline group keeps
its backlog; a topic's messages published before any group is known are owed to its
*unclaimed* lane (named ``UNCLAIMED``) until the first groups claim them. The loop visits
only the lanes with work: those that got ready messages (``ready``) and those with a
timer due (a heap of (time, serial, lane)), so thousands of idle lanes cost nothing.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Iterable

from ..._store.store import WriteBatch, pack
from ..._subjects import TopicConfigs, is_pattern
from ...config import TopicConfig
from ..lane.delivery import Timing
from ..lane.lane import Lane
from ..stats import Counters

log = logging.getLogger(__name__)

UNCLAIMED = ""  # lane name of a topic's messages published before any group was known
_DEFAULT = TopicConfig()


def timing_of(cfg: TopicConfig) -> Timing:
    return Timing(cfg.ack_timeout_s, cfg.retry_backoff_s, cfg.max_retry_backoff_s, cfg.max_attempts)


def lane_id_bytes(n: int) -> bytes:
    return n.to_bytes(4, "big")


class Lanes:
    """The topics one producer publishes and the lanes that owe their messages."""

    def __init__(
        self, node_id: bytes, topics: dict[str, TopicConfig], next_lane: int, counters: Counters
    ) -> None:
        self.node_id = node_id
        self.topics = TopicConfigs(topics)  # (set by name or by pattern)
        self.counters = counters
        self.all: dict[tuple[str, str], Lane] = {}
        self.by_topic: dict[str, list[Lane]] = {}  # claimed lanes only
        # When each lane last had no member (wall clock; None while it has one, or not
        # seen yet), as its ``lanes`` entry keeps it.
        self.idle_since: dict[tuple[str, str], float | None] = {}
        self._next_lane = next_lane
        self._recorded: dict[Lane, int] = {}  # the assignment version each lane's entry has
        # The lanes with work: those that got ready messages (dispatch drops those with
        # none left, or no member; an ordered set), and each lane's timers as (at, serial,
        # (topic, name)), the earliest first: by key, not the lane, so a lane retired
        # with a timer far off (a schedule a year ahead) is not kept until then.
        self.ready: dict[Lane, None] = {}
        self._wakeups: list[tuple[float, int, tuple[str, str]]] = []
        self._serial = 0

    # -- topics -------------------------------------------------------------------------

    def config(self, topic: str) -> TopicConfig:
        """``topic``'s settings: its own, else the most specific matching pattern's."""
        return self.topics.of(topic) or _DEFAULT

    def configure(self, configs: list[tuple[str, TopicConfig]]) -> list[str]:
        """The configurations of topics (or of the topics patterns match that have none
        of their own) from now on, their lanes' retry timing too. Returns the topics with
        a lane whose settings may have changed."""
        for name, cfg in configs:
            self.topics[name] = cfg
        names = [name for name, _cfg in configs]
        topics = self.topic_names() if any(map(is_pattern, names)) else names
        for topic in topics:
            timing = timing_of(self.config(topic))
            for lane in self.of_topic(topic, unclaimed=True):
                lane.timing = timing
        return topics

    def topic_names(self) -> list[str]:
        """The topics with a lane (claimed or not)."""
        return list(dict.fromkeys(topic for topic, _name in self.all))

    # -- lanes --------------------------------------------------------------------------

    def get(self, topic: str, name: str) -> Lane | None:
        return self.all.get((topic, name))

    def add(
        self,
        topic: str,
        name: str,
        group: str,
        mode: str,
        batch: WriteBatch | None,
        lane_id: int | None = None,
        idle_since: float | None = None,
        assigned: list[bytes] | None = None,
    ) -> Lane:
        """A lane of ``topic``: a new one (``lane_id`` None: the next id, remembered in
        ``batch``), or one read back from the store (with its partitions' homes)."""
        new = lane_id is None
        if lane_id is None:
            assert batch is not None
            lane_id = self.new_id(batch)
        cfg = self.config(topic)
        lane = Lane(
            topic,
            name,
            producer=self.node_id,
            partitions=cfg.partitions,
            timing=timing_of(cfg),
            lane_id=lane_id,
            group=group,
            mode=mode,
        )
        lane.on_timer = self._on_timer
        lane.on_ready = self._on_ready
        key = (topic, name)
        self.all[key] = lane
        self.idle_since[key] = idle_since
        if assigned is not None:
            lane.assignment.seed(assigned)
        if name != UNCLAIMED:
            self.by_topic.setdefault(topic, []).append(lane)
        if new:
            assert batch is not None
            self.remember(lane, batch)
        else:
            self._recorded[lane] = lane.assignment.version  # (as its entry has it)
        return lane

    def remember(self, lane: Lane, batch: WriteBatch) -> None:
        """``lane``'s entry in the ``lanes`` db, as it stands: its id, group and mode,
        when it last had no member, and its partitions' homes once each has one (kept as
        the distinct members and each partition's index among them)."""
        key = (lane.topic, lane.name)
        home = lane.assignment.home
        fields: list[object] = [lane.id, lane.group, lane.mode, self.idle_since.get(key)]
        if None not in home:
            members = list(dict.fromkeys(home))
            index = {m: i for i, m in enumerate(members)}
            fields.append([members, [index[m] for m in home]])
        self._recorded[lane] = lane.assignment.version
        batch.lanes_put.append((pack(list(key)), pack(fields)))

    def note_assigned(self, lane: Lane, batch: WriteBatch) -> None:
        """Remember ``lane``'s homes if they changed since its entry was written."""
        if self._recorded.get(lane) != lane.assignment.version:
            self.remember(lane, batch)

    def new_id(self, batch: WriteBatch) -> int:
        """The next lane id, its counter remembered in ``batch``."""
        lane_id = self._next_lane
        self._next_lane += 1
        batch.meta_put[b"next_lane"] = lane_id_bytes(self._next_lane)
        return lane_id

    def remove(self, lane: Lane, batch: WriteBatch) -> None:
        """Forget ``lane``, and every entry of its in the store (with ``batch``)."""
        key = (lane.topic, lane.name)
        del self.all[key]
        self.idle_since.pop(key, None)
        self.ready.pop(lane, None)
        self._recorded.pop(lane, None)
        lanes = self.by_topic.get(lane.topic, [])
        if lane in lanes:
            lanes.remove(lane)
            if not lanes:
                del self.by_topic[lane.topic]
        batch.lanes_del.append((pack(list(key)), lane.id))

    def live(self, lane: Lane) -> bool:
        """Whether ``lane`` is still one of these (not retired)."""
        return self.all.get((lane.topic, lane.name)) is lane

    def of_topic(self, topic: str, unclaimed: bool = False) -> list[Lane]:
        """The claimed lanes of ``topic`` (and its unclaimed one, if asked)."""
        lanes = list(self.by_topic.get(topic, ()))
        if unclaimed and (lane := self.all.get((topic, UNCLAIMED))) is not None:
            lanes.append(lane)
        return lanes

    def receiving(self, topic: str) -> list[Lane]:
        """The lanes that owe ``topic``'s new messages: its claimed lanes, or its unclaimed
        one while it has none (``Staging.prepare_lanes`` makes it)."""
        return self.by_topic.get(topic) or [self.all[(topic, UNCLAIMED)]]

    def owing(self, topic: str, seq: int) -> list[Lane]:
        """The lanes of ``topic`` that owe ``seq``."""
        return [lane for lane in self.of_topic(topic, unclaimed=True) if seq in lane]

    def owed(self, topic: str, seq: int) -> bool:
        """Some lane of ``topic`` still owes ``seq``."""
        return bool(self.owing(topic, seq))

    def floor(self) -> float:
        """Every sequence below it is settled in every lane (inf: none owes anything)."""
        return min((lane.floor() for lane in self.all.values() if len(lane)), default=math.inf)

    def members_gone(self, member: bytes, now: float) -> int:
        """``member`` died or left: what it held in flight is ready again, for others."""
        moved = sum(lane.remove_member(member, now) for lane in self.all.values())
        if moved:
            self.counters.add("redelivered_member_gone", moved)
        return moved

    def note_idle(self, lane: Lane, since: float | None, batch: WriteBatch) -> None:
        """``lane`` had no member from ``since`` (None: it has one), remembered."""
        self.idle_since[(lane.topic, lane.name)] = since
        self.remember(lane, batch)

    def count(self, lane: Lane, name: str, n: int) -> None:
        """Count ``n`` events ``name`` of ``lane`` (per lane and for the node)."""
        if n:
            lane.counts[name] += n
            self.counters.add(name, n)

    # -- work -----------------------------------------------------------------------------

    def _on_ready(self, lane: Lane) -> None:
        self.ready[lane] = None

    def _on_timer(self, lane: Lane, at: float) -> None:
        self._serial += 1
        heapq.heappush(self._wakeups, (at, self._serial, (lane.topic, lane.name)))

    def due(self, now: float) -> Iterable[Lane]:
        """The lanes (still here) with a timer due at ``now``, each once (a lane made
        again under a retired one's key may be woken for nothing: its tick finds none)."""
        wakeups, lanes = self._wakeups, self.all
        due: dict[Lane, None] = {}
        while wakeups and wakeups[0][0] <= now:
            lane = lanes.get(heapq.heappop(wakeups)[2])
            if lane is not None:
                due[lane] = None
        return due

    def next_wakeup(self) -> float | None:
        """The earliest timer of any lane (maybe of work already done: a tick then finds
        nothing), or None."""
        return self._wakeups[0][0] if self._wakeups else None
