"""Snapshot a running node's store and start a node from the copy."""

from __future__ import annotations

import pytest

import zmesh
from tests.conftest import run_module
from tests.integration.test_delivery import drain


def test_snapshot_while_running_and_restore(make_node, tmp_path):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    rs = [prod.publish("t", str(i).encode()) for i in range(100)]
    for r in rs:
        r.wait_stored(5)
    prod.snapshot(tmp_path / "snap-api")
    # From another process, beside the live node (as `zmesh snapshot` does).
    code, output = run_module(
        [
            "-c",
            "import sys, zmesh; zmesh.snapshot(sys.argv[1], sys.argv[2])",
            str(tmp_path / "prod"),
            str(tmp_path / "snap-fn"),
        ],
        30,
        cwd=str(tmp_path),
    )
    assert code == 0, output
    prod_id = prod.id
    prod.close()
    for snap in ("snap-api", "snap-fn"):
        restored = make_node(f"restored-{snap}", data_dir=str(tmp_path / snap))
        assert restored.id == prod_id
        assert restored.status()["outbox"] == 100
        cons = make_node(f"cons-{snap}", seeds=[restored.control_address])
        got = drain(cons.subscribe("t", group="g"), 100)
        assert sorted(int(m.payload) for m in got) == list(range(100))
        restored.close()
        cons.close()


def test_snapshot_refuses_a_non_empty_destination(make_node, tmp_path):
    prod = make_node("prod")
    (tmp_path / "dest" / "store").mkdir(parents=True)
    (tmp_path / "dest" / "store" / "x").write_text("x")
    with pytest.raises(zmesh.StoreError, match="not empty"):
        prod.snapshot(tmp_path / "dest")
    with pytest.raises(zmesh.StoreError, match="no zmesh store"):
        zmesh.snapshot(str(tmp_path / "nothing"), str(tmp_path / "d2"))
