"""No call of the sync API blocks past close(): each waiter wakes with NodeClosedError
(a subscription closed on its own ends its waiters with None instead)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import zmesh
from tests.conftest import wait_members, wait_until


class Blocked:
    """``fn`` running on a thread of its own; what it returned or raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name="test-blocked")
        self.thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def ended(self, timeout: float = 5.0) -> Blocked:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "still blocked after close()"
        return self


def waiters(cond: object) -> int:
    """Threads waiting on a threading.Condition (to know a call is blocked, not racing)."""
    return len(cond._waiters)  # type: ignore[attr-defined]


def test_a_wait_for_acks_without_timeout_wakes_when_the_node_closes(make_node):
    # The hang behind zmesh.aio's: a group owed the message that never acks it.
    node = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipt = node.publish("t", b"x")
    receipt.wait_stored(5)
    blocked = Blocked(receipt.wait_acked)
    cond = node._engine.queue.cond
    wait_until(lambda: waiters(cond) == 1, what="wait_acked blocked")
    node.close()
    error = blocked.ended().error
    assert isinstance(error, zmesh.NodeClosedError), error
    assert isinstance(error, zmesh.NodeStateError)  # (handlers of the old error catch it)
    assert error.node == "prod" and str(receipt.id) in str(error)
    receipt.wait_stored(0)  # stored before the close: that wait still returns
    with pytest.raises(zmesh.NodeClosedError, match="not acknowledged"):
        receipt.wait_acked(0)


def test_a_publish_waiting_for_room_wakes_when_the_node_closes(make_node):
    node = make_node("prod", max_outbox_messages=1, topics={"t": zmesh.TopicConfig(groups=("g",))})
    node.publish("t", b"fills it").wait_stored(5)
    blocked = Blocked(lambda: node.publish("t", b"no room", timeout=float("inf")))
    wait_until(lambda: waiters(node._engine.queue.cond) == 1, what="publish waiting for room")
    node.close()
    assert isinstance(blocked.ended().error, zmesh.NodeClosedError)


@pytest.mark.parametrize("how", ["get", "fetch", "iterate"])
@pytest.mark.parametrize("closing", ["node", "subscription"])
def test_a_consumer_waiting_for_messages_wakes_on_close(make_node, how, closing):
    node = make_node("cons")
    sub = node.subscribe("t", group="g")
    take: Callable[[], object] = {
        "get": sub.get,
        "fetch": lambda: sub.fetch(10),
        "iterate": lambda: list(sub),
    }[how]
    blocked = Blocked(take)
    wait_until(lambda: waiters(sub._cond) == 1, what=f"{how} blocked")
    if closing == "node":
        node.close()
        error = blocked.ended().error
        assert isinstance(error, zmesh.NodeClosedError), error
        assert "subscription t/g" in str(error)
        with pytest.raises(zmesh.NodeClosedError):
            sub.get(timeout=0)
    else:  # its own close: the end of what it delivers, not an error
        sub.close()
        ended = blocked.ended()
        assert ended.error is None and ended.result in (None, [])
        node.close()
        assert sub.get(timeout=0) is None  # (closed on its own first: it stays the end)


def test_handler_threads_end_with_the_node(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    seen: list[bytes] = []
    cons.subscribe("t", group="g", handler=lambda m: seen.append(m.payload), concurrency=3)
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"one").wait_acked(10)
    workers = [t for t in threading.enumerate() if t.name.startswith("zmesh-handler-cons")]
    assert len(workers) == 3
    cons.close()
    for t in workers:
        t.join(5)
    assert not any(t.is_alive() for t in workers) and seen == [b"one"]


def test_calls_and_transactions_after_close_say_the_node_is_closed(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"x")
    msg = sub.get(timeout=10)
    assert msg is not None
    tx = cons.transaction()
    tx.publish("out", b"y")
    tx.ack(msg)
    cons.close()
    with pytest.raises(zmesh.NodeClosedError):
        tx.commit()
    # (released when its node closed, with its subscription: the failed commit left it so)
    assert msg.settled
    with pytest.raises(zmesh.MessageStateError, match="released when its subscription closed"):
        msg.ack()
    with pytest.raises(zmesh.NodeClosedError, match="'cons' is closed"):
        cons.status()
    with pytest.raises(zmesh.NodeClosedError):
        cons.publish("t", b"z")


def test_close_ends_iteration_at_once_and_what_it_held_is_released(make_node):
    # Iteration went on through the rest of a batch already handed out, and an ack just
    # after close() was taken, though close() had said what it held went back at once.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish_many("t", [b"%d" % i for i in range(100)]).wait_stored(5)
    wait_until(lambda: sub._queued() == 100, what="the batch to be queued")
    it = iter(sub)
    first, second = next(it), next(it)
    first.ack()
    sub.close()
    with pytest.raises(zmesh.MessageStateError, match="released when its subscription closed"):
        second.ack()
    assert list(it) == []
    wait_until(lambda: prod.stats().get("acked", 0) >= 1, what="the ack at the producer")
    assert cons.stats()["released_on_close"] == 99


def test_two_handler_threads_closing_their_node_at_once_both_end(make_node):
    # Each close joined the handler threads of the subscriptions it ended: the other
    # handler, itself in close() and joining the first: both waited for good.
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    both = threading.Barrier(2, timeout=10)
    returned: list[str] = []

    def closing(m: zmesh.Message) -> None:
        both.wait()
        cons.close()
        returned.append(m.topic)

    for topic in ("a", "b"):
        cons.subscribe(topic, group="g", handler=closing)
        wait_members(prod, topic, "g", 1)
    prod.publish("a", b"x")
    prod.publish("b", b"y")
    wait_until(lambda: len(returned) == 2, what="both closes returned")
    with pytest.raises(zmesh.NodeClosedError):
        cons.status()
