"""The scene the mesh-view tests look at: three nodes on loopback, two topics, three
groups, a backlog for a group with no member, and a dead letter."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.integration.conftest import procs  # noqa: F401  (the fixture, for these tests too)
from tests.integration.test_cli import Proc
from tests.integration.test_cli_ops import node_toml

ORDERS = 10
METRICS = 4
BAD = b"order-3"  # the order billing fails: a dead letter at prod


@dataclass
class Scene:
    """hub serves the HTTP API and consumes metrics/ops; prod produces both topics; cons
    consumes orders/billing. orders also declares audit, which has no member: its backlog
    is every order."""

    hub: zmesh.Node
    prod: zmesh.Node
    cons: zmesh.Node
    billing: zmesh.Subscription
    ops: zmesh.Subscription

    def url(self, path: str) -> str:
        return f"http://{self.hub.http_address}{path}"


def lane_of(node: zmesh.Node, topic: str, group: str) -> dict:
    [lane] = [ln for ln in node.status()["lanes"] if ln["topic"] == topic and ln["group"] == group]
    return lane


def build_scene(make_node: Callable[..., zmesh.Node], **hub_options: object) -> Scene:
    hub = make_node("hub", http_address="127.0.0.1:0", **hub_options)
    prod = make_node("prod", seeds=[hub.control_address])
    cons = make_node("cons", seeds=[hub.control_address])
    prod.topic("orders", groups=["billing", "audit"])
    prod.topic("metrics")
    billing = cons.subscribe("orders", group="billing")
    ops = hub.subscribe("metrics", group="ops")
    wait_members(prod, "orders", "billing", 1)
    wait_members(prod, "metrics", "ops", 1)
    for i in range(ORDERS):
        prod.publish("orders", f"order-{i}".encode(), key=f"k{i}")
    for i in range(METRICS):
        prod.publish("metrics", f"m{i}".encode())
    for msg in fetched(billing, ORDERS):
        if msg.payload == BAD:
            msg.fail("bad record")
        else:
            msg.ack()
    for msg in fetched(ops, METRICS):
        msg.ack()

    def settled() -> bool:
        b, o = lane_of(prod, "orders", "billing"), lane_of(prod, "metrics", "ops")
        return (b.get("acked"), b.get("dead_lettered"), o.get("acked")) == (ORDERS - 1, 1, METRICS)

    wait_until(settled, what="billing and ops settled at prod")
    wait_until(
        lambda: all(len(n.peers()) == 2 for n in (hub, prod, cons)),
        what="every node knowing the other two",
    )
    return Scene(hub, prod, cons, billing, ops)


@pytest.fixture
def scene(make_node: Callable[..., zmesh.Node]) -> Scene:
    return build_scene(make_node)


def get_json(url: str) -> tuple[int, dict]:
    """GET ``url``: status code and JSON body (error bodies too)."""
    return call_json(urllib.request.Request(url))


def post_json(
    url: str,
    body: object,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict]:
    """POST ``body`` as JSON to ``url`` (with ``headers`` besides): status code and JSON
    answer."""
    return call_json(
        urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": content_type, **(headers or {})},
        )
    )


def call_json(req: urllib.request.Request) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def connect(address: str) -> socket.socket:
    """A TCP connection to ``address`` (``host:port``), reads and writes failing after
    30 s."""
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def read_all(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the other side closes."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def raw_request(address: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as it is to ``address``: the answer's status, headers (names in
    lower case) and body."""
    with connect(address) as sock:
        sock.sendall(request)
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status.split()[1]), headers, body


def run_node(tmp_path: Path, mesh: str, started: list[Proc]) -> tuple[Proc, str]:
    """A ``zmesh node run`` process with an HTTP API (added to ``started``): it and the
    API's URL."""
    toml = node_toml(tmp_path, "solo", mesh, extra='http_address = "127.0.0.1:0"')
    node = Proc(tmp_path, "solo", ["node", "run", str(toml)])
    started.append(node)
    return node, node.wait_for(r"http (http://127\.0\.0\.1:\d+)/").group(1)
