"""Delivery between real nodes on loopback: groups, keys, broadcast, backlog."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter, defaultdict

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.waiting import pause
from zmesh._engine.routing import partition_for
from zmesh._protocol.codec import (
    LARGE_PAYLOAD_BYTES,
    MAX_BATCH_ITEMS,
    MAX_HEADERS_BYTES,
    MAX_KEY_CHARS,
    MAX_SUBSCRIPTION_BYTES,
    MAX_SUBSCRIPTIONS,
    announced_bytes,
)
from zmesh.node import DEFAULT_PARTITIONS


def drain(sub: zmesh.Subscription, count: int, timeout: float = 10.0) -> list[zmesh.Message]:
    """Receive and ack ``count`` messages (fails the test if they do not come)."""
    got: list[zmesh.Message] = []

    def more() -> bool:
        for msg in sub.fetch(1000, timeout=0.05):
            msg.ack()
            got.append(msg)
        return len(got) >= count

    wait_until(more, timeout, what=f"{count} messages on {sub.topic}/{sub.group}")
    return got


def test_seed_discovery_publish_and_ack(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("orders", group="billing")
    wait_members(prod, "orders", "billing", 1)
    receipts = [prod.publish("orders", f"order-{i}".encode(), key=f"k{i % 5}") for i in range(500)]
    got = drain(sub, 500)
    assert sorted(m.payload for m in got) == sorted(f"order-{i}".encode() for i in range(500))
    for r in receipts:
        r.wait_acked(timeout=10)
    stats = prod.stats()
    assert (stats["sent"], stats["acked"]) == (500, 500)  # each sent once, none again
    wait_until(lambda: prod.status()["outbox"] == 0, what="empty outbox")
    msg = got[0]
    assert msg.topic == "orders" and msg.group == "billing" and msg.attempt == 1
    assert msg.id.producer == prod.id


def test_groups_far_apart_get_every_message_when_kept_records_are_dropped(make_node):
    """Records are kept decoded from staging until every lane sent them, within a bound;
    dropping the oldest (here after a few messages) must never lose one a lane was about
    to send: every message reaches both groups, none is settled as lost."""
    prod = make_node("prod")
    prod._engine.outbox.records.decoded.limit = 3 * 700
    cons = make_node("cons", seeds=[prod.control_address])
    fast = cons.subscribe("t", group="fast", max_in_flight=5000)  # takes them all at once
    slow = cons.subscribe("t", group="slow", max_in_flight=10)
    wait_members(prod, "t", "fast", 1)
    wait_members(prod, "t", "slow", 1)
    n = 3000
    prod.publish_many("t", [str(i).encode() for i in range(n)])
    assert sorted(int(m.payload) for m in drain(fast, n)) == list(range(n))
    assert sorted(int(m.payload) for m in drain(slow, n, timeout=30)) == list(range(n))
    wait_until(lambda: prod.status()["outbox"] == 0, what="empty outbox")
    assert prod.stats().get("lost_records", 0) == 0


def test_small_and_large_payloads_arrive_intact(make_node):
    # Small payloads travel inside the batch's header frame, large ones as frames of
    # their own; one batch here holds both kinds, with headers, keys and indexes.
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("blobs", group="g")
    wait_members(prod, "blobs", "g", 1)
    sizes = [
        0,
        1,
        100,
        LARGE_PAYLOAD_BYTES - 1,
        LARGE_PAYLOAD_BYTES,
        3 * LARGE_PAYLOAD_BYTES,
        7,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        40_000,
        5,
    ]
    sent = {f"m{i}": bytes([i]) * size for i, size in enumerate(sizes)}
    receipt = prod.publish_many(
        "blobs", list(sent.values()), keys=list(sent), headers={"unit": "B"}
    )
    got = drain(sub, len(sent))
    assert {m.key: m.payload for m in got} == sent
    assert all(m.headers == {"unit": "B"} and m.id.producer == prod.id for m in got)
    assert sorted(m.id for m in got) == receipt.ids
    assert all(type(m.id) is zmesh.MessageId for m in got)
    receipt.wait_acked(timeout=10)


def test_long_keys_and_large_headers_travel_in_batches_a_consumer_can_decode(make_node):
    # Published before the consumer comes, so they go out as full batches: 60 messages of
    # the largest headers and keys publish() takes would make one batch header of 4 MiB,
    # past what a consumer decodes; the producer sends smaller batches instead.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    headers = {"h": "x" * (MAX_HEADERS_BYTES - 64)}
    key = "é" * MAX_KEY_CHARS  # two bytes each in UTF-8
    receipts = [
        prod.publish("t", b"%d" % i, key=key if i % 2 else None, headers=headers) for i in range(60)
    ]
    for r in receipts:
        r.wait_stored(10)
    cons = make_node("cons", seeds=[prod.control_address])
    got = drain(cons.subscribe("t", group="g"), 60, timeout=20)
    assert sorted(int(m.payload) for m in got) == list(range(60))
    assert all(m.headers == headers and m.key == (key if int(m.payload) % 2 else None) for m in got)
    assert cons.stats().get("decode_errors", 0) == 0


def test_the_largest_batches_and_credit_a_subscription_takes_work(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    prod.publish_many("t", [b"%d" % i for i in range(20_000)]).wait_stored(20)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", batch_size=MAX_BATCH_ITEMS, max_in_flight=20_000)
    got = drain(sub, 20_000, timeout=60)
    assert sorted(int(m.payload) for m in got) == list(range(20_000))
    assert cons.stats().get("decode_errors", 0) == 0 == prod.stats().get("decode_errors", 0)


def test_as_many_subscriptions_as_a_hello_announces_and_no_more(make_node):
    # Past what its hello may hold, a node's hellos were dropped by every peer: it went
    # silent to the mesh (taken for dead) without an error anywhere.
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    subs = [cons.subscribe(f"t{i}", group="g") for i in range(MAX_SUBSCRIPTIONS)]
    cons.subscribe("t7", group="g").close()  # the same topic and group again: no more room
    with pytest.raises(zmesh.ArgumentError, match=f"at most {MAX_SUBSCRIPTIONS}"):
        cons.subscribe("one-more", group="g")
    wait_members(prod, f"t{MAX_SUBSCRIPTIONS - 1}", "g", 1)
    r = prod.publish(f"t{MAX_SUBSCRIPTIONS - 1}", b"x")
    assert drain(subs[-1], 1)[0].id == r.id
    subs[0].close()  # makes room
    cons.subscribe("one-more", group="g")
    assert [p["alive"] for p in prod.peers()] == [True]

    # Long names: the bytes bound them first.
    other = make_node("other")
    topic = "x" * 120
    fit = MAX_SUBSCRIPTION_BYTES // announced_bytes(topic + "-0000", "g")
    for i in range(fit):
        other.subscribe(f"{topic}-{i:04d}", group="g")
    with pytest.raises(zmesh.ArgumentError, match=f"{MAX_SUBSCRIPTION_BYTES} bytes"):
        other.subscribe(f"{topic}-{fit:04d}", group="g")


def test_timers_of_one_lane_among_hundreds_fire(make_node):
    # The loop visits only lanes with work (timers, ready messages): with hundreds of
    # idle lanes it went through every one of them twice per iteration.
    prod = make_node("prod", topics={"slow": zmesh.TopicConfig(ack_timeout_s=0.5)})
    cons = make_node("cons", seeds=[prod.control_address])
    idle = [cons.subscribe(f"idle{i}", group="g") for i in range(300)]
    slow, later = cons.subscribe("slow", group="g"), cons.subscribe("later", group="g")
    wait_members(prod, "idle299", "g", 1)
    wait_members(prod, "later", "g", 1)
    held = prod.publish("slow", b"held past its ack timeout")
    first = slow.get(timeout=5)
    assert first is not None and first.attempt == 1
    wait_until(lambda: prod.stats().get("ack_timeouts") == 1, what="the ack timeout")
    r = prod.publish("later", b"nacked")
    msg = later.get(timeout=5)
    assert msg is not None and msg.id == r.id
    msg.nack(delay=0.3)  # a delayed redelivery: a timer of the lane
    again = later.get(timeout=5)
    assert again is not None and again.id == r.id and again.attempt == 2
    again.ack()
    first.ack()
    held.wait_acked(5)
    r.wait_acked(5)
    assert all(sub.get(timeout=0) is None for sub in idle)


def test_shared_group_balances_and_keeps_keys_on_one_member(make_node):
    prod = make_node("prod", topics={"m": zmesh.TopicConfig(partitions=16)})
    a = make_node("a", seeds=[prod.control_address])
    b = make_node("b", seeds=[prod.control_address])
    sa = a.subscribe("m", group="g")
    sb = b.subscribe("m", group="g")
    wait_members(prod, "m", "g", 2)
    n = 2000
    for i in range(n):
        prod.publish("m", str(i).encode(), key=f"key-{i % 40}")
    got_a: list[zmesh.Message] = []
    got_b: list[zmesh.Message] = []

    def both() -> bool:
        for sub, got in ((sa, got_a), (sb, got_b)):
            for msg in sub.fetch(1000, timeout=0.02):
                msg.ack()
                got.append(msg)
        return len(got_a) + len(got_b) >= n

    wait_until(both, 15, what="all messages across the group")
    assert len(got_a) + len(got_b) == n
    assert got_a and got_b, "both members should receive a share"
    keys_a = {m.key for m in got_a}
    keys_b = {m.key for m in got_b}
    assert not keys_a & keys_b, "a key must stay on one member"
    # Within a key, messages arrive in publish order.
    per_key: dict[str, list[int]] = defaultdict(list)
    for m in got_a + got_b:
        per_key[m.key].append(int(m.payload))
    for key, seq in per_key.items():
        assert seq == sorted(seq), f"key {key} out of order"


def test_broadcast_gives_each_member_a_copy(make_node):
    prod = make_node("prod")
    members = [make_node(f"c{i}", seeds=[prod.control_address]) for i in range(3)]
    subs = [m.subscribe("news", group="screens", mode="broadcast") for m in members]
    for m in members:
        wait_members(prod, "news", f"screens/{m.id}", 1)
    for i in range(200):
        prod.publish("news", str(i).encode())
    for sub in subs:
        got = drain(sub, 200)
        assert sorted(int(m.payload) for m in got) == list(range(200))


def test_two_groups_each_get_everything(make_node):
    prod = make_node("prod")
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    s1 = c1.subscribe("t", group="one")
    s2 = c2.subscribe("t", group="two")
    wait_members(prod, "t", "one", 1)
    wait_members(prod, "t", "two", 1)
    rs = [prod.publish("t", str(i).encode()) for i in range(300)]
    for sub in (s1, s2):
        assert sorted(int(m.payload) for m in drain(sub, 300)) == list(range(300))
    for r in rs:
        r.wait_acked(10)


def test_offline_group_gets_its_backlog(make_node, tmp_path):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("jobs", group="workers")
    wait_members(prod, "jobs", "workers", 1)
    r = prod.publish("jobs", b"first")
    assert [m.payload for m in drain(sub, 1)] == [b"first"]
    r.wait_acked(10)
    cons.close()
    wait_members(prod, "jobs", "workers", 0)
    rs = [prod.publish("jobs", f"late-{i}".encode()) for i in range(100)]
    for r in rs:
        r.wait_stored(5)
    assert not any(r.acked for r in rs)
    back = make_node("cons2", data_dir=str(tmp_path / "cons"), seeds=[prod.control_address])
    sub2 = back.subscribe("jobs", group="workers")
    got = drain(sub2, 100)
    assert sorted(m.payload for m in got) == sorted(f"late-{i}".encode() for i in range(100))
    for r in rs:
        r.wait_acked(10)


def test_messages_published_before_any_group_is_known_are_kept(make_node):
    prod = make_node("prod")
    rs = [prod.publish("early", str(i).encode()) for i in range(50)]
    for r in rs:
        r.wait_stored(5)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("early", group="late-joiners")
    got = drain(sub, 50)
    assert sorted(int(m.payload) for m in got) == list(range(50))
    # The lane that held them until a group was known is gone once claimed (a topic per
    # device, first published before its groups said hello, kept one for good).
    wait_until(
        lambda: (
            [(ln["topic"], ln["lane"]) for ln in prod.status()["lanes"]]
            == [("early", "late-joiners")]
        ),
        what="the unclaimed lane gone",
    )
    receipt = prod.publish("early", b"later")
    assert drain(sub, 1)[0].payload == b"later"
    receipt.wait_acked(timeout=10)


def test_a_message_not_settled_within_its_ack_timeout_reaches_the_application_again(make_node):
    prod = make_node(
        "prod", topics={"w": zmesh.TopicConfig(ack_timeout_s=0.3, retry_backoff_s=0.0)}
    )
    a = make_node("a", seeds=[prod.control_address])
    sa = a.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    r = prod.publish("w", b"job")
    first = sa.get(timeout=5)
    assert first is not None and first.attempt == 1
    # Taken and never settled (a forgotten ack): past the ack timeout the producer sends
    # it again and the application gets it again, to the same member, one attempt more.
    again = sa.get(timeout=5)
    assert again is not None and again.id == first.id and again.attempt == 2
    assert prod.stats().get("ack_timeouts", 0) >= 1
    assert a.stats()["redelivered_lease_expired"] >= 1
    first.ack()  # (the first copy's late ack settles it)
    r.wait_delivered(5)
    with pytest.raises(zmesh.MessageStateError):
        first.ack()


def test_the_unsettled_messages_of_a_partly_acked_batch_come_again_after_the_timeout(make_node):
    """Messages of one batch acked in order, one acked out of order, the rest held past
    the ack timeout: the producer resends only the unacked ones, and the application gets
    each of those again, once per resend, with its attempt."""
    prod = make_node(
        "prod", topics={"w": zmesh.TopicConfig(ack_timeout_s=0.5, retry_backoff_s=0.0)}
    )
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    receipt = prod.publish_many("w", [str(i).encode() for i in range(10)])
    got = fetched(sub, 10)
    assert len({id(m._origin) for m in got}) == 1  # one batch
    for msg in got[:4] + [got[6]]:
        msg.ack()
    again = fetched(sub, 5)
    assert sorted(int(m.payload) for m in again) == [4, 5, 7, 8, 9]
    assert {m.attempt for m in again} == {2}
    sub.ack_many(again)
    receipt.wait_delivered(10)
    assert cons.stats()["acked_local"] == 10


def test_a_handler_that_says_it_is_in_progress_keeps_its_message(make_node):
    prod = make_node(
        "prod", topics={"w": zmesh.TopicConfig(ack_timeout_s=0.5, retry_backoff_s=0.0)}
    )
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    r = prod.publish("w", b"long job")
    msg = sub.get(timeout=5)
    assert msg is not None
    # Working for four ack timeouts, saying so twice per timeout.
    for _ in range(8):
        assert sub.get(timeout=0.25) is None
        msg.in_progress()
    assert prod.stats().get("ack_timeouts", 0) == 0
    assert prod.stats()["lease_extended"] >= 7
    msg.ack()
    r.wait_delivered(5)
    assert cons.stats().get("redelivered_lease_expired", 0) == 0


def test_closing_a_subscription_gives_its_unsettled_messages_to_another_member(make_node):
    prod = make_node("prod")
    a = make_node("a", seeds=[prod.control_address])
    b = make_node("b", seeds=[prod.control_address])
    sa = a.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    r = prod.publish("w", b"job")
    first = sa.get(timeout=5)
    assert first is not None  # taken, never settled
    sb = b.subscribe("w", group="g")
    wait_members(prod, "w", "g", 2)
    sa.close()  # at once, not after the 30 s ack timeout
    again = sb.get(timeout=5)
    assert again is not None and again.id == first.id and again.attempt == 2
    again.ack()
    r.wait_delivered(5)
    with pytest.raises(zmesh.MessageStateError, match="released"):
        first.ack()


def test_a_message_taken_and_not_settled_comes_back_across_close_and_subscribe(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    r = prod.publish("w", b"job")
    first = sub.get(timeout=5)
    assert first is not None
    sub.close()
    again = cons.subscribe("w", group="g").get(timeout=5)
    assert again is not None and again.id == first.id and again.attempt == 2
    again.ack()
    r.wait_delivered(5)


def test_acks_of_one_batch_from_several_threads_all_reach_the_producer(make_node):
    """A batch's acks are collected on its ``Origin`` and queued once per batch: acks
    made on four threads at once, interleaved with the IO thread taking them, each reach
    the producer exactly once."""
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    receipt = prod.publish_many("w", [str(i).encode() for i in range(1000)])
    got = fetched(sub, 1000)
    threads = [
        threading.Thread(target=lambda part=got[k::4]: [m.ack() for m in part]) for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    receipt.wait_acked(10)
    assert cons.stats()["acked_local"] == 1000
    assert sorted(int(m.payload) for m in got) == list(range(1000))


def test_an_ack_after_close_says_the_message_was_released(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    prod.publish_many("w", [b"a", b"b"])
    got = fetched(sub, 2)
    cons.close()
    for msg in got:  # (closing the node closed its subscription, which released them)
        with pytest.raises(zmesh.MessageStateError, match="released when its subscription"):
            msg.ack()


def test_redelivery_after_consumer_restart_is_attempt_two(make_node, tmp_path):
    prod = make_node("prod")
    a = make_node("a", seeds=[prod.control_address])
    sa = a.subscribe("w", group="g")
    wait_members(prod, "w", "g", 1)
    r = prod.publish("w", b"job")
    first = sa.get(timeout=5)
    assert first is not None and first.attempt == 1
    a.close()  # unsettled: released back to the producer
    b = make_node("a2", data_dir=str(tmp_path / "a"), seeds=[prod.control_address])
    again = b.subscribe("w", group="g").get(timeout=10)
    assert again is not None and again.id == first.id and again.attempt == 2
    again.ack()
    r.wait_acked(5)


def test_nack_redelivers_and_handler_form_acks(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    seen: Counter[bytes] = Counter()

    def handler(msg: zmesh.Message) -> None:
        seen[msg.payload] += 1
        if msg.payload == b"flaky" and msg.attempt == 1:
            raise RuntimeError("first try fails")
        if msg.payload == b"exits" and msg.attempt == 1:
            sys.exit(3)  # (a BaseException: it ended the only worker, and the handling)

    sub = cons.subscribe("h", group="g", handler=handler)
    wait_members(prod, "h", "g", 1)
    prod.topic("h", retry_backoff_s=0.05)
    rs = [prod.publish("h", p) for p in (b"ok", b"flaky", b"exits", b"after")]
    for r in rs:
        r.wait_acked(10)
    assert seen == {b"ok": 1, b"flaky": 2, b"exits": 2, b"after": 1}
    assert sub.handler_errors == 2


def test_handler_threads_share_a_batch_and_each_message_is_handled_once(make_node):
    """Four handler threads take from the same delivered batches at once (each batch's
    messages are made as they are taken): every message is handled by one of them, once,
    and acked."""
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    seen: Counter[int] = Counter()
    threads: set[str] = set()
    lock = threading.Lock()

    def handler(msg: zmesh.Message) -> None:
        with lock:
            seen[int(msg.payload)] += 1
            threads.add(threading.current_thread().name)
        pause(0.0001)  # (a handler's work: the other threads take meanwhile)

    cons.subscribe("c", group="g", handler=handler, concurrency=4)
    wait_members(prod, "c", "g", 1)
    last = None
    for start in range(0, 4000, 1000):
        last = prod.publish_many("c", [str(i).encode() for i in range(start, start + 1000)])
    assert last is not None
    last.wait_acked(60)
    wait_until(lambda: prod.status()["outbox"] == 0, what="every message acked")
    assert seen == Counter(range(4000))
    assert len(threads) == 4


def test_two_meshes_on_one_host_stay_apart(make_node, tmp_path):
    a = make_node("a", mesh="mesh-one")
    b = make_node("b", mesh="mesh-two", seeds=[a.control_address])
    wait_until(lambda: a.stats().get("foreign_mesh_hellos", 0) > 0, what="a foreign hello")
    assert a.peers() == [] and b.peers() == []


@pytest.mark.parametrize("restart_consumer", [False, True])
def test_a_redelivered_message_acked_before_is_dropped_by_the_dedupe_window(
    make_node, tmp_path, restart_consumer
):
    """The ack reached the consumer's dedupe window but the producer never settled it: a
    producer restored from a snapshot taken while the message was in flight sends it
    again, and the consumer (also after its own restart) acks it without delivering it."""
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    r = prod.publish("t", b"once")
    msg = sub.get(timeout=5)
    assert msg is not None
    prod.snapshot(str(tmp_path / "restored"))  # it is in flight here
    later = prod.publish("t", b"after")  # never acked before the snapshot: delivered
    msg.ack()
    r.wait_acked(5)
    second = sub.get(timeout=5)
    assert second is not None and second.payload == b"after"
    second.ack()
    later.wait_acked(5)
    prod.close()
    if restart_consumer:
        cons.close()
        cons = make_node("cons2", data_dir=str(tmp_path / "cons"))
        sub = cons.subscribe("t", group="g")
    restored = make_node(
        "restored", data_dir=str(tmp_path / "restored"), seeds=[cons.control_address]
    )
    wait_until(lambda: cons.stats().get("duplicates_dropped", 0) == 1, what="a dropped resend")
    wait_until(lambda: restored.status()["outbox"] == 0, what="the resend acked")
    assert sub.get(timeout=0.3) is None


def test_a_new_message_in_a_batch_with_a_resend_keeps_its_own_fields(make_node, tmp_path):
    """A batch holding a message the consumer acked before (both nodes closed before the
    ack reached the producer) and a new one: the resend is acked again, the new message
    is delivered with its own key, headers, attempt, partition, index and time."""
    prod = make_node("prod", data_dir=str(tmp_path / "prod"))
    cons = make_node("cons", data_dir=str(tmp_path / "cons"), seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"once", headers={"h": "once"})
    msg = sub.get(timeout=5)
    assert msg is not None and msg.headers == {"h": "once"} and msg.index == 0
    prod.close()
    msg.ack()  # in the consumer's dedupe window; the producer never hears of it
    wait_until(lambda: cons.stats().get("acked_local", 0) == 1, what="the ack committed")
    cons.close()
    prod = make_node("prod2", data_dir=str(tmp_path / "prod"))
    before = time.time()
    receipt = prod.publish("t", b"new", key="k", headers={"h": "v"})
    cons = make_node("cons2", data_dir=str(tmp_path / "cons"), seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    new = sub.get(timeout=10)
    assert new is not None and new.payload == b"new" and new.key == "k"
    assert new.headers == {"h": "v"} and new.attempt == 1
    assert new.partition == partition_for("k", DEFAULT_PARTITIONS, new.id.seq)
    assert new.index == (1 if new.partition == msg.partition else 0)  # (per partition)
    assert before <= new.published_at <= time.time()
    new.ack()
    receipt.wait_acked(5)
    wait_until(lambda: prod.status()["outbox"] == 0, what="the resend acked")
    assert cons.stats().get("duplicates_dropped") == 1
    assert sub.get(timeout=0.3) is None


def test_a_consumer_forgets_the_window_of_producers_gone_for_good(make_node, tmp_path):
    """Workers that each run once, with a data dir (so a node id) of their own, leave
    nothing in a long-lived consumer's dedupe window once silent for dedupe_window_s
    (tests/unit/test_consumer.py: one that keeps publishing keeps its part)."""
    from zmesh._store.store import Store

    cons = make_node("cons", dedupe_window_s=1.0)
    sub = cons.subscribe("jobs", group="g")
    for i in range(3):
        worker = make_node(f"run{i}", seeds=[cons.control_address])
        wait_members(worker, "jobs", "g", 1)
        receipts = [worker.publish("jobs", f"{i}-{n}".encode()) for n in range(20)]
        drain(sub, 20)
        for r in receipts:
            r.wait_acked(timeout=10)
        worker.close()
    wait_until(lambda: cons.stats().get("producers_forgotten") == 3, what="3 producers forgotten")
    cons.close()
    store = Store(str(tmp_path / "cons"), 1 << 24)
    try:
        assert store.window_state() == ({}, {})
    finally:
        store.close()


def test_ack_many_takes_any_iterable_of_this_nodes_messages_and_refuses_the_rest(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    other = make_node("other", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    elsewhere = other.subscribe("u", group="h")
    wait_members(prod, "t", "g", 1)
    wait_members(prod, "u", "h", 1)
    prod.publish_many("t", [b"%d" % i for i in range(4)])
    prod.publish("u", b"there")
    msgs = sorted(fetched(sub, 4), key=lambda m: m.payload)
    msgs[1].nack(0)
    with pytest.raises(zmesh.MessageStateError, match="already nacked"):
        sub.ack_many(m for m in msgs[:2])  # (a generator is checked like a list)
    assert not msgs[0].settled
    [theirs] = fetched(elsewhere, 1)
    with pytest.raises(zmesh.ArgumentError, match="not received by this subscription's node"):
        sub.ack_many([msgs[0], theirs])
    with pytest.raises(zmesh.ArgumentError, match="takes messages, got a NoneType"):
        sub.ack_many([None])
    sub.ack_many(m for m in [msgs[0], msgs[2], msgs[3]])
    theirs.ack()
    wait_until(lambda: prod.status()["outbox"] == 1, what="all but the nacked one acked")


def test_a_fail_reason_utf8_cannot_carry_is_kept_as_its_escape(make_node):
    # A lone surrogate (os.fsdecode of a bad file name) could not be packed: the
    # consumer's IO thread stopped on it.
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"x")
    [msg] = fetched(sub, 1)
    msg.fail(b"bad \xff.csv".decode("utf-8", "surrogateescape"))
    letters = wait_until(lambda: prod.dead_letters("t", "g"), what="the dead letter")
    assert letters[0].reason == "bad \\udcff.csv"
    prod.publish("t", b"after")  # (its IO thread goes on)
    assert [m.payload for m in fetched(sub, 1)] == [b"after"]
