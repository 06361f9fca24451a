"""What the benchmark ran on: CPU, memory, kernel and the versions that matter."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROBE_ADDITIONS = 1_000_000


def python_speed() -> float:
    """Seconds this interpreter takes for a loop of a million additions, now: how fast the
    host runs Python at this moment. A shared or throttled host can run it at half its
    usual speed for minutes, which moves every Python-heavy figure and ratio with it."""
    t0 = time.perf_counter()
    total = 0
    for i in range(PROBE_ADDITIONS):
        total += i
    return round(time.perf_counter() - t0, 4)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=10, cwd=ROOT
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) // 1024
    except OSError:
        pass
    return out


def describe() -> dict[str, Any]:
    """A JSON-able description of this machine and software stack."""
    import lmdb
    import msgpack
    import zmq

    import zmesh

    lscpu = _run(["lscpu"])
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    mem = _meminfo()
    commit = _run(["git", "rev-parse", "--short", "HEAD"])
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))
    return {
        "cpu_model": fields.get("Model name", platform.processor()).strip(),
        "cpus": os.cpu_count(),
        "memory_total_mb": mem.get("MemTotal"),
        "memory_available_mb": mem.get("MemAvailable"),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "lmdb_binding": lmdb.__version__,
        "lmdb_library": ".".join(map(str, lmdb.version())),
        "msgpack": ".".join(map(str, msgpack.version)),
        "zmesh": zmesh.__version__,
        "git_commit": commit + ("+dirty" if dirty else ""),
        "lscpu": lscpu,
    }


def markdown(desc: dict[str, Any]) -> str:
    keys = [k for k in desc if k != "lscpu"]
    lines = [
        "# Machine of the committed benchmark run",
        "",
        "Every process of a scenario runs on this one machine over TCP loopback. "
        "`load_average_start` / `load_average_end` show how busy the machine was "
        "with other work: above the CPU count, the figures are depressed and noisier. "
        "`python_speed_s_start` / `_end` are the seconds a loop of a million additions "
        "took then (`machine.python_speed`; `python_speed_s` in each repetition of "
        "results.json is the same, taken just before it): a reading well above the "
        "machine's usual one means the host ran Python slower than it can.",
        "",
        "| what | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {desc[k]} |" for k in keys]
    lines += ["", "## lscpu", "", "```", desc.get("lscpu", ""), "```", ""]
    return "\n".join(lines)
