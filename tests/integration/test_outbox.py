"""The producer's outbox: restarts, durability modes, limits and bad input."""

from __future__ import annotations

import datetime
import dis
import gc
import inspect
import logging
import math
import os
import shutil
import sys
import threading
import time
import types
import zlib
from typing import Any

import pytest

import zmesh
from tests.conftest import LOOPBACK, fetched, wait_members, wait_until
from tests.integration.test_delivery import drain
from zmesh._protocol.codec import MAX_HEADERS_BYTES, MAX_KEY_CHARS
from zmesh._store.pages import RELEASE_BYTES


def test_restarted_producer_resumes_from_its_outbox(make_node, tmp_path):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    rs = [prod.publish("t", str(i).encode()) for i in range(200)]
    for r in rs:
        r.wait_stored(5)
    prod.close()
    prod2 = make_node("prod", data_dir=str(tmp_path / "prod"))
    assert prod2.status()["outbox"] == 200
    cons = make_node("cons", seeds=[prod2.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, 200)
    assert sorted(int(m.payload) for m in got) == list(range(200))
    wait_until(lambda: prod2.status()["outbox"] == 0, what="outbox drained")
    # New sequences continue after the old ones: ids stay unique.
    r = prod2.publish("t", b"next")
    assert r.id.seq > max(rr.id.seq for rr in rs)


def test_a_reopened_outbox_counts_each_message_once(make_node, tmp_path):
    """Two groups owe every message of one topic; the outbox is messages, not debts."""
    prod = make_node(
        "prod",
        topics={"a": zmesh.TopicConfig(groups=("g1", "g2")), "b": zmesh.TopicConfig(groups=("g",))},
    )
    receipts = [prod.publish_many("a", [b"x"] * 30), prod.publish_many("b", [b"y"] * 20)]
    for r in receipts:
        r.wait_stored(5)
    assert prod.status()["outbox"] == 50
    prod.close()
    reopened = make_node("prod", data_dir=str(tmp_path / "prod"))
    assert reopened.status()["outbox"] == 50
    assert sorted((ln["lane"], ln["pending"]) for ln in reopened.status()["lanes"]) == [
        ("g", 20),
        ("g1", 30),
        ("g2", 30),
    ]


@pytest.mark.parametrize("durability", ["fsync", "process", "memory"])
def test_each_durability_mode_delivers(make_node, durability):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(durability=durability)})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    rs = [prod.publish("t", bytes(100)) for _ in range(500)]
    assert len(drain(sub, 500)) == 500
    for r in rs:
        r.wait_acked(10)


def test_memory_mode_spills_to_lmdb_past_its_budget(make_node, tmp_path):
    prod = make_node(
        "prod",
        memory_budget_bytes=20_000,
        topics={"t": zmesh.TopicConfig(durability="memory", groups=("g",))},
    )
    rs = [prod.publish("t", bytes(1000)) for _ in range(100)]
    for r in rs:
        r.wait_stored(5)
    assert prod.stats().get("spilled", 0) > 0
    cons = make_node("cons", seeds=[prod.control_address])
    assert len(drain(cons.subscribe("t", group="g"), 100)) == 100
    for r in rs:
        r.wait_acked(10)


def test_a_memory_topics_messages_lost_at_close_are_said_and_counted(make_node, caplog):
    # They were dropped without a word: the contract drops nothing silently.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(durability="memory", groups=("g",))})
    for i in range(10):
        prod.publish("t", b"single %d" % i).wait_stored(5)
    prod.publish_many("t", [b"run"] * 20).wait_stored(5)
    prod.close()
    assert prod.stats()["memory_lost_on_close"] == 30
    assert "closes with 30 messages of memory topics" in caplog.text


def test_full_outbox_blocks_then_raises_a_clear_error(make_node):
    prod = make_node("prod", max_outbox_messages=10, topics={"t": zmesh.TopicConfig(groups=("g",))})
    for _ in range(10):
        prod.publish("t", b"x")
    with pytest.raises(zmesh.OutboxFullError, match="max_outbox_messages") as err:
        prod.publish("t", b"x", timeout=0.2)
    assert err.value.limit == 10


def test_a_fast_publisher_stops_exactly_at_max_outbox_messages(make_node):
    # publish() takes the room the IO thread last counted without checking each time
    # (Commands._credit): the bound holds all the same, to the message.
    prod = make_node(
        "prod", max_outbox_messages=3000, topics={"t": zmesh.TopicConfig(groups=("g",))}
    )
    published = 0
    with pytest.raises(zmesh.OutboxFullError):
        for _ in range(3001):
            prod.publish("t", b"x", timeout=0.5)
            published += 1
    assert published == 3000
    for _ in range(3):  # (after a loop iteration that counted the room again)
        with pytest.raises(zmesh.OutboxFullError):
            prod.publish("t", b"x", timeout=0.05)
    assert prod.status()["outbox"] == 3000


@pytest.mark.parametrize("timeout", [30.0, math.inf])
def test_a_publish_blocked_on_a_full_outbox_goes_on_when_acks_make_room(make_node, timeout):
    """Acks that settle messages wake a publisher waiting for outbox room at once, not
    when its timeout runs out (it then found the room and went on, 30 s late). A timeout
    of infinity waits like no timeout (it raised OverflowError)."""
    prod = make_node("prod", max_outbox_messages=5, topics={"t": zmesh.TopicConfig(groups=("g",))})
    for _ in range(5):
        prod.publish("t", b"x")
    waited: list[float] = []
    receipts: list[zmesh.Receipt] = []

    def sixth() -> None:
        t0 = time.monotonic()
        receipts.append(prod.publish("t", b"sixth", timeout=timeout))
        waited.append(time.monotonic() - t0)

    publisher = threading.Thread(target=sixth)
    publisher.start()
    try:
        wait_until(lambda: prod._engine.queue.cond._waiters, what="the sixth publish waiting")
        cons = make_node("cons", seeds=[prod.control_address])
        sub = cons.subscribe("t", group="g")
        for _ in range(5):
            msg = sub.get(timeout=10)
            assert msg is not None
            msg.ack()
        acked = time.monotonic()
        publisher.join(40)
        assert waited, "the sixth publish never returned"
        assert time.monotonic() - acked < 15, "the publish waited for its timeout"
        msg = sub.get(timeout=timeout)
        assert msg is not None and msg.payload == b"sixth"
        msg.ack()
        receipts[0].wait_acked(timeout)
    finally:
        publisher.join(40)


def test_a_data_dir_serves_one_node_at_a_time(make_node, tmp_path):
    make_node("a")
    with pytest.raises(zmesh.DataDirLockedError):
        # (closed at once if it is wrongly made: no second node left on the data dir)
        zmesh.Node("a2", data_dir=str(tmp_path / "a"), mdns=False, interfaces=LOOPBACK).close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"payload": 123}, "payload"),
        ({"key": 5}, "key"),
        ({"priority": -1}, "priority"),
        ({"priority": 256}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 1.0}, "priority"),
        ({"ttl": 0}, "ttl"),
        ({"headers": {1: 2}}, "headers"),
        ({"delay": 1, "deliver_at": 5.0}, "deliver_at or delay"),
        ({"priority": False}, "priority"),
        ({"priority": 0.0}, "priority"),
        ({"payload": b"x" * 2049}, "max_message_bytes"),
        # What a consumer could not decode is refused at the call (it stopped the IO thread,
        # or every consumer dropped the batch holding it).
        ({"key": "k" * (MAX_KEY_CHARS + 1)}, "key of"),
        ({"headers": {"h": object()}}, "cannot be packed"),
        ({"headers": {"h": {1: 2}}}, "would not decode"),
        ({"headers": {"h": "x" * MAX_HEADERS_BYTES}}, "more than"),
        ({"headers": {"h": 1 << 64}}, "cannot be packed"),
        ({"headers": {"h": "\ud800"}}, "cannot be packed"),
        ({"key": "\ud800"}, "key is not valid text"),
        ({"msg_id": "a\ud800"}, "msg_id is not valid text"),
        ({"payload": "\ud800"}, "payload is not valid text"),
        ({"ttl": float("nan")}, "ttl"),
        ({"delay": float("nan")}, "delay"),
        ({"delay": float("inf")}, "delay"),
        ({"deliver_at": float("nan")}, "deliver_at"),
        # A bool was taken for 1 s (or the timestamp 1.0).
        ({"ttl": True}, "ttl must be a positive number"),
        ({"delay": True}, "delay must be a finite number"),
        ({"deliver_at": True}, "deliver_at must be a datetime or a UNIX timestamp, got True"),
        # Scheduled past any use, the message sat in the outbox for good.
        ({"delay": 1e12}, "delay=1000000000000.0 is more than ten years ahead"),
        ({"deliver_at": 1e300}, "deliver_at=1e.300 is more than ten years ahead"),
        ({"deliver_at": datetime.datetime.max.replace(tzinfo=datetime.UTC)}, "ten years ahead"),
        # (past what a float or a datetime's timestamp holds: a raw OverflowError or
        # ValueError)
        ({"deliver_at": 10**400}, "deliver_at must be a datetime or a UNIX timestamp"),
        ({"deliver_at": datetime.datetime.min}, "deliver_at must be a datetime or a UNIX"),
    ],
)
@pytest.mark.parametrize("first", [True, False], ids=["first publish", "topic published"])
def test_bad_publish_arguments_raise_at_the_call(make_node, kwargs, match, first):
    # A topic published before takes publish()'s short way when every option is at its
    # default: what is not must still be checked there.
    prod = make_node("prod", max_message_bytes=2048)
    if not first:
        prod.publish("t", b"ok").wait_stored(5)
    args = {"payload": b"x", **kwargs}
    with pytest.raises(zmesh.ArgumentError, match=match):
        prod.publish("t", args.pop("payload"), **args)
    # Nothing of it was kept: the node goes on, and its outbox counts what was stored.
    prod.publish("t", b"after").wait_stored(5)
    assert prod.status()["outbox"] == (1 if first else 2)
    assert prod._engine.queue._submitted == prod._engine.queue._done


def test_arguments_of_other_types_are_refused_with_what_they_should_be(make_node):
    # (each escaped as a raw TypeError, OverflowError or ValueError)
    prod = make_node("prod")
    with pytest.raises(zmesh.ConfigError, match="topic name"):
        prod.publish([], b"x")  # type: ignore[arg-type]
    with pytest.raises(zmesh.ConfigError, match="topic name"):
        prod.publish_many(["t"], [b"a"])  # type: ignore[arg-type]
    with pytest.raises(zmesh.ArgumentError, match=r"from_index must be an int 0..2\*\*63-1"):
        prod.replay("t", 2**64)
    for call, what in (
        (lambda: prod.replay_dead_letters("t", "g", 5), "ids"),  # type: ignore[arg-type]
        (lambda: prod.purge_dead_letters("t", "g", 5), "ids"),  # type: ignore[arg-type]
        (lambda: prod.replay("t", partitions=5), "partitions"),  # type: ignore[arg-type]
        (lambda: prod.replay("t", producers="p"), "producers"),
    ):
        with pytest.raises(zmesh.ArgumentError, match=f"{what} must be a list"):
            call()
    # A ttl past any float is as long as infinity: it never expires.
    prod.publish("t", b"lasting", ttl=10**400).wait_stored(5)


def test_publish_options_are_keywords_it_knows(make_node):
    """An option publish() does not know is a TypeError naming it, as for any function;
    options given at their defaults store the message as a call without them does."""
    prod = make_node("prod")
    with pytest.raises(TypeError, match=r"publish\(\) got an unexpected keyword argument 'prio'"):
        prod.publish("t", b"x", prio=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        prod.publish("t", b"x", "k")  # type: ignore[misc]
    given = prod.publish("t", b"a", key="k", headers=None, priority=0, ttl=None, msg_id=None)
    plain = prod.publish("t", b"b", key="k")
    given.wait_stored(5)
    plain.wait_stored(5)
    assert plain.id.seq == given.id.seq + 1 and prod.status()["outbox"] == 2
    assert sorted(zmesh.PublishOptions.__annotations__) == [
        "delay",
        "deliver_at",
        "headers",
        "msg_id",
        "priority",
        "ttl",
    ]


def test_a_publish_is_scheduled_up_to_ten_years_ahead(make_node):
    prod = make_node("prod")
    nine_years = 9 * 365 * 86_400
    prod.publish("t", b"a", delay=nine_years).wait_stored(5)
    prod.publish("t", b"b", deliver_at=time.time() + nine_years).wait_stored(5)
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=9 * 365)
    prod.publish("t", b"c", deliver_at=at).wait_stored(5)
    assert prod.status()["outbox"] == 3


@pytest.mark.parametrize(
    "payloads, keys, match",
    [
        ("abc", None, "list of payloads, got one str"),  # was three messages "a", "b", "c"
        (b"abc", None, "list of payloads, got one bytes"),
        (bytearray(b"ab"), None, "list of payloads"),
        ([], None, "at least one payload"),
        ([b"a", b"b", b"c"], "abc", "list of keys"),  # was the keys "a", "b", "c"
        ([b"a", b"b"], ["k"], "1 keys for 2 payloads"),
        (5, None, "list of payloads .bytes or str., got int"),  # was a raw TypeError
        ([b"a"], 5, "list of keys .one per payload., got int"),
        # A mapping was taken for its keys (published as payloads), a set in no order.
        ({b"a": 1, b"b": 2}, None, "list of payloads .bytes or str., got dict"),
        ({b"a", b"b"}, None, "list of payloads .bytes or str., got set"),
        (frozenset([b"a"]), None, "list of payloads .bytes or str., got frozenset"),
        ([b"a", b"b"], {"k0": 1, "k1": 2}, "list of keys .one per payload., got dict"),
        ([b"a", b"b"], {"k0", "k1"}, "list of keys .one per payload., got set"),
    ],
)
def test_bad_publish_many_arguments_raise_at_the_call(make_node, payloads, keys, match):
    prod = make_node("prod")
    with pytest.raises(zmesh.ArgumentError, match=match):
        prod.publish_many("t", payloads, keys=keys)
    receipt = prod.publish_many("t", (p for p in [b"a", "b"]))  # any iterable of payloads
    receipt.wait_stored(5)
    assert len(receipt.ids) == 2 and prod.status()["outbox"] == 2


def test_topic_config_set_after_publishing_applies_to_the_next_publish(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    keys = [f"k{i}" for i in range(4)]
    before = [prod.publish("t", b"%d" % i, key=key) for i, key in enumerate(keys)]
    prod.topic("t", partitions=1)
    after = [prod.publish("t", b"%d" % i, key=key) for i, key in enumerate(keys)]
    got = {m.id.seq: m for m in drain(sub, 8)}
    want = [zlib.crc32(key.encode()) % zmesh.TopicConfig().partitions for key in keys]
    assert [got[r.id.seq].partition for r in before] == want and any(want)
    assert [got[r.id.seq].partition for r in after] == [0] * 4
    prod.topic("t", ttl_s=0.2, groups=("g2",))
    prod.publish("t", b"expires").wait_stored(5)
    wait_until(
        lambda: any(ln["lane"] == "g2" and ln.get("expired") == 1 for ln in prod.status()["lanes"]),
        what="the topic's new ttl applied to the next publish",
    )


def test_bad_names_and_closed_nodes_give_clear_errors(make_node, tmp_path):
    with pytest.raises(zmesh.ConfigError, match="topic name"):
        make_node("prod").publish("bad topic!", b"x")
    node = zmesh.Node("n", data_dir=str(tmp_path / "n"), mdns=False)
    with pytest.raises(zmesh.NodeStateError, match="start"):
        node.publish("t", b"x")
    with pytest.raises(zmesh.NodeStateError, match="has not started"):
        node.control_address  # noqa: B018  (port 0 would be refused as a seed)
    node.close()
    with pytest.raises(zmesh.ConfigError, match="broadcast subscription needs a group"):
        make_node("c").subscribe("t", mode="broadcast")


def test_msg_id_makes_publish_idempotent_across_restarts(make_node, tmp_path):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    first = prod.publish("t", b"v1", msg_id="order-7")
    again = prod.publish("t", b"v1-retry", msg_id="order-7")
    first.wait_stored(5)
    again.wait_stored(5)
    assert again.id == first.id
    prod.close()
    prod = make_node("prod", data_dir=str(tmp_path / "prod"))
    after_restart = prod.publish("t", b"v1-after-crash", msg_id="order-7")
    after_restart.wait_stored(5)
    assert after_restart.id == first.id
    assert prod.status()["outbox"] == 1
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    assert [m.payload for m in drain(sub, 1)] == [b"v1"]
    after_restart.wait_acked(10)
    assert sub.get(timeout=0.3) is None
    assert prod.stats()["duplicates_suppressed"] == 1


def test_a_msg_id_is_bounded_in_bytes_and_its_refusal_spares_the_loops_other_work(make_node):
    # 200 characters of three bytes each passed the limit of 256 characters; the store's
    # key of it did not fit LMDB's, and the loop's whole transaction failed with a raw
    # MDB_BAD_VALSIZE: the publishes stored beside it failed too.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    with pytest.raises(zmesh.ArgumentError, match="at most 256 bytes"):
        prod.publish("t", b"x", msg_id="\u5199" * 200)
    longest = prod.publish("t", b"y", msg_id="\u5199" * 85 + "x")  # (256 bytes)
    plain = prod.publish("t", b"z")
    longest.wait_stored(5)
    plain.wait_stored(5)
    assert "store_errors" not in prod.stats()


def test_every_receipt_of_one_msg_id_is_acked_whichever_is_asked_first(make_node):
    # Asking a duplicate's receipt after the original's took the original's place among
    # the receipts waiting: the original was never told it was acked.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipts = [prod.publish("t", b"v", msg_id="same") for _ in range(3)]
    for r in receipts:
        r.wait_stored(5)
        assert not r.acked  # (each asked in turn: each is watched)
    cons = make_node("cons", seeds=[prod.control_address])
    drain(cons.subscribe("t", group="g"), 1)
    for r in receipts:
        r.wait_acked(10)


def test_publish_many_and_ack_many(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipt = prod.publish_many(
        "t", [str(i).encode() for i in range(1000)], keys=[f"k{i % 7}" for i in range(1000)]
    )
    receipt.wait_stored(5)
    assert receipt.count == 1000 and len(receipt.ids) == 1000
    assert receipt.ids[-1].seq - receipt.ids[0].seq == 999
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = []
    while len(got) < 1000:
        msgs = sub.fetch(500, timeout=5)
        assert msgs
        sub.ack_many(msgs)
        got.extend(msgs)
    receipt.wait_acked(10)
    assert sorted(int(m.payload) for m in got) == list(range(1000))
    with pytest.raises(zmesh.MessageStateError):
        sub.ack_many(got[:1])
    with pytest.raises(zmesh.ArgumentError, match="keys"):
        prod.publish_many("t", [b"a", b"b"], keys=["x"])
    with pytest.raises(zmesh.ArgumentError, match="key of"):
        prod.publish_many("t", [b"a", b"b"], keys=["x", "k" * (MAX_KEY_CHARS + 1)])


def test_ack_many_refuses_a_message_twice_and_takes_any_order(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipt = prod.publish_many("t", [str(i).encode() for i in range(100)])
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = fetched(sub, 100)
    with pytest.raises(zmesh.MessageStateError, match="already acked"):
        sub.ack_many([got[0], got[1], got[0]])
    assert not any(m.settled for m in got)  # none of them taken
    sub.ack_many(got[:10][::-1])  # out of order
    sub.ack_many(got[10:50])  # in order, after the others
    got[60].nack(0.0)
    with pytest.raises(zmesh.MessageStateError, match="already nacked"):
        sub.ack_many(got[50:70])  # in order, one of them settled: none taken
    assert not any(m.settled for m in got[50:70] if m is not got[60])
    again = fetched(sub, 1)  # the nacked one, again
    assert again[0].id == got[60].id
    for msg in got[50:60] + got[61:] + again:
        msg.ack()
    receipt.wait_acked(10)
    assert cons.stats()["acked_local"] == 100


def test_ack_many_of_a_stretch_of_a_batch_in_its_order(make_node):
    """A list that is a stretch of one batch's messages in its order is acked as such
    (from its middle too), and refused whole when one of them was acked already."""
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipt = prod.publish_many("t", [str(i).encode() for i in range(100)])
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = fetched(sub, 100)
    sub.ack_many(got[40:70])
    assert [m.settled for m in got[39:71]] == [False] + [True] * 30 + [False]
    with pytest.raises(zmesh.MessageStateError, match="already acked"):
        sub.ack_many(got[30:50])
    assert not any(m.settled for m in got[30:40])
    sub.ack_many(got[:40])
    sub.ack_many(got[70:])
    receipt.wait_acked(10)
    assert cons.stats()["acked_local"] == 100


def test_ack_many_of_the_list_fetch_returned_across_batches_and_changed(make_node):
    """The list ``fetch`` returned, given back whole, is acked as the stretches of the
    batches it spans; changed after the fetch, it is taken for what it holds now."""
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", batch_size=25)
    wait_members(prod, "t", "g", 1)
    receipt = prod.publish_many("t", [str(i).encode() for i in range(150)])
    wait_until(lambda: sub._queued() == 150, what="150 messages queued")
    first = sub.fetch(60)
    assert len({id(m._origin) for m in first}) == 3  # 25 + 25 + 10
    sub.ack_many(first)
    assert all(m.settled for m in first)
    second = sub.fetch(60)  # 15 + 25 + 20
    kept = second[5]
    second[5] = second[4]  # changed in place: one message twice
    with pytest.raises(zmesh.MessageStateError, match="already acked"):
        sub.ack_many(second)
    assert not any(m.settled for m in second) and not kept.settled
    second[5] = kept
    left_out = second.pop(30)  # changed again: one fewer
    sub.ack_many(second)
    assert all(m.settled for m in second) and not left_out.settled
    with pytest.raises(zmesh.MessageStateError, match="already acked"):
        sub.ack_many(second)
    left_out.ack()
    sub.ack_many(fetched(sub, 30))
    receipt.wait_acked(10)
    assert [int(m.payload) for m in first + second] == [i for i in range(120) if i != 90]
    assert int(left_out.payload) == 90
    assert cons.stats()["acked_local"] == 150


def test_messages_are_made_as_taken_and_freed_when_dropped(make_node):
    """A delivered batch waits in the subscription as its columns: its messages are made
    as the application takes them (by get, fetch or iterating), and nothing else holds
    them, so one dropped is freed at once, with no cycle for the collector to find."""
    prod = make_node("prod", topics={"made": zmesh.TopicConfig(groups=("g",))})
    receipt = prod.publish_many("made", [str(i).encode() for i in range(100)])
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("made", group="g")

    def queued() -> int:
        [status] = cons.status()["subscriptions"]
        return status["queued"]

    wait_until(lambda: queued() == 100, what="the batch queued")

    def alive() -> list[int]:
        return sorted(
            int(o.payload)
            for o in gc.get_objects()
            if type(o) is zmesh.Message and o.topic == "made"
        )

    gc.disable()
    try:
        assert alive() == []
        first = sub.get(0)
        some = sub.fetch(39)
        assert alive() == list(range(40)) and queued() == 60
        first.ack()
        sub.ack_many(some)
        del first, some
        assert alive() == []
        for n, msg in enumerate(sub, 40):
            assert alive() == [n]
            msg.ack()
            if n == 99:
                break
        del msg
        assert alive() == [] and queued() == 0
    finally:
        gc.enable()
    receipt.wait_acked(10)


def _mapped_kb(path: str) -> int:
    """Resident KiB of this process's mapping of ``path`` (/proc/self/smaps)."""
    rss, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:
                inside = line.rstrip("\n").endswith(path)
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1])
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pages are released on Linux")
def test_a_large_backlog_does_not_stay_mapped_in_memory(make_node):
    """The store's file pages are let go of as records are written and read back: a backlog
    far larger than RELEASE_BYTES never stays resident, and every record reads back whole."""
    prod = make_node(
        "prod", map_size_bytes=256 << 20, topics={"t": zmesh.TopicConfig(groups=("g",))}
    )
    pages = prod._engine.store.pages
    n, size = 14_000, 4096  # 56 MiB of payloads
    receipts = [
        prod.publish_many(
            "t", [i.to_bytes(4, "big") * (size // 4) for i in range(start, start + 500)]
        )
        for start in range(0, n, 500)
    ]
    for r in receipts:
        r.wait_stored(30)
    assert os.path.getsize(pages.path) > 3 * RELEASE_BYTES
    assert pages.released >= 2
    assert _mapped_kb(pages.path) * 1024 < 2 * RELEASE_BYTES
    released = pages.released
    cons = make_node("cons", seeds=[prod.control_address])
    got = drain(cons.subscribe("t", group="g"), n, timeout=60)
    assert sorted(int.from_bytes(m.payload[:4], "big") for m in got) == list(range(n))
    assert all(m.payload == m.payload[:4] * (size // 4) for m in got)
    assert pages.released > released  # reading the backlog back released pages too
    assert _mapped_kb(pages.path) * 1024 < 2 * RELEASE_BYTES


def test_subscribe_takes_a_config_or_arguments_not_both(make_node):
    node = make_node("cons")
    cfg = zmesh.SubscriptionConfig(group="g", max_in_flight=10)
    # Each argument of subscribe defaults to what SubscriptionConfig does.
    defaults = inspect.signature(zmesh.Node.subscribe).parameters
    for name in ("mode", "max_in_flight", "batch_size", "concurrency"):
        assert defaults[name].default == getattr(zmesh.SubscriptionConfig(group="g"), name)
    with pytest.raises(zmesh.ArgumentError, match="config= or group=, not both"):
        node.subscribe("t", group="other", config=cfg)  # "other" was ignored
    with pytest.raises(zmesh.ArgumentError, match="config= or max_in_flight=, batch_size="):
        node.subscribe("t", config=cfg, max_in_flight=5, batch_size=7)
    sub = node.subscribe("t", "g", config=cfg)  # the same as the config's: no clash
    assert sub.group == "g" and sub.config.max_in_flight == 10


@pytest.mark.parametrize("bad", [math.nan, "1", True, [1]])
def test_a_timeout_that_is_not_a_number_is_refused_where_a_call_would_wait(make_node, bad):
    # NaN compares false with everything: get(timeout=nan) spun at 100 % CPU for good.
    node = make_node("n", topics={"t": zmesh.TopicConfig(groups=("g",))})
    sub = node.subscribe("t", group="g")
    waits = [
        lambda: sub.get(timeout=bad),
        lambda: sub.fetch(10, timeout=bad),
        lambda: node.publish("t", b"x").wait_stored(bad),
        lambda: node.publish("t", b"x").wait_acked(bad),
        lambda: node.publish("t", b"x", timeout=bad),
        lambda: node.publish_many("t", [b"x"], timeout=bad),
        lambda: node.transaction(timeout=bad),
    ]
    for wait in waits:
        with pytest.raises(zmesh.ArgumentError, match="must be a number of seconds or None"):
            wait()
    assert sub.get(timeout=-1) is None and sub.fetch(5, timeout=0) == []  # no wait at all
    msg = sub.get(timeout=10)  # (the publishes above that went through)
    assert msg is not None and msg.payload == b"x"


def test_a_payload_past_max_message_bytes_is_refused_alone_or_in_a_batch(make_node):
    node = make_node("prod", max_message_bytes=1000, topics={"t": zmesh.TopicConfig(groups=("g",))})
    with pytest.raises(zmesh.ArgumentError, match="1001 bytes exceeds max_message_bytes 1000"):
        node.publish("t", b"x" * 1001)
    # Together past the limit, each within it: taken.
    node.publish_many("t", [b"a" * 600, b"b" * 600]).wait_stored(5)
    for batch in ([b"a" * 10, b"b" * 1001], [b"a" * 10, "é" * 501]):  # (a str as UTF-8)
        with pytest.raises(zmesh.ArgumentError, match="exceeds max_message_bytes 1000"):
            node.publish_many("t", batch)
    node.publish_many("t", [b"c" * 1000, "é" * 500]).wait_stored(5)
    assert node.stats()["published"] == 4


def test_an_interrupt_inside_publish_leaves_the_node_working(make_node, monkeypatch):
    # A KeyboardInterrupt (a signal's handler runs between any two bytecodes) raised
    # while publish() held the allocation lock left it held: the next publish, close(),
    # and the IO thread waited for good.
    from zmesh._engine import submit as submit_module

    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    prod.publish("t", b"first", key="k").wait_stored(5)

    def interrupted(*_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(submit_module, "partition_for", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prod.publish("t", b"cut short", key="k")
    # A batch's sequences taken, then interrupted: their room was never given back (the
    # node counted them as waiting for its IO thread for good).
    with pytest.raises(KeyboardInterrupt):
        prod.publish_many("t", [b"a", b"b"], keys=["k", "k"])
    monkeypatch.undo()
    prod.publish("t", b"after", key="k").wait_stored(5)
    assert prod.status()["outbox"] == 2
    assert prod._engine.queue._submitted == prod._engine.queue._done


def _signal_points(code: types.CodeType, known: dict[types.CodeType, set[int]]) -> set[int]:
    """Where CPython 3.11 runs a signal's handler in ``code``: after each call returns
    (a builtin's, or a function's entry), and at each loop's jump back."""
    points = known.get(code)
    if points is None:
        points = known[code] = set()
        before = None
        for ins in dis.get_instructions(code):
            if before is not None and before.opname in ("CALL", "RESUME"):
                points.add(ins.offset)
            if ins.opname == "JUMP_BACKWARD":
                points.add(ins.offset)
            before = ins
    return points


def _interrupting(at: int, under: str, known: dict[types.CodeType, set[int]]) -> Any:
    """A trace function that raises KeyboardInterrupt at the ``at``-th point where a
    signal's handler could run (``_signal_points``) in code under the directory ``under``."""
    seen = 0

    def tracer(frame: types.FrameType, event: str, _arg: object) -> Any:
        nonlocal seen
        if event == "call":
            if not frame.f_code.co_filename.startswith(under):
                return None
            frame.f_trace_lines = False
            frame.f_trace_opcodes = True
        elif event == "opcode" and frame.f_lasti in _signal_points(frame.f_code, known):
            seen += 1
            if seen == at:
                raise KeyboardInterrupt
        return tracer

    return tracer


def _free(lock: Any) -> bool:
    """Whether another thread can take ``lock`` (within 5 s)."""
    took: list[bool] = []

    def take() -> None:
        took.append(lock.acquire(timeout=5))
        if took[0]:
            lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return took == [True]


def test_a_signal_at_any_point_of_a_publish_gives_its_room_back(make_node, monkeypatch):
    # A signal's handler (KeyboardInterrupt) runs where CPython checks for one: raised
    # at each such point of zmesh's code on publish()'s and publish_many()'s path in
    # turn, every publish is either queued (and stored) or its room is given back, never
    # kept counted as waiting for the IO thread (a batch's room so kept refused larger
    # batches for good), the allocation lock is let go of (a publish cut just after it
    # took it held it for good) and the IO thread is woken by the next publish.
    zmesh_dir = os.path.dirname(zmesh.__file__)
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    queue = prod._engine.queue
    known: dict[types.CodeType, set[int]] = {}
    calls = {
        "publish_many": lambda: prod.publish_many("t", [b"a", b"b"], keys=["k", "k"]),
        "publish with options": lambda: prod.publish("t", b"x", priority=1),
        "publish": lambda: prod.publish("t", b"x", key="k"),
        "publish, its room waited for": lambda: prod.publish("t", b"x"),
    }
    for name, call in calls.items():
        if name == "publish, its room waited for":  # (no room taken at once: _reserve's)
            monkeypatch.setattr(queue, "_refill", lambda: None)
            with queue._alloc:
                queue._credit = queue._credit_bytes = 0
        at = 0
        while True:
            at += 1
            tracer = _interrupting(at, zmesh_dir, known)
            sys.settrace(tracer)
            try:
                call()
                finished = True
            except KeyboardInterrupt:
                finished = False
            finally:
                sys.settrace(None)
            assert _free(queue._alloc), f"{name} kept its lock, cut at its point {at}"
            wait_until(  # (and no wake-up counted as sent that was not: later ones skipped)
                lambda: queue._submitted == queue._done and not queue._wake_pending,
                10,
                what=f"{name} interrupted at its point {at}: its room given back or stored",
            )
            if finished:
                break
        assert at > 10  # (every point of the path was tried)
    prod.publish_many("t", [b"y"] * 2000, timeout=5).wait_stored(10)  # (a full batch's room)


def test_a_node_restored_from_a_snapshot_does_not_reuse_its_later_lifes_ids(
    make_node, tmp_path, caplog
):
    # A snapshot put back after its node went on (the documented restore) resumed the
    # sequences from the snapshot: the messages it published next had the ids of those
    # its later life had published, which the consumers had acked, so they were dropped as
    # duplicates while their receipts said acked. Its incarnation was that later life's
    # too (or older, which its peers ignore).
    topics = {"t": zmesh.TopicConfig(groups=("g",))}
    data_dir = tmp_path / "p"
    prod = make_node("p", data_dir=str(data_dir), topics=topics)
    cons = make_node("c", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")

    def publish_and_take(node: zmesh.Node, tag: str) -> list[bytes]:
        receipts = [node.publish("t", f"{tag}{i}".encode()) for i in range(5)]
        got = []
        while len(got) < 5:
            batch = sub.fetch(5, timeout=10)
            assert batch, f"{tag}: {got} only"
            sub.ack_many(batch)
            got += [m.payload for m in batch]
        for receipt in receipts:
            receipt.wait_delivered(10)
        return got

    assert publish_and_take(prod, "a") == [b"a0", b"a1", b"a2", b"a3", b"a4"]
    prod.snapshot(tmp_path / "snap")
    life = prod.status()["node"]["incarnation"]
    assert publish_and_take(prod, "b") == [b"b0", b"b1", b"b2", b"b3", b"b4"]
    prod.close()
    shutil.rmtree(data_dir)
    shutil.copytree(tmp_path / "snap", data_dir)
    caplog.set_level(logging.WARNING, logger="zmesh._store.store")
    prod = make_node("p", data_dir=str(data_dir), topics=topics)
    assert "holds an earlier state than its node left" in caplog.text
    assert prod.status()["node"]["incarnation"] > life + 1
    assert publish_and_take(prod, "c") == [b"c0", b"c1", b"c2", b"c3", b"c4"]
    assert cons.stats().get("duplicates_dropped", 0) == 0
    # A plain restart is no restore: its sequences go on as they were.
    seq = prod.publish("t", b"d").id.seq
    prod.close()
    prod = make_node("p", data_dir=str(data_dir), topics=topics)
    assert prod.publish("t", b"e").id.seq == seq + 1
