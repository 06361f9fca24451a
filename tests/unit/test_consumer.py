"""The consumer half of an engine, fed batches as its listener hands them over: what a
redelivery that mixes held, acked and new messages delivers, and what the acks of a batch
become on their way to the producer. A real engine and LMDB store; its IO thread is not
started, so this test drives the steps the loop would take, in the loop's order."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from zmesh._engine.engine import Engine
from zmesh._protocol.frames import Ack, Batch, Nack
from zmesh._store.store import WriteBatch
from zmesh.config import NodeConfig, SubscriptionConfig
from zmesh.subscription import Origin, Subscription

PRODUCER = os.urandom(16)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(NodeConfig(name="c", mesh="unit", data_dir=str(tmp_path / "c"), mdns=False))
    eng._state = "running"  # (acks are queued as commands; nothing wakes a thread)
    eng._wake_pending = True
    yield eng
    eng._state = "new"
    eng.close()


def _batch(seqs: Sequence[int], attempt: int = 1) -> Batch:
    n = len(seqs)
    return Batch(PRODUCER, 1, "t", "g", 0, seqs, [s % 4 for s in seqs], [f"k{s}" for s in seqs],
                 [{"h": str(s)} for s in seqs], [attempt] * n, [float(s) for s in seqs],
                 list(seqs), [str(s).encode() for s in seqs])


def _loop(engine: Engine, *batches: Batch) -> list:
    """One loop iteration: the acks queued, the batches, the commit, the flush. Returns
    what was sent to the producer."""
    wb = WriteBatch()
    cmds = engine._cmds
    while cmds:  # (what ``Commands._drain_commands`` does with these two kinds)
        cmd = cmds.popleft()
        if isinstance(cmd, Origin):
            engine.consumer.acked_seqs(cmd, cmd.take_acks(), wb)
        else:
            assert isinstance(cmd, tuple) and cmd[0] == "settle"
            engine.consumer.settle(*cmd[1:])
    for batch in batches:
        engine.consumer.on_batch(batch, wb, 0.0)
    engine.store.commit(wb)
    sent: list = []
    engine.consumer.flush(lambda _producer, msg: sent.append(msg))
    return sent


def test_a_redelivery_mixing_held_acked_and_new_messages(engine: Engine) -> None:
    sub = Subscription(engine, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(10, 15)))
    got = sub.fetch(5, 0)
    assert len(got) == 5
    got[0].ack()
    got[1].ack()  # in order: 10, 11
    got[3].ack()  # out of order: 13
    sent = _loop(engine)
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[10, 11, 13]]
    # The producer resends 12, 13 (its ack lost) and 14 with a new message, 15.
    sent = _loop(engine, _batch((12, 13, 14, 15), attempt=2))
    assert [list(a.seqs) for a in sent if isinstance(a, Ack)] == [[13]]  # acked again
    stats = engine.counters.snapshot()
    assert stats["duplicates_held"] == 2 and stats["duplicates_dropped"] == 1
    new = sub.get(0)
    assert new is not None and sub.get(0) is None
    assert (new.id.seq, new.key, new.payload, new.headers, new.attempt, new.partition,
            new.published_at, new.index) == (15, "k15", b"15", {"h": "15"}, 2, 3, 15.0, 15)
    # The held ones settle in any order; each reaches the producer once.
    got[4].ack()
    new.ack()
    got[2].nack()
    sent = _loop(engine)
    assert sorted(s for a in sent if isinstance(a, Ack) for s in a.seqs) == [14, 15]
    assert [list(n.seqs) for n in sent if isinstance(n, Nack)] == [[12]]
    assert not any(engine.consumer._holding.values())  # nothing held any more


def test_acks_in_order_reach_the_producer_as_one_range(engine: Engine) -> None:
    sub = Subscription(engine, "t", SubscriptionConfig(group="g"))
    engine.consumer.add(sub)
    _loop(engine, _batch(range(100, 600)), _batch(range(600, 1100)))
    for msg in sub.fetch(1000, 0):
        msg.ack()
    acks = [a for a in _loop(engine) if isinstance(a, Ack)]
    assert len(acks) == 1 and acks[0].seqs == range(100, 1100)  # two batches, joined
    assert engine.store.seen_filter(PRODUCER, b"g", [99, 100, 1099, 1100]) == {100, 1099}
