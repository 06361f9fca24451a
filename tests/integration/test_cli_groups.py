"""``zmesh group ls|rm`` as real processes against nodes on loopback: the groups of two
producers added up, and a group deleted at both while it has a backlog."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import reap, spawn, wait_members, wait_until
from tests.integration.test_cli import CLI, run_cli


def _groups(address: str, *topic: str) -> dict:
    done = run_cli(["group", "ls", *topic, "--address", address, "--json", "--timeout", "5"])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_group_ls_adds_up_producers_and_rm_deletes_at_each(make_node):
    p1 = make_node("p1")
    p2 = make_node("p2", seeds=[p1.control_address])
    cons = make_node("cons", seeds=[p1.control_address, p2.control_address])
    ops = cons.subscribe("t", group="ops")
    keep = cons.subscribe("t", group="keep")
    for p in (p1, p2):
        wait_members(p, "t", "ops", 1)
        wait_members(p, "t", "keep", 1)
    ops.close()
    keep.close()
    for p in (p1, p2):
        wait_members(p, "t", "ops", 0)
    for i in range(30):
        p1.publish("t", b"%d" % i)
    for i in range(12):
        p2.publish("t", b"%d" % i)
    wait_until(
        lambda: p1.status()["outbox"] == 30 and p2.status()["outbox"] == 12,
        what="the backlogs stored",
    )
    for p in (p1, p2):  # (a heartbeat notes when a lane lost its last member)
        wait_until(
            lambda p=p: all(g["last_seen"] for g in p.groups()),
            what=f"the lanes' last members noted at {p.name}",
        )
    listed = _groups(p1.control_address, "t")
    rows = {r["group"]: r for r in listed["groups"]}
    assert listed["unreachable"] == []
    assert sorted(rows) == ["keep", "ops"]
    assert rows["ops"]["producers"] == 3  # (p1, p2, and cons: its own lanes)
    assert rows["ops"]["pending"] == 42 and rows["ops"]["members"] == []
    assert rows["ops"]["oldest_age_s"] >= 0 and rows["ops"]["last_seen_ago_s"] >= 0

    refused = run_cli(["group", "rm", "t", "ops", "-a", p2.control_address], stdin_data=b"n\n")
    assert refused.returncode == 1 and "nothing deleted" in refused.stderr
    done = run_cli(["group", "rm", "t", "ops", "-a", p2.control_address, "--yes"])
    assert done.returncode == 0, done.stderr
    # What each node dropped, summed: the node asked and each live peer it knows.
    assert "42 pending message(s) dropped (p2 12, " in done.stdout, done.stdout
    assert "p1 30" in done.stdout and "cons 0" in done.stdout
    for p in (p1, p2):
        wait_until(
            lambda p=p: [g["group"] for g in p.groups("t")] == ["keep"],
            what=f"ops gone at {p.name}",
        )
    assert [r["group"] for r in _groups(p1.control_address)["groups"]] == ["keep"]
    assert p1.stats()["dropped_group_deleted"] == 30
    table = run_cli(["group", "ls"], env={**os.environ, "ZMESH_SEED": p1.control_address})
    assert table.returncode == 0 and "keep" in table.stdout and "ops" not in table.stdout
    # An address where TOPIC goes (as status and dlq take it) is named as such.
    misplaced = run_cli(["group", "ls", p1.control_address])
    assert misplaced.returncode == 2
    assert "looks like a node's address, not a topic" in misplaced.stderr
    bad = run_cli(["group", "rm", "t", "bad group", "-a", p1.control_address, "--yes"])
    assert bad.returncode == 2 and "group name 'bad group' is invalid" in bad.stderr
    where = ["--topic", "a..b", "--group", "g"]
    dlq = run_cli(["dlq", "list", p1.control_address, *where])
    assert dlq.returncode == 2 and "topic name 'a..b' is invalid" in dlq.stderr


def test_fifty_runs_of_sub_without_a_group_leave_nothing_at_the_producer(make_node, mesh_name):
    """`zmesh sub TOPIC` (and `--mode broadcast`) without --group is ephemeral: fifty
    runs, each getting the message published while it ran, leave the producer's lanes
    and outbox as they were."""
    prod = make_node("prod")
    worker = make_node("worker", seeds=[prod.control_address])
    acked = worker.subscribe("t", group="g", handler=lambda msg: None)  # (acks each)
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"first").wait_acked(timeout=10)
    lanes, outbox = _lanes(prod), prod.status()["outbox"]
    assert lanes == ["g"] and outbox == 0
    node = [
        "--interface",
        "127.0.0.1",
        "--no-mdns",
        "--mesh",
        mesh_name,
        "--seed",
        prod.control_address,
    ]
    for batch in range(10):  # (five at a time)
        subs = [
            spawn(
                [
                    *CLI,
                    "sub",
                    "t",
                    *(["--mode", "broadcast"] if i % 2 else []),
                    *node,
                    "--json",
                    "--count",
                    "1",
                    "--timeout",
                    "60",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for i in range(5)
        ]
        try:
            wait_until(
                lambda: _ephemeral(prod) >= 5,
                timeout=30,
                what=f"five ephemeral subscriptions (batch {batch})",
            )
            receipt = prod.publish("t", b"run %d" % batch)
            for proc in subs:
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
                assert json.loads(out)["payload"] == f"run {batch}"
            receipt.wait_acked(timeout=10)
        finally:
            for proc in subs:
                reap(proc)
        wait_until(lambda: _ephemeral(prod) == 0, what="the subscribers gone")
    assert _lanes(prod) == lanes and prod.status()["outbox"] == outbox
    assert prod.stats()["sent_ephemeral"] == 50
    acked.close()


def _lanes(node) -> list[str]:
    return sorted(ln["lane"] for ln in node.status()["lanes"] if ln["lane"])


def _ephemeral(node) -> int:
    return sum(s[2] == "ephemeral" for p in node.peers() if p["alive"] for s in p["subscriptions"])
