"""``zmesh top`` with its output on a pipe, as a real process against a real node."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import read_line, reap, spawn
from tests.integration.test_cli import ADDRESS_RE, CLI, Proc, hub_toml


def test_top_on_a_pipe_prints_each_refresh_as_it_comes(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    """`zmesh top | grep ...` sees each refresh when it is made (a live display only
    drew on a terminal, so a pipe got nothing until top was stopped), and top ends with
    141 once the reader is gone, as other commands do."""
    hub = Proc(tmp_path, "hub", ["node", "run", str(hub_toml(tmp_path, mesh_name))])
    procs.append(hub)
    address = hub.wait_for(ADDRESS_RE).group(1)
    top = spawn(
        [*CLI, "top", address, "--interval", "0.1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        heads = []
        while len(heads) < 2:  # (the first refresh and the next one)
            line = read_line(top, timeout=30)
            assert line, top.stderr.read() if top.poll() is not None else "stdout closed"
            if "refresh" in line.decode():
                heads.append(line.decode())
        assert "refresh 1 " in heads[0] and "refresh 2 " in heads[1], heads
        assert top.stdout is not None
        top.stdout.close()  # (the reader goes away)
        assert top.wait(timeout=30) == 141
    finally:
        reap(top)
