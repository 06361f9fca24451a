"""Child processes running ``tests.integration.mesh_worker``: one node each, driven by
one command per line on its stdin (see mesh_worker.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import read_line, reap, spawn, wait_until


class Worker:
    """One worker process: its node's control address, and a command per call."""

    def __init__(
        self,
        name: str,
        mesh: str,
        data_dir: Path,
        seeds: list[str] = (),  # type: ignore[assignment]
        keep_last: dict[str, int] | None = None,
    ) -> None:
        args = ["-m", "tests.integration.mesh_worker"]
        args += ["--mesh", mesh, "--data-dir", str(data_dir), "--name", name]
        for seed in seeds:
            args += ["--seed", seed]
        for pattern, n in (keep_last or {}).items():
            args += ["--keep-last", f"{pattern}={n}"]
        self.name = name
        self.popen = spawn(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        first = str(read_line(self.popen)).split()
        assert first[0] == "addr", first
        self.address = first[1]

    def ask(self, command: str, timeout: float = 60.0) -> str:
        """Send a command; its one line of answer."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()
        return str(read_line(self.popen, timeout)).strip()

    def json(self, command: str) -> Any:
        return json.loads(self.ask(command))

    def sees(self, name: str, topic: str) -> bool:
        """Whether this node has the live peer ``name`` subscribing ``topic``."""
        return any(
            p["name"] == name and any(s[0] == topic for s in p["subscriptions"])
            for p in self.json("peers")
        )

    def wait_sees(self, name: str, topic: str) -> None:
        wait_until(lambda: self.sees(name, topic), 20, what=f"{self.name} to see {name} on {topic}")

    def quit(self) -> None:
        """Close the node cleanly and wait for the process to end."""
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.write("quit\n")
            self.popen.stdin.flush()
            self.popen.wait(30)
        finally:
            reap(self.popen)

    def kill(self) -> None:
        """kill -9."""
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)
        reap(self.popen)
