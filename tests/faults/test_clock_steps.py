"""Steps of the wall clock under a running node and across a restart, in real processes:
libfaketime (preloaded into clock_worker.py) steps the worker's ``time.time()`` by
hours, days or years while its monotonic clock goes on, as NTP does to a board that
booted with a stale clock. Nothing owed is dropped, no duplicate passes the publish-id
window, retained history stays, and each step is counted (``clock_steps``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import libfaketime  # (the dev extra installs it)
import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "faults" / "clock_worker.py"


def run_worker(scenario: str, data_dir: Path, mesh: str, step: str, clock: Path) -> dict:
    """Run one scenario of the worker with its wall clock read from ``clock``; its JSON."""
    _reload, preload = libfaketime.get_reload_information()
    env = {
        **os.environ,
        **preload,
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, str(WORKER), scenario, "--mesh", mesh, "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [*argv, f"--step={step}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.splitlines()[-1])


@pytest.fixture
def clock(tmp_path: Path) -> Path:
    path = tmp_path / "faketime"
    path.write_text("+0\n")
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("step", ["+30d", "-3650d"])
def test_a_step_keeps_what_an_idle_group_is_owed(
    tmp_path: Path, mesh_name: str, clock: Path, step: str
) -> None:
    found = run_worker("expiry", tmp_path / "p", mesh_name, step, clock)
    assert found["steps"] == 1
    assert found["received"] == 5, found
    assert "groups_expired" not in found["counters"]


@pytest.mark.timeout(120)
def test_a_step_forward_keeps_the_publish_id_window(
    tmp_path: Path, mesh_name: str, clock: Path
) -> None:
    found = run_worker("ids", tmp_path / "p", mesh_name, "+2d", clock)
    assert found["steps"] == 1
    assert found["counters"]["published"] == 1, found
    assert found["counters"]["duplicates_suppressed"] == 1


@pytest.mark.timeout(120)
def test_a_step_forward_keeps_retained_messages(
    tmp_path: Path, mesh_name: str, clock: Path
) -> None:
    found = run_worker("retention", tmp_path / "p", mesh_name, "+1d", clock)
    assert found["steps"] == 1
    assert found["kept"] == 3, found


@pytest.mark.timeout(120)
def test_a_step_while_the_node_was_stopped_keeps_what_an_idle_group_is_owed(
    tmp_path: Path, mesh_name: str, clock: Path
) -> None:
    run_worker("owe", tmp_path / "p", mesh_name, "+0", clock)
    found = run_worker("reopen", tmp_path / "p", mesh_name, "+30d", clock)
    assert found["steps"] == 1  # (the same boot: the monotonic clock went on)
    assert found["received"] == 5, found
    assert "groups_expired" not in found["counters"]
