"""The benchmark suite runs end to end (quick mode), so it never rots.

Speed is not asserted: only that every scenario produced positive figures.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import SCENARIOS
from benchmarks.peer_servers import PEER_NAMES, PEERS, missing, server
from benchmarks.scen_peers import PEER_SCENARIOS
from benchmarks.sizes import QUICK
from tests.conftest import run_module

ROOT = Path(__file__).resolve().parents[2]


def test_a_child_reports_its_own_peak_rss_not_its_parents() -> None:
    # A parent of at least 96 MiB spawns a bare child: the child's peak is its own.
    held = bytearray(96 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    code = "from benchmarks._wio import rss_mb; print(rss_mb())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, check=True
    )
    assert 0 < float(out.stdout) < 64, out.stdout
    del held


@pytest.mark.timeout(240)
def test_quick_benchmark_run_reports_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code, text = run_module(
        ["-m", "benchmarks", "--quick", "--peers", "--json", str(out)], 210, str(ROOT)
    )
    assert code == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "quick"
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["libzmq"]
    assert doc["machine"]["python_speed_s_start"] > 0 < doc["machine"]["python_speed_s_end"]
    scenarios = doc["scenarios"]
    # Each peer ran, or was skipped with one line saying why (its server or client absent).
    ran, skipped = doc["peers"]["ran"], doc["peers"]["skipped"]
    assert sorted(ran + list(skipped)) == sorted(PEERS)
    for peer, reason in skipped.items():
        assert missing(peer) == reason
        assert f"skipped {PEER_NAMES[peer]}: {reason}" in text
    peer_names = {n for n, (peer, _fn) in PEER_SCENARIOS.items() if peer in ran}
    assert set(scenarios) == set(SCENARIOS) | peer_names, text[-2000:]
    for name, entry in scenarios.items():
        assert not entry["errors"], f"{name}: {entry['errors']}"
        assert entry["rate"] > 0, name
        assert entry["ratio"] is not None and entry["ratio"] > 0, name
        assert all(v > 0 for v in entry["median"]["rss_mb"].values()), name
        assert all(r["python_speed_s"] > 0 for r in entry["reps"]), name
    for name, entry in scenarios.items():  # (each process's CPU over its timed part)
        cpu = entry["median"]["cpu_us_per_msg"]
        # (a server's CPU is read in clock ticks: a quick run may take less than one)
        assert cpu and all(v > 0 for k, v in cpu.items() if k != "server"), name
    latencies = [n for n in scenarios if n.startswith("latency_")]
    for name in latencies:
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
    # The peers beside zmesh and raw pyzmq: every peer that ran has figures in the table.
    rows = doc["peers"]["rows"]
    for peer in ran:
        cells = [r["peers"][peer] for r in rows if peer in r["peers"]]
        assert len(cells) >= 3 and all(c["value"] > 0 for c in cells), peer
        assert PEER_NAMES[peer] in text
    for r in rows:
        assert r["raw"] is not None or r["zmesh"] is not None, r["row"]


def test_a_peer_whose_server_is_absent_is_skipped_saying_why(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ, "PATH": str(tmp_path)}  # (no nats-server nor redis-server on it)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--json", str(out)]
        + ["--only", "raw_pushpull_1", "nats_js_each", "redis_streams_each"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        timeout=120,
    )
    text = (proc.stdout + proc.stderr).decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    doc = json.loads(out.read_text())
    assert doc["peers"]["ran"] == [] and set(doc["peers"]["skipped"]) == {"nats", "redis"}
    assert list(doc["scenarios"]) == ["raw_pushpull_1"]
    for peer, binary in (("nats", "nats-server"), ("redis", "redis-server")):
        line = f"skipped {PEER_NAMES[peer]}: {binary} is not installed"
        assert sum(line in ln for ln in text.splitlines()) == 1, text[-3000:]


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net shows them) listening on TCP ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_peer_server_listens_on_loopback_and_is_stopped_by_pid(tmp_path: Path) -> None:
    with server("redis", tmp_path) as srv:
        assert srv is not None and srv.proc is not None
        pid, port = srv.proc.pid, srv.port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(16).startswith(b"+PONG")
        assert srv.rss_mb() > 0
        assert _listening(port) == {"0100007F"}  # (127.0.0.1, and no other address)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # (exited and reaped)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_benchmark_worker_rejects_unknown_roles() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", "nope", "{}"],
        cwd=str(ROOT),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert b"unknown role" in proc.stdout


def test_every_role_is_found_by_its_first_word() -> None:
    from benchmarks.worker import MODULES, _role

    for module in set(MODULES.values()):
        for name, run in importlib.import_module(f"benchmarks.{module}").ROLES.items():
            assert _role(name) is run


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
