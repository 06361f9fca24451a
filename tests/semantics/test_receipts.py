"""Receipts: a message is acked only once it is stored and every group settled it; a
receipt of an old message knows it is settled without asking the node."""

from __future__ import annotations

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.faults.test_store_faults import GROUPS, SMALL, fill, payload
from tests.integration.test_delivery import drain


def test_receipts_of_settled_messages_answer_without_asking_the_node(make_node):
    prod = make_node("prod", topics=GROUPS)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    receipts = [prod.publish("t", b"%d" % i) for i in range(2000)]
    receipts.append(prod.publish_many("t", [b"x"] * 300))  # (one receipt for the batch)
    drain(sub, 2300, timeout=30)
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox drained")
    receipts[0].wait_acked(timeout=10)  # (asks the node: its answer tells the floor)
    assert all(r.acked for r in receipts)
    # The first asked; the others were older than the floor its answer told.
    assert [r._watched for r in receipts].count(True) == 1


def test_a_receipt_waits_for_the_acks_of_messages_stored_after_the_floor(make_node):
    prod = make_node("prod", topics=GROUPS)
    first = prod.publish("t", b"0")
    first.wait_stored(timeout=10)
    assert not first.acked  # (owed: no consumer yet)
    later = [prod.publish("t", b"%d" % i) for i in range(1, 50)]
    assert not any(r.acked for r in later)
    cons = make_node("cons", seeds=[prod.control_address])
    drain(cons.subscribe("t", group="g"), 50, timeout=30)
    for r in [first, *later]:
        r.wait_acked(timeout=10)


def test_a_transaction_receipt_is_not_acked_before_commit_and_fails_with_an_abort(make_node):
    prod = make_node("prod", topics=GROUPS)
    with prod.transaction(timeout=5) as tx:
        committed = tx.publish("t", b"kept")
        assert not committed.acked and not committed.stored
    committed.wait_stored(timeout=5)
    tx = prod.transaction(timeout=5)
    aborted = tx.publish("t", b"dropped")
    tx.abort()
    assert not aborted.acked and not aborted.stored
    with pytest.raises(zmesh.NodeStateError, match="aborted"):
        aborted.wait_acked(timeout=5)
    cons = make_node("cons", seeds=[prod.control_address])
    got = drain(cons.subscribe("t", group="g"), 1, timeout=30)
    assert [m.payload for m in got] == [b"kept"]
    committed.wait_acked(timeout=10)


def test_receipts_of_publishes_the_full_map_holds_or_refuses_are_not_acked(make_node):
    prod = make_node("prod", **SMALL, topics=GROUPS)
    receipts: list[zmesh.Receipt] = []
    fill(prod, receipts=receipts)
    held = [r for r in receipts if not r.stored]
    assert held, "the full map held no publish"
    assert not any(r.acked for r in held)
    with pytest.raises(zmesh.TimeoutError, match="not stored"):
        held[0].wait_acked(timeout=0.3)


def test_the_receipt_of_a_transaction_the_full_map_refused_raises_its_error(make_node):
    prod = make_node("prod", **SMALL, topics=GROUPS)
    for i in range(5000):
        tx = prod.transaction(timeout=5)
        receipt = tx.publish("t", payload(i))
        try:
            tx.commit()
        except zmesh.StoreFullError:
            break
    else:
        pytest.fail("the map never filled up")
    assert not receipt.acked and not receipt.stored
    with pytest.raises(zmesh.StoreFullError):
        receipt.wait_acked(timeout=5)


def test_a_msg_id_repeated_on_another_topic_follows_the_first_message(make_node):
    # A msg_id names one message: the repeat's receipt is the first's, owed where the
    # first is (it was settled at once, for the repeat's topic, as if delivered).
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub_a = cons.subscribe("a", group="ga")
    sub_b = cons.subscribe("b", group="gb")
    wait_members(prod, "a", "ga", 1)
    wait_members(prod, "b", "gb", 1)
    first = prod.publish("a", b"on a", msg_id="dup-1")
    again = prod.publish("b", b"on b", msg_id="dup-1")
    again.wait_stored(10)
    assert again.id == first.id and again.topic == "a"
    assert again.outcomes == {"ga": zmesh.Outcome.PENDING}
    assert not again.acked
    [msg] = fetched(sub_a, 1)
    msg.ack()
    again.wait_delivered(10)
    assert sub_b.get(timeout=0.3) is None  # (the repeat was never published)
