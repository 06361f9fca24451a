"""The scene the mesh-view tests look at: three nodes on loopback, two topics, three
groups, a backlog for a group with no member, and a dead letter."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.integration.conftest import procs  # noqa: F401  (the fixture, for these tests too)

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


def post_json(url: str, body: object, content_type: str = "application/json") -> tuple[int, dict]:
    """POST ``body`` as JSON to ``url``: status code and JSON answer."""
    return call_json(
        urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": content_type},
        )
    )


def call_json(req: urllib.request.Request) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())
