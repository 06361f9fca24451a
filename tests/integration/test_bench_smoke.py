"""The benchmark suite runs end to end (quick mode), so it never rots.

Speed is not asserted: only that every scenario produced positive figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import SCENARIOS
from benchmarks.sizes import QUICK
from tests.conftest import run_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_quick_benchmark_run_reports_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code, text = run_module(["-m", "benchmarks", "--quick", "--json", str(out)], 150, str(ROOT))
    assert code == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "quick"
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["libzmq"]
    assert doc["machine"]["python_speed_s_start"] > 0 < doc["machine"]["python_speed_s_end"]
    scenarios = doc["scenarios"]
    assert set(scenarios) == set(SCENARIOS), text[-2000:]
    for name, entry in scenarios.items():
        assert not entry["errors"], f"{name}: {entry['errors']}"
        assert entry["rate"] > 0, name
        assert entry["ratio"] is not None and entry["ratio"] > 0, name
        assert all(v > 0 for v in entry["median"]["rss_mb"].values()), name
        assert all(r["python_speed_s"] > 0 for r in entry["reps"]), name
    for name, entry in scenarios.items():  # (each process's CPU over its timed part)
        cpu = entry["median"]["cpu_us_per_msg"]
        assert cpu and all(v > 0 for v in cpu.values()), name
    for name in ("latency_raw", "latency_raw_contract", "latency_zmesh_process"):
        assert scenarios[name]["median"]["p50_ms"] > 0
        assert scenarios[name]["median"]["p99_ms"] >= scenarios[name]["median"]["p50_ms"]
        # The warm-up's latencies are left out on both sides: one sample per timed message.
        assert scenarios[name]["median"]["samples"] == QUICK.latency_s * QUICK.latency_rate
    restart = scenarios["restart_first_message"]["median"]
    assert restart["first_message_s"] > 0
    # Delivered within the window, the backlog's rate is its own, not backlog / window.
    assert restart["rate"] != QUICK.restart / QUICK.restart_window_s
    assert len(scenarios["fanout_4_groups"]["median"]["group_rates"]) == 4
    assert {t["scenario"] for t in doc["targets"]} <= set(SCENARIOS)
    assert all(t["met"] in (True, False) for t in doc["targets"])
    assert "msgs/s" in text


def test_benchmark_worker_rejects_unknown_roles() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", "nope", "{}"],
        cwd=str(ROOT),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert b"unknown role" in proc.stdout


@pytest.mark.timeout(120)
def test_contract_floor_commits_each_message_before_it_is_sent(tmp_path: Path) -> None:
    import lmdb

    from benchmarks.scen_raw import latency_raw_contract

    out = latency_raw_contract(tmp_path, QUICK)
    timed = int(QUICK.latency_s * QUICK.latency_rate)
    assert out["samples"] == timed and 0 < out["p50_ms"] <= out["p99_ms"]
    env = lmdb.open(str(tmp_path / "raw-contract-outbox"), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            stored = [int.from_bytes(k, "big") for k, _ in txn.cursor()]
    finally:
        env.close()
    # One record per message, warm-up included, in the order they were handed over.
    assert stored == list(range(QUICK.latency_warmup + timed))


def test_a_socket_owning_thread_that_fails_fails_its_worker() -> None:
    import threading

    from benchmarks.raw_roles import _owning

    def broken(stop: threading.Event) -> None:
        raise OSError("the socket's thread broke")

    with (
        pytest.raises(RuntimeError, match="raw-test-io failed") as err,
        _owning("raw-test-io", broken),
    ):
        pass
    assert isinstance(err.value.__cause__, OSError)
    assert "raw-test-io" not in {t.name for t in threading.enumerate()}
