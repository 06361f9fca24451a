"""Priorities: a backlog built while the group is offline drains most urgent first."""

from __future__ import annotations

import zmesh
from tests.integration.test_delivery import drain


def test_backlog_drains_most_urgent_first_even_after_kill(make_node, tmp_path):
    prod = make_node("prod", topics={"jobs": zmesh.TopicConfig(groups=("w",))})
    expected = []
    for i in range(60):
        prio = (7, 0, 3)[i % 3]
        prod.publish("jobs", f"{prio}:{i}".encode(), key=f"k{i % 10}", priority=prio)
        expected.append((prio, i))
    prod.publish("jobs", b"0:last", priority=0).wait_stored(5)
    prod.close()
    prod = make_node("prod", data_dir=str(tmp_path / "prod"))
    cons = make_node("cons", seeds=[prod.control_address])
    # One at a time, so arrival order is the producer's choice of order.
    sub = cons.subscribe("jobs", group="w", max_in_flight=1, batch_size=1)
    got = [m.payload.decode() for m in drain(sub, 61)]
    prios = [int(p.split(":")[0]) for p in got]
    assert prios == sorted(prios), f"not most urgent first: {prios}"
    assert sum(1 for p in prios if p == 0) == 21


def test_priorities_survive_kill_9_of_the_producer(tmp_path, mesh_name):
    from tests.conftest import kill_9_when, spawn, wait_until

    script = tmp_path / "p.py"
    script.write_text(
        "import sys, zmesh\n"
        "n = zmesh.Node('prod', mesh=sys.argv[1], data_dir=sys.argv[2], mdns=False,\n"
        "               interfaces=['127.0.0.1'],\n"
        "               topics={'jobs': zmesh.TopicConfig(groups=('w',))}).start()\n"
        "for i in range(30):\n"
        "    n.publish('jobs', str(i).encode(), priority=9 if i < 20 else 1)\n"
        "n.publish('jobs', b'done', priority=1).wait_stored(10)\n"
        "print('stored', flush=True)\n"
        "sys.stdin.read()\n"
    )
    import subprocess

    kill_9_when(
        spawn(
            [str(script), mesh_name, str(tmp_path / "prod")],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        ),
        "stored",
    )
    prod = zmesh.Node(
        "prod",
        mesh=mesh_name,
        data_dir=str(tmp_path / "prod"),
        mdns=False,
        interfaces=["127.0.0.1"],
    ).start()
    try:
        cons = zmesh.Node(
            "cons",
            mesh=mesh_name,
            data_dir=str(tmp_path / "c"),
            mdns=False,
            interfaces=["127.0.0.1"],
            seeds=[prod.control_address],
        ).start()
        try:
            sub = cons.subscribe("jobs", group="w", max_in_flight=1, batch_size=1)
            got = [m.payload for m in drain(sub, 31)]
            assert set(got[:11]) == {str(i).encode() for i in range(20, 30)} | {b"done"}
            wait_until(lambda: prod.status()["outbox"] == 0, what="drained")
        finally:
            cons.close()
    finally:
        prod.close()
