"""How long one `zmesh pub` call takes, start to exit, with a consumer acking.

    python -m benchmarks.cli_pub [--calls 20] [--json PATH]

A hub (`zmesh node run`, loopback, no mDNS) is the seed; a `zmesh sub` of the topic acks
what comes. Each call is a new process that joins through the seed, publishes one
message once the consumer's hello came, waits for its ack and exits: interpreter start
and imports included, as a user sees it. Three ways to name the mesh: flags (--mesh,
--seed, --interface), environment variables (ZMESH_*) and a selected context. Printed
(median, p90, fastest, in seconds), never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "zmesh.cli"]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, *args],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found.group(0)
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited: {log.read_text()}")
        time.sleep(0.02)
    raise RuntimeError(f"no {pattern!r} in {log} within {timeout}s")


def _timed(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, timeout=120, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0 or b"acknowledged 1" not in done.stdout:
        raise RuntimeError(f"pub failed ({done.returncode}): {done.stderr.decode()}")
    return elapsed


def run(calls: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="zmesh-bench-pub-") as tmp:
        work = Path(tmp)
        mesh = f"bench-pub-{os.getpid()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZMESH_")}
        env["XDG_CONFIG_HOME"] = str(work / "config")
        (work / "hub.toml").write_text(
            f'[node]\nname = "hub"\nmesh = "{mesh}"\ndata_dir = "{work / "hub"}"\n'
            'interfaces = ["127.0.0.1"]\nmdns = false\n'
        )
        procs = [_start(["node", "run", str(work / "hub.toml")], env, work / "hub.log")]
        try:
            seed = _wait_for(work / "hub.log", r"127\.0\.0\.1:\d+", procs[0])
            flags = ["--mesh", mesh, "--seed", seed, "--interface", "127.0.0.1"]
            procs.append(_start(["sub", "t", "--group", "g", *flags], env, work / "sub.log"))
            _wait_for(work / "sub.log", "consuming t as g", procs[1])
            by_env = {**env, "ZMESH_MESH": mesh, "ZMESH_SEED": seed, "ZMESH_INTERFACE": "127.0.0.1"}
            subprocess.run(
                [*CLI, "context", "add", "bench", *flags, "--select"],
                env=env,
                check=True,
                capture_output=True,
            )
            ways = {
                "flags": (["pub", "t", "x", *flags], env),
                "env": (["pub", "t", "x"], by_env),
                "context": (["pub", "t", "x"], env),
            }
            times: dict[str, list[float]] = {way: [] for way in ways}
            for _ in range(calls):
                for way, (args, way_env) in ways.items():  # (interleaved)
                    times[way].append(_timed(args, way_env))
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(30)
    return {
        way: {
            "median_s": statistics.median(t),
            "p90_s": sorted(t)[int(0.9 * (len(t) - 1))],
            "fastest_s": min(t),
        }
        for way, t in times.items()
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.cli_pub", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--calls", type=int, default=20, help="pub calls per way")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    figures = run(args.calls)
    print(f"{'zmesh pub via':<14}{'median s':>10}{'p90 s':>10}{'fastest s':>11}")
    for way, f in figures.items():
        print(f"{way:<14}{f['median_s']:>10.3f}{f['p90_s']:>10.3f}{f['fastest_s']:>11.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"calls": args.calls, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
