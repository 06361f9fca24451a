"""Message indexes and retention rules, without a clock (time is passed in)."""

from __future__ import annotations

from pathlib import Path

from zmesh import TopicConfig
from zmesh._engine.outbox.retention import (
    Head,
    Indexes,
    log_entry,
    partition_prefix,
    reclaimable,
    retains,
    topic_prefix,
)
from zmesh._store.store import Store, WriteBatch


def heads(*published: float, size: int = 100) -> list[Head]:
    return [Head(seq, 0, seq, size, at) for seq, at in enumerate(published, start=1)]


def never_owed(_seq: int) -> bool:
    return False


def test_indexes_count_per_topic_and_partition() -> None:
    ix = Indexes()
    assert [ix.allocate("t", 0) for _ in range(3)] == [0, 1, 2]
    assert ix.allocate("t", 1) == 0
    assert ix.allocate("u", 0) == 0
    assert ix.partitions("t") == {0: 3, 1: 1} and ix.parts("t") == {0: 3, 1: 1}
    assert sorted(ix.topics()) == ["t", "u"]


def test_indexes_continue_from_what_is_stored() -> None:
    ix = Indexes({partition_prefix("t", 2): 41, partition_prefix("a.b-c", 0): 7})
    assert ix.allocate("t", 2) == 41
    assert ix.allocate("a.b-c", 0) == 7
    assert ix.allocate("t", 0) == 0


def test_without_retention_settled_messages_go_at_once() -> None:
    cfg = TopicConfig()
    assert not retains(cfg)
    assert (
        reclaimable(heads(0.0, 1.0, 2.0), wall=2.0, cfg=cfg, retained_bytes=300, owed=never_owed)
        == 3
    )


def test_retention_by_time_keeps_what_is_younger() -> None:
    cfg = TopicConfig(retention_s=10)
    assert retains(cfg)
    hs = heads(100.0, 105.0, 109.0, 120.0)
    assert reclaimable(hs, wall=109.0, cfg=cfg, retained_bytes=400, owed=never_owed) == 0
    assert reclaimable(hs, wall=110.0, cfg=cfg, retained_bytes=400, owed=never_owed) == 1
    assert reclaimable(hs, wall=119.5, cfg=cfg, retained_bytes=400, owed=never_owed) == 3
    assert reclaimable(hs, wall=1000.0, cfg=cfg, retained_bytes=400, owed=never_owed) == 4


def test_retention_by_size_pushes_the_oldest_out() -> None:
    cfg = TopicConfig(retention_bytes=250)
    hs = heads(1.0, 2.0, 3.0, 4.0)  # 100 bytes each
    assert reclaimable(hs, wall=1e9, cfg=cfg, retained_bytes=400, owed=never_owed) == 2
    assert reclaimable(hs, wall=1e9, cfg=cfg, retained_bytes=250, owed=never_owed) == 0
    assert reclaimable(hs, wall=1e9, cfg=cfg, retained_bytes=251, owed=never_owed) == 1


def test_time_and_size_together_reclaim_what_either_allows() -> None:
    cfg = TopicConfig(retention_s=10, retention_bytes=1000)
    hs = heads(0.0, 1.0, 50.0, 51.0)
    assert reclaimable(hs, wall=55.0, cfg=cfg, retained_bytes=400, owed=never_owed) == 2
    assert reclaimable(hs, wall=55.0, cfg=cfg, retained_bytes=1300, owed=never_owed) == 3


def test_reclamation_stops_at_a_message_still_owed() -> None:
    for cfg in (TopicConfig(), TopicConfig(retention_s=1), TopicConfig(retention_bytes=1)):
        assert (
            reclaimable(
                heads(0.0, 0.0, 0.0),
                wall=100.0,
                cfg=cfg,
                retained_bytes=300,
                owed=lambda seq: seq == 2,
            )
            == 1
        )


def test_store_derives_next_indexes_from_entries_and_counters(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "d"), 1 << 24)
    try:
        wb = WriteBatch()
        for i in range(5):
            wb.log_put.append(log_entry("t", 0, i, 10 + i, 1.0 + i, 50))
        wb.log_put.append(log_entry("t", 3, 0, 20, 9.0, 70))
        wb.log_put.append(log_entry("tt", 1, 8, 21, 9.0, 70))
        # A counter ahead of the entries (their entries were reclaimed) wins ...
        wb.log_next.append((partition_prefix("u", 2), 12))
        # ... and entries ahead of a stale counter win too.
        wb.log_next.append((partition_prefix("t", 0), 2))
        store.commit(wb)
        assert store.next_indexes() == {
            partition_prefix("t", 0): 5,
            partition_prefix("t", 3): 1,
            partition_prefix("tt", 1): 9,
            partition_prefix("u", 2): 12,
        }
        assert store.log_totals() == {topic_prefix("t"): (6, 320), topic_prefix("tt"): (1, 70)}
        oldest, entries = store.log_range(partition_prefix("t", 0), 3, 10)
        assert oldest == 0 and [(i, s) for i, s, _p in entries] == [(3, 13), (4, 14)]
        first = [Head.decode(seq, v) for seq, v in store.log_heads(topic_prefix("t"), 2)]
        assert first == [Head(10, 0, 0, 50, 1.0), Head(11, 0, 1, 50, 2.0)]
        wb = WriteBatch()
        wb.log_del.append(
            (
                partition_prefix("t", 0) + (0).to_bytes(8, "big"),
                topic_prefix("t") + (10).to_bytes(8, "big"),
            )
        )
        store.commit(wb)
        assert store.log_range(partition_prefix("t", 0), 0, 1)[0] == 1
    finally:
        store.close()
