"""``zmesh ls nodes|topics|groups`` as a real process, against the scene's nodes: from a
seed, by mDNS on loopback, as tables and as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable

import zmesh
from tests.integration.test_cli import run_cli
from tests.web.conftest import ORDERS, Scene

LOOP = ["--interface", "127.0.0.1"]


def ls(scene: Scene, kind: str, *extra: str) -> str:
    done = run_cli(
        [
            "ls",
            kind,
            "--mesh",
            scene.hub.config.mesh,
            "--seed",
            scene.hub.control_address,
            *LOOP,
            "--no-mdns",
            *extra,
        ]
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ls_json_from_a_seed(scene: Scene) -> None:
    nodes = json.loads(ls(scene, "nodes", "--json"))
    # (the command's own node only looks: it is left out)
    assert sorted(n["name"] for n in nodes) == ["cons", "hub", "prod"]
    assert all(n["reachable"] and n["peers"] == 2 for n in nodes)
    topics = json.loads(ls(scene, "topics", "--json"))["topics"]
    assert [(t["topic"], t["groups"], t["pending"]) for t in topics] == [
        ("metrics", ["ops"], 0),
        ("orders", ["audit", "billing"], ORDERS),
    ]
    groups = json.loads(ls(scene, "groups", "--json"))["groups"]
    audit = [g for g in groups if g["group"] == "audit"][0]
    assert (audit["pending"], audit["members"], audit["producers"][0]["node"]) == (
        ORDERS,
        [],
        "prod",
    )
    assert all(
        p["node"] != "ls" and not p["node"].startswith("ls-")
        for g in groups
        for p in g["producers"]
    )


def test_ls_tables(scene: Scene) -> None:
    scene.prod.publish("drafts", b"x").wait_stored(5)  # (no group of it known: unclaimed)
    out = ls(scene, "groups")
    rows = {
        tuple(cell.strip() for cell in line.split("│")[1:4]): line
        for line in out.splitlines()
        if line.startswith("│")
    }
    assert set(rows) == {
        ("drafts", "(no group yet)", "unclaimed"),
        ("metrics", "ops", "shared"),
        ("orders", "audit", "shared"),
        ("orders", "billing", "shared"),
    }
    assert f"│ {ORDERS:>7} │" in rows[("orders", "audit", "shared")]
    out = ls(scene, "nodes")
    assert all(f"│ {name}" in out for name in ("hub", "prod", "cons")) and "ok" in out


def test_ls_by_mdns_on_loopback(make_node: Callable[..., zmesh.Node], mesh_name: str) -> None:
    a = make_node("alpha", mdns=True)
    b = make_node("beta", mdns=True)
    b.topic("t", groups=["g"])
    b.publish("t", b"x").wait_stored(5)
    done = run_cli(["ls", "topics", "--mesh", mesh_name, *LOOP, "--json", "--wait", "10"])
    assert done.returncode == 0, done.stderr
    [topic] = json.loads(done.stdout)["topics"]
    assert (topic["topic"], topic["producers"], topic["pending"]) == ("t", ["beta"], 1)
    assert a.peers()  # (alpha found beta too: both were on the mesh all along)
