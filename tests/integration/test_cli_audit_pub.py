"""``zmesh pub`` when it cannot publish everything it was given, and a command started
with its stdout closed, in real processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import reap, wait_until
from tests.integration.test_cli import ADDRESS_RE, CLI, LOOP, Proc, hub_toml, run_cli


@pytest.fixture
def seed(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> str:
    """A hub (`zmesh node run`) whose control address the other commands seed from."""
    proc = Proc(tmp_path, "hub", ["node", "run", str(hub_toml(tmp_path, mesh_name))])
    procs.append(proc)
    return proc.wait_for(ADDRESS_RE).group(1)


def test_pub_stdin_line_too_large_settles_the_lines_before_it(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc]
) -> None:
    """A line of stdin larger than --max-message-bytes ends the run: the lines before it,
    published already, are waited for and reported (not dropped with the temporary data
    dir unacknowledged, the run saying nothing of them), and the run fails as bad input."""
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = Proc(
        tmp_path, "sub", ["sub", "t", "--group", "g", *node, "--count", "2", "--timeout", "60"]
    )
    procs.append(sub)
    sub.wait_for("consuming t as g", stream="stderr")
    pub = run_cli(
        ["pub", "t", *node, "--timeout", "60", "--max-message-bytes", "64"],
        stdin_data=b"first\nsecond\n" + b"x" * 100 + b"\nlast\n",
        timeout=90,
    )
    assert pub.returncode == 2, pub.stderr
    assert "published 2, acknowledged 2 (topic t)" in pub.stdout, pub.stderr
    said = " ".join(pub.stderr.split())
    assert "message 3 was not published: payload of 100 bytes exceeds" in said, said
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert sub.stdout().split() == ["first", "second"]


def test_node_run_with_stdout_closed_runs_until_stopped(tmp_path: Path, mesh_name: str) -> None:
    """`zmesh node run FILE >&-` (a supervisor that closes stdout) runs its node until
    SIGTERM, its control line written nowhere (as stdin closed reads as empty), where
    it ended with a traceback right after its node started."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    err = tmp_path / "hub.err"
    with err.open("wb") as err_file:
        proc = subprocess.Popen(
            ["sh", "-c", 'exec "$0" "$@" >&-', sys.executable, *CLI, "node", "run"]
            + [str(hub_toml(tmp_path, mesh_name))],
            stdin=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
        )
    try:
        # (said as the node starts, its stop signals handled by then)
        wait_until(
            lambda: "is open" in err.read_text() or proc.poll() is not None,
            60,
            what="the node to start",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, err.read_text()
    finally:
        reap(proc)
    said = err.read_text()
    assert "node hub: closed" in said and "Traceback" not in said, said
