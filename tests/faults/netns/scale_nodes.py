"""Worker processes of the scale runs (scale.py, spread.py) on namespace hosts, and what
they write: their info, their views of the mesh, their counters, their CPU and memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

from tests.waiting import until

from .hosts import Host, HostNet
from .node_worker import node_args

WORKER = str(Path(__file__).with_name("scale_worker.py"))
START_S_PER_NODE = 1.5  # Python nodes start at about 0.5 s each on two busy cores
EXIT_TIMEOUT_S = 20.0
TICKS = os.sysconf("SC_CLK_TCK")


def transitions(path: Path) -> list[tuple[float, str, str]]:
    """A node's view changes: (time, peer id, state)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), parts[1], parts[2]))
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Nodes:
    """Worker processes on the hosts of a ``HostNet``, and what they write."""

    def __init__(self, bed: HostNet, root: Path, *, mdns: bool = True) -> None:
        self.bed = bed
        self.root = root
        self.run_dir = root / "run"
        self.run_dir.mkdir(exist_ok=True)
        self.mesh = f"scale-{uuid.uuid4().hex[:12]}"
        self.mdns = mdns
        self.procs: dict[str, subprocess.Popen] = {}
        self.hosts: dict[str, Host] = {}
        self.roles: dict[str, list[str]] = {}
        self._starts: Counter[str] = Counter()

    def spawn(self, name: str, host: Host, role: list[str], seeds: list[str] = ()) -> None:
        (self.run_dir / f"{name}.info.json").unlink(missing_ok=True)
        args = [
            WORKER,
            *role[:1],
            *node_args(name, self.mesh, self.root, host.addr, self.run_dir),
            *role[1:],
        ]
        for seed in seeds:
            args += ["--seed", seed]
        if not self.mdns:
            args.append("--no-mdns")
        out = self.root / f"{name}.{self._starts[name]}.out"
        self._starts[name] += 1
        with open(out, "wb") as f:
            self.procs[name] = self.bed.spawn(host, args, f)
        self.hosts[name] = host
        self.roles[name] = role

    def info(self, name: str) -> dict | None:
        try:
            return json.loads((self.run_dir / f"{name}.info.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def check_running(self, *names: str) -> None:
        for name in names or list(self.procs):
            rc = self.procs[name].poll()
            if rc is not None:
                raise RuntimeError(f"{name} exited with {rc}:\n{self.output(name)}")

    def output(self, name: str) -> str:
        outs = sorted(self.root.glob(f"{name}.*.out"))
        return outs[-1].read_text(errors="replace")[-3000:] if outs else ""

    def wait_started(self, names: list[str], timeout: float) -> dict[str, dict]:
        def up() -> bool:
            self.check_running(*names)
            return all(self.info(n) is not None for n in names)

        if not until(up, timeout, 0.2):
            missing = [n for n in names if self.info(n) is None]
            raise TimeoutError(f"{len(missing)} nodes did not start in {timeout:g}s: {missing}")
        return {n: self.info(n) for n in names}  # type: ignore[misc]

    def view(self, name: str) -> dict[str, str]:
        """``name``'s latest view: peer id -> state."""
        state: dict[str, str] = {}
        for _t, pid, s in transitions(self.run_dir / f"{name}.peers"):
            state[pid] = s
        return state

    def status(self, name: str) -> dict | None:
        """``name``'s latest status (a producer writes it)."""
        try:
            return json.loads((self.run_dir / f"{name}.status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def log(self, name: str) -> list[tuple[float, str, str]]:
        return transitions(self.run_dir / f"{name}.peers")

    def stats(self, name: str) -> dict[str, int]:
        try:
            return json.loads((self.run_dir / f"{name}.stats.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def kill9(self, name: str) -> float:
        proc = self.procs[name]
        at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_TIMEOUT_S)
        return at

    def terminate(self, names: list[str]) -> list[str]:
        """SIGTERM ``names``; the ones that did not exit 0 in time."""
        for name in names:
            if self.procs[name].poll() is None:
                os.kill(self.procs[name].pid, signal.SIGTERM)
        bad = []
        for name in names:
            try:
                rc = self.procs[name].wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                rc = None
            if rc not in (0, -signal.SIGKILL):
                bad.append(f"{name} (rc {rc})")
        return bad
