"""Groups have a lifecycle: an operator deletes one (every producer that owes it drops
its lanes, counted), one without members expires, and subscriptions without a group are
ephemeral (producers keep nothing for them)."""

from __future__ import annotations

import threading

import zmesh
from tests.conftest import wait_members, wait_until
from tests.integration.test_delivery import drain


def _lanes(node: zmesh.Node, topic: str = "t") -> list[str]:
    return sorted(
        ln["lane"] for ln in node.status()["lanes"] if ln["topic"] == topic and ln["lane"]
    )


def test_deleting_a_group_drops_its_lanes_at_every_producer_while_they_publish(make_node):
    p1 = make_node("p1")
    p2 = make_node("p2", seeds=[p1.control_address])
    cons = make_node("cons", seeds=[p1.control_address, p2.control_address])
    sub = cons.subscribe("t", group="ops")
    keep = cons.subscribe("t", group="keep")
    for p in (p1, p2):
        wait_members(p, "t", "ops", 1)
        wait_members(p, "t", "keep", 1)
    sub.close()  # "ops" is gone for good: its backlog grows at both producers
    for p in (p1, p2):
        wait_members(p, "t", "ops", 0)
    early = [p.publish("t", b"early") for p in (p1, p2)]
    for r in early:  # (stored before the deletion: owed to "ops" too)
        r.wait_stored(timeout=10)
    stop = threading.Event()
    receipts: list[zmesh.Receipt] = []

    def publish() -> None:
        for i in range(50_000):  # (bounded: until the test says stop, a few seconds)
            if stop.is_set():
                return
            receipts.append(p1.publish("t", b"%d" % i))

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_until(lambda: len(receipts) > 200, what="publishes under way")
        result = p2.delete_group("t", "ops")
        assert result["peers_told"] == 2  # p1 and cons
        wait_until(lambda: _lanes(p1) == ["keep"], what="ops retired at p1")
        after = len(receipts)
        wait_until(lambda: len(receipts) > after + 200, what="publishes after it")
    finally:
        stop.set()
        publisher.join(30)
    for p in (p1, p2):
        wait_until(lambda p=p: _lanes(p) == ["keep"], what=f"ops retired at {p.name}")
        assert p.stats()["dropped_group_deleted"] >= 1
        assert p.groups("t")[0]["group"] == "keep"
    drain(keep, 2 + len(receipts), timeout=60)
    for r in [*early, *receipts]:
        r.wait_acked(timeout=10)
    assert all(r.outcomes.get("keep") == "acked" for r in [*early, *receipts])
    assert {r.outcomes.get("ops") for r in early} == {"group_deleted"}
    # Published after the deletion reached p1: owed to "keep" alone.
    assert any("ops" not in r.outcomes for r in receipts)
    assert p1.status()["outbox"] == 0 and p2.status()["outbox"] == 0


def test_a_deleted_group_with_live_members_starts_again_empty(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    old = prod.publish_many("t", [b"1", b"2", b"3"])
    old.wait_stored(timeout=5)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=1, batch_size=1)
    wait_members(prod, "t", "g", 1)
    prod.delete_group("t", "g")
    wait_members(prod, "t", "g", 1)  # a new lane, its member at once
    new = prod.publish("t", b"after")
    seen: list[zmesh.Message] = []  # (the old lane's first message may be in flight)
    wait_until(
        lambda: (
            seen.extend(sub.fetch(10, timeout=0.05)) or any(m.payload == b"after" for m in seen)
        ),
        what="the new message",
    )
    sub.ack_many(seen)
    new.wait_delivered(timeout=10)
    old.wait_acked(timeout=10)
    assert old.outcomes == {"g": "group_deleted"}


def test_a_group_without_members_expires(make_node):
    topics = {
        "t": zmesh.TopicConfig(group_inactive_expiry_s=0.5),
        "declared": zmesh.TopicConfig(groups=("d",), group_inactive_expiry_s=0.5),
    }
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="gone")
    tail = cons.subscribe("t", group="tail", mode="broadcast")
    wait_members(prod, "t", "gone", 1)
    sub.close()
    tail.close()
    receipts = [prod.publish("t", b"%d" % i) for i in range(10)]
    kept = prod.publish("declared", b"x")
    wait_until(lambda: _lanes(prod) == [], timeout=15, what="the idle lanes retired")
    for r in receipts:
        r.wait_acked(timeout=10)
        assert set(r.outcomes.values()) == {"group_deleted"}
    assert prod.stats()["groups_expired"] == 2
    assert prod.stats()["dropped_group_deleted"] == 20
    assert _lanes(prod, "declared") == ["d"]  # declared groups never expire
    assert not kept.acked


def test_an_ephemeral_subscriber_that_does_not_read_holds_a_bounded_queue(make_node):
    # It once queued all it was sent: 3,000 messages of 256 KiB took 760 MB.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("tail", seeds=[prod.control_address])
    sub = cons.subscribe("t", max_in_flight=50)
    wait_until(
        lambda: any(
            s[2] == "ephemeral"
            for p in prod.peers()
            if p["id"] == cons.id
            for s in p["subscriptions"]
        ),
        what="the producer knows the subscriber",
    )
    payload = b"x" * (256 << 10)
    for _ in range(10):  # 1,000 messages, 250 MB, never read
        prod.publish_many("t", [payload] * 100).wait_stored(timeout=30)
    wait_until(
        lambda: (
            cons.stats().get("received_ephemeral", 0) + prod.stats().get("ephemeral_dropped", 0)
            >= 1000
        ),
        timeout=30,
        what="every message received or dropped",
    )
    queued = sub._queued()
    # (a batch, whatever its size, when none is queued; then 16 MiB of 256 KiB at most)
    assert 0 < queued <= 100 + 64
    assert cons.stats()["ephemeral_dropped"] >= 1000 - queued - prod.stats().get(
        "ephemeral_dropped", 0
    )
    got = [sub.get(timeout=5) for _ in range(queued)]  # what it holds is delivered
    assert all(m is not None and m.payload == payload for m in got)


def test_ephemeral_subscriptions_leave_nothing_at_the_producer(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    prod.publish("t", b"before").wait_stored(timeout=5)
    lanes = _lanes(prod)
    for i in range(20):
        cons = make_node(f"tail-{i}", seeds=[prod.control_address])
        sub = cons.subscribe("t")
        assert sub.group is None and sub.mode == "ephemeral"
        wait_until(
            lambda cons=cons: any(
                s[2] == "ephemeral"
                for p in prod.peers()
                if p["id"] == cons.id
                for s in p["subscriptions"]
            ),
            what="the producer knows the subscriber",
        )
        r = prod.publish("t", b"live %d" % i)
        msg = sub.get(timeout=5)
        assert msg is not None and msg.payload == b"live %d" % i and msg.group is None
        msg.ack()  # (does nothing: nothing to settle)
        r.wait_stored(timeout=5)
        assert not r.acked  # owed to "g" alone, which has no member
        cons.close()
    assert _lanes(prod) == lanes == ["g"]
    assert prod.status()["outbox"] == 21
    assert prod.stats()["sent_ephemeral"] == 20
