"""Permissions at their edges, with real nodes: a group deletion a peer announces needs
its key to hold the admin right ``group``; a key the ACL names is revoked when its .pub
is taken out; a permission taken away while its peer is dead stays away when it is back."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import read_line, reap, spawn, wait_members, wait_until
from tests.faults.test_acl import node_kw as secured
from tests.waiting import pause
from zmesh._security import generate_keypair


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    d = tmp_path / "trusted"
    for name in ("prod", "cons", "ops"):
        generate_keypair(d, name)
    return d


def test_a_peer_without_the_group_right_cannot_delete_a_group(make_node, keys, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="zmesh._engine.guard")
    acl = tmp_path / "acl.toml"
    acl.write_text(
        '[[allow]]\nwho = ["cons"]\nsubscribe = ["t"]\n\n'
        '[[allow]]\nwho = ["ops"]\nadmin = ["group"]\n'
    )
    prod = make_node("prod", **secured(keys, "prod", acl))
    prod.topic("t", groups=["audit"])
    cons = make_node("cons", seeds=[prod.control_address], **secured(keys, "cons"))
    cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    for i in range(5):
        prod.publish("t", b"%d" % i).wait_stored(5)
    # A key that may only consume "t" told the producer to delete the group "audit": the
    # producer dropped the 5 messages it owed it.
    assert cons.delete_group("t", "audit")["peers_told"] == 1
    wait_until(lambda: prod.stats().get("acl_denied", 0) >= 1, what="the deletion refused")
    pause(0.5)  # (what would have been dropped by now, had it been let through)
    assert prod.stats().get("dropped_group_deleted", 0) == 0
    owed = {ln["lane"]: ln["pending"] for ln in prod.status()["lanes"] if ln["topic"] == "t"}
    assert owed["audit"] == 5
    assert "may not use the admin right group" in caplog.text
    # A key that holds the right still deletes it everywhere.
    ops = make_node("ops", seeds=[prod.control_address], **secured(keys, "ops"))
    wait_until(lambda: any(p["id"] == ops.id for p in prod.status()["peers"]), what="ops met")
    ops.delete_group("t", "audit")
    wait_until(lambda: prod.stats().get("dropped_group_deleted", 0) == 5, what="audit deleted")


def test_a_key_the_acl_names_is_revoked_when_its_pub_is_taken_out(
    make_node, keys, tmp_path, caplog
):
    # The ACL names the key by its .pub: taking the .pub out (how a key is revoked) made
    # the ACL fail to load, and the whole reload was refused, the key still trusted.
    caplog.set_level(logging.ERROR, logger="zmesh._engine.guard")
    acl = tmp_path / "acl.toml"
    acl.write_text('[[allow]]\nwho = ["cons"]\nsubscribe = ["t"]\n')
    prod = make_node("prod", **secured(keys, "prod", acl))
    cons = make_node("cons", seeds=[prod.control_address], **secured(keys, "cons"))
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    (keys / "cons.pub").unlink()
    wait_until(
        lambda: all(p["id"] != cons.id for p in prod.status()["peers"]),
        what="cons revoked at the producer",
    )
    assert "the ACL file in force stays" in caplog.text and "'cons' is neither" in caplog.text
    prod.publish("t", b"after")
    pause(1.0)  # (what would have come by now, had it been let through)
    assert sub.fetch(10, timeout=0.05) == []


CONSUMER = textwrap.dedent("""
    import sys, zmesh
    mesh, data_dir, seed, key, trusted = sys.argv[1:6]
    node = zmesh.Node("cons", mesh=mesh, data_dir=data_dir, interfaces=["127.0.0.1"],
                      mdns=False, heartbeat_interval_s=0.2, dead_after_s=1.5, seeds=[seed],
                      secret_key_file=key, trusted_keys_dir=trusted)
    node.start()
    node.subscribe("t", group="g")
    print("ready", node.id, flush=True)
    sys.stdin.read()  # until the test closes the pipe (or ends)
    node.close()
""")


def test_a_permission_taken_away_while_its_peer_is_dead_stays_away_when_it_is_back(
    make_node, keys, tmp_path, mesh_name, caplog
):
    # A dead peer's subscriptions were kept as its last hello had them under the old ACL,
    # and applied again when it was back: the producer sent it the backlog of a topic it
    # may no longer consume, until its next hello.
    acl = tmp_path / "acl.toml"
    caplog.set_level(logging.WARNING, logger="zmesh._engine.guard")
    acl.write_text('[[allow]]\nwho = ["cons"]\nsubscribe = ["t"]\n')
    prod = make_node("prod", **secured(keys, "prod", acl))
    proc = spawn(
        [
            "-c",
            CONSUMER,
            mesh_name,
            str(tmp_path / "cons"),
            prod.control_address,
            str(keys / "cons.key"),
            str(keys),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert str(read_line(proc, 30)).startswith("ready ")
        wait_members(prod, "t", "g", 1)

        def cons_state() -> list[str]:
            return [p["state"] for p in prod.peers() if p["name"] == "cons"]

        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: cons_state() == ["dead"], what="cons dead while stopped")
        acl.write_text('[[allow]]\nwho = ["cons"]\nsubscribe = ["other"]\n')
        wait_until(lambda: "reloaded the trusted keys" in caplog.text, what="the new ACL read")
        for i in range(20):
            prod.publish("t", b"%d" % i).wait_stored(5)  # (owed to the group g)
        sent = prod.stats().get("sent", 0)
        os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: cons_state() == ["alive"], what="cons back in the same life")
        pause(1.0)  # (its hellos since, and what would have been sent it by now)
        assert prod.stats().get("sent", 0) == sent
        assert [ln["members"] for ln in prod.status()["lanes"] if ln["topic"] == "t"] == [[]]
    finally:
        reap(proc)
