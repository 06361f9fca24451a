"""Transactions through the public API on real nodes."""

from __future__ import annotations

import threading

import pytest

import zmesh
from tests.conftest import wait_members, wait_until
from tests.integration.test_delivery import drain


def test_consume_transform_produce_commits_together(make_node):
    src = make_node("src", topics={"a": zmesh.TopicConfig(groups=("xf",))})
    xf = make_node(
        "xf", seeds=[src.control_address], topics={"b": zmesh.TopicConfig(groups=("sink",))}
    )
    sink = make_node("sink", seeds=[xf.control_address])
    sub_a = xf.subscribe("a", group="xf")
    sub_b = sink.subscribe("b", group="sink")
    rs = [src.publish("a", str(i).encode()) for i in range(20)]
    for _ in range(20):
        msg = sub_a.get(timeout=10)
        assert msg is not None
        with xf.transaction() as tx:
            tx.publish("b", b"x" + msg.payload)
            tx.publish("b", b"y" + msg.payload)
            tx.ack(msg)
        assert msg.settled
    for r in rs:
        r.wait_acked(10)
    got = sorted(m.payload for m in drain(sub_b, 40))
    assert got == sorted([b"x%d" % i for i in range(20)] + [b"y%d" % i for i in range(20)])


def test_an_aborted_transaction_leaves_nothing(make_node):
    src = make_node("src")
    xf = make_node(
        "xf", seeds=[src.control_address], topics={"b": zmesh.TopicConfig(groups=("sink",))}
    )
    sub_a = xf.subscribe("a", group="xf")
    wait_members(src, "a", "xf", 1)
    src.publish("a", b"in")
    msg = sub_a.get(timeout=10)
    assert msg is not None
    with pytest.raises(RuntimeError), xf.transaction() as tx:
        tx.publish("b", b"out")
        tx.ack(msg)
        raise RuntimeError("transform failed")
    assert not msg.settled
    assert xf.status()["outbox"] == 0
    msg.ack()  # still the application's to settle
    wait_until(lambda: src.status()["outbox"] == 0, what="ack to reach the source")


def test_a_transaction_whose_wait_runs_out_leaves_nothing(make_node):
    # The IO thread held up (by a call of the node's own that waits on an event), the
    # commit's wait runs out before the thread takes the transaction: it raises, and
    # nothing of it may happen later, or a retry stores its publishes twice.
    src = make_node("src")
    xf = make_node(
        "xf", seeds=[src.control_address], topics={"b": zmesh.TopicConfig(groups=("sink",))}
    )
    sink = make_node("sink", seeds=[xf.control_address])
    sub_a = xf.subscribe("a", group="xf")
    sub_b = sink.subscribe("b", group="sink")
    wait_members(src, "a", "xf", 1)
    wait_members(xf, "b", "sink", 1)
    src.publish("a", b"in")
    msg = sub_a.get(timeout=10)
    assert msg is not None
    started, release = threading.Event(), threading.Event()
    held = threading.Thread(
        target=xf._queue.call,
        args=(lambda _wb, _now: started.set() or release.wait(10),),
        daemon=True,
    )
    held.start()
    try:
        assert started.wait(10), "the IO thread did not take the holding call"
        with (
            pytest.raises(zmesh.NodeStateError, match="nothing of it"),
            xf.transaction(timeout=0.2) as tx,
        ):
            receipt = tx.publish("b", b"once")
            tx.ack(msg)
    finally:
        release.set()
        held.join(10)
    assert not msg.settled
    with pytest.raises(zmesh.NodeStateError, match="nothing of it"):
        receipt.wait_stored(5)
    with xf.transaction() as tx:  # the retry
        tx.publish("b", b"once")
        tx.ack(msg)
    assert drain(sub_b, 1)[0].payload == b"once"
    assert sub_b.get(timeout=1) is None  # stored once, not twice
    wait_until(lambda: src.status()["outbox"] == 0, what="the ack to reach the source")
    assert xf.status()["outbox"] == 0


def test_a_transaction_dropped_without_commit_or_abort_gives_its_room_back(make_node, caplog):
    # Used without ``with`` and forgotten, its publishes held outbox room for good: a
    # full outbox of messages never stored.
    node = make_node("xf", max_outbox_messages=10, publish_timeout_s=1)
    tx = node.transaction()
    for _ in range(8):
        tx.publish("b", b"never")
    del tx
    receipts = [node.publish("b", b"%d" % i) for i in range(10)]  # the whole outbox
    receipts[-1].wait_stored(5)
    assert node.status()["outbox"] == 10
    assert "dropped without commit or abort: its 8 publishes were discarded" in caplog.text


def test_transaction_rejects_foreign_and_settled_messages(make_node):
    src = make_node("src")
    a = make_node("a", seeds=[src.control_address])
    b = make_node("b", seeds=[src.control_address])
    sub = a.subscribe("t", group="g")
    wait_members(src, "t", "g", 1)
    src.publish("t", b"m")
    msg = sub.get(timeout=10)
    assert msg is not None
    with pytest.raises(zmesh.ArgumentError, match="not received by this node"):
        b.transaction().ack(msg)
    msg.ack()
    with pytest.raises(zmesh.MessageStateError):
        a.transaction().ack(msg)


def test_a_transaction_larger_than_the_publish_queue_bound_commits(make_node):
    # Publishers wait while MAX_AHEAD_MSGS publishes are queued for the IO thread; a
    # transaction's publishes are queued only at commit, so they must not wait for that.
    from zmesh._engine.limits import MAX_AHEAD_MSGS

    node = make_node("tx", publish_timeout_s=2.0, topics={"t": zmesh.TopicConfig(groups=("g",))})
    n = MAX_AHEAD_MSGS + 500
    with node.transaction(timeout=10) as tx:
        receipts = [tx.publish("t", b"%d" % i) for i in range(n)]
    receipts[-1].wait_stored(5)
    assert node.status()["outbox"] == n
    # And a single publish_many larger than the bound goes through at once.
    node.publish_many("t", [b"x"] * n, timeout=5).wait_stored(5)
    assert node.status()["outbox"] == 2 * n


def test_a_transaction_of_publishes_alone_and_an_empty_ack_many(make_node):
    """Nothing to ack is a valid case of both: the node stays up and delivers."""
    src = make_node("src", topics={"a": zmesh.TopicConfig(groups=("g",))})
    dst = make_node("dst", seeds=[src.control_address])
    sub = dst.subscribe("a", group="g")
    wait_members(src, "a", "g", 1)
    with src.transaction() as tx:
        tx.publish("a", b"one")
        tx.publish("a", b"two")
    sub.ack_many([])
    got = [m for m in (sub.get(timeout=10) for _ in range(2)) if m is not None]
    sub.ack_many(got)
    assert sorted(m.payload for m in got) == [b"one", b"two"]
    assert all(m.settled for m in got)
    wait_until(lambda: src.status()["outbox"] == 0, what="both acked")


def test_a_message_a_transaction_acks_is_its_own_until_it_commits_or_aborts(make_node):
    # Settled some other way before the commit, it would be acked by the commit as well,
    # or handed to another member while the commit stores what was made of it.
    src = make_node("src")
    xf = make_node(
        "xf", seeds=[src.control_address], topics={"b": zmesh.TopicConfig(groups=("sink",))}
    )
    sub = xf.subscribe("a", group="xf")
    wait_members(src, "a", "xf", 1)
    for i in range(3):
        src.publish("a", b"%d" % i)
    first, second, third = (sub.get(timeout=10) for _ in range(3))
    assert first is not None and second is not None and third is not None
    tx = xf.transaction()
    tx.publish("b", b"out")
    tx.ack(first)
    assert not first.settled
    for settle in (first.ack, first.nack, first.fail, lambda: sub.ack_many([first])):
        with pytest.raises(zmesh.MessageStateError, match="transaction that has not committed"):
            settle()
    with pytest.raises(zmesh.MessageStateError, match="transaction"):
        xf.transaction().ack(first)
    first.in_progress()  # (still being worked on: its lease may be extended)
    tx.abort()
    first.ack()  # the application's to settle again
    # Its subscription closed before the commit: released to other members, so the
    # commit fails and stores nothing.
    tx = xf.transaction()
    receipt = tx.publish("b", b"out")
    tx.ack(second)
    sub.close()
    with pytest.raises(zmesh.MessageStateError, match="released when its subscription closed"):
        tx.commit()
    with pytest.raises(zmesh.MessageStateError, match="nothing of it was stored"):
        receipt.wait_stored(5)
    assert second.settled and third.settled  # (released, both)
    assert xf.status()["outbox"] == 0
