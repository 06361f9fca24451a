"""Settling what a producer's lanes owe (outbox/settle.py): acks, nacks, fails, timers and
supersession, what each writes to LMDB, and a message leaving the outbox only once no
lane owes it. A real LMDB store in a temp dir; the time is passed in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit import stored
from tests.unit.engine_parts import A, Producer, one_group, opened, owes, reopened
from zmesh._engine.lane.delivery import DELAYED, IN_FLIGHT, READY
from zmesh._engine.limits import LATEST_KEYS_PRUNE
from zmesh._engine.outbox.deadletters import PARKED
from zmesh._engine.outbox.outcomes import Outcome
from zmesh._store.store import Store, pack
from zmesh.config import TopicConfig


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield from opened(tmp_path / "p")


def _sent(producer: Producer, now: float = 0.0) -> list[int]:
    """Every ready message handed to member A (which takes all it is given)."""
    return [seq for _m, _lane, taken, _c in producer.dispatch(now) for seq in taken.seqs]


# -- acks -----------------------------------------------------------------------------------


def test_acks_as_a_range_settle_a_run_and_its_receipt(store: Store) -> None:
    producer, lane = one_group(store, partitions=2)
    pm = producer.publish_many("t", [b"%d" % i for i in range(10)])
    producer.commit(pm)
    receipts = producer.outbox.receipts
    assert pm.receipt is not None
    receipts.watch([pm.receipt], producer.outbox.lanes)
    assert receipts.settled_floor == pm.seq  # (every message below it is settled)
    assert _sent(producer) == list(pm.seqs) and receipts.acked == []
    assert producer.ack("t", "g", pm.seqs) == 10
    assert stored.runs(store) == {} and stored.pruns(store) == {} and owes(lane) == []
    assert producer.depth == 0 and producer.counters.get("acked") == 10
    assert receipts.acked == [pm.receipt] * 10  # (one per message: its count goes down)


def test_acks_scattered_over_a_run_rewrite_its_entry_and_a_restart_owes_the_rest(
    store: Store,
) -> None:
    producer, lane = one_group(store, partitions=1)
    pm = producer.publish_many("t", [b"%d" % i for i in range(8)])
    producer.commit(pm)
    _sent(producer)
    first = pm.seq
    producer.ack("t", "g", [first, first + 2, first + 7])
    rest = [first + i for i in (1, 3, 4, 5, 6)]
    assert stored.pruns(store) == {(lane.id, first): ([0] * 8, [1, 3, 4, 5, 6], None)}
    assert list(stored.runs(store)) == [first] and producer.depth == 5
    assert owes(reopened(store).outbox.lanes.all[("t", "g")]) == rest
    producer.ack("t", "g", rest[:1])
    producer.ack("t", "g", rest[1:])  # (the tail: written as the offset it starts from)
    assert stored.runs(store) == {} and stored.pruns(store) == {} and producer.depth == 0


def test_a_keyless_run_keeps_its_one_partition_and_writes_it_again(store: Store) -> None:
    producer, lane = one_group(store, partitions=3)
    before = producer.publish_many("t", [b"first"] * 4)  # (partition 0)
    producer.commit(before)
    pm = producer.publish_many("t", [b"%d" % i for i in range(10)])
    producer.commit(pm)
    run = producer.outbox.records.runs.by_first[pm.seq]
    assert run.parts is None and run.one == 1  # (the next in turn; no byte per message kept)
    parts = [1] * 10
    assert list(stored.runs(store)[pm.seq][1]) == parts == list(run.partitions())
    _sent(producer)
    producer.ack("t", "g", [*before.seqs, pm.seq + 1, pm.seq + 4])
    owed = [0, 2, 3, 5, 6, 7, 8, 9]
    assert stored.pruns(store) == {(lane.id, pm.seq): (parts, owed, None)}
    assert owes(reopened(store, t=TopicConfig(partitions=3)).outbox.lanes.all[("t", "g")]) == [
        pm.seq + i for i in owed
    ]


def test_a_message_leaves_the_outbox_only_when_no_lane_owes_it(store: Store) -> None:
    producer = Producer(store, t=TopicConfig(partitions=1))
    g1, g2 = producer.group("t", "g1"), producer.group("t", "g2")
    for lane in (g1, g2):
        lane.set_member(A, 100, 100)
    one = producer.publish("t", b"one")
    pm = producer.publish_many("t", [b"a", b"b", b"c"])
    producer.commit(one)
    producer.commit(pm)
    receipts = producer.outbox.receipts
    assert one.receipt is not None and pm.receipt is not None
    receipts.watch([one.receipt, pm.receipt], producer.outbox.lanes)
    _sent(producer)
    seqs = [one.seq, *pm.seqs]
    producer.ack("t", "g1", seqs)
    assert owes(g1) == [] and owes(g2) == seqs and producer.depth == 4
    assert stored.msgs(store).keys() == {one.seq} and list(stored.runs(store)) == [pm.seq]
    assert stored.pend(store).keys() == {(g2.id, one.seq)}
    assert stored.pruns(store) == {(g2.id, pm.seq): ([0] * 3, None, None)}
    assert receipts.acked == []
    producer.ack("t", "g2", [pm.seq + 1])
    assert stored.pruns(store) == {(g2.id, pm.seq): ([0] * 3, [0, 2], None)}
    producer.ack("t", "g2", [one.seq, pm.seq, pm.seq + 2])
    assert stored.msgs(store) == stored.runs(store) == {}
    assert stored.pend(store) == stored.pruns(store) == {}
    assert producer.depth == 0
    assert sorted(map(id, receipts.acked)) == sorted([id(one.receipt)] + [id(pm.receipt)] * 3)


# -- nacks and fails ------------------------------------------------------------------------


def test_a_nack_persists_the_attempt_and_delays_the_message(store: Store) -> None:
    producer, lane = one_group(store, partitions=1)
    one = producer.publish("t", b"one")
    pm = producer.publish_many("t", [b"a", b"b", b"c"])
    producer.commit(one)
    producer.commit(pm)
    _sent(producer, 0.0)
    nacked = [one.seq, pm.seq + 1]
    producer.step(lambda wb: producer.outbox.settler.on_nack("t", "g", nacked, 5.0, wb, 0.0))
    assert stored.pend(store) == {(lane.id, one.seq): (0, 0, 1, None, None)}
    assert stored.pruns(store) == {(lane.id, pm.seq): ([0] * 3, None, [0, 1, 0])}
    assert [lane.state(seq) for seq in nacked] == [DELAYED, DELAYED]
    assert producer.counters.get("nacked") == 2
    again = reopened(store).outbox.lanes.all[("t", "g")]
    assert [again.attempt(seq) for seq in nacked] == [1, 1]  # (a restart counts on)
    producer.step(lambda wb: producer.outbox.settler.tick(4.9, wb))
    assert _sent(producer, 4.9) == []
    producer.step(lambda wb: producer.outbox.settler.tick(5.0, wb))
    sent = producer.dispatch(5.0)
    assert [(list(t.seqs), list(t.attempts)) for _m, _l, t, _c in sent] == [(nacked, [2, 2])]


@pytest.mark.parametrize("how", ["fail", "nack past max_attempts"])
def test_a_parked_message_keeps_its_record_in_the_dead_letters(store: Store, how: str) -> None:
    producer, lane = one_group(store, partitions=1, max_attempts=1)
    p = producer.publish("t", b"payload", "k", headers={"h": "v"})
    producer.commit(p)
    _sent(producer)
    settler = producer.outbox.settler
    if how == "fail":
        producer.step(lambda wb: settler.on_fail("t", "g", p.seq, "handler said no", wb))
        reason = "handler said no"
    else:
        producer.step(lambda wb: settler.on_nack("t", "g", [p.seq], None, wb, 0.0))
        reason = "max attempts reached after nack"
    assert stored.msgs(store) == stored.pend(store) == {}
    assert owes(lane) == [] and producer.depth == 0
    state, why, attempts, _at, history, record = store.get_dead(lane.id, p.seq) or []
    assert (state, why, attempts, [h[1:] for h in history]) == (PARKED, reason, 1, [[1, reason]])
    assert record == pack(["t", 0, "k", {"h": "v"}, 0, 1000.0, None, None, b"payload", 0])
    [dead] = producer.outbox.dead.list("t", "g", 10)
    assert (dead.id.seq, dead.key, dead.payload, dead.headers, dead.reason) == (
        p.seq,
        "k",
        b"payload",
        {"h": "v"},
        reason,
    )
    assert producer.outcome(p.seq) == Outcome.DEAD_LETTERED
    assert producer.counters.get("dead_lettered") == 1


# -- timers ---------------------------------------------------------------------------------


def test_an_ack_timeout_hands_the_message_out_again_after_a_backoff(store: Store) -> None:
    producer, lane = one_group(store, partitions=1, ack_timeout_s=10.0, retry_backoff_s=1.0)
    p = producer.publish("t", b"x")
    producer.commit(p)
    settler = producer.outbox.settler
    assert _sent(producer, 100.0) == [p.seq]
    producer.step(lambda wb: settler.tick(109.9, wb))
    assert lane.state(p.seq) == IN_FLIGHT
    producer.step(lambda wb: settler.tick(110.0, wb))
    assert lane.state(p.seq) == DELAYED and producer.counters.get("ack_timeouts") == 1
    producer.step(lambda wb: settler.tick(111.5, wb))  # (a backoff is 0.5 to 1.5 s)
    sent = producer.dispatch(111.5)
    assert [(list(t.seqs), list(t.attempts)) for _m, _l, t, _c in sent] == [([p.seq], [2])]


def test_an_ack_timeout_past_max_attempts_parks_the_message(store: Store) -> None:
    producer, lane = one_group(store, partitions=1, ack_timeout_s=10.0, max_attempts=1)
    p = producer.publish("t", b"x")
    producer.commit(p)
    _sent(producer, 0.0)
    producer.step(lambda wb: producer.outbox.settler.tick(10.0, wb))
    dead = store.get_dead(lane.id, p.seq)
    assert dead is not None and dead[1] == "max attempts reached after ack timeouts"
    assert stored.msgs(store) == {} and producer.depth == 0
    assert producer.outcome(p.seq) == Outcome.DEAD_LETTERED


def test_a_message_expires_by_tick_at_its_time(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    now = time.monotonic()  # (expires_at is wall-clock time, turned into monotonic time)
    p = producer.publish("t", b"x", expires_at=time.time() + 10.0)
    kept = producer.publish("t", b"y")
    producer.commit(p, kept, now=now)
    settler = producer.outbox.settler
    producer.step(lambda wb: settler.tick(now + 9.0, wb))
    assert owes(lane) == [p.seq, kept.seq]
    producer.step(lambda wb: settler.tick(now + 11.0, wb))
    assert owes(lane) == [kept.seq] and stored.msgs(store).keys() == {kept.seq}
    assert stored.pend(store).keys() == {(lane.id, kept.seq)} and producer.depth == 1
    assert producer.outcome(p.seq) == Outcome.EXPIRED
    assert producer.counters.get("expired") == 1


# -- latest wins ----------------------------------------------------------------------------


def test_latest_wins_supersedes_an_unsent_message_with_the_same_key(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1, latest_wins=True)
    old = producer.publish("t", b"old", "k")
    other = producer.publish("t", b"other", "j")
    producer.commit(old, other)
    new = producer.publish("t", b"new", "k")
    producer.commit(new)
    assert owes(lane) == [other.seq, new.seq] and stored.msgs(store).keys() == {other.seq, new.seq}
    assert stored.pend(store).keys() == {(lane.id, other.seq), (lane.id, new.seq)}
    assert producer.outcome(old.seq) == Outcome.SUPERSEDED and producer.depth == 2
    assert producer.counters.get("superseded") == 1
    lane.set_member(A, 100, 100)
    _sent(producer)  # in flight: no longer replaced
    newest = producer.publish("t", b"newest", "k")
    producer.commit(newest)
    assert owes(lane) == [other.seq, new.seq, newest.seq]
    # A restart rebuilds the key index from the stored messages, in sequence order as
    # their publishes would: nothing is in flight after it, so of a key only the newest
    # is owed (``new``, sent before, would be sent again: it is superseded).
    again = reopened(store, t=TopicConfig(partitions=1, latest_wins=True))
    assert owes(again.outbox.lanes.all[("t", "g")]) == [other.seq, newest.seq]
    last = again.publish("t", b"last", "k")
    again.commit(last)
    assert owes(again.outbox.lanes.all[("t", "g")]) == [other.seq, last.seq]
    assert again.outbox.lanes.all[("t", "g")].state(last.seq) == READY


def test_latest_wins_forgets_the_keys_of_messages_no_longer_owed(store: Store) -> None:
    """A key per device or session comes and goes: the key index keeps the keys of owed
    messages, not every key the topic ever saw."""
    producer, lane = one_group(store, partitions=1, latest_wins=True)
    keys = producer.outbox.settler._latest
    for burst in range(6):
        pubs = [producer.publish("t", b"v", f"k-{burst}-{i}") for i in range(LATEST_KEYS_PRUNE)]
        producer.commit(*pubs)
        while sent := _sent(producer):  # (member A's credit at a time)
            producer.ack("t", "g", sent)
    assert owes(lane) == []
    assert len(keys[("t", "g")]) <= 2 * LATEST_KEYS_PRUNE
    # An owed message's key still supersedes.
    old = producer.publish("t", b"old", "kept")
    producer.commit(old)
    for i in range(2 * LATEST_KEYS_PRUNE):
        producer.commit(producer.publish("t", b"v", f"more-{i}"))
    new = producer.publish("t", b"new", "kept")
    producer.commit(new)
    assert producer.outcome(old.seq) == Outcome.SUPERSEDED and lane.state(new.seq) == READY
