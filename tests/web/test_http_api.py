"""A node's HTTP API against real nodes on loopback: every field as documented in
docs/monitoring.md, a node killed with SIGKILL reported as unreachable, and admin actions
refused unless the node enables them."""

from __future__ import annotations

import base64
import os
import signal
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

import zmesh
from tests.conftest import fetched, wait_until
from tests.integration.test_cli import ADDRESS_RE, Proc
from tests.integration.test_cli_ops import node_toml
from tests.web.conftest import (
    BAD,
    METRICS,
    ORDERS,
    Scene,
    build_scene,
    connect,
    get_json,
    lane_of,
    post_json,
)
from zmesh._http.views import SUMMED

# The shapes docs/monitoring.md documents ("The HTTP API").
STATUS_KEYS = {
    "node",
    "outbox",
    "store",
    "lanes",
    "pattern_groups",
    "subscriptions",
    "peers",
    "bans",
    "replicas",
    "counters",
}
LANE_KEYS = {
    "topic",
    "lane",
    "group",
    "mode",
    "members",
    "windows",
    "assigned",
    "partitions_moved",
    "pending",
    "ready",
    "in_flight",
    "oldest_age_s",
    "dead_letters",
}
LANE_COUNTS = {"acked", "nacked", "ack_timeouts", "expired", "dead_lettered", "superseded"}
PEER_KEYS = {
    "id",
    "name",
    "incarnation",
    "control",
    "data",
    "alive",
    "state",
    "last_seen_s",
    "subscriptions",
    "public_key",
}
MESH_KEYS = {"mesh", "observer", "collected_at", "timeout_s", "nodes", "links"}
MESH_NODE_KEYS = {
    "id",
    "name",
    "control",
    "self",
    "alive",
    "reachable",
    "read_at",
    "rtt_ms",
    "error",
    "status",
}
NODE_ROW_KEYS = {
    "id",
    "name",
    "control",
    "self",
    "alive",
    "reachable",
    "rtt_ms",
    "error",
    "outbox",
    "lanes",
    "subscriptions",
    "peers",
    "peers_alive",
}
TOPIC_KEYS = {
    "topic",
    "producers",
    "groups",
    "subscribers",
    "pending",
    "in_flight",
    "dead_letters",
    "acked",
    "oldest_age_s",
}
GROUP_KEYS = {
    "topic",
    "group",
    "mode",
    *SUMMED,
    "oldest_age_s",
    "members",
    "subscribers",
    "producers",
    "entered",
}
GROUP_PRODUCER_KEYS = {"node", "node_id", "lane", *SUMMED, "oldest_age_s", "entered"}
DEAD_LETTER_KEYS = {
    "id",
    "seq",
    "node",
    "topic",
    "group",
    "lane",
    "key",
    "headers",
    "reason",
    "attempts",
    "failed_at",
    "history",
    "payload_b64",
    "payload_text",
}


def test_node_is_the_status_with_backlog_fields(scene: Scene) -> None:
    code, node = get_json(scene.url("/api/node"))
    assert code == 200
    assert set(node) == STATUS_KEYS
    assert node["node"]["name"] == "hub" and node["node"]["id"] == scene.hub.id
    assert [(s["topic"], s["group"]) for s in node["subscriptions"]] == [("metrics", "ops")]
    assert {p["name"] for p in node["peers"]} == {"prod", "cons"}
    for peer in node["peers"]:
        assert set(peer) == PEER_KEYS and peer["alive"] and peer["public_key"] is None
    audit = lane_of(scene.prod, "orders", "audit")
    assert set(audit) >= LANE_KEYS and set(audit) <= LANE_KEYS | LANE_COUNTS
    assert audit["pending"] == ORDERS and audit["members"] == []
    assert audit["oldest_age_s"] > 0 and audit["dead_letters"] == 0
    billing = lane_of(scene.prod, "orders", "billing")
    assert billing["dead_letters"] == 1 and billing["oldest_age_s"] is None


def test_mesh_lists_every_node_with_its_status_and_links(scene: Scene) -> None:
    code, mesh = get_json(scene.url("/api/mesh"))
    assert code == 200 and set(mesh) == MESH_KEYS
    assert mesh["observer"] == scene.hub.id and mesh["timeout_s"] == 2.0
    by_name = {n["name"]: n for n in mesh["nodes"]}
    assert sorted(by_name) == ["cons", "hub", "prod"]
    for name, node in by_name.items():
        assert set(node) == MESH_NODE_KEYS
        assert node["reachable"] and node["error"] is None and node["alive"]
        assert node["read_at"] <= mesh["collected_at"]
        assert node["self"] == (name == "hub")
        assert node["status"]["node"]["name"] == name
        assert node["control"] == getattr(scene, name).control_address
    assert by_name["prod"]["status"]["outbox"] == ORDERS  # audit owes every order
    links = {(ln["from"], ln["to"]): ln["alive"] for ln in mesh["links"]}
    ids = [scene.hub.id, scene.prod.id, scene.cons.id]
    assert links == {(a, b): True for a in ids for b in ids if a != b}

    code, nodes = get_json(scene.url("/api/nodes"))
    assert code == 200 and set(nodes) == {"mesh", "collected_at", "nodes", "links"}
    rows = {r["name"]: r for r in nodes["nodes"]}
    assert all(set(r) == NODE_ROW_KEYS for r in rows.values())
    assert (rows["prod"]["outbox"], rows["prod"]["peers"], rows["prod"]["peers_alive"]) == (
        ORDERS,
        2,
        2,
    )
    assert rows["cons"]["subscriptions"] == 1 and rows["hub"]["self"]


def test_topics_and_groups_sum_every_producers_lanes(scene: Scene) -> None:
    code, topics = get_json(scene.url("/api/topics"))
    assert code == 200 and topics["unreachable"] == []
    by_topic = {t["topic"]: t for t in topics["topics"]}
    assert sorted(by_topic) == ["metrics", "orders"]
    orders, metrics = by_topic["orders"], by_topic["metrics"]
    assert all(set(t) == TOPIC_KEYS for t in by_topic.values())
    assert (orders["producers"], orders["groups"], orders["subscribers"]) == (
        ["prod"],
        ["audit", "billing"],
        ["cons"],
    )
    assert (orders["pending"], orders["in_flight"], orders["dead_letters"], orders["acked"]) == (
        ORDERS,
        0,
        1,
        ORDERS - 1,
    )
    assert orders["oldest_age_s"] > 0
    assert (metrics["groups"], metrics["subscribers"], metrics["acked"], metrics["pending"]) == (
        ["ops"],
        ["hub"],
        METRICS,
        0,
    )

    code, groups = get_json(scene.url("/api/groups"))
    assert code == 200
    by_key = {(g["topic"], g["group"]): g for g in groups["groups"]}
    assert sorted(by_key) == [("metrics", "ops"), ("orders", "audit"), ("orders", "billing")]
    for g in by_key.values():
        assert set(g) == GROUP_KEYS
        assert all(set(p) == GROUP_PRODUCER_KEYS for p in g["producers"])
    audit, billing = by_key[("orders", "audit")], by_key[("orders", "billing")]
    assert (audit["pending"], audit["ready"], audit["members"], audit["subscribers"]) == (
        ORDERS,
        ORDERS,
        [],
        [],
    )
    assert audit["oldest_age_s"] > 0 and audit["entered"] == ORDERS
    assert (
        billing["acked"],
        billing["dead_lettered"],
        billing["dead_letters"],
        billing["pending"],
        billing["members"],
        billing["mode"],
    ) == (ORDERS - 1, 1, 1, 0, ["cons"], "shared")
    [prod_share] = [p for p in billing["producers"] if p["node"] == "prod"]
    assert (prod_share["node_id"], prod_share["lane"], prod_share["entered"]) == (
        scene.prod.id,
        "billing",
        ORDERS,
    )


def test_dead_letters_of_a_group_across_the_mesh(scene: Scene) -> None:
    code, dead = get_json(scene.url("/api/dead-letters?topic=orders&group=billing"))
    assert code == 200 and dead["errors"] == []
    assert (dead["topic"], dead["group"], dead["limit"]) == ("orders", "billing", 1000)
    [letter] = dead["letters"]
    assert set(letter) == DEAD_LETTER_KEYS
    assert (letter["node"], letter["reason"], letter["attempts"], letter["key"]) == (
        "prod",
        "bad record",
        1,
        "k3",
    )
    assert letter["id"] == f"{scene.prod.id}:{letter['seq']}"
    assert base64.b64decode(letter["payload_b64"]) == BAD and letter["payload_text"] == "order-3"
    assert [h[2] for h in letter["history"]] == ["bad record"]
    code, none = get_json(scene.url("/api/dead-letters?topic=orders&group=audit&node=prod"))
    assert code == 200 and none["letters"] == []
    assert get_json(scene.url("/api/dead-letters?group=billing")) == (
        400,
        {"error": "topic is required"},
    )
    # (as the actions answer for a node this one does not know)
    assert get_json(scene.url("/api/dead-letters?topic=orders&group=billing&node=ghost")) == (
        404,
        {"error": "node 'ghost' is not known to this node"},
    )


def test_metrics_on_the_same_port(scene: Scene) -> None:
    with urllib.request.urlopen(scene.url("/metrics"), timeout=10) as resp:
        kind, body = resp.headers["Content-Type"], resp.read().decode()
    assert kind.startswith("text/plain; version=0.0.4")
    assert 'zmesh_lane_dead_letters{group="ops",lane="ops",mesh="' in body
    assert 'zmesh_events_total{event="received",mesh="' in body


def test_admin_actions_are_refused_unless_enabled(scene: Scene) -> None:
    body = {"node": "prod", "topic": "orders", "group": "billing"}
    for op in ("replay", "purge"):
        code, answer = post_json(scene.url(f"/api/dead-letters/{op}"), body)
        assert code == 403 and "http_admin" in answer["error"]
    code, answer = post_json(scene.url("/api/groups/rm"), {"topic": "orders", "group": "audit"})
    assert code == 403 and "http_admin" in answer["error"]
    assert lane_of(scene.prod, "orders", "billing")["dead_letters"] == 1  # untouched
    assert lane_of(scene.prod, "orders", "audit")["pending"] == ORDERS
    assert get_json(scene.url("/api/nowhere"))[0] == 404


def test_admin_actions_when_enabled(make_node: Callable[..., zmesh.Node]) -> None:
    scene = build_scene(make_node, http_admin=True)
    url = scene.url("/api/dead-letters/replay")
    body = {"node": "prod", "topic": "orders", "group": "billing"}
    code, answer = post_json(url, body, content_type="text/plain")
    assert code == 415  # (what a form on another site could send without a preflight)
    assert post_json(url, {**body, "node": "nobody"})[0] == 404
    assert post_json(url, {**body, "seqs": "all"}) == (
        400,
        {"error": "seqs must be a list of ints in 0..2**64-1"},
    )
    code, answer = post_json(url, {**body, "node": scene.prod.id})
    assert code == 200
    assert answer == {
        "node": scene.prod.id,
        "name": "prod",
        "topic": "orders",
        "group": "billing",
        "replayed": 1,
    }
    [again] = fetched(scene.billing, 1)
    assert again.payload == BAD
    again.fail("still bad")
    wait_until(
        lambda: lane_of(scene.prod, "orders", "billing")["dead_letters"] == 1,
        what="the replayed message parked again",
    )
    # (a replayed message entered the lane once: it was published once)
    assert lane_of(scene.prod, "orders", "billing")["dead_replayed"] == 1
    [billing] = [
        g for g in get_json(scene.url("/api/groups"))[1]["groups"] if g["group"] == "billing"
    ]
    assert (billing["entered"], billing["dead_lettered"], billing["dead_replayed"]) == (
        ORDERS,
        2,
        1,
    )
    code, answer = post_json(scene.url("/api/dead-letters/purge"), body)
    assert (code, answer["purged"]) == (200, 1)
    assert lane_of(scene.prod, "orders", "billing")["dead_letters"] == 0
    # Group removal: asked at every node the API's node knows, then at it, which tells
    # every live peer; what each dropped is summed.
    code, answer = post_json(scene.url("/api/groups/rm"), {"topic": "orders", "group": "audit"})
    assert code == 200
    dropped_at = sorted(answer.pop("dropped_at"), key=lambda d: d["name"])
    assert answer == {
        "node": scene.hub.id,
        "name": "hub",
        "topic": "orders",
        "group": "audit",
        "dropped": ORDERS,
        "peers_told": 2,
        "errors": [],
    }
    assert dropped_at == [
        {"node": scene.cons.id, "name": "cons", "dropped": 0},
        {"node": scene.hub.id, "name": "hub", "dropped": 0},
        {"node": scene.prod.id, "name": "prod", "dropped": ORDERS},
    ]
    wait_until(
        lambda: not [ln for ln in scene.prod.status()["lanes"] if ln["group"] == "audit"],
        what="prod dropping the audit lane",
    )
    assert scene.prod.stats()["dropped_group_deleted"] == ORDERS
    assert post_json(scene.url("/api/groups/rm"), {"topic": "orders"}) == (
        400,
        {"error": "group is required"},
    )


def test_admin_actions_only_from_the_servers_own_origin(
    make_node: Callable[..., zmesh.Node],
) -> None:
    # (a page of another site whose name was made to point at the node: DNS rebinding)
    scene = build_scene(make_node, http_admin=True)
    url = scene.url("/api/dead-letters/purge")
    port = url.split(":")[2].split("/")[0]
    body = {"node": "prod", "topic": "orders", "group": "billing"}
    for headers in (
        {"Host": f"rebound.example:{port}"},
        {"Host": f"rebound.example:{port}", "Origin": f"http://rebound.example:{port}"},
        {"Origin": f"http://rebound.example:{port}"},
        {"Origin": "null"},
    ):
        code, answer = post_json(url, body, headers=headers)
        assert code == 403, headers
        assert "this server" in answer["error"]
    assert lane_of(scene.prod, "orders", "billing")["dead_letters"] == 1  # untouched
    own = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
    code, answer = post_json(url, body, headers=own)
    assert (code, answer["purged"]) == (200, 1)


def test_http_admin_is_refused_on_a_secured_node(tmp_path: Path) -> None:
    with pytest.raises(zmesh.ConfigError, match="http_admin cannot be set on a secured node"):
        zmesh.NodeConfig(
            name="n",
            data_dir=str(tmp_path),
            http_admin=True,
            secret_key_file=str(tmp_path / "n.key"),
        )


def test_a_killed_node_is_reported_unreachable(
    tmp_path: Path, mesh_name: str, make_node: Callable[..., zmesh.Node], procs: list[Proc]
) -> None:
    hub = make_node("hub", http_address="127.0.0.1:0")
    toml = node_toml(
        tmp_path,
        "ghost",
        mesh_name,
        extra=f'seeds = ["{hub.control_address}"]\nhttp_address = "127.0.0.1:0"',
    )
    ghost = Proc(tmp_path, "ghost", ["node", "run", str(toml)])
    procs.append(ghost)
    ghost.wait_for(ADDRESS_RE)
    # (zmesh node run shows the address the port-0 API got)
    ghost_api = ghost.wait_for(r"http (http://127\.0\.0\.1:\d+/)").group(1)
    assert get_json(ghost_api + "api/node")[1]["node"]["name"] == "ghost"
    url = f"http://{hub.http_address}/api/mesh?timeout=0.5"
    wait_until(
        lambda: [n["reachable"] for n in get_json(url)[1]["nodes"]] == [True, True],
        what="the ghost reached through the hub",
    )
    os.kill(ghost.popen.pid, signal.SIGKILL)
    ghost.popen.wait(10)
    code, mesh = get_json(url)
    assert code == 200
    [gone] = [n for n in mesh["nodes"] if n["name"] == "ghost"]
    assert (gone["reachable"], gone["status"], gone["rtt_ms"], gone["read_at"]) == (
        False,
        None,
        None,
        None,
    )
    assert gone["error"] == "no status reply within 0.5s"
    wait_until(
        lambda: [n["alive"] for n in get_json(url)[1]["nodes"]] == [True, False],
        what="the hub declaring the ghost dead",
    )
    code, topics = get_json(f"http://{hub.http_address}/api/topics?timeout=0.5")
    assert topics["unreachable"] == ["ghost"]
    assert get_json(f"http://{hub.http_address}/api/mesh?timeout=0")[0] == 400


def test_node_run_shows_both_addresses_and_stops_with_a_client_idle(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    extra = 'http_address = "127.0.0.1:0"\nmetrics_address = "127.0.0.1:0"'
    toml = node_toml(tmp_path, "solo", mesh_name, extra=extra)
    node = Proc(tmp_path, "solo", ["node", "run", str(toml)])
    procs.append(node)
    # (port 0: zmesh node run shows the ports chosen)
    shown = node.wait_for(r"http http://(\S+)/ metrics http://(\S+)/metrics")
    api, metrics = shown.group(1), shown.group(2)
    code, status = get_json(f"http://{api}/api/node")
    assert code == 200
    assert (status["node"]["http_address"], status["node"]["metrics_address"]) == (api, metrics)
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
        assert b'zmesh_outbox_messages{mesh="' in resp.read()
    with connect(api), connect(metrics):  # (clients that never send a request)
        node.popen.terminate()
        assert node.finish(30) == 0


@pytest.mark.parametrize("key", ["http_address", "metrics_address"])
def test_an_address_in_use_is_said_with_its_setting(make_node, key: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(zmesh.ZMeshError, match=f"{key} {address}: cannot listen there"):
            make_node("n", **{key: address})
    make_node("n").close()  # (the failed start left its data dir free)
