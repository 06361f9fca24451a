"""Node definitions: subscriptions with handlers from TOML, and the metrics endpoint."""

from __future__ import annotations

import textwrap
import urllib.request

import pytest

import zmesh
from tests.conftest import wait_members

RECEIVED: list[bytes] = []


def record(msg: zmesh.Message) -> None:
    """A handler named in a node definition."""
    RECEIVED.append(msg.payload)


def test_toml_subscription_with_handler_and_metrics(tmp_path, mesh_name, make_node):
    RECEIVED.clear()
    path = tmp_path / "worker.toml"
    path.write_text(
        textwrap.dedent(f"""
        [node]
        name = "worker"
        mesh = "{mesh_name}"
        data_dir = "{tmp_path / "worker"}"
        interfaces = ["127.0.0.1"]
        mdns = false
        metrics_address = "127.0.0.1:0"

        [subscriptions.orders]
        topic = "orders"
        group = "billing"
        handler = "tests.integration.test_node_definitions:record"
        concurrency = 2
    """)
    )
    prod = make_node("prod")
    worker = zmesh.Node.from_toml(path)
    worker.start()
    try:
        prod_seeded = make_node("prod2", seeds=[worker.control_address])
        wait_members(prod_seeded, "orders", "billing", 1)
        rs = [prod_seeded.publish("orders", f"o{i}".encode()) for i in range(20)]
        for r in rs:
            r.wait_acked(10)
        assert sorted(RECEIVED) == sorted(f"o{i}".encode() for i in range(20))
        body = (
            urllib.request.urlopen(f"http://{worker.metrics_address}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert 'zmesh_events_total{event="acked_local",mesh="' in body
        assert "zmesh_peers" in body and 'node="worker"' in body
    finally:
        worker.close()
    assert prod.peers() == []  # never seeded: only prod2 met the worker


@pytest.mark.parametrize(
    "table, match",
    [
        ('[subscriptions.x]\ntopic = "t"\ngroup = "g"\n', "needs handler"),
        ('[subscriptions.x]\ntopic = "t"\ngroup = "g"\nhandler = "nocolon"\n', "module:function"),
        (
            '[subscriptions.x]\ntopic = "t"\ngroup = "g"\nhandler = "no.such.mod:f"\n',
            "cannot import",
        ),
    ],
)
def test_bad_subscription_definitions(tmp_path, table, match):
    path = tmp_path / "n.toml"
    path.write_text(
        f'[node]\nname = "n"\ndata_dir = "{tmp_path / "n"}"\n'
        'interfaces = ["127.0.0.1"]\nmdns = false\n' + table
    )
    with pytest.raises(zmesh.ConfigError, match=match) as err:
        node = zmesh.Node.from_toml(path)
        node.start()
        node.close()  # (only if it started after all: it is not left running)
    if match != "cannot import":
        assert str(path) in str(err.value) and "subscriptions.x" in str(err.value)
    # A failed start leaves the data dir free for the next try.
    zmesh.Node("n2", data_dir=str(tmp_path / "n"), mdns=False).close()
