"""Request/reply at its edges against real nodes on 127.0.0.1: a serve function that
answers with ``msg.reply`` itself, a reply that is not valid text, a request that meets
a full outbox, timeouts past any float."""

from __future__ import annotations

import threading
import time

import pytest

import zmesh
import zmesh.aio
from tests.conftest import wait_until
from tests.integration.test_aio import COMMON, run


def alive(node: zmesh.Node, topic: str) -> bool:
    return any(p["alive"] and any(s[0] == topic for s in p["subscriptions"]) for p in node.peers())


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
@pytest.mark.parametrize("then", ["returns", "raises"])
def test_a_serve_function_that_replies_itself_is_answered_once_and_acked(
    make_node, delivery, then
) -> None:
    # serve's function may answer with msg.reply (the README: "serve, or msg.reply(...)").
    # serve then replied again (or an error, had it raised), which raised
    # MessageStateError in the handler: the request was nacked and, at least once,
    # handed to the function again and again until its ttl ran out.
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])
    calls: list[int] = []

    def answer(msg: zmesh.Message) -> None:
        calls.append(msg.attempt)
        msg.reply(b"mine")
        if then == "raises":
            raise ValueError("after the reply")

    sub = server.serve("calib.*", "svc", answer)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    reply = client.request("calib.l4", b"?", timeout=30, delivery=delivery)
    assert reply.payload == b"mine" and reply.ok
    wait_until(lambda: client.status()["outbox"] == 0, 5, what="the request acked")
    assert calls == [1]
    assert sub.handler_errors == 0
    assert server.stats().get("replies_sent") == 1


def test_a_reply_that_is_not_valid_text_is_a_reply_error(make_node) -> None:
    # A str reply with a lone surrogate (a file name decoded with surrogateescape) raised
    # UnicodeEncodeError in the handler: the requester heard nothing until its timeout.
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])
    refused: list[BaseException] = []

    def direct(msg: zmesh.Message) -> None:
        try:
            msg.reply("bad\udc80")
        except BaseException as exc:
            refused.append(exc)
            raise

    server.serve("calib.*", "svc", lambda msg: "bad\udc80")
    server.serve("direct", "svc", direct)
    wait_until(lambda: alive(client, "calib.*") and alive(client, "direct"), what="the server")
    start = time.monotonic()
    with pytest.raises(zmesh.ReplyError, match="ArgumentError: a reply is not valid text"):
        client.request("calib.l4", b"?", timeout=30)
    with pytest.raises(zmesh.ReplyError, match="ArgumentError: a reply is not valid text"):
        client.request("direct", b"?", timeout=30)
    assert time.monotonic() - start < 10  # (answered, not waited out)
    [exc] = refused
    assert isinstance(exc, zmesh.ArgumentError)
    wait_until(lambda: client.status()["outbox"] == 0, what="the requests acked")


def test_a_request_on_a_full_outbox_waits_no_longer_than_its_timeout(make_node) -> None:
    # A request waited for room in the outbox for publish_timeout_s (30 s here), whatever
    # its own timeout: request(timeout=0.5) returned 30 s later.
    node = make_node("node", max_outbox_messages=1, publish_timeout_s=30)
    node.serve("calib.*", "svc", lambda msg: b"ok")
    node.subscribe("hold", "holders")  # takes the message, acks nothing
    node.publish("hold", b"x").wait_stored(5)
    assert node.status()["outbox"] == 1
    for ask in (node.request, node.request_many):
        start = time.monotonic()
        with pytest.raises(zmesh.OutboxFullError, match="within 0.5s"):
            ask("calib.l4", b"?", timeout=0.5)
        assert time.monotonic() - start < 5


def test_an_async_request_on_a_full_outbox_waits_no_longer_than_its_timeout(
    tmp_path, mesh_name
) -> None:
    async def main() -> None:
        async with zmesh.aio.Node(
            "node",
            mesh=mesh_name,
            data_dir=str(tmp_path / "node"),
            max_outbox_messages=1,
            publish_timeout_s=30,
            **COMMON,
        ) as node:
            node.serve("calib.*", "svc", lambda msg: b"ok")
            node.subscribe("hold", "holders")
            await (await node.publish("hold", b"x")).wait_stored(5)
            start = time.monotonic()
            with pytest.raises(zmesh.OutboxFullError, match="within 0.5s"):
                await node.request("calib.l4", b"?", timeout=0.5)
            assert time.monotonic() - start < 5

    run(main())


def test_a_request_that_waited_for_room_waits_for_replies_only_what_is_left(
    make_node,
) -> None:
    # The timeout bounds the whole call: time spent waiting for room in the outbox is
    # not waited again for the reply.
    node = make_node("node", max_outbox_messages=1, publish_timeout_s=30)
    release = threading.Event()
    node.serve("calib.*", "svc", lambda msg: b"late" if release.wait(30) else b"")
    hold = node.subscribe("hold", "holders")
    node.publish("hold", b"x").wait_stored(5)
    held = hold.get(timeout=5)
    assert held is not None
    timer = threading.Timer(1.5, held.ack)  # room comes 1.5 s into a 3 s request
    timer.start()
    try:
        start = time.monotonic()
        with pytest.raises(zmesh.TimeoutError):
            node.request("calib.l4", b"?", timeout=3.0)
        assert time.monotonic() - start < 4.0  # (not 1.5 s, then 3 s more)
    finally:
        timer.cancel()
        timer.join()
        release.set()


def test_a_timeout_past_any_float_is_an_argument_error(make_node) -> None:
    node = make_node("node")
    node.serve("calib.*", "svc", lambda msg: b"ok")
    for call in (node.request, node.request_many, node.last):
        args = ("calib.l4", b"?") if call != node.last else ("calib.l4",)
        with pytest.raises(zmesh.ArgumentError, match="timeout must be a finite number"):
            call(*args, timeout=10**400)  # type: ignore[operator]


def test_a_request_nobody_answers_leaves_no_topic_for_later_patterns(make_node) -> None:
    # A request with no responders is not stored, yet its topic stayed known for good
    # (one entry per topic ever asked): a pattern group learned later got a lane of
    # each, made and stored at once (20,000 topics asked: a 2.6 s stall).
    node = make_node("node")
    asked = [f"dev.{i}.cmd" for i in range(50)]
    for topic in asked:
        with pytest.raises(zmesh.NoRespondersError):
            node.request(topic, b"?", timeout=5)
    node.serve("dev.>", "svc", lambda msg: b"ok")
    assert node.request("dev.new.cmd", b"?", timeout=5).payload == b"ok"
    assert [lane["topic"] for lane in node.status()["lanes"]] == ["dev.new.cmd"]
    assert node.request(asked[0], b"?", timeout=5).payload == b"ok"  # (asked again: served)


def test_an_error_longer_than_a_reply_may_be_is_replied_cut_short(make_node) -> None:
    # What a function raised is replied as its text: a text past max_message_bytes (a
    # payload quoted in it) was refused in its turn, the handler raised, and the request
    # was handed to the function again and again until the requester gave up.
    server = make_node("server", max_message_bytes=1 << 20)
    client = make_node("client", seeds=[server.control_address], max_message_bytes=1 << 20)
    calls: list[int] = []

    def broken(msg: zmesh.Message) -> bytes:
        calls.append(msg.attempt)
        raise ValueError("bad input " + "x" * (2 << 20))

    server.serve("calib.*", "svc", broken)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    with pytest.raises(zmesh.ReplyError, match="ValueError: bad input xxx") as info:
        client.request("calib.l4", b"?", timeout=30, delivery="at_least_once")
    assert len(info.value.reply.payload) < 64 << 10
    wait_until(lambda: client.status()["outbox"] == 0, 5, what="the request acked")
    assert calls == [1]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_error_that_cannot_be_printed_is_replied_by_its_name(make_node) -> None:
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])

    def broken(msg: zmesh.Message) -> bytes:
        raise Unprintable

    server.serve("calib.*", "svc", broken)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    with pytest.raises(zmesh.ReplyError) as info:
        client.request("calib.l4", b"?", timeout=30)
    assert info.value.reply.payload == b"Unprintable"
