"""Discovery on loopback: mDNS bound to 127.0.0.1, seeds, gossip, liveness, restarts."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

from tests.conftest import read_line, reap, spawn, wait_members, wait_until


def peer_names(node) -> set[str]:
    return {p["name"] for p in node.peers() if p["alive"]}


def test_mdns_on_loopback_finds_peers_of_the_same_mesh(make_node, mesh_name):
    a = make_node("a", mdns=True)
    b = make_node("b", mdns=True)
    other = make_node("x", mdns=True, mesh=mesh_name + "-other")
    wait_until(
        lambda: peer_names(a) == {"b"} and peer_names(b) == {"a"},
        20,
        what="mDNS discovery of a and b",
    )
    sub = b.subscribe("t", group="g")
    wait_members(a, "t", "g", 1)
    a.publish("t", b"over mdns").wait_stored(5)
    msg = sub.get(timeout=10)
    assert msg is not None and msg.payload == b"over mdns"
    msg.ack()
    assert peer_names(other) == set()


def test_gossip_introduces_peers_learned_from_a_seed(make_node):
    hub = make_node("hub")
    a = make_node("a", seeds=[hub.control_address])
    b = make_node("b", seeds=[hub.control_address])
    wait_until(
        lambda: peer_names(a) == {"hub", "b"} and peer_names(b) == {"hub", "a"},
        what="a and b to meet through the hub",
    )


CONSUMER = textwrap.dedent("""
    import sys, zmesh
    mesh, data_dir, seed = sys.argv[1:4]
    node = zmesh.Node("cons", mesh=mesh, data_dir=data_dir, interfaces=["127.0.0.1"],
                      mdns=False, heartbeat_interval_s=0.2, dead_after_s=1.5, seeds=[seed])
    node.start()
    node.subscribe("t", group="g")
    print("ready", node.id, flush=True)
    sys.stdin.read()  # until the test closes the pipe (or ends)
    node.close()
""")


def start_consumer(mesh: str, data_dir: Path, seed: str) -> tuple[subprocess.Popen, str]:
    """A consumer node in a process of its own, and its node id once it is up."""
    proc = spawn(
        ["-c", CONSUMER, mesh, str(data_dir), seed],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = str(read_line(proc, 30))
        assert line.startswith("ready "), f"the consumer did not start: {line!r}"
        node_id = line.split()[1]
    except BaseException:
        reap(proc)
        raise
    return proc, node_id


def test_silent_peer_is_declared_dead_and_returns(make_node, tmp_path, mesh_name):
    prod = make_node("prod")

    def cons_info() -> list[dict]:
        return [p for p in prod.peers() if p["name"] == "cons"]

    proc, cons_id = start_consumer(mesh_name, tmp_path / "cons", prod.control_address)
    try:
        wait_members(prod, "t", "g", 1)
        # Stopped, it says nothing (no bye, connections kept open): only its silence for
        # dead_after_s tells the producer. A bye would have made it forget the peer; a
        # silent one is kept, marked dead.
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(
            lambda: [p["alive"] for p in cons_info()] == [False],
            what="cons declared dead by its silence",
        )
        wait_members(prod, "t", "g", 0)
    finally:
        reap(proc)  # (SIGKILL ends a stopped process too: a crash, never a bye)
    proc, back_id = start_consumer(mesh_name, tmp_path / "cons", prod.control_address)
    try:
        assert back_id == cons_id, "node id is stable across restarts"
        wait_members(prod, "t", "g", 1)
        wait_until(
            lambda: [(p["alive"], p["incarnation"]) for p in cons_info()] == [(True, 2)],
            what="cons back, in its second incarnation",
        )
    finally:
        reap(proc)


def test_a_peer_too_busy_to_answer_is_back_in_the_same_life(make_node, tmp_path, mesh_name):
    """Stopped long enough to be declared dead, then resumed: it hears it was declared
    dead, refutes, and is a member again in the same incarnation, with the sockets it had
    (no restart, no new peer)."""
    prod = make_node("prod")

    def cons_info() -> list[dict]:
        return [p for p in prod.peers() if p["name"] == "cons"]

    proc, _cons_id = start_consumer(mesh_name, tmp_path / "cons", prod.control_address)
    try:
        wait_members(prod, "t", "g", 1)
        assert [(p["state"], p["incarnation"]) for p in cons_info()] == [("alive", 1)]
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(
            lambda: [p["state"] for p in cons_info()] == ["dead"],
            what="cons declared dead while stopped",
        )
        wait_members(prod, "t", "g", 0)
        os.kill(proc.pid, signal.SIGCONT)
        wait_members(prod, "t", "g", 1)
        wait_until(
            lambda: [(p["state"], p["incarnation"]) for p in cons_info()] == [("alive", 1)],
            what="cons alive again in its first incarnation",
        )
        stats = prod.stats()
        assert stats.get("peers_back") == 1 and stats.get("peers_dead") == 1
    finally:
        reap(proc)


def test_an_open_mesh_of_zmesh_nodes_warns_of_no_failed_handshake(make_node, caplog):
    """Nodes meeting, leaving and coming back, and a connection cut during its handshake
    (what a node does to its contact of a peer it has just met another way, or a node
    killed while connecting): counted, never warned of as a stranger."""
    caplog.set_level(logging.WARNING, logger="zmesh._engine.listener")
    hub = make_node("hub")
    nodes = [make_node(f"n{i}", seeds=[hub.control_address]) for i in range(4)]
    everyone = {"hub", *(n.name for n in nodes)}

    def all_met() -> bool:
        return all(peer_names(n) == everyone - {n.name} for n in (hub, *nodes))

    wait_until(all_met, what="five nodes to meet through the hub")
    data_dir = nodes[0].config.data_dir
    nodes[0].close()
    wait_until(lambda: "n0" not in peer_names(hub), what="n0's goodbye")
    nodes[0] = make_node("n0", data_dir=data_dir, seeds=[hub.control_address])
    wait_until(all_met, what="n0 back")
    host, port = hub.control_address.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        pass  # (closed before ZMTP's greeting)
    wait_until(lambda: hub.stats().get("handshakes_cut", 0) >= 1, what="the cut counted")
    assert not [r for r in caplog.records if "failed handshakes" in r.getMessage()]
    assert all("handshakes_failed" not in n.stats() for n in (hub, *nodes))


def test_a_seed_that_cannot_work_is_said_at_warning(make_node, mesh_name, caplog):
    # A seed whose host does not resolve (.invalid never does), and a seed that is a node
    # of another mesh (said by that node, where its hello comes).
    caplog.set_level(logging.WARNING, logger="zmesh")
    other = make_node("other", mesh=f"{mesh_name}-other")
    make_node("n", seeds=["no-such-host.invalid:4000", other.control_address])
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "seed no-such-host.invalid:4000: host 'no-such-host.invalid' does not resolve" in m
        for m in said
    ), said
    wait_until(
        lambda: any(
            f"ignoring node n of mesh '{mesh_name}'" in r.getMessage()
            and r.levelno == logging.WARNING
            for r in caplog.records
        ),
        what="the other mesh's node saying it",
    )


def test_nodes_that_die_by_the_dozen_do_not_lock_out_new_ones(
    make_node, monkeypatch, mesh_name, tmp_path
):
    """A node keeps a peer that died without a goodbye (killed, crashed) for a while, in
    case it comes back. A worker that crash-loops with a new data dir each time (a new
    node id) once filled the table with the dead and locked out every new peer, its
    messages waiting; now the one dead the longest makes room (a table of 3 here, not
    256)."""
    from zmesh._engine import mesh as mesh_module

    monkeypatch.setattr(mesh_module, "MAX_PEERS", 3)
    hub = make_node("hub")
    sub = hub.subscribe("jobs", group="g")
    for i in range(5):
        name = f"run{i}"
        worker = spawn(
            [
                "-m",
                "tests.integration.mesh_worker",
                "--mesh",
                mesh_name,
                "--name",
                name,
                "--data-dir",
                str(tmp_path / name),
                "--seed",
                hub.control_address,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert str(read_line(worker)).startswith("addr ")
            wait_until(lambda n=name: n in peer_names(hub), what=f"{name} at the hub")
            worker.stdin.write("pub jobs 1\n")
            worker.stdin.flush()
            assert str(read_line(worker)).strip() == "published"
            got = sub.fetch(1, timeout=10)
            assert [m.payload for m in got] == [f"{name}:jobs:0".encode()]
            got[0].ack()
            worker.kill()  # (no goodbye)
            worker.wait(10)
        finally:
            reap(worker)
        wait_until(
            lambda n=name: any(p["name"] == n and p["state"] == "dead" for p in hub.peers()),
            what=f"{name} dead at the hub",
        )
    stats = hub.stats()
    assert "peers_refused" not in stats
    assert stats["dead_peers_forgotten_for_room"] == 2
    assert sorted(p["name"] for p in hub.peers()) == ["run2", "run3", "run4"]
