"""Expiry (ttl) and scheduled delivery (deliver_at / delay), across restarts."""

from __future__ import annotations

import time

import pytest

import zmesh
from tests.conftest import wait_members, wait_until
from tests.integration.test_delivery import drain


def test_expired_messages_are_never_delivered_and_are_counted(make_node, tmp_path):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    short = [prod.publish("t", b"short", ttl=0.3) for _ in range(5)]
    long = prod.publish("t", b"long", ttl=60)
    for r in short:
        r.wait_stored(5)
    prod.close()
    prod = make_node("prod", data_dir=str(tmp_path / "prod"))
    # Restarted after the short ttl ran out: they expire without any consumer.
    wait_until(lambda: prod.stats().get("expired", 0) == 5, what="5 expired")
    assert prod.status()["outbox"] == 1
    [lane] = [ln for ln in prod.status()["lanes"] if ln["lane"] == "g"]
    assert lane["expired"] == 5
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    assert [m.payload for m in drain(sub, 1)] == [b"long"]
    assert sub.get(timeout=0.3) is None
    assert long.id.seq > max(r.id.seq for r in short)


def test_topic_ttl_is_the_default(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(ttl_s=0.2, groups=("g",))})
    prod.publish("t", b"x").wait_stored(5)
    wait_until(lambda: prod.stats().get("expired", 0) == 1, what="expiry by topic ttl")


def test_scheduled_message_waits_for_its_time_even_across_restart(make_node, tmp_path):
    # The schedule survives the restart: the message is received at its time, not before
    # (the time each message is received is checked against it). That shows something
    # only if the restarted producer reaches the consumer before the time comes (a plain
    # message published with it arrives first); when a loaded machine makes the restart
    # slower than that, the test is run again with twice the time the restart took.
    lead = 3.0
    tries: list[str] = []
    for attempt in range(3):
        name = f"prod{attempt}"
        prod = make_node(name, topics={"t": zmesh.TopicConfig(groups=("g",))})
        start = time.time()
        at = start + lead
        prod.publish("t", b"later", deliver_at=at).wait_stored(5)
        prod.publish("t", b"now").wait_stored(5)
        prod.close()
        prod = make_node(name, data_dir=str(tmp_path / name))
        cons = make_node(f"cons{attempt}", seeds=[prod.control_address])
        sub = cons.subscribe("t", group="g")
        received: dict[bytes, float] = {}

        def both(sub: zmesh.Subscription = sub, received: dict[bytes, float] = received) -> bool:
            for m in sub.fetch(10, timeout=0.05):
                received.setdefault(bytes(m.payload), time.time())
                m.ack()
            return len(received) == 2

        wait_until(both, lead + 20, what="the plain and the scheduled message")
        assert received[b"later"] >= at, f"delivered {at - received[b'later']:.2f}s before its time"
        assert set(received) == {b"now", b"later"}
        ready = received[b"now"]
        if ready < at - 0.5:
            return  # the producer was back well before the time: the hold was shown
        tries.append(f"lead {lead:.1f}s, back after {ready - start:.1f}s")
        cons.close()
        prod.close()
        lead = 2 * (ready - start) + 1.0
    pytest.fail(
        "the restarted producer never reached the consumer before the scheduled "
        f"time, so the hold across the restart was not shown ({'; '.join(tries)})"
    )


def test_delay_argument(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    t0 = time.time()
    prod.publish("t", b"x", delay=0.5)
    [msg] = drain(sub, 1)
    assert time.time() - t0 >= 0.5


def test_a_message_that_would_expire_before_it_is_due_is_refused(make_node):
    prod = make_node("prod", topics={"short": zmesh.TopicConfig(ttl_s=1.0)})
    with pytest.raises(zmesh.ArgumentError, match="ttl=1 ends before the message is due"):
        prod.publish("t", b"x", ttl=1.0, delay=5.0)
    with pytest.raises(zmesh.ArgumentError, match="the topic's ttl_s=1 ends before"):
        prod.publish("short", b"x", deliver_at=time.time() + 5.0)
    assert prod.status()["outbox"] == 0
    prod.publish("short", b"x", delay=0.5).wait_stored(5)  # (due before it expires)


def test_nack_with_delay_and_backoff_survive_producer_restart(make_node, tmp_path):
    prod = make_node(
        "prod", topics={"t": zmesh.TopicConfig(groups=("g",), max_attempts=3, retry_backoff_s=0.05)}
    )
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    r = prod.publish("t", b"x")
    first = sub.get(timeout=5)
    assert first is not None and first.attempt == 1
    t0 = time.monotonic()
    first.nack(delay=0.4)
    second = sub.get(timeout=5)
    assert second is not None and time.monotonic() - t0 >= 0.35 and second.attempt == 2
    second.nack()  # the topic's backoff
    wait_until(lambda: prod.stats().get("nacked", 0) == 2, what="both nacks at the producer")
    prod.close()
    prod = make_node(
        "prod",
        data_dir=str(tmp_path / "prod"),
        topics={"t": zmesh.TopicConfig(max_attempts=3, retry_backoff_s=0.05)},
    )
    third = sub.get(timeout=10)
    assert third is not None and third.id == r.id and third.attempt == 3
    third.nack(0)
    wait_until(lambda: prod.dead_letters("t", "g"), what="attempts exhausted after restart")
