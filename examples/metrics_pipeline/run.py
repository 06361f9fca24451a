"""The metrics pipeline on one machine, in one command:

    python examples/metrics_pipeline/run.py

A Spark bridge node (in this process) joins group ``spark`` on ``metrics``; a pager
(alerts_consumer.py) joins group ``pager`` on ``alerts``; edge sensors (sensors.py)
publish readings; then the Spark job (job.py, on local[*]) turns the bridge's log into
windowed aggregates in Parquet and publishes alerts, which the pager prints. Everything
binds to 127.0.0.1 and finds its peers by seed, without multicast.

The workdir keeps the data dirs of the bridge and the pager from run to run; the rest
(the bridge's log, the job's checkpoint and windows, the sensors, each child's stderr in
logs/) is made anew. run.py takes only a new or empty workdir, or one of its own, and
refuses one that another run is using.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import zmesh
import zmesh.spark

HERE = Path(__file__).resolve().parent
MARKER = ".metrics_pipeline"  # in a workdir of run.py's, which it may empty again
FRESH = ("bridge-log", "checkpoint", "windows", "sensors", "logs")  # made anew each run
STOP: list[int] = []  # the signal (SIGINT or SIGTERM) that asked run.py to stop


def stop(signum: int, _frame: object) -> None:
    # Noted, not raised: raised while a child is being started, it would orphan the child.
    STOP.append(signum)


class Child:
    """One of the pipeline's scripts as a process of its own, its stderr in logs/."""

    def __init__(self, script: str, args: list[str], work: Path) -> None:
        self.script = script
        self.stderr = work / "logs" / f"{Path(script).stem}.err"
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONUNBUFFERED": "1",
        }
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / script), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # (Ctrl-C reaches run.py only, which stops them)
            )

    def check(self, serves: bool = False) -> bool:
        """True once it exited with code 0; a child that failed (or ended at all, when it
        ``serves`` until stopped) ends run.py with its exit code and stderr."""
        code = self.proc.poll()
        if code is None or (code == 0 and not serves):
            return code == 0
        lines = self.stderr.read_text(errors="replace").splitlines()[-5:]
        tail = "".join(f"\n  {line}" for line in lines)
        raise SystemExit(f"run.py: {self.script} exited with code {code}{tail}")


def wait(done: Callable[[], bool], pager: Child, timeout: float, what: str) -> None:
    """Wait until ``done()``, for ``timeout`` seconds at most, while the pager runs."""
    deadline = time.monotonic() + timeout
    while not done():
        if STOP:
            print(f"run.py: stopped by {signal.Signals(STOP[0]).name}", file=sys.stderr)
            raise SystemExit(128 + STOP[0])
        pager.check(serves=True)
        if time.monotonic() > deadline:
            raise SystemExit(f"run.py: {what} within {timeout:g}s")
        time.sleep(0.1)


def stop_children(children: list[Child]) -> None:
    """Stop each child still running by its pid: SIGTERM to all, SIGKILL after 30 s."""
    running = [c.proc for c in children if c.proc.poll() is None]
    for proc in running:
        proc.terminate()
    for proc in running:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def claim(work: Path) -> None:
    """Make ``work`` run.py's workdir; a directory with other things in it is refused."""
    theirs = work.exists() and not (work / MARKER).exists()
    if theirs and (work.is_file() or any(work.iterdir())):
        print(
            f"run.py: --workdir {work} is not empty and not run.py's; give a new or empty "
            "directory",
            file=sys.stderr,
        )
        raise SystemExit(2)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text(
        "A workdir of examples/metrics_pipeline/run.py, which makes these anew on each "
        f"run: {', '.join(FRESH)}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="var/metrics_pipeline")
    parser.add_argument("--sensors", type=int, default=3)
    parser.add_argument("--readings", type=int, default=60, help="per sensor")
    parser.add_argument("--threshold", type=float, default=75.0)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    work = Path(args.workdir).resolve()
    claim(work)
    mesh = f"metrics-{uuid.uuid4().hex[:8]}"
    # The bridge node locks its data dir: a second run of this workdir stops here
    # (DataDirLockedError), before anything is deleted.
    with zmesh.Node(
        "spark-bridge", mesh=mesh, data_dir=work / "bridge", interfaces=["127.0.0.1"], mdns=False
    ) as node:
        for name in FRESH:
            shutil.rmtree(work / name, ignore_errors=True)
        (work / "logs").mkdir()
        node.topic("alerts", groups=["pager"])  # alerts wait for the pager, however late
        with zmesh.spark.Bridge(node, topics=["metrics"], log_dir=work / "bridge-log") as bridge:
            print(
                f"bridge up: node {node.control_address}, log served at {bridge.endpoint}",
                flush=True,
            )
            peers = ["--mesh", mesh, "--seed", node.control_address]
            peers += ["--interface", "127.0.0.1", "--no-mdns"]
            pager = Child("alerts_consumer.py", [*peers, "--data-dir", str(work / "pager")], work)
            children = [pager]
            try:
                wait(
                    lambda: any(g["members"] for g in node.groups("alerts")),
                    pager,
                    60,
                    "the pager did not join",
                )
                sensors = Child(
                    "sensors.py",
                    [*peers, "--sensors", str(args.sensors), "--readings", str(args.readings)]
                    + ["--data-dir", str(work / "sensors")],
                    work,
                )
                children.append(sensors)
                wait(sensors.check, pager, args.timeout, "sensors.py did not finish")
                logged = sum(end for _head, end in bridge.streams().values())
                print(f"bridge: {logged} readings logged", flush=True)
                job = Child(
                    "job.py",
                    ["--endpoint", bridge.endpoint, "--bridge-log", str(work / "bridge-log")]
                    + ["--out", str(work / "windows"), "--checkpoint", str(work / "checkpoint")]
                    + ["--threshold", str(args.threshold), "--master", args.master],
                    work,
                )
                children.append(job)
                wait(job.check, pager, args.timeout, "job.py did not finish")
                # The pager acks each alert it printed.
                wait(
                    lambda: not node.status()["outbox"],
                    pager,
                    60,
                    "the pager did not acknowledge every alert",
                )
            finally:
                stop_children(children)
            alerts = bridge.stats().get("published", 0)
    print(f"pipeline done: {alerts} alerts published, windows in {work / 'windows'}", flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        main()
    except zmesh.DataDirLockedError as exc:  # the bridge's: another run uses the workdir
        holder = exc.holder_pid or "?"
        raise SystemExit(
            f"run.py: another run (pid {holder}) uses {Path(exc.path).parent}"
        ) from None
