"""Flow control: a slow consumer holds at most max_in_flight, and no more than it handles
in a quarter of the ack timeout; the backlog stays in the producer's outbox, not in
anyone's memory queue."""

from __future__ import annotations

import zmesh
from tests.conftest import wait_members, wait_until
from tests.waiting import pause
from zmesh._engine.inbox.origin import Origin


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
        peak_queue = max(peak_queue, len(msgs) + sub._queued())
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
    # The messages of one received frame share an Origin (their batch): count per batch
    # (the origins are kept, so no id is reused).
    origins: dict[int, Origin] = {}
    got = 0
    while got < 50:
        msgs = sub.fetch(1000, timeout=5)
        assert msgs, f"stalled after {got} messages"
        for m in msgs:
            origins[id(m._origin)] = m._origin
            m.ack()
        got += len(msgs)
    sizes = sorted(len(o.seqs) for o in origins.values())
    assert got == 50 and sum(sizes) == 50
    assert sizes[-1] <= 5, f"batch sizes {sizes}"


def test_a_slow_handler_is_sent_what_it_handles_before_its_acks_time_out(make_node):
    # 10 ms per message and a 4 s ack timeout: the member's window holds what it acks in
    # a quarter of that, 1 s (about 100 messages). Its max_in_flight alone would let all
    # 600 messages wait at once, the last six seconds behind the first, and a third of
    # them would time out and be sent again. The timeout is long beside the window so
    # that a loaded machine, stalling the handler for a second or two, times none out.
    prod = make_node(
        "prod",
        topics={"t": zmesh.TopicConfig(groups=("g",), ack_timeout_s=4.0, retry_backoff_s=0.0)},
    )
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=1000, batch_size=10)
    wait_members(prod, "t", "g", 1)
    n = 600
    receipt = prod.publish_many("t", [bytes(16)] * n)
    peak_in_flight = 0
    for handled in range(n):
        msg = sub.get(timeout=5)
        assert msg is not None, f"stalled after {handled} messages"
        pause(0.01)  # the handler's work
        msg.ack()
        if handled % 10 == 0:
            [lane] = [ln for ln in prod.status()["lanes"] if ln["lane"] == "g"]
            peak_in_flight = max(peak_in_flight, lane["in_flight"])
    receipt.wait_acked(10)
    assert prod.stats().get("ack_timeouts", 0) == 0
    assert cons.stats().get("duplicates_held", 0) == 0
    assert 0 < peak_in_flight <= n // 2, peak_in_flight
