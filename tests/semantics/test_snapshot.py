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


def test_snapshot_of_a_data_dir_open_in_this_process(make_node, tmp_path):
    """zmesh.snapshot of a data dir whose node runs in this process copies through that
    node's open store (LMDB cannot open it a second time in one process)."""
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    for r in [prod.publish("t", str(i).encode()) for i in range(10)]:
        r.wait_stored(5)
    zmesh.snapshot(str(tmp_path / "prod"), str(tmp_path / "snap"))
    prod_id = prod.id
    prod.close()
    restored = make_node("restored", data_dir=str(tmp_path / "snap"))
    assert restored.id == prod_id
    assert restored.status()["outbox"] == 10
    restored.close()
    zmesh.snapshot(str(tmp_path / "snap"), str(tmp_path / "again"))  # (closed: opened anew)


@pytest.mark.parametrize("dest", [None, 5, 3.5, b"dest", ""])
def test_snapshot_refuses_what_is_no_path_and_makes_nothing(make_node, tmp_path, monkeypatch, dest):
    monkeypatch.chdir(tmp_path)
    prod = make_node("prod")
    made = set(tmp_path.iterdir())
    with pytest.raises(zmesh.ArgumentError, match=r"dest must be a path .*, got "):
        prod.snapshot(dest)
    with pytest.raises(zmesh.ArgumentError, match=r"dest must be a path .*, got "):
        zmesh.snapshot(str(tmp_path / "prod"), dest)
    with pytest.raises(zmesh.ArgumentError, match=r"data_dir must be a path .*, got "):
        zmesh.snapshot(dest, str(tmp_path / "d2"))  # type: ignore[arg-type]
    assert set(tmp_path.iterdir()) == made


def test_snapshot_of_a_closed_node_is_node_closed_error(make_node, tmp_path):
    prod = make_node("prod")
    prod.close()
    with pytest.raises(zmesh.NodeClosedError):
        prod.snapshot(tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
