"""The consumer half of an engine, fed batches as its listener hands them over: what a
redelivery that mixes held, acked and new messages delivers, and what the acks of a batch
become on their way to the producer. A real engine and LMDB store; its IO thread is not
started, so this test drives the steps the loop would take, in the loop's order."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from zmesh._engine.engine import Engine
from zmesh._engine.inbox import consumer as consumer_module
from zmesh._engine.inbox.origin import Origin
from zmesh._protocol.frames import Ack, Batch, Nack
from zmesh._store.store import WriteBatch
from zmesh.config import NodeConfig, SubscriptionConfig
from zmesh.errors import MessageStateError, StoreFullError
from zmesh.subscription import Message, Subscription, _fetched_runs

PRODUCER = os.urandom(16)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(NodeConfig(name="c", mesh="unit", data_dir=str(tmp_path / "c"), mdns=False))
    eng.queue.state = "running"  # (acks are queued as commands; nothing wakes a thread)
    eng.queue._wake_pending = True
    yield eng
    eng.queue.state = "new"
    eng.close()


def _batch(seqs: Sequence[int], attempt: int = 1, topic: str = "t") -> Batch:
    n = len(seqs)
    return Batch(
        PRODUCER,
        1,
        topic,
        "g",
        0,
        seqs,
        [s % 4 for s in seqs],
        [f"k{s}" for s in seqs],
        [{"h": str(s)} for s in seqs],
        [attempt] * n,
        [float(s) for s in seqs],
        list(seqs),
        [str(s).encode() for s in seqs],
    )


def _loop(engine: Engine, *batches: Batch) -> list:
    """One loop iteration: the acks queued, the batches, the commit, the flush. Returns
    what was sent to the producer."""
    wb = WriteBatch()
    engine.commands.drain(wb, [], [], 0.0)  # (the acks, nacks and fails queued)
    for batch in batches:
        engine.consumer.on_batch(batch, wb, 0.0)
    engine.store.commit(wb)
    sent: list = []
    engine.consumer.flush(lambda _producer, msg: sent.append(msg))
    return sent


def test_a_redelivery_mixing_held_acked_and_new_messages(engine: Engine) -> None:
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(10, 15)))
    got = sub.fetch(3, 0)  # 10, 11, 12 taken by the application; 13, 14 still queued
    assert len(got) == 3
    got[0].ack()
    got[1].ack()  # in order: 10, 11
    sent = _loop(engine)
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[10, 11]]
    # The producer resends 11 (its ack lost), 12, 13 and 14 after a reconnect (the same
    # attempt), with a new message, 15.
    sent = _loop(engine, _batch((11, 12, 13, 14, 15)))
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[11]]  # acked again
    stats = engine.counters.snapshot()
    assert stats["duplicates_held"] == 3 and stats["duplicates_dropped"] == 1
    assert "redelivered_lease_expired" not in stats
    queued = sub.fetch(10, 0)
    assert [m.id.seq for m in queued] == [13, 14, 15]
    new = queued[-1]
    assert (
        new.id.seq,
        new.key,
        new.payload,
        new.headers,
        new.attempt,
        new.partition,
        new.published_at,
        new.index,
    ) == (15, "k15", b"15", {"h": "15"}, 1, 3, 15.0, 15)
    # The held ones settle in any order; each reaches the producer once.
    queued[1].ack()
    new.ack()
    got[2].nack()
    queued[0].ack()
    sent = _loop(engine)
    assert sorted(s for a in sent if isinstance(a, Ack) for s in a.seqs) == [13, 14, 15]
    assert [list(n.seqs) for n in sent if isinstance(n, Nack)] == [[12]]
    assert not any(engine.consumer._holding.values())  # nothing held any more


def test_topics_that_come_and_go_leave_nothing_behind(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pattern subscription meets a topic per device, each published a few messages
    then never again: once they are settled the consumer holds no entry of theirs, and
    the subscriptions it found per topic are a bounded cache."""
    monkeypatch.setattr(consumer_module, "RECEIVERS_KEPT", 16)
    sub = Subscription(engine.queue, "dev.*", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    for i in range(100):
        seqs = range(3 * i, 3 * i + 3)
        _loop(engine, _batch(seqs, topic=f"dev.{i}"))
        got = sub.fetch(3, 0)
        assert [m.id.seq for m in got] == list(seqs)
        sub.ack_many(got)
        _loop(engine)
        # A batch sent again after its ack (lost) is acked again, leaving nothing held.
        _loop(engine, _batch(seqs, topic=f"dev.{i}"))
    assert engine.counters.snapshot()["duplicates_dropped"] == 300
    assert engine.consumer._holding == {}
    assert 0 < len(engine.consumer._receivers) <= 16


def test_a_message_sent_again_after_its_ack_timeout_reaches_the_application_again(
    engine: Engine,
) -> None:
    """The application took 12 and 13 and settled neither; the producer's ack timeout
    sends them again (attempt 2): the application gets them again. 14, still queued when
    its resend comes, is not delivered twice. Either copy's ack settles the message."""
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(12, 15)))
    first = sub.fetch(2, 0)
    _loop(engine, _batch((12, 13, 14), attempt=2))
    stats = engine.counters.snapshot()
    assert stats["redelivered_lease_expired"] == 2 and stats["duplicates_held"] == 1
    again = sub.fetch(10, 0)
    assert [(m.id.seq, m.attempt) for m in again] == [(14, 1), (12, 2), (13, 2)]
    first[0].ack()  # the first copy of 12, late
    again[2].ack()  # the second copy of 13
    again[0].ack()
    acked = [s for a in _loop(engine) if isinstance(a, Ack) for s in a.seqs]
    assert sorted(acked) == [12, 13, 14]
    first[1].ack()  # the first copy of 13: acked again, harmless
    again[1].ack()  # the second copy of 12
    acked = [s for a in _loop(engine) if isinstance(a, Ack) for s in a.seqs]
    assert sorted(acked) == [12, 13]
    assert not any(engine.consumer._holding.values())


def test_closing_a_subscription_releases_what_the_application_did_not_settle(
    engine: Engine,
) -> None:
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(20, 26)))
    taken = sub.fetch(3, 0)  # 20, 21, 22 taken; 23..25 queued
    taken[1].ack()
    sub._drain_unsettled()
    engine.consumer.remove(sub)
    sent = _loop(engine)
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[21]]
    assert sorted(s for n in sent if isinstance(n, Nack) for s in n.seqs) == [20, 22, 23, 24, 25]
    assert not any(engine.consumer._holding.values())
    with pytest.raises(MessageStateError, match="released"):
        taken[0].ack()


def test_acks_in_order_reach_the_producer_as_one_range(engine: Engine) -> None:
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(100, 600)), _batch(range(600, 1100)))
    for msg in sub.fetch(1000, 0):
        msg.ack()
    acks = [a for a in _loop(engine) if isinstance(a, Ack)]
    assert len(acks) == 1 and acks[0].seqs == range(100, 1100)  # two batches, joined
    assert engine.store.seen_filter(PRODUCER, b"g", [99, 100, 1099, 1100]) == {100, 1099}


def test_threads_taking_from_one_subscription_get_each_message_once(engine: Engine) -> None:
    """Threads taking from the same batches at once (a handler with concurrency, or the
    application's own threads): each message goes to one of them, once, and the lists
    fetched with gaps (another thread took from the same batch meanwhile) are acked for
    what they hold. Thread switches are forced as often as Python allows."""
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, *[_batch(range(k, k + 500)) for k in range(0, 20_000, 500)])
    taken: list[list[Message]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(taken))

    def take(mine: list[Message], fetch: bool) -> None:
        try:
            start.wait(10)
            while True:
                msgs = sub.fetch(37, 0) if fetch else [m for m in [sub.get(0)] if m]
                if not msgs:
                    return
                sub.ack_many(msgs)
                mine.extend(msgs)
        except BaseException as exc:  # (reported below, on the test's thread)
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [
            threading.Thread(target=take, args=(mine, n % 2 == 0)) for n, mine in enumerate(taken)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(switch)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted(m.id.seq for mine in taken for m in mine) == list(range(20_000))
    acked = [s for a in _loop(engine) if isinstance(a, Ack) for s in a.seqs]
    assert sorted(acked) == list(range(20_000))


def test_the_runs_of_a_fetched_list() -> None:
    """``fetch`` records each stretch it took from one batch; those consecutive make the
    list's runs (joined where one goes on from the one before), any other refuses."""
    a = Origin(
        None,
        (PRODUCER, "t", "g"),
        "g",
        range(10),
        [None] * 10,
        [1] * 10,
        [0] * 10,
        [0.0] * 10,
        list(range(10)),
    )
    b = Origin(
        None,
        (PRODUCER, "t", "g"),
        "g",
        range(10, 20),
        [None] * 10,
        [1] * 10,
        [0] * 10,
        [0.0] * 10,
        list(range(10)),
    )
    assert _fetched_runs([(a, 2, 2, 1), (a, 3, 9, 7), (b, 0, 4, 5)]) == [
        (a, range(2, 10), True),
        (b, range(0, 5), True),
    ]
    assert _fetched_runs([(a, 0, 9, 8)]) is None  # two places taken by another thread
    assert _fetched_runs([(a, 0, 0, 1), (a, 3, 9, 7)]) is None  # the batch in two runs
    assert _fetched_runs([(a, 0, 4, 5), (b, 0, 4, 5), (a, 5, 9, 5)]) is None


def test_acks_a_full_store_cannot_record_are_sent_and_remembered_until_it_can(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store too full to take the acks' dedupe bits even in pieces (a commit with any
    of them fails, as on a full disk with no free page in its file): the acks go to the
    producer all the same, which deletes the messages; a redelivery that was already on
    its way is dropped by the bits kept in memory; once the store has room the bits are
    written, a second after the last try."""
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    commit = engine.store.commit

    def full(batch: WriteBatch) -> None:
        if batch.seen_put or batch.seen_masks:
            raise StoreFullError(engine.store.path, engine.store.map_size_bytes)
        commit(batch)

    def loop(now: float, *batches: Batch) -> list:
        wb = WriteBatch()
        engine.commands.drain(wb, [], [], now)
        for batch in batches:
            engine.consumer.on_batch(batch, wb, now)
        engine.commits.commit(wb, [], [], None, now)
        sent: list = []
        engine.consumer.flush(lambda _producer, msg: sent.append(msg))
        return sent

    loop(0.0, _batch(range(10, 15)))
    monkeypatch.setattr(engine.store, "commit", full)
    sub.ack_many(sub.fetch(5, 0))
    sent = loop(0.1)
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[10, 11, 12, 13, 14]]
    stats = engine.counters.snapshot()
    assert stats["acks_unwritten"] == 5 and "acks_rolled_back" not in stats
    assert engine.consumer.unwritten.count == 5 and engine.commits.full
    assert engine.store.seen_filter(PRODUCER, b"g", list(range(10, 15))) == set()
    # Sent again before the acks arrived: acked again, not delivered again.
    sent = loop(0.5, _batch(range(10, 16), attempt=2))
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[10, 11, 12, 13, 14]]
    assert [m.id.seq for m in sub.fetch(10, 0)] == [15]
    # (that loop's commit tried them again, in vain: the next try is due at 1.5)
    monkeypatch.setattr(engine.store, "commit", commit)
    loop(1.4)
    assert engine.consumer.unwritten.count == 5
    loop(1.5)
    assert engine.consumer.unwritten.count == 0 and not engine.commits.full
    assert engine.store.seen_filter(PRODUCER, b"g", list(range(9, 16))) == set(range(10, 15))
    assert engine.counters.snapshot()["acks_unwritten"] == 5


def test_the_bits_kept_for_a_full_store_go_once_the_producer_s_floor_passes_them(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer settled everything below its floor and sends none of it again: bits
    kept below it are let go, as the store's window is pruned there."""
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    commit = engine.store.commit
    wb = WriteBatch()
    engine.consumer.on_batch(_batch(range(10, 15)), wb, 0.0)
    commit(wb)

    def full(batch: WriteBatch) -> None:
        if batch.seen_put or batch.seen_masks:
            raise StoreFullError(engine.store.path, engine.store.map_size_bytes)
        commit(batch)

    monkeypatch.setattr(engine.store, "commit", full)
    sub.ack_many(sub.fetch(5, 0))
    wb = WriteBatch()
    engine.commands.drain(wb, [], [], 0.0)
    engine.commits.commit(wb, [], [], None, 0.0)
    engine.consumer.flush(lambda _producer, _msg: None)
    assert engine.consumer.unwritten.count == 5
    floor = 2048  # (two chunks of 1,024 past them)
    later = Batch(
        PRODUCER, 1, "t", "g", floor, (floor,), [0], [None], [None], [1], [0.0], [0], [b"x"]
    )
    wb = WriteBatch()
    engine.consumer.on_batch(later, wb, 5.0)
    assert engine.consumer.unwritten.count == 0


def _beat(engine: Engine, observed: float, window_s: float = 86_400.0) -> None:
    """A heartbeat's sweep of the producers heard, committed."""
    wb = WriteBatch()
    engine.consumer.forget_silent(observed, window_s, wb)
    engine.store.commit(wb)


def test_a_producer_silent_for_the_dedupe_window_is_forgotten(engine: Engine) -> None:
    """A producer that sent nothing for ``dedupe_window_s`` (gone for good: a worker's
    node id of one run) leaves nothing of its window behind, in memory or in the store;
    one that keeps sending is kept, and until its window passes its redeliveries are
    still dropped."""
    sub = Subscription(engine.queue, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(10, 15)))
    sub.ack_many(sub.fetch(5, 0))
    _loop(engine)
    _beat(engine, 1_000.0)
    assert engine.store.window_state() == ({(PRODUCER, "g"): 14}, {PRODUCER: 1_000.0})
    _beat(engine, 1_000.0 + 86_400.0)  # (a day: not more)
    sent = _loop(engine, _batch(range(10, 15), attempt=2))  # an ack it never received
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[10, 11, 12, 13, 14]]
    assert sub.fetch(5, 0) == []  # dropped, acked again
    assert "producers_forgotten" not in engine.counters.snapshot()

    _beat(engine, 1_000.0 + 2 * 86_400.0)  # heard at the last beat: its day starts again
    assert engine.store.window_state().heard == {PRODUCER: 1_000.0 + 2 * 86_400.0}
    _beat(engine, 1_001.0 + 3 * 86_400.0)  # silent since
    assert engine.store.window_state() == ({}, {})
    assert engine.consumer._tops == {} and engine.consumer._pruned == {}
    assert engine.counters.snapshot()["producers_forgotten"] == 1
    _loop(engine, _batch(range(10, 15), attempt=3))
    assert len(sub.fetch(5, 0)) == 5  # (nothing left to drop it by)


def test_when_a_producer_was_heard_from_survives_a_restart(tmp_path: Path) -> None:
    """The time saved is read again at start, and a store that holds a producer's chunks
    with no time (written before times were kept) counts it heard at the first beat."""
    config = NodeConfig(name="c", mesh="unit", data_dir=str(tmp_path / "c"), mdns=False)
    other = os.urandom(16)
    eng = Engine(config)
    try:
        wb = WriteBatch(seen_put=[(PRODUCER, b"g", [3]), (other, b"g", [7])])
        wb.seen_heard[PRODUCER] = 500.0
        eng.store.commit(wb)
    finally:
        eng.close()
    eng = Engine(config)
    try:
        assert eng.store.window_state().heard == {PRODUCER: 500.0}
        _beat(eng, 900.0, window_s=300.0)  # PRODUCER silent for 400 s; the other heard now
        assert eng.store.window_state() == ({(other, "g"): 7}, {other: 900.0})
        assert eng.counters.snapshot()["producers_forgotten"] == 1
    finally:
        eng.close()
