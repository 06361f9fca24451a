"""Staging publishes into a producer's outbox (outbox/staging.py, spill.py): what one
loop iteration writes to LMDB, what its lanes owe once the commit is done, and what a
failed commit gives back. A real LMDB store in a temp dir, no IO thread, no sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit import stored
from tests.unit.engine_parts import A, Producer, one_group, opened, owes, reopened
from zmesh._engine.outbox.publishes import AnyPublish
from zmesh._engine.outbox.records import MEM_RECORD_OVERHEAD
from zmesh._engine.outbox.runs import RUN_MAX_MESSAGES
from zmesh._engine.routing import partition_for
from zmesh._store.store import Store, WriteBatch
from zmesh.config import TopicConfig
from zmesh.errors import StoreFullError

SMALL_MAP = 256 << 10  # a map that a few hundred KiB of records fill


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield from opened(tmp_path / "p")


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Store]:
    yield from opened(tmp_path / "small", SMALL_MAP)


def _failed_stage(producer: Producer, *pubs: AnyPublish) -> None:
    """Stage ``pubs`` into a batch whose commit fails (the map has no room), then undo
    the stage as the committer does."""
    staging = producer.outbox.staging
    wb = WriteBatch()
    staging.prepare_lanes(list(pubs), wb, 0.0)
    fresh = staging.stage(list(pubs), wb)
    with pytest.raises(StoreFullError):
        producer.store.commit(wb)
    staging.unstage(fresh)


# -- what is stored, what is owed -----------------------------------------------------------


def test_a_publish_is_stored_with_its_pending_entry_and_owed_only_once_committed(
    store: Store,
) -> None:
    producer, lane = one_group(store, False, partitions=4)
    p = producer.publish("t", b"body", "k", headers={"h": "1"})
    staging = producer.outbox.staging
    wb = WriteBatch()
    fresh = staging.stage([p], wb)
    assert p.seq not in lane and producer.depth == 0  # (nothing owed before it is stored)
    store.commit(wb)
    producer.step(lambda after: staging.added(fresh, 0.0, after))
    part = partition_for("k", 4, p.seq)
    assert stored.msgs(store) == {
        p.seq: ["t", part, "k", {"h": "1"}, 0, 1000.0, None, None, b"body", 0]
    }
    assert stored.pend(store) == {(lane.id, p.seq): (part, 0, 0, None, None)}
    assert stored.runs(store) == {} and stored.pruns(store) == {}
    assert owes(lane) == [p.seq] and lane.ready_count == 1 and producer.depth == 1
    assert producer.outbox.receipts.stored == [p.stage] and p.stage.lanes == ("g",)
    assert producer.counters.get("published") == 1
    assert store.open_identity()[2] == p.seq + 1  # next_seq stored with it


def test_priority_schedule_and_expiry_are_kept_in_the_pending_entry(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    later = time.time() + 3600
    urgent = producer.publish("t", b"u", priority=3)
    scheduled = producer.publish("t", b"s", deliver_at=later)
    expiring = producer.publish("t", b"e", expires_at=later)
    producer.commit(urgent, scheduled, expiring, now=time.monotonic())
    assert stored.pend(store) == {
        (lane.id, urgent.seq): (0, 3, 0, None, None),
        (lane.id, scheduled.seq): (0, 0, 0, None, later),
        (lane.id, expiring.seq): (0, 0, 0, later, None),
    }
    records = stored.msgs(store)
    assert records[scheduled.seq][7] == later and records[expiring.seq][6] == later
    assert lane.ready_count == 2  # (the scheduled one waits)
    assert owes(reopened(store).outbox.lanes.all[("t", "g")]) == owes(lane)


def test_a_publish_many_is_stored_as_runs_each_owed_whole_by_every_lane(store: Store) -> None:
    producer = Producer(store, t=TopicConfig(partitions=4))
    g1, g2 = producer.group("t", "g1"), producer.group("t", "g2")
    n = 2 * RUN_MAX_MESSAGES + 76
    pm = producer.publish_many("t", [b"%d" % i for i in range(n)])
    producer.commit(pm)
    first = pm.seq
    firsts = [first, first + RUN_MAX_MESSAGES, first + 2 * RUN_MAX_MESSAGES]
    records = stored.runs(store)
    assert sorted(records) == firsts
    assert [len(records[f][5]) for f in firsts] == [RUN_MAX_MESSAGES, RUN_MAX_MESSAGES, 76]
    assert [payload for f in firsts for payload in records[f][5]] == pm.payloads
    # Keyless, the batch takes one partition (the topic's first, in turn), whose indexes
    # go on from one run to the next: 0, 1, 2, ...
    by_partition: dict[int, list[int]] = {}
    for f in firsts:
        _t, parts, _k, _h, _at, _p, indexes = records[f]
        for part, index in zip(parts, indexes, strict=True):
            by_partition.setdefault(part, []).append(index)
    assert by_partition == {0: list(range(n))}
    assert stored.msgs(store) == {} and stored.pend(store) == {}
    assert stored.pruns(store) == {
        (lane.id, f): (list(records[f][1]), None, None) for lane in (g1, g2) for f in firsts
    }
    assert owes(g1) == owes(g2) == list(pm.seqs) and producer.depth == n
    assert producer.outbox.receipts.stored == [pm.stage] and pm.stage.lanes == ("g1", "g2")
    again = reopened(store, t=TopicConfig(partitions=4))
    assert again.depth == n
    assert owes(again.outbox.lanes.all[("t", "g2")]) == list(pm.seqs)


def test_a_run_holds_at_most_its_bytes(store: Store) -> None:
    producer = Producer(store, t=TopicConfig(partitions=1))
    producer.group("t", "g")
    pm = producer.publish_many("t", [bytes([i]) * (100 << 10) for i in range(5)])
    producer.commit(pm)
    assert {f: len(r[5]) for f, r in stored.runs(store).items()} == {
        pm.seq: 2,
        pm.seq + 2: 2,
        pm.seq + 4: 1,
    }  # 200 KiB each at most, of 256


@pytest.mark.parametrize(
    "cfg",
    [TopicConfig(partitions=2, retention_s=60.0), TopicConfig(partitions=2, latest_wins=True)],
    ids=["retaining", "latest_wins"],
)
def test_a_topic_that_indexes_single_messages_stores_a_publish_many_as_singles(
    store: Store, cfg: TopicConfig
) -> None:
    producer = Producer(store, t=cfg)
    lane = producer.group("t", "g")
    pm = producer.publish_many("t", [b"a", b"b", b"c"], ["x", "y", "z"])
    producer.commit(pm)
    assert stored.runs(store) == {}
    assert sorted(stored.msgs(store)) == list(pm.seqs)
    assert sorted(stored.pend(store)) == [(lane.id, seq) for seq in pm.seqs]
    retained = producer.outbox.retained.totals.get("t")
    if cfg.retention_s:
        assert len(stored.db_keys(store, "rlog")) == 3 and retained is not None and retained[0] == 3
    else:
        assert stored.db_keys(store, "rlog") == [] and retained is None


def test_a_topic_without_a_group_is_owed_to_its_unclaimed_lane_until_groups_claim_it(
    store: Store,
) -> None:
    producer = Producer(store, t=TopicConfig(partitions=1))
    one = producer.publish("t", b"1")
    many = producer.publish_many("t", [b"2", b"3"])
    producer.commit(one, many)
    unclaimed = producer.outbox.lanes.get("t", "")
    assert unclaimed is not None and owes(unclaimed) == [one.seq, *many.seqs]
    assert one.stage.lanes == many.stage.lanes == ()
    assert stored.runs(store) == {}  # (no group: each message on its own)
    assert sorted(stored.pend(store)) == [(unclaimed.id, s) for s in (one.seq, *many.seqs)]
    g1, g2 = producer.group("t", "g1"), producer.group("t", "g2")
    assert owes(unclaimed) == [] and owes(g1) == [one.seq, *many.seqs]
    assert owes(g2) == []  # (the first group learned takes them)
    assert sorted(stored.pend(store)) == [(g1.id, s) for s in (one.seq, *many.seqs)]
    assert producer.outcomes.claimed("t", one.seq) == ("g1",)
    assert producer.depth == 3


# -- a failed commit -----------------------------------------------------------------------


def test_a_failed_commit_gives_back_indexes_retained_bytes_and_what_was_kept_decoded(
    small: Store,
) -> None:
    producer = Producer(
        small, kept=TopicConfig(partitions=1, retention_s=60.0), runs=TopicConfig(partitions=1)
    )
    kept_lane = producer.group("kept", "g")
    runs_lane = producer.group("runs", "g")
    for lane in (kept_lane, runs_lane):
        lane.set_member(A, 100, 10)  # (a live member: staged records are kept decoded)
    first = producer.publish("kept", b"first")
    producer.commit(first)
    totals = list(producer.outbox.retained.totals["kept"])
    records = producer.outbox.records
    decoded = dict(records.decoded.fields)
    big = producer.publish("kept", b"x" * SMALL_MAP)
    pm = producer.publish_many("runs", [b"a", b"b"])
    _failed_stage(producer, big, pm)
    assert producer.outbox.indexes.parts("kept") == {0: 1}  # index 1 is free again
    assert producer.outbox.indexes.parts("runs") == {0: 0}
    assert producer.outbox.retained.totals["kept"] == totals
    assert records.decoded.fields == decoded and records.decoded.runs == {}
    assert len(records.runs) == 0 and producer.depth == 1
    assert stored.msgs(small).keys() == {first.seq} and stored.runs(small) == {}
    again = producer.publish("kept", b"again")
    producer.commit(again)
    assert stored.msgs(small)[again.seq][9] == 1  # the index the failed stage had taken


def test_memory_messages_stay_in_ram_and_the_oldest_spill_past_the_budget(store: Store) -> None:
    each = 1000 + MEM_RECORD_OVERHEAD
    producer = Producer(
        store, memory_budget_bytes=4 * each, t=TopicConfig(partitions=1, durability="memory")
    )
    lane = producer.group("t", "g")
    records = producer.outbox.records
    old = [producer.publish("t", bytes([i]) * 1000) for i in range(3)]
    producer.commit(*old)
    assert sorted(records.mem) == [p.seq for p in old] and records.mem_bytes == 3 * each
    assert stored.msgs(store) == {} and stored.pend(store) == {}
    new = [producer.publish("t", b"n" * 1000) for _ in range(2)]
    producer.commit(*new)  # 5 of 4 budgets: the oldest go until half the budget is left
    assert sorted(records.mem) == [p.seq for p in new] and records.mem_bytes == 2 * each
    assert sorted(stored.msgs(store)) == [p.seq for p in old]
    assert stored.pend(store) == {(lane.id, p.seq): (0, 0, 0, None, None) for p in old}
    assert producer.counters.get("spilled") == 3
    assert owes(lane) == [p.seq for p in (*old, *new)] and producer.depth == 5
    assert owes(reopened(store).outbox.lanes.all[("t", "g")]) == [p.seq for p in old]


def test_a_memory_run_spills_as_a_run(store: Store) -> None:
    producer = Producer(
        store, memory_budget_bytes=5000, t=TopicConfig(partitions=1, durability="memory")
    )
    lane = producer.group("t", "g")
    records = producer.outbox.records
    pm = producer.publish_many("t", [b"r" * 1000] * 4)  # 4,400 bytes counted
    producer.commit(pm)
    assert list(records.mem_runs) == [pm.seq]
    assert stored.runs(store) == {} and stored.pruns(store) == {}
    newer = producer.publish_many("t", [b"s" * 100] * 4)  # 800 more: past the budget
    producer.commit(newer)
    assert list(stored.runs(store)) == [pm.seq] and stored.runs(store)[pm.seq][5] == pm.payloads
    assert stored.pruns(store) == {(lane.id, pm.seq): ([0] * 4, None, None)}
    assert list(records.mem_runs) == [newer.seq] and records.mem_bytes == 800
    assert records.runs.by_first[pm.seq].stored and not records.runs.by_first[newer.seq].stored
    assert owes(reopened(store).outbox.lanes.all[("t", "g")]) == list(pm.seqs)


def test_a_failed_commit_takes_older_spilled_messages_back_into_ram(small: Store) -> None:
    producer = Producer(
        small, memory_budget_bytes=200_000, t=TopicConfig(partitions=1, durability="memory")
    )
    producer.group("t", "g")
    records = producer.outbox.records
    old = [producer.publish("t", bytes([i]) * 60_000) for i in range(3)]
    producer.commit(*old)
    before = records.mem_bytes
    _failed_stage(producer, producer.publish("t", b"n" * 60_000))  # spills the three
    assert sorted(records.mem) == [p.seq for p in old] and records.mem_bytes == before
    assert stored.msgs(small) == {} and stored.pend(small) == {}


def test_a_failed_commit_keeps_nothing_of_a_stage_whose_own_messages_spilled(small: Store) -> None:
    """A stage whose own memory messages are past the budget spills them in its batch;
    its commit fails. ``unspill`` puts back into RAM what older stages held there, never
    the failed stage's own messages: they were never stored (RAM would hold, and count,
    messages no lane owes, and a later spill would write them to ``msgs``)."""
    producer = Producer(
        small, memory_budget_bytes=4000, t=TopicConfig(partitions=1, durability="memory")
    )
    producer.group("t", "g")
    _failed_stage(producer, *[producer.publish("t", b"x" * 100_000) for _ in range(3)])
    records = producer.outbox.records
    assert (list(records.mem), records.mem_bytes) == ([], 0)


# -- msg_id ---------------------------------------------------------------------------------


def test_a_duplicate_msg_id_is_not_stored_and_follows_its_original(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    receipts = producer.outbox.receipts
    original = producer.publish("t", b"1", msg_id="order-7")
    producer.commit(original)
    receipts.told()
    dup = producer.publish("t", b"2", msg_id="order-7")
    assert producer.commit(dup) == []
    assert stored.msgs(store).keys() == {original.seq} and owes(lane) == [original.seq]
    assert dup.receipt is not None and original.receipt is not None
    assert dup.receipt.id == original.receipt.id
    assert producer.counters.get("duplicates_suppressed") == 1
    assert receipts.stored == [dup.stage] and dup.stage.lanes == ("g",)
    assert producer.depth == 1
    lane.set_member(A, 10, 10)
    producer.dispatch(0.0)
    producer.ack("t", "g", [original.seq])
    assert receipts.acked == [dup.receipt]  # acked with its original
    late = producer.publish("t", b"3", msg_id="order-7")
    producer.commit(late)
    assert late.receipt in receipts.acked  # its original is settled: acked at once


def test_claims_are_kept_for_the_newest_topics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Topics come and go (one per device, each first published before its groups said
    hello): the claims of the topics claimed least recently are forgotten past
    MAX_CLAIM_TOPICS (4,096; 3 here), where each topic kept its claims for good."""
    from zmesh._engine.outbox import outcomes as outcomes_module

    monkeypatch.setattr(outcomes_module, "MAX_CLAIM_TOPICS", 3)
    table = outcomes_module.Outcomes()
    for i in range(5):
        table.claim(f"t{i}", [10 * i], ["g"])
    table.claim("t2", [99], ["h"])  # (claimed again: the newest)
    assert [table.claimed(f"t{i}", 10 * i) for i in range(5)] == [(), (), ("g",), ("g",), ("g",)]
    table.claim("t5", [50], ["g"])
    assert table.claimed("t3", 30) == () and table.claimed("t2", 99) == ("h",)


def test_the_outcomes_of_the_oldest_messages_are_forgotten_past_the_table_s_bound() -> None:
    """Past ``max_ranges`` a tenth of the table goes at once, the lowest sequences first,
    over every lane; a receipt of a message at or below them reports ``unknown``."""
    from zmesh._engine.outbox.outcomes import Outcome, Outcomes

    table = Outcomes(max_ranges=100)
    for i in range(100):  # 100 ranges, two lanes in turn (as groups come and go)
        table.record(f"g{i % 2}", Outcome.EXPIRED, [10 * i])
    assert table.of(0, 1, ["g0"], True) == {"g0": Outcome.EXPIRED}
    table.record("g9", Outcome.GROUP_DELETED, [5000])
    assert table._count == 90  # (the 11 lowest forgotten)
    assert table.horizon == 101
    assert table.of(0, 1, ["g0"], True) == {"g0": Outcome.UNKNOWN}
    assert table.of(100, 1, ["g0"], True) == {"g0": Outcome.UNKNOWN}
    assert table.of(110, 1, ["g1"], True) == {"g1": Outcome.EXPIRED}
    assert table.of(5000, 1, ["g9"], True) == {"g9": Outcome.GROUP_DELETED}
