"""Groups subscribed by pattern at a producer's outbox on a real LMDB store, with no IO
thread and no sockets: remembered across a restart, lanes of new topics, expiry with the
wall clock passed in, deletion, and values kept per key owed to a new lane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_group_expiry import DAY, MEMBER, _expire, _producer
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.retention import Head
from zmesh._store.store import Store, WriteBatch
from zmesh.config import TopicConfig


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "p")


@pytest.fixture
def store(path: str) -> Iterator[Store]:
    store = Store(path, 1 << 24)
    yield store
    store.close()


def _new_topics(producer: Outbox, *topics: str) -> None:
    wb = WriteBatch()
    for topic in topics:
        producer.groups.patterns.new_topic(topic, wb, 0.0)
    producer.store.commit(wb)


def _remember(producer: Outbox, pattern: str, name: str = "g", mode: str = "shared") -> None:
    wb = WriteBatch()
    producer.groups.patterns.remember([(pattern, name, "g", mode, None)], wb, 0.0)
    producer.store.commit(wb)


def test_a_pattern_group_makes_lanes_of_known_and_new_topics_and_survives_a_restart(
    path: str,
) -> None:
    store = Store(path, 1 << 24)
    producer = _producer(store)
    _new_topics(producer, "plant.l1.temp", "plant.l1.wind")  # published before
    _remember(producer, "plant.*.temp")
    assert sorted(producer.lanes.all) == [("plant.l1.temp", "g")]
    _new_topics(producer, "plant.l2.temp", "plant.l2.wind", "office.l2.temp")
    assert sorted(producer.lanes.all) == [("plant.l1.temp", "g"), ("plant.l2.temp", "g")]
    store.close()
    store = Store(path, 1 << 24)
    try:
        again = _producer(store)
        wb = WriteBatch()
        again.load(0.0, wb)
        store.commit(wb)
        assert [pg["pattern"] for pg in again.groups.patterns.listing()] == ["plant.*.temp"]
        assert again.groups.patterns.listing()[0]["topics"] == 2
        assert sorted(again.lanes.all) == [("plant.l1.temp", "g"), ("plant.l2.temp", "g")]
        _new_topics(again, "plant.l3.temp")  # (owed while no member is known)
        assert ("plant.l3.temp", "g") in again.lanes.all
    finally:
        store.close()


def test_a_pattern_group_without_members_expires_unless_declared(store: Store) -> None:
    producer = _producer(
        store,
        **{
            "plant.>": TopicConfig(group_inactive_expiry_s=DAY),
            "office.>": TopicConfig(groups=("kept",), group_inactive_expiry_s=DAY),
        },
    )
    wb = WriteBatch()
    producer.load(0.0, wb)
    store.commit(wb)
    _remember(producer, "plant.>")
    patterns = producer.groups.patterns
    assert sorted(patterns.known) == [("office.>", "kept"), ("plant.>", "g")]
    assert _expire(producer, 1000.0) == 0  # idle from now
    assert _expire(producer, 1000.0 + DAY - 1) == 0
    assert _expire(producer, 1000.0 + DAY) == 1
    assert sorted(patterns.known) == [("office.>", "kept")]
    assert producer.lanes.counters.get("pattern_groups_retired") == 1
    assert sorted(name for _t, name, *_ in store.iter_lanes()) == ["kept"]


def test_deleting_by_pattern_retires_the_lanes_it_matches(store: Store) -> None:
    producer = _producer(store)
    _remember(producer, "logs.*")
    _new_topics(producer, "logs.web", "logs.db", "metrics.web")
    lane = producer.lanes.get("logs.web", "g")
    assert lane is not None
    lane.set_member(MEMBER, 100, 10)
    for seq in range(3):
        lane.add(seq, 0, now=0.0)
    wb = WriteBatch()
    assert producer.groups.delete("logs.*", "g", wb) == 3
    store.commit(wb)
    assert producer.lanes.all == {} and producer.groups.patterns.known == {}
    _new_topics(producer, "logs.web")  # (no group left to owe it)
    assert producer.lanes.get("logs.web", "g") is None


def test_the_values_kept_evict_the_oldest_of_each_key(store: Store) -> None:
    producer = _producer(store, t=TopicConfig(keep_last=2))
    kept = producer.kept
    entries = [("t", f"k{i % 2}", Head(i, 0, i, 10, 0.0)) for i in range(7)]
    entries.append(("t", None, Head(7, 0, 7, 10, 0.0)))
    kept.added(entries)
    values = kept.of("t")
    assert values is not None
    assert sorted(values.kept) == [3, 4, 5, 6, 7]
    assert [h.seq for h in kept.candidates("t", 10)] == [0, 1, 2]
    assert [h.seq for h in kept.candidates("t", 2)] == [0, 1]
    kept.reclaimed("t", [0, 1])
    assert [h.seq for h in kept.candidates("t", 10)] == [2]
    assert kept.candidates("other", 10) == []
