"""A node's HTTP endpoints (its API and its metrics port) against clients that misbehave:
connections left idle or requests sent by halves neither keep the node from closing nor
hold a thread for ever, and bad input (a Content-Length, a query, a body) is a 400 that
says what is wrong."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
from collections.abc import Callable

import pytest

import zmesh
from tests.conftest import wait_until
from tests.web.conftest import connect, get_json, post_json, raw_request, read_all
from zmesh._http import server

HALF_SENT = (
    b"POST /api/groups/rm HTTP/1.0\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{"
)


def both_ports(make_node: Callable[..., zmesh.Node]) -> tuple[zmesh.Node, list[str]]:
    node = make_node("n", http_address="127.0.0.1:0", metrics_address="127.0.0.1:0")
    assert node.http_address is not None and node.metrics_address is not None
    return node, [node.http_address, node.metrics_address]


def test_close_ends_idle_and_half_sent_requests(
    make_node: Callable[..., zmesh.Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server._Handler, "timeout", 3600.0)  # (only close can end them)
    node, addresses = both_ports(make_node)
    clients = []
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (node.close(), closed.set()))
    try:
        for address in addresses:
            idle, half = connect(address), connect(address)
            half.sendall(HALF_SENT)
            clients += [idle, half]
            # (connections are taken in order: once a later one is answered, these two
            # are being served, each by a thread of its own)
            assert raw_request(address, b"GET /metrics HTTP/1.0\r\n\r\n")[0] == 200
        closer.start()
        wait_until(closed.is_set, what="the node closing while its clients wait")
        for client in clients:
            read_all(client)  # (the node hung up)
    finally:
        for client in clients:
            client.close()
        if closer.is_alive():
            closer.join()


def test_a_request_too_slow_is_cut_off(
    make_node: Callable[..., zmesh.Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server._Handler, "timeout", 0.2)
    _node, addresses = both_ports(make_node)
    for address in addresses:
        with connect(address) as idle, connect(address) as half:
            half.sendall(HALF_SENT)
            assert read_all(idle) == b""
            assert read_all(half).startswith(b"HTTP/1.0 408 ")
        assert raw_request(address, b"GET /metrics HTTP/1.0\r\n\r\n")[0] == 200


@pytest.mark.parametrize("length", ["abc", "-1", "1e3", "+2", "9" * 5000])
def test_a_bad_content_length_is_refused(make_node: Callable[..., zmesh.Node], length: str) -> None:
    node = make_node("n", http_address="127.0.0.1:0", http_admin=True)
    assert node.http_address is not None
    code, headers, body = raw_request(
        node.http_address,
        b"POST /api/groups/rm HTTP/1.0\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n{{}}".encode(),
    )
    assert (code, headers["content-type"]) == (400, "application/json")
    assert json.loads(body) == {
        "error": f"Content-Length must be a number of bytes, got {length!r}"
    }


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("limit=%C2%B2", "limit must be an int in 1..100000, got '\u00b2'"),
        (f"limit={2**64}", f"limit must be an int in 1..100000, got '{2**64}'"),
        ("limit=" + "9" * 5000, "limit must be an int in 1..100000, got '999"),  # (int(): 4300)
        ("timeout=1_0", "timeout must be seconds in (0, 30], got '1_0'"),
        ("limit=0", "limit must be an int in 1..100000, got '0'"),
        ("topic=a*b", "topic name 'a*b' is invalid"),
        ("group=a%20b", "group name 'a b' is invalid"),
    ],
)
def test_bad_dead_letter_queries_are_400(
    make_node: Callable[..., zmesh.Node], query: str, error: str
) -> None:
    hub = make_node("hub", http_address="127.0.0.1:0")
    make_node("peer", seeds=[hub.control_address])  # (asked over its control socket)
    wait_until(lambda: hub.peers(), what="the hub meeting its peer")
    base = {"topic": "t", "group": "g"}
    name, _, value = query.partition("=")
    query = "&".join(f"{k}={v}" for k, v in {**base, name: value}.items())
    code, answer = get_json(f"http://{hub.http_address}/api/dead-letters?{query}")
    assert code == 400 and answer["error"].startswith(error)


@pytest.mark.parametrize(
    ("path", "body", "error"),
    [
        ("replay", {"seqs": [10**23]}, "seqs must be a list of ints in 0..2**64-1"),
        ("purge", {"seqs": [-1]}, "seqs must be a list of ints in 0..2**64-1"),
        ("replay", {"topic": "a*b"}, "topic name 'a*b' is invalid"),
        ("purge", {"group": ""}, "group is required"),
        ("rm", {"topic": "a*b"}, "topic name 'a*b' is invalid"),
        ("rm", {"group": "a/b"}, "group name 'a/b' is invalid"),
    ],
)
def test_bad_actions_are_400(
    make_node: Callable[..., zmesh.Node], path: str, body: dict, error: str
) -> None:
    hub = make_node("hub", http_address="127.0.0.1:0", http_admin=True)
    make_node("peer", seeds=[hub.control_address])
    wait_until(lambda: hub.peers(), what="the hub meeting its peer")
    url = f"http://{hub.http_address}/api/" + (
        "groups/rm" if path == "rm" else f"dead-letters/{path}"
    )
    code, answer = post_json(url, {"node": "peer", "topic": "t", "group": "g", **body})
    assert code == 400 and answer["error"].startswith(error)


def test_bad_targets_and_bodies_are_refused_with_what_is_wrong(
    make_node: Callable[..., zmesh.Node],
) -> None:
    node = make_node("n", http_address="127.0.0.1:0", http_admin=True)
    assert node.http_address is not None
    post = b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    for request in (
        b"GET http://[/api/node HTTP/1.0\r\n\r\n",
        b"POST http://[/x HTTP/1.0\r\n" + post,
    ):
        code, _headers, body = raw_request(node.http_address, request)
        assert code == 400 and json.loads(body)["error"].startswith("bad request target")
    # (an action's name alone is no path to it)
    code, _headers, body = raw_request(node.http_address, b"POST purge HTTP/1.0\r\n" + post)
    assert code == 404 and json.loads(body) == {"error": "no such action: purge"}
    code, _headers, body = raw_request(
        node.http_address,
        b"POST /api/groups/rm HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    )
    assert code == 411 and "Content-Length" in json.loads(body)["error"]


def test_a_body_nested_too_deep_is_400(make_node: Callable[..., zmesh.Node]) -> None:
    node = make_node("n", http_address="127.0.0.1:0", http_admin=True)
    assert node.http_address is not None
    deep = b"[" * 100_000
    code, _headers, body = raw_request(
        node.http_address,
        b"POST /api/groups/rm HTTP/1.0\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(deep)}\r\n\r\n".encode()
        + deep,
    )
    assert code == 400 and json.loads(body)["error"].startswith("body is not JSON")


def test_a_client_gone_early_is_a_debug_line(
    make_node: Callable[..., zmesh.Node],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="zmesh._http.server")
    node = make_node("n", http_address="127.0.0.1:0", http_admin=True)
    assert node.http_address is not None
    for request in (HALF_SENT, b"GET /api/node HTTP/1.0\r\n\r\n"):
        with connect(node.http_address) as client:
            client.sendall(request)
            # (the connection reset, not closed: the node's next read or write fails)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # (connections are taken in order: once a later one is answered, both were taken)
    assert raw_request(node.http_address, b"GET /metrics HTTP/1.0\r\n\r\n")[0] == 200
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name == "zmesh-http-n-request"],
        what="the node done with both requests",
    )
    assert "Traceback" not in capfd.readouterr().err
    gone = [r for r in caplog.records if r.name == "zmesh._http.server" and "reset" in r.message]
    assert gone and all(r.levelno == logging.DEBUG and not r.exc_info for r in gone)


def test_methods_other_than_get_head_and_post_are_405(
    make_node: Callable[..., zmesh.Node],
) -> None:
    node, addresses = both_ports(make_node)
    for address, allow in zip(addresses, ("GET, HEAD, POST", "GET, HEAD"), strict=True):
        for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
            code, headers, body = raw_request(
                address, f"{method} /metrics HTTP/1.0\r\nContent-Length: 2\r\n\r\n{{}}".encode()
            )
            assert (code, headers["allow"], headers["content-type"]) == (
                405,
                allow,
                "application/json",
            )
            assert json.loads(body) == {"error": f"{method} is not served here (only {allow})"}
        code, headers, body = raw_request(address, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert (code, body) == (200, b"") and int(headers["content-length"]) > 0
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        code, headers, body = raw_request(address, b"BREW /metrics HTTP/1.0\r\n\r\n")
        assert (code, headers["content-type"]) == (501, "application/json")
        assert json.loads(body) == {"error": "Unsupported method ('BREW')"}
    code, _headers, body = raw_request(addresses[0], b"HEAD /api/node HTTP/1.0\r\n\r\n")
    assert (code, body) == (200, b"")


def test_media_types_are_case_insensitive(make_node: Callable[..., zmesh.Node]) -> None:
    node = make_node("n", http_address="127.0.0.1:0", http_admin=True)
    url = f"http://{node.http_address}/api/groups/rm"
    code, answer = post_json(url, {"group": "g"}, content_type="Application/JSON; charset=UTF-8")
    assert (code, answer) == (400, {"error": "topic is required"})
