"""Edges of request/reply, subjects, last values, replay and dead letters, each against
real nodes on 127.0.0.1: what the README's snippets and the docstrings promise at the
corners (a node answering its own requests, a function that raises what is not an
Exception, readers used after close, limits at their ends)."""

from __future__ import annotations

import pytest

import zmesh
from tests.conftest import wait_until


def test_a_node_serving_a_topic_answers_its_own_request_at_once(make_node) -> None:
    # The README's snippet: serve(), then request() on the same node. The subscription
    # and the request reach the IO thread in one batch; the request must see the member
    # its serve() made, not NoRespondersError.
    node = make_node("calib")
    node.serve("calib.*", "calibration", lambda msg: msg.topic)
    reply = node.request("calib.line4", b"?", timeout=5.0)
    assert reply.payload == b"calib.line4" and reply.responder == node.id
    node.serve("census.>", "census", lambda msg: node.name, mode="broadcast")
    assert [r.payload for r in node.request_many("census.nodes", b"?", timeout=5.0)] == [b"calib"]


def alive(node: zmesh.Node, topic: str) -> bool:
    return any(p["alive"] and any(s[0] == topic for s in p["subscriptions"]) for p in node.peers())


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_function_raising_what_is_no_exception_is_a_reply_error(make_node, raised) -> None:
    # serve's promise: what fn raises is replied as an error and the request acked. A
    # BaseException was nacked unanswered: the requester waited out its timeout.
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])

    def broken(msg: zmesh.Message) -> bytes:
        raise raised

    server.serve("calib.*", "svc", broken)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    with pytest.raises(zmesh.ReplyError, match=type(raised).__name__) as info:
        client.request("calib.l4", b"?", timeout=10)
    assert info.value.responder == server.id
    wait_until(lambda: client.status()["outbox"] == 0, what="the request acked")
    assert server.stats().get("requests_dropped_redelivered", 0) == 0


def test_serve_without_a_group_is_refused(make_node) -> None:
    # Requests go to groups: a serve() without one made an ephemeral subscription that no
    # request ever reaches, and every request said NoRespondersError.
    node = make_node("server")
    with pytest.raises(zmesh.ArgumentError, match="serve needs a group"):
        node.serve("calib.*", None, lambda msg: b"x")  # type: ignore[arg-type]
    assert node.status()["subscriptions"] == []
