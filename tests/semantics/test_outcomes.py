"""True outcomes: a receipt tells, per group, how each was done with its message (acked,
dead-lettered, expired, superseded, group-deleted); ``wait_delivered`` raises unless every
group acked it."""

from __future__ import annotations

import pytest

import zmesh
from tests.conftest import fetched, wait_members


def test_an_acked_message_is_delivered_to_every_group(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("a", "b"))})
    cons = make_node("cons", seeds=[prod.control_address])
    subs = [cons.subscribe("t", group=g) for g in ("a", "b")]
    r = prod.publish("t", b"x")
    for sub in subs:
        fetched(sub, 1)[0].ack()
    r.wait_delivered(timeout=10)
    assert r.outcomes == {"a": "acked", "b": "acked"}


def test_a_failed_message_is_dead_lettered_for_its_group_only(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("a", "b"))})
    cons = make_node("cons", seeds=[prod.control_address])
    a, b = (cons.subscribe("t", group=g) for g in ("a", "b"))
    r = prod.publish("t", b"bad record")
    fetched(a, 1)[0].fail("cannot parse")
    fetched(b, 1)[0].ack()
    r.wait_acked(timeout=10)  # (settled: every group is done with it)
    assert r.outcomes == {"a": zmesh.Outcome.DEAD_LETTERED, "b": zmesh.Outcome.ACKED}
    with pytest.raises(zmesh.NotDeliveredError, match="a: dead_lettered") as err:
        r.wait_delivered(timeout=10)
    assert err.value.outcomes == {"a": "dead_lettered", "b": "acked"}


def test_an_expired_message_says_so(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("offline",))})
    r = prod.publish("t", b"stale soon", ttl=0.3)
    r.wait_acked(timeout=10)
    assert r.outcomes == {"offline": "expired"}
    with pytest.raises(zmesh.NotDeliveredError, match="offline: expired"):
        r.wait_delivered(timeout=1)


def test_a_superseded_message_says_so(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",), latest_wins=True)})
    old = prod.publish("t", b"21.0", key="line-4")
    new = prod.publish("t", b"21.5", key="line-4")
    old.wait_acked(timeout=10)
    assert old.outcomes == {"g": "superseded"}
    assert new.outcomes == {"g": "pending"}
    cons = make_node("cons", seeds=[prod.control_address])
    [msg] = fetched(cons.subscribe("t", group="g"), 1)
    assert msg.payload == b"21.5"
    msg.ack()
    new.wait_delivered(timeout=10)


def test_a_message_stored_before_any_group_takes_the_outcomes_of_those_that_claim_it(make_node):
    prod = make_node("prod")
    r = prod.publish("t", b"early")
    r.wait_stored(timeout=10)
    assert r.outcomes == {}  # (no group yet)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="late")
    wait_members(prod, "t", "late", 1)
    fetched(sub, 1)[0].ack()
    r.wait_delivered(timeout=10)
    assert r.outcomes == {"late": "acked"}


def test_a_batch_receipt_reports_a_group_that_did_not_ack_one_of_its_messages(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    r = prod.publish_many("t", [b"1", b"2", b"3"])
    first, second, third = fetched(sub, 3)
    first.ack()
    second.fail("no")
    third.ack()
    r.wait_acked(timeout=10)
    assert r.outcomes == {"g": "dead_lettered"}
