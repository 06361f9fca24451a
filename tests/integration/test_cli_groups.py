"""``zmesh group ls|rm`` as real processes against nodes on loopback: the groups of two
producers added up, and a group deleted at both while it has a backlog."""

from __future__ import annotations

import json

from tests.conftest import wait_members, wait_until
from tests.integration.test_cli import run_cli


def _groups(address: str, *topic: str) -> dict:
    done = run_cli(["group", "ls", address, *topic, "--json", "--timeout", "5"])
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
    wait_until(lambda: p1.status()["outbox"] == 30 and p2.status()["outbox"] == 12,
               what="the backlogs stored")
    for p in (p1, p2):  # (a heartbeat notes when a lane lost its last member)
        wait_until(lambda p=p: all(g["last_seen"] for g in p.groups()),
                   what=f"the lanes' last members noted at {p.name}")
    listed = _groups(p1.control_address, "t")
    rows = {r["group"]: r for r in listed["groups"]}
    assert listed["unreachable"] == []
    assert sorted(rows) == ["keep", "ops"]
    assert rows["ops"]["producers"] == 3  # (p1, p2, and cons: its own lanes)
    assert rows["ops"]["pending"] == 42 and rows["ops"]["members"] == []
    assert rows["ops"]["oldest_age_s"] >= 0 and rows["ops"]["last_seen_ago_s"] >= 0

    refused = run_cli(["group", "rm", p2.control_address, "t", "ops"], stdin_data=b"n\n")
    assert refused.returncode == 1 and "nothing deleted" in refused.stderr
    done = run_cli(["group", "rm", p2.control_address, "t", "ops", "--yes"])
    assert done.returncode == 0, done.stderr
    assert "12 pending message(s) dropped" in done.stdout
    for p in (p1, p2):
        wait_until(lambda p=p: [g["group"] for g in p.groups("t")] == ["keep"],
                   what=f"ops gone at {p.name}")
    assert [r["group"] for r in _groups(p1.control_address)["groups"]] == ["keep"]
    assert p1.stats()["dropped_group_deleted"] == 30
    table = run_cli(["group", "ls", p1.control_address])
    assert table.returncode == 0 and "keep" in table.stdout and "ops" not in table.stdout
