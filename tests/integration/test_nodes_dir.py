"""Every reference node definition in nodes/ loads and starts, and together they work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zmesh
import zmesh.spark
from tests.conftest import wait_until
from zmesh.cli import roles
from zmesh.cli.noderun import build, read_definition
from zmesh.spark._client import BridgeClient
from zmesh.spark._runs import messages

NODES = Path(__file__).resolve().parents[2] / "nodes"
FILES = sorted(NODES.glob("*.toml"))


def local(
    path: Path, tmp_path: Path, mesh: str, **changes: object
) -> zmesh.Node | zmesh.spark.Bridge:
    """The definition as ``zmesh node run`` loads it, but on loopback, in this test's mesh,
    in a temp dir and (a bridge) on an ephemeral port."""
    node_cfg, bridge_table = read_definition(path)
    node_cfg = node_cfg.replace(
        mesh=mesh,
        data_dir=str(tmp_path / node_cfg.name),
        interfaces=("127.0.0.1",),
        heartbeat_interval_s=0.2,
        dead_after_s=1.5,
        **changes,
    )
    if bridge_table is not None:
        bridge_table = {
            **bridge_table,
            "bind": "tcp://127.0.0.1:*",
            "log_dir": str(tmp_path / f"{node_cfg.name}-log"),
        }
    return build(node_cfg, bridge_table, str(path))


def test_there_are_reference_roles():
    names = {p.stem for p in FILES}
    assert {"sensor", "aggregator", "relay", "spark-bridge"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_definition_loads_and_starts(path, tmp_path, mesh_name):
    started = local(path, tmp_path, mesh_name).start()
    node = started if isinstance(started, zmesh.Node) else started.node
    try:
        assert node.status()["node"]["name"] == node.name
    finally:
        started.close()


def test_the_reference_roles_work_together(tmp_path, mesh_name):
    """sensor -> aggregator and relay -> spark bridge, found over mDNS on loopback."""

    def aggregated() -> float:
        """Readings the aggregator handled in this process so far (its figures are the
        module's, kept across tests)."""
        return sum(s["count"] for s in roles.snapshot().values())

    before = aggregated()
    started = []
    try:
        for name in ("aggregator", "relay", "spark-bridge", "sensor"):
            started.append(local(NODES / f"{name}.toml", tmp_path, mesh_name, mdns=True).start())
        bridge = started[2]
        assert isinstance(bridge, zmesh.spark.Bridge)

        def logged() -> int:
            return sum(end for _head, end in bridge.streams().values())

        wait_until(
            lambda: logged() >= 3, 30, what="clean readings through the relay into the bridge's log"
        )
        with BridgeClient(bridge.endpoint) as client:
            stream, (head, end) = next(iter(client.info().items()))
            _first, runs = client.fetch(stream, head, end, 10)
        # A log record is a run of messages (zmesh.spark._runs).
        msgs = [m for start, record in runs for m in messages(start, record)]
        assert msgs and all("temp_k" in json.loads(m.payload) for m in msgs)
        wait_until(lambda: aggregated() > before, 10, what="readings in the aggregator's figures")
    finally:
        for runner in reversed(started):
            runner.close()


@pytest.mark.parametrize("role", ["aggregator", "relay"])
def test_the_reference_roles_dead_letter_what_is_not_a_reading(tmp_path, mesh_name, role):
    """A payload the aggregator (a handler) or the relay (a transform) cannot read would
    fail the same way at every delivery: it is parked with the reason, and the readings
    after it go on (aggregated; relayed, cleaned, to readings.clean)."""
    group = "aggregators" if role == "aggregator" else "relay"
    node = local(NODES / f"{role}.toml", tmp_path, mesh_name, mdns=False).start()
    assert isinstance(node, zmesh.Node)
    try:
        with zmesh.Node(
            "pub",
            mesh=mesh_name,
            data_dir=str(tmp_path / "pub"),
            interfaces=["127.0.0.1"],
            mdns=False,
            seeds=[node.control_address],
            heartbeat_interval_s=0.2,
        ) as producer:
            producer.topic("readings", groups=[group])
            before = roles.snapshot().get("dl-1", {}).get("count", 0)
            bad = [b"not json", b"[1]", b'{"sensor": "dl-1", "temp_c": "warm"}']
            if role == "aggregator":
                bad.append(b'{"temp_c": 1}')
            receipts = [producer.publish("readings", p, key="dl-1") for p in bad]
            good = b'{"sensor": "dl-1", "temp_c": 21.5}'
            receipts.append(producer.publish("readings", good, key="dl-1"))
            for receipt in receipts:
                receipt.wait_acked(timeout=30)
            parked = producer.dead_letters("readings", group)
            assert sorted(d.payload for d in parked) == sorted(bad)
            assert all(d.reason.startswith("not a reading (") for d in parked), parked
            if role == "aggregator":
                assert roles.snapshot()["dl-1"]["count"] == before + 1
            else:
                with producer.subscribe("readings.clean", group="spark") as sub:
                    msg = sub.get(timeout=30)
                    assert msg is not None and json.loads(msg.payload)["temp_k"] == 294.65
                    msg.ack()
    finally:
        node.close()
