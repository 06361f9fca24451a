"""Groups without members expire, with the wall clock passed in: a producer's outbox on
a real LMDB store, no IO thread, no sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from zmesh._engine.limits import QUIET_LANE_FORGET_S
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.outcomes import Outcomes
from zmesh._engine.stats import Counters
from zmesh._store.store import Store, WriteBatch
from zmesh.config import TopicConfig

MEMBER = b"\x07" * 16
DAY = 86400.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(str(tmp_path / "p"), 1 << 24)
    yield store
    store.close()


def _producer(store: Store, **topics: TopicConfig) -> Outbox:
    node_id, _incarnation, next_seq, next_lane = store.open_identity()
    return Outbox(
        store, node_id, next_seq, next_lane, dict(topics), 1 << 20, 1 << 20, Counters(), Outcomes()
    )


def _expire(producer: Outbox, wall: float) -> int:
    wb = WriteBatch()
    retired = producer.groups.expire_idle(wall, wb)
    producer.store.commit(wb)
    return retired


def _stored_lanes(store: Store) -> dict[str, float | None]:
    return {name: idle for _t, name, _id, _g, _m, idle, _a in store.iter_lanes()}


def test_a_group_expires_after_its_topic_s_expiry_without_members(store: Store) -> None:
    producer = _producer(store, t=TopicConfig(group_inactive_expiry_s=7 * DAY))
    wb = WriteBatch()
    lane = producer.groups.ensure("t", "g", "g", "shared", wb, 0.0)
    lane.set_member(MEMBER, 100, 10)
    for seq in range(5):
        lane.add(seq, 0, now=0.0)
    store.commit(wb)
    assert _expire(producer, 1000.0) == 0
    assert _stored_lanes(store) == {"g": None}  # (it has a member)
    lane.remove_member(MEMBER, 0.0)
    assert _expire(producer, 2000.0) == 0  # idle from now
    assert _stored_lanes(store) == {"g": 2000.0}
    assert _expire(producer, 2000.0 + 7 * DAY - 1) == 0
    assert _expire(producer, 2000.0 + 7 * DAY) == 1
    assert _stored_lanes(store) == {}
    assert producer.lanes.all == {}
    assert producer.lanes.counters.get("groups_expired") == 1
    assert producer.lanes.counters.get("dropped_group_deleted") == 5


def test_a_member_back_in_time_keeps_its_group(store: Store) -> None:
    producer = _producer(store, t=TopicConfig(group_inactive_expiry_s=60.0))
    wb = WriteBatch()
    lane = producer.groups.ensure("t", "g", "g", "shared", wb, 0.0)
    store.commit(wb)
    _expire(producer, 100.0)
    lane.set_member(MEMBER, 100, 10)
    assert _expire(producer, 159.0) == 0
    assert _stored_lanes(store) == {"g": None}
    lane.remove_member(MEMBER, 0.0)
    assert _expire(producer, 200.0) == 0  # the clock starts again
    assert _expire(producer, 259.0) == 0
    assert _expire(producer, 260.0) == 1


def test_declared_groups_and_an_expiry_of_0_never_expire(store: Store) -> None:
    producer = _producer(
        store,
        d=TopicConfig(groups=("kept",), group_inactive_expiry_s=1.0),
        z=TopicConfig(group_inactive_expiry_s=0),
    )
    wb = WriteBatch()
    producer.set_topic("d", producer.lanes.topics["d"], wb, 0.0)
    producer.groups.ensure("d", "kept/ab", "kept", "broadcast", wb, 0.0)  # a member's own copy
    producer.groups.ensure("z", "g", "g", "shared", wb, 0.0)
    store.commit(wb)
    _expire(producer, 0.0)
    assert _expire(producer, 10 * DAY) == 1  # the broadcast lane: not the declared group
    assert sorted(producer.lanes.all) == [("d", "kept"), ("z", "g")]


def test_the_idle_clock_is_kept_across_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "p")
    store = Store(path, 1 << 24)
    producer = _producer(store, t=TopicConfig(group_inactive_expiry_s=60.0))
    wb = WriteBatch()
    producer.groups.ensure("t", "g", "g", "shared", wb, 0.0)
    store.commit(wb)
    _expire(producer, 100.0)
    store.close()
    store = Store(path, 1 << 24)
    try:
        assert _stored_lanes(store) == {"g": 100.0}
    finally:
        store.close()


def test_a_quiet_lane_of_a_pattern_group_is_forgotten_and_made_again(store: Store) -> None:
    """A topic per device: its lane of a group subscribed by pattern goes once it owed
    nothing, and was owed nothing new, for QUIET_LANE_FORGET_S; the group (and the lanes
    that owe, or that a group has by name) stay, and the topic's next publish makes the
    lane again."""
    producer = _producer(store, **{"dev.9": TopicConfig(groups=("g",))})  # declared
    patterns = producer.groups.patterns
    wb = WriteBatch()
    patterns.remember([("dev.*", "g", "g", "shared", None)], wb, 0.0)
    for topic in ("dev.1", "dev.2", "dev.3"):
        patterns.new_topic(topic, wb, 0.0)
    producer.lanes.get("dev.1", "g").set_member(MEMBER, 100, 10)  # (members or not)
    producer.lanes.get("dev.2", "g").add(7, 0, now=0.0)  # it owes a message
    producer.groups.ensure("other", "g", "g", "shared", wb, 0.0)  # a group by name
    producer.set_topic("dev.9", producer.lanes.topics["dev.9"], wb, 0.0)
    store.commit(wb)
    quiet = QUIET_LANE_FORGET_S
    _expire(producer, 1000.0)  # quiet from now
    dev3 = producer.lanes.get("dev.3", "g")
    dev3.add(8, 0, now=0.0)
    dev3.ack([8])  # a message came and went: quiet from the next look
    _expire(producer, 1001.0)
    assert _expire(producer, 1000.0 + quiet - 1) == 0 and len(producer.lanes.all) == 5
    _expire(producer, 1000.0 + quiet)
    assert sorted(producer.lanes.all) == [
        ("dev.2", "g"),
        ("dev.3", "g"),
        ("dev.9", "g"),
        ("other", "g"),
    ]
    _expire(producer, 1001.0 + quiet)
    assert sorted(producer.lanes.all) == [("dev.2", "g"), ("dev.9", "g"), ("other", "g")]
    assert producer.lanes.counters.get("lanes_forgotten") == 2
    assert "lanes_retired" not in producer.lanes.counters.snapshot()
    stored = {(topic, name) for topic, name, *_rest in store.iter_lanes()}
    assert stored == {("dev.*", "g"), ("dev.9", "g"), ("dev.2", "g"), ("other", "g")}
    # The topic's next publish makes its lane again (Staging.prepare_lanes: not checked).
    assert "dev.1" not in patterns.checked
    wb = WriteBatch()
    assert patterns.new_topic("dev.1", wb, 2.0)
    store.commit(wb)
    assert producer.lanes.get("dev.1", "g") is not None


def test_a_group_expires_after_the_idle_time_the_node_observed(store: Store) -> None:
    producer = _producer(store, t=TopicConfig(group_inactive_expiry_s=7 * DAY))
    clock = producer.clock
    clock.start(None, 1000.0, 0.0, "boot", 0)
    wb = WriteBatch()
    producer.groups.ensure("t", "g", "g", "shared", wb, 0.0)
    store.commit(wb)
    assert _expire(producer, clock.observed(1000.0)) == 0  # idle from now
    clock.beat(2000.0 + 30 * DAY, 1000.0, 0)  # NTP: a month forward
    assert _expire(producer, clock.observed(2000.0 + 30 * DAY)) == 0
    assert producer.groups.listing("t", 0.0)[0]["last_seen"] == 1000.0 + 30 * DAY
    clock.beat(3000.0 + 30 * DAY - 3650 * DAY, 2000.0, 0)  # and ten years back
    assert _expire(producer, clock.observed(3000.0 + 30 * DAY - 3650 * DAY)) == 0
    later = 1000.0 + 7 * DAY + 30 * DAY - 3650 * DAY  # (7 days observed idle)
    assert _expire(producer, clock.observed(later)) == 1  # not held back ten years


def test_a_retired_lane_with_a_timer_far_off_is_not_kept_until_then(store: Store) -> None:
    """A group deleted while it owes a message scheduled a year ahead: its lane is let go
    at once (the producer's timers name lanes by key), where it was kept, with all it
    held, until the year was up."""
    import gc
    import weakref

    producer = _producer(store)
    wb = WriteBatch()
    lane = producer.groups.ensure("t", "g", "g", "shared", wb, 0.0)
    lane.set_member(MEMBER, 100, 10)
    lane.add(1, 0, now=0.0, not_before=365 * DAY)
    store.commit(wb)
    assert producer.lanes.next_wakeup() == 365 * DAY
    wb = WriteBatch()
    assert producer.groups.delete("t", "g", wb) == 1
    store.commit(wb)
    gone = weakref.ref(lane)
    del lane
    gc.collect()
    assert gone() is None
    assert list(producer.lanes.due(365 * DAY)) == []
