"""Request/reply between real processes: two servers, one killed with SIGKILL mid-run
while requests keep coming; no responders; a reply that comes too late."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import zmesh
from tests.conftest import fetched, wait_until
from tests.integration.workers import Worker
from tests.waiting import pause

REQUESTS = 240
THREADS = 4
TIMEOUT_S = 10.0


def test_requests_are_answered_by_the_other_server_when_one_is_killed(
    tmp_path: Path, mesh_name: str, make_node
) -> None:
    servers = [Worker(name, mesh_name, tmp_path / name) for name in ("s1", "s2")]
    try:
        for w in servers:
            assert w.ask("serve calib.* svc") == "serving"
        client = make_node("client", seeds=[w.address for w in servers])
        # (a peer's subscriptions count once its hello shows it knows this node)
        wait_until(lambda: len(alive_servers(client)) == 2, 20, what="both servers")

        answered: Counter[str] = Counter()
        late: list[float] = []
        errors: list[BaseException] = []
        done = 0
        lock = threading.Lock()
        killed = threading.Event()

        def ask(first: int) -> None:
            nonlocal done
            for i in range(first, REQUESTS, THREADS):
                start = time.monotonic()
                try:
                    reply = client.request(
                        f"calib.l{i % 7}",
                        f"q{i}",
                        timeout=TIMEOUT_S,
                        delivery="at_least_once",
                    )
                except BaseException as exc:
                    with lock:
                        errors.append(exc)
                    continue
                took = time.monotonic() - start
                who, payload = reply.payload.decode().split(":", 1)
                assert payload == f"q{i}"
                with lock:
                    answered[who] += 1
                    done += 1
                    if killed.is_set():
                        late.append(took)
                pause(0.01)  # (a stream of requests: some are in flight at the kill)

        threads = [threading.Thread(target=ask, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        wait_until(lambda: done >= REQUESTS // 3, 60, what="a third of the replies")
        servers[0].kill()
        killed.set()
        for t in threads:
            t.join(90)
        assert not errors, errors[:3]
        assert sum(answered.values()) == REQUESTS
        assert answered["s1"] > 0 and answered["s2"] > 0
        assert late and max(late) < TIMEOUT_S
        assert client.stats().get("replies_received", 0) >= REQUESTS
    finally:
        for w in servers[1:]:
            w.quit()


def alive_servers(node: zmesh.Node) -> list[str]:
    return [
        p["name"]
        for p in node.peers()
        if p["alive"] and any(s[0] == "calib.*" for s in p["subscriptions"])
    ]


def test_no_responders_is_said_at_once(make_node) -> None:
    node = make_node("lonely")
    start = time.monotonic()
    with pytest.raises(zmesh.NoRespondersError) as info:
        node.request("calib.l4", b"?", timeout=10)
    assert time.monotonic() - start < 2.0
    assert info.value.topic == "calib.l4"
    assert node.status()["outbox"] == 0  # nothing was stored for nobody
    with pytest.raises(zmesh.NoRespondersError):
        node.request_many("calib.l4", b"?", timeout=10)


def test_a_reply_too_late_is_a_timeout_and_is_dropped(make_node) -> None:
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])
    release = threading.Event()

    def slow(msg: zmesh.Message) -> bytes:
        release.wait(10)
        return b"late"

    server.serve("slow", "svc", slow)
    wait_until(lambda: alive(client, "slow"), what="the server")
    start = time.monotonic()
    with pytest.raises(zmesh.TimeoutError, match="no reply to the request on 'slow' within 0.5s"):
        client.request("slow", b"?", timeout=0.5)
    took = time.monotonic() - start
    assert 0.5 <= took < 3.0
    release.set()
    wait_until(lambda: client.stats().get("replies_unclaimed", 0) == 1, what="the late reply")


def alive(node: zmesh.Node, topic: str) -> bool:
    return any(p["alive"] and any(s[0] == topic for s in p["subscriptions"]) for p in node.peers())


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
def test_a_request_given_back_is_handled_again_only_at_least_once(make_node, delivery) -> None:
    """A member that takes a request and gives it back (its subscription closes) may have
    acted on it: at most once, the other server drops it; at least once, it answers."""
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])
    holder = server.subscribe("calib", "svc")  # takes requests, answers none
    wait_until(lambda: alive(client, "calib"), what="the holder")
    outcome: list[object] = []
    asking = threading.Thread(
        target=lambda: outcome.append(_outcome(client, "calib", delivery)), name="asking"
    )
    asking.start()
    [request] = fetched(holder, 1)
    assert request.attempt == 1
    server.serve("calib", "svc", lambda msg: b"answered")
    holder.close()  # (given back: delivered again, with attempt 2)
    asking.join(10)
    if delivery == "at_least_once":
        assert outcome == [b"answered"]
    else:
        assert outcome == ["timeout"]
        assert server.stats()["requests_dropped_redelivered"] == 1


def _outcome(node: zmesh.Node, topic: str, delivery: str) -> object:
    try:
        return node.request(topic, b"?", timeout=3.0, delivery=delivery).payload  # type: ignore[arg-type]
    except zmesh.TimeoutError:
        return "timeout"


def test_request_many_gathers_one_reply_per_broadcast_member(make_node) -> None:
    servers = [make_node(f"s{i}") for i in range(3)]
    client = make_node("client", seeds=[s.control_address for s in servers])
    for s in servers:
        s.serve("census.>", "all", lambda msg, s=s: s.name, mode="broadcast")
    wait_until(lambda: count(client) == 3, what="three servers")
    replies = client.request_many("census.count", b"?", timeout=5)
    assert sorted(r.payload for r in replies) == [b"s0", b"s1", b"s2"]
    assert {r.responder for r in replies} == {s.id for s in servers}
    two = client.request_many("census.count", b"?", count=2, timeout=5)
    assert len(two) == 2


def count(node: zmesh.Node) -> int:
    return sum(
        1
        for p in node.peers()
        if p["alive"] and any(s[0] == "census.>" for s in p["subscriptions"])
    )


def test_a_failing_handler_is_a_reply_error(make_node) -> None:
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])

    def broken(msg: zmesh.Message) -> bytes:
        raise ValueError(f"no calibration for {msg.topic}")

    server.serve("calib.*", "svc", broken)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    with pytest.raises(zmesh.ReplyError, match="no calibration for calib.l4") as info:
        client.request("calib.l4", b"?", timeout=5)
    assert info.value.reply.ok is False and info.value.responder == server.id
    replies = client.request_many("calib.l4", b"?", timeout=5)
    assert [r.ok for r in replies] == [False]


def test_a_request_is_replied_to_once(make_node) -> None:
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])
    sub = server.subscribe("calib.*", group="svc")
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    errors: list[Exception] = []

    def answer_twice() -> None:
        msg = sub.get(timeout=10)
        assert msg is not None
        msg.reply(b"one")
        try:
            msg.reply(b"two")
        except zmesh.MessageStateError as exc:
            errors.append(exc)
        msg.ack()

    responder = threading.Thread(target=answer_twice)
    responder.start()
    try:
        replies = client.request_many("calib.l4", b"?", count=2, timeout=1.0)
    finally:
        responder.join()
    assert [r.payload for r in replies] == [b"one"]
    assert len(errors) == 1 and "was replied to already" in str(errors[0])


def test_a_timeout_longer_than_one_wait_is_waited_for(make_node) -> None:
    """A finite timeout past what one wait takes (threading.TIMEOUT_MAX) is a long wait,
    not an OverflowError."""
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])
    server.serve("calib.*", "svc", lambda msg: b"ok")
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    assert client.request("calib.l4", b"?", timeout=1e10).payload == b"ok"
    replies = client.request_many("calib.l4", b"?", timeout=1e300)
    assert [r.payload for r in replies] == [b"ok"]


@pytest.mark.parametrize(
    "result",
    [5, 2.5, [b"x"], {"a": 1}, b"x" * ((1 << 20) + 1)],
    ids=["int", "float", "list", "dict", "too_large"],
)
def test_a_return_value_no_reply_can_be_is_a_reply_error(make_node, result) -> None:
    server = make_node("server", max_message_bytes=1 << 20)
    client = make_node("client", seeds=[server.control_address])
    server.serve("calib.*", "svc", lambda msg: result)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    # (a ReplyError, not a TimeoutError: answered, not waited out)
    with pytest.raises(zmesh.ReplyError, match="ArgumentError: a reply") as info:
        client.request("calib.l4", b"?", timeout=10)
    assert info.value.responder == server.id
    wait_until(lambda: client.status()["outbox"] == 0, what="the request acked")


def test_a_reply_past_the_requesters_limit_is_a_reply_error(make_node) -> None:
    # The responder takes larger messages than the requester: a reply past the
    # requester's max_message_bytes is refused where it is made, not lost on the way.
    server = make_node("server", max_message_bytes=4 << 20)
    client = make_node("client", seeds=[server.control_address], max_message_bytes=1 << 20)
    server.serve("calib.*", "svc", lambda msg: b"y" * int(msg.payload))
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    assert len(client.request("calib.l4", b"1000", timeout=10).payload) == 1000
    with pytest.raises(zmesh.ReplyError, match="past the requester's max_message_bytes 1048576"):
        client.request("calib.l4", str(3 << 20).encode(), timeout=10)


@pytest.mark.parametrize("headers", ["x", 5, [("h", 1)], {1: 2}, {"h": {1: 2}}])
def test_bad_request_headers_are_refused_as_a_publish_refuses_them(make_node, headers) -> None:
    node = make_node("lonely")  # (checked at the call, before responders are looked for)
    with pytest.raises(zmesh.ArgumentError, match="headers") as refused:
        node.publish("calib.l4", b"?", headers=headers)
    for ask in (node.request, node.request_many):
        with pytest.raises(zmesh.ArgumentError) as info:
            ask("calib.l4", b"?", headers=headers, timeout=10)
        assert str(info.value) == str(refused.value)


def test_bad_reply_headers_are_refused_as_a_publish_refuses_them(make_node) -> None:
    server = make_node("server")
    client = make_node("client", seeds=[server.control_address])

    def answer(msg: zmesh.Message) -> None:
        msg.reply(b"x", headers="x")  # type: ignore[arg-type]

    server.serve("calib.*", "svc", answer)
    wait_until(lambda: alive(client, "calib.*"), what="the server")
    with pytest.raises(zmesh.ReplyError, match="ArgumentError: headers must be a mapping"):
        client.request("calib.l4", b"?", timeout=10)
