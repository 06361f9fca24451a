"""Flow control: a slow consumer holds at most max_in_flight; the backlog stays in the
producer's outbox, not in anyone's memory queue."""

from __future__ import annotations

import zmesh
from tests.conftest import wait_members, wait_until


def test_slow_consumer_is_bounded_by_max_in_flight(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=8, batch_size=4)
    wait_members(prod, "t", "g", 1)
    n = 3000
    receipts = [prod.publish("t", bytes(64)) for _ in range(n)]
    receipts[-1].wait_stored(10)
    handled = 0
    peak_queue = 0
    peak_in_flight = 0
    while handled < n:
        msgs = sub.fetch(100, timeout=5)
        assert msgs, f"stalled after {handled} messages"
        peak_queue = max(peak_queue, len(msgs) + len(sub._queue))
        lanes = [ln for ln in prod.status()["lanes"] if ln["lane"] == "g"]
        peak_in_flight = max(peak_in_flight, lanes[0]["in_flight"])
        if handled == 0:
            # The rest of the backlog waits in the outbox.
            assert lanes[0]["pending"] > n - 100
        for m in msgs:
            m.ack()
        handled += len(msgs)
    assert peak_queue <= 8 and peak_in_flight <= 8
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox drained")


def test_batch_size_limits_messages_per_frame(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    for _ in range(50):
        prod.publish("t", b"x")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=1000, batch_size=5)
    got = 0
    while got < 50:
        msgs = sub.fetch(1000, timeout=5)
        assert msgs
        for m in msgs:
            m.ack()
        got += len(msgs)
    assert prod.stats()["sent"] == 50
