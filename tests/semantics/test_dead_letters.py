"""Dead letters: fail → listed with reason and attempts → replay → delivered → acked."""

from __future__ import annotations

import time

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.waiting import pause
from zmesh._protocol.codec import MAX_REASON_CHARS


@pytest.mark.parametrize("durability", ["process", "memory"])
def test_fail_list_replay_ack(make_node, tmp_path, durability):
    # A memory message is parked with its record (packed from the fields it was kept as).
    topics = {"orders": zmesh.TopicConfig(durability=durability)}
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("orders", group="billing")
    wait_members(prod, "orders", "billing", 1)
    r = prod.publish("orders", b"bad-record", key="k1", headers={"v": 1})
    msg = sub.get(timeout=5)
    assert msg is not None
    msg.fail("cannot parse")
    wait_until(lambda: prod.dead_letters("orders", "billing"), what="a dead letter")
    [dead] = prod.dead_letters("orders", "billing")
    assert dead.id == r.id and dead.payload == b"bad-record" and dead.key == "k1"
    assert dead.reason == "cannot parse" and dead.attempts == 1
    assert dead.headers == {"v": 1} and len(dead.history) == 1
    r.wait_acked(5)  # settled for its only group: parked is not owed
    assert sub.get(timeout=0.3) is None, "a parked message is never redelivered"

    # Across a producer restart, the dead letter stays parked.
    prod.close()
    prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
    assert [d.id for d in prod.dead_letters("orders", "billing")] == [r.id]
    wait_members(prod, "orders", "billing", 1)
    assert prod.replay_dead_letters("orders", "billing") == 1
    again = sub.get(timeout=10)
    assert again is not None and again.id == r.id and again.payload == b"bad-record"
    again.fail("still bad")
    wait_until(lambda: prod.dead_letters("orders", "billing"), what="parked again")
    [dead] = prod.dead_letters("orders", "billing")
    assert [h[2] for h in dead.history] == ["cannot parse", "still bad"]
    assert prod.replay_dead_letters("orders", "billing", [r.id]) == 1
    third = sub.get(timeout=10)
    assert third is not None and third.id == r.id
    third.ack()
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox empty")
    assert prod.dead_letters("orders", "billing") == []


def test_max_attempts_parks_and_purge_deletes(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(max_attempts=2, retry_backoff_s=0.0)})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"poison")
    for attempt in (1, 2):
        msg = sub.get(timeout=5)
        assert msg is not None and msg.attempt == attempt
        msg.nack(0)
    wait_until(lambda: prod.dead_letters("t", "g"), what="parked after 2 attempts")
    [dead] = prod.dead_letters("t", "g")
    assert dead.attempts == 2 and "max attempts" in dead.reason
    assert prod.purge_dead_letters("t", "g") == 1
    assert prod.dead_letters("t", "g") == []
    assert prod.stats()["dead_purged"] == 1


def test_a_long_reason_is_cut_to_what_a_fail_carries(make_node):
    # A whole traceback as the reason: the producer would drop a FAIL past 4,096
    # characters as undecodable (and the message would come back after its ack timeout).
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    r = prod.publish("t", b"x")
    msg = sub.get(timeout=5)
    assert msg is not None
    msg.fail("y" * (MAX_REASON_CHARS * 3))
    wait_until(lambda: prod.dead_letters("t", "g"), what="a dead letter")
    [dead] = prod.dead_letters("t", "g")
    assert dead.id == r.id and len(dead.reason) == MAX_REASON_CHARS
    assert dead.reason == "y" * (MAX_REASON_CHARS - 1) + "…"
    assert prod.stats().get("decode_errors", 0) == 0


def test_dead_letter_calls_refuse_bad_names_and_limits(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    for i in range(3):
        prod.publish("t", b"%d" % i)
    for msg in fetched(sub, 3):
        msg.fail("bad")
    wait_until(lambda: len(prod.dead_letters("t", "g")) == 3, what="three dead letters")
    assert len(prod.dead_letters("t", "g", limit=1)) == 1
    # limit 0 and -1 gave one letter, 2.5 three, "x" a raw TypeError on the IO thread.
    for limit in (0, -1, 2.5, "x", True, None):
        with pytest.raises(zmesh.ArgumentError, match="limit must be an int >= 1"):
            prod.dead_letters("t", "g", limit=limit)
    calls = [prod.dead_letters, prod.replay_dead_letters, prod.purge_dead_letters]
    for call in calls:
        with pytest.raises(zmesh.ConfigError, match="topic name"):
            call("bad topic", "g")
        with pytest.raises(zmesh.ConfigError, match="group name"):
            call("t", 5)
    # A sequence no message has (they are 1..2**63-1) was taken, and matched nothing.
    for call in calls[1:]:
        for seq in (0, -1, 1 << 63, 1 << 64):
            with pytest.raises(zmesh.ArgumentError, match=r"sequence is 1\.\.2\*\*63-1"):
                call("t", "g", ids=[seq])
    assert prod.purge_dead_letters("t", "g") == 3  # the node goes on


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf"), True, "1", 1e12])
def test_nack_and_fetch_refuse_bad_arguments_and_the_message_stays_unsettled(make_node, delay):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    prod.publish("t", b"x")
    msg = sub.get(timeout=5)
    assert msg is not None
    with pytest.raises(zmesh.ArgumentError, match="finite number >= 0"):
        msg.nack(delay)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(zmesh.ArgumentError, match="max_messages"):
            sub.fetch(bad)  # type: ignore[arg-type]
    msg.nack(0)  # still unsettled: a good delay goes through
    again = sub.get(timeout=5)
    assert again is not None and again.attempt == 2


def test_a_payload_larger_than_a_consumer_accepts_is_parked_for_its_group_only(make_node):
    # The consumer of "small" accepts 64 KiB (its node's max_message_bytes, told in its
    # hello): the producer parks a larger payload for that group instead of sending it
    # (dropped as undecodable, it would come back after every ack timeout), and the
    # group's credit goes on to the messages after it. "big" accepts it.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("small", "big"))})
    small_node = make_node("small", seeds=[prod.control_address], max_message_bytes=64 << 10)
    big_node = make_node("big", seeds=[prod.control_address])
    small = small_node.subscribe("t", group="small", max_in_flight=1)
    big = big_node.subscribe("t", group="big")
    wait_members(prod, "t", "small", 1)
    wait_members(prod, "t", "big", 1)
    large = prod.publish("t", b"L" * (100 << 10), key="large")
    after = [prod.publish("t", b"s%d" % i) for i in range(3)]

    got = []
    for _ in after:
        msg = small.get(timeout=5)
        assert msg is not None
        got.append(msg.id)
        msg.ack()
    assert got == [r.id for r in after]
    [dead] = prod.dead_letters("t", "small")
    assert dead.id == large.id and dead.key == "large" and len(dead.payload) == 100 << 10
    assert "larger than the max_message_bytes (65536)" in dead.reason
    assert prod.dead_letters("t", "big") == []
    assert prod.stats()["refused_oversized"] == 1

    delivered = []
    for _ in range(4):
        msg = big.get(timeout=5)
        assert msg is not None
        delivered.append(msg.id)
        msg.ack()
    assert delivered == [large.id] + [r.id for r in after]
    large.wait_acked(5)  # parked for "small", acked by "big": settled for both groups
    assert small_node.stats().get("decode_errors", 0) == 0


def test_a_payload_stored_under_a_larger_limit_is_parked_for_a_consumer_after_restart(
    make_node, tmp_path
):
    # Stored while the producer allowed 1 MiB, sent after it restarted allowing 128 KiB
    # to a consumer that accepts 128 KiB: the record read back is what is checked.
    topics = {"t": zmesh.TopicConfig(groups=("g",))}
    prod = make_node("prod", topics=topics, max_message_bytes=1 << 20)
    large = prod.publish("t", b"L" * (200 << 10))
    large.wait_stored(5)
    prod.close()
    prod = make_node(
        "prod", data_dir=str(tmp_path / "prod"), topics=topics, max_message_bytes=128 << 10
    )
    cons = make_node("cons", seeds=[prod.control_address], max_message_bytes=128 << 10)
    sub = cons.subscribe("t", group="g")
    small = prod.publish("t", b"s")
    msg = sub.get(timeout=10)
    assert msg is not None and msg.id == small.id
    msg.ack()
    wait_until(lambda: prod.dead_letters("t", "g"), what="the large message parked")
    [dead] = prod.dead_letters("t", "g")
    assert dead.id == large.id and "(131072)" in dead.reason
    assert cons.stats().get("decode_errors", 0) == 0


def test_a_replayed_dead_letter_keeps_its_ttl_and_its_receipt_follows_it_again(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    lasting = prod.publish("t", b"lasting")
    short = prod.publish("t", b"short-lived", ttl=1.0)
    ends = time.monotonic() + 1.0
    for msg in fetched(sub, 2):
        msg.fail("bad")
    wait_until(lambda: len(prod.dead_letters("t", "g")) == 2, what="both parked")
    assert lasting.outcomes == {"g": zmesh.Outcome.DEAD_LETTERED}
    pause(ends - time.monotonic() + 0.1)  # (the short one's ttl over)
    assert prod.replay_dead_letters("t", "g") == 2
    # Owed again: its receipt no longer says dead-lettered (it said so after the replayed
    # message was acked too); the one whose ttl ended expires (as its pending entry says
    # at a restart) and is not delivered.
    [again] = fetched(sub, 1)
    assert again.payload == b"lasting"
    again.ack()
    wait_until(lambda: prod.status()["outbox"] == 0, what="both settled")
    assert lasting.outcomes == {"g": zmesh.Outcome.ACKED}
    lasting.wait_delivered(10)
    assert short.outcomes == {"g": zmesh.Outcome.EXPIRED}
    assert sub.get(timeout=0.3) is None
