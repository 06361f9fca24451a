"""A process forked from one that runs nodes (a pre-forking server, multiprocessing's
fork): the nodes' IO threads and sockets stay in the parent, so in the child their calls
are refused at once, saying why, instead of queueing what nothing would take (a publish
that is never stored) or handing out what the parent delivers (a message twice)."""

from __future__ import annotations

import json
import os
import select
import signal
from collections.abc import Callable

import zmesh
from tests.conftest import wait_until

CHILD_TIMEOUT_S = 30.0


def tried(call: Callable[[], object]) -> str:
    """What ``call`` did: returned what, or raised what (the error's type and text)."""
    try:
        return f"returned {call()!r}"
    except zmesh.ZMeshError as exc:
        return f"{type(exc).__name__}: {exc}"


def in_child(
    producer: zmesh.Node, consumer: zmesh.Node, sub: zmesh.Subscription, unacked: zmesh.Receipt
) -> dict:
    """What each call does in the forked child."""
    found = {
        # (a receipt of the parent's waited for good: nothing here tells it)
        "wait_acked": tried(lambda: unacked.wait_acked(CHILD_TIMEOUT_S)),
        "publish": tried(lambda: producer.publish("t", b"from the child")),
        "status": tried(producer.status),
        "get": tried(lambda: sub.get(timeout=0)),
        "subscribe": tried(lambda: consumer.subscribe("t", group="g2")),
    }
    for node in (consumer, producer):  # (the parent's nodes and data dirs are untouched)
        node.close()
    found["close"] = "returned"
    return found


def test_a_forked_child_refuses_its_parents_nodes(make_node) -> None:
    producer = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    consumer = make_node("cons", seeds=[producer.control_address])
    sub = consumer.subscribe("t", group="g")
    unacked = producer.publish("t", b"held")
    unacked.wait_stored(5)
    wait_until(lambda: sub.delivered >= 1, what="the message delivered to the subscription")
    rx, tx = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: reports through the pipe, never returns into pytest)
        code = 1
        try:
            os.close(rx)
            found = in_child(producer, consumer, sub, unacked)
            os.write(tx, json.dumps(found).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(tx)
    found = {}
    try:
        with os.fdopen(rx, "rb") as pipe:
            if select.select([pipe], [], [], CHILD_TIMEOUT_S)[0]:
                found = json.loads(pipe.read() or b"{}")
    finally:
        if not found:  # (it failed or hung before it wrote)
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, found
    for call, node in (
        ("wait_acked", "prod"),
        ("publish", "prod"),
        ("status", "prod"),
        ("get", "cons"),
        ("subscribe", "cons"),
    ):
        assert found[call].startswith(f"NodeStateError: node '{node}' runs in process"), found
        assert "forked from it" in found[call]
    assert found["close"] == "returned"
    # The parent goes on: the message it held is its own to take, publishing works.
    msg = sub.get(timeout=5)
    assert msg is not None and msg.payload == b"held"
    msg.ack()
    producer.publish("t", b"after").wait_stored(5)
    again = sub.get(timeout=10)
    assert again is not None and again.payload == b"after"
    again.ack()
