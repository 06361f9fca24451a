"""Redelivery at its edges: a message redelivered past a thousand attempts (a poison
message of a topic without ``max_attempts``) still gets the topic's backoff."""

from __future__ import annotations

import zmesh
from tests.conftest import wait_members
from zmesh._engine.lane.delivery import Timing
from zmesh._engine.lane.lane import Lane


def test_backoff_after_more_than_a_thousand_attempts_keeps_the_node_running(make_node):
    # (2 ** 1024 is past a float: the backoff of such an attempt raised on the IO
    # thread, and the message, taken from its member, was never delivered again)
    prod = make_node(
        "prod",
        topics={"t": zmesh.TopicConfig(groups=("g",), retry_backoff_s=0.0, max_attempts=0)},
    )
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=1, batch_size=1)
    wait_members(prod, "t", "g", 1)
    receipt = prod.publish("t", b"poison")
    attempts = 0
    while attempts < 1030:
        msg = sub.get(timeout=10)
        assert msg is not None, f"no redelivery after attempt {attempts}"
        assert msg.attempt == attempts + 1
        attempts = msg.attempt
        msg.nack(0 if attempts < 1028 else None)  # (None: the topic's backoff)
    msg = sub.get(timeout=10)
    assert msg is not None and msg.attempt == 1031
    msg.ack()
    receipt.wait_acked(timeout=10)
    assert receipt.outcomes == {"g": zmesh.Outcome.ACKED}
    assert prod.publish("t", b"after").wait_stored(timeout=10) is None


def test_an_ack_timeout_past_a_thousand_attempts_waits_the_capped_backoff() -> None:
    # (an attempt count as a restart restores it from the outbox)
    lane = Lane(
        "t",
        "g",
        producer=b"P" * 16,
        partitions=1,
        timing=Timing(ack_timeout_s=10.0, retry_backoff_s=1.0, max_retry_backoff_s=5.0),
        rng=lambda: 0.5,  # (a jitter factor of exactly 1)
    )
    lane.set_member(b"A" * 16, max_in_flight=1, batch_size=1)
    lane.add(0, 0, attempt=1100, now=0.0)
    out, _ = lane.take(0.0)
    assert list(out[b"A" * 16].attempts) == [1101]
    result = lane.tick(10.0)
    assert result.timed_out == 1 and not result.exhausted
    assert lane.next_wakeup() == 15.0
    lane.tick(15.0)
    out, _ = lane.take(15.0)
    assert list(out[b"A" * 16].attempts) == [1102]
