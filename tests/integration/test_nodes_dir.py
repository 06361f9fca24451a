"""Every reference node definition in nodes/ loads and starts, and together they work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zmesh
from tests.conftest import wait_until
from zmesh.cli import roles

NODES = Path(__file__).resolve().parents[2] / "nodes"
FILES = sorted(NODES.glob("*.toml"))


def local(path: Path, tmp_path: Path, mesh: str, **changes: object) -> zmesh.Node:
    """The definition as it is, but on loopback, in this test's mesh and a temp dir."""
    cfg = zmesh.NodeConfig.from_toml(path)
    cfg = cfg.replace(mesh=mesh, data_dir=str(tmp_path / cfg.name), interfaces=("127.0.0.1",),
                      heartbeat_interval_s=0.2, dead_after_s=1.5, **changes)
    return zmesh.Node(config=cfg)


def test_there_are_reference_roles():
    names = {p.stem for p in FILES}
    assert {"sensor", "aggregator", "relay"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_definition_loads_and_starts(path, tmp_path, mesh_name):
    node = local(path, tmp_path, mesh_name).start()
    try:
        assert node.status()["node"]["name"] == node.name
    finally:
        node.close()


def test_sensor_aggregator_relay_work_together(tmp_path, mesh_name):
    started = []
    try:
        for name in ("aggregator", "relay", "sensor"):
            extra = {"mdns": True}
            started.append(local(NODES / f"{name}.toml", tmp_path, mesh_name, **extra).start())
        agg, relay, sensor = started
        sink = zmesh.Node("sink", mesh=mesh_name, data_dir=str(tmp_path / "sink"),
                          interfaces=["127.0.0.1"], heartbeat_interval_s=0.2,
                          dead_after_s=1.5).start()
        started.append(sink)
        clean = sink.subscribe("readings.clean", group="spark")
        got = []

        def relayed() -> bool:
            for m in clean.fetch(100, timeout=0.05):
                got.append(json.loads(m.payload))
                m.ack()
            return len(got) >= 3
        wait_until(relayed, 30, what="clean readings through the relay (mDNS on loopback)")
        assert all("temp_k" in r for r in got)
        wait_until(lambda: roles.snapshot(), 10, what="the aggregator's figures")
    finally:
        for node in reversed(started):
            node.close()
