"""The metrics pipeline on one machine, in one command:

    python examples/metrics_pipeline/run.py

A Spark bridge node (in this process) joins group ``spark`` on ``metrics``; a pager
(alerts_consumer.py) joins group ``pager`` on ``alerts``; edge sensors (sensors.py)
publish readings; then the Spark job (job.py, on local[*]) turns the bridge's log into
windowed aggregates in Parquet and publishes alerts, which the pager prints. Everything
binds to 127.0.0.1 and finds its peers by seed, without multicast.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import zmesh
import zmesh.spark

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], env: dict[str, str], timeout: float) -> None:
    try:
        subprocess.run(cmd, env=env, check=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{Path(cmd[1]).name} failed with exit code {exc.returncode}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"{Path(cmd[1]).name} did not finish within {timeout:g}s") from exc


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
    shutil.rmtree(work, ignore_errors=True)  # a fresh run: new mesh, log and checkpoints
    mesh = f"metrics-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
    }
    py = sys.executable
    with zmesh.Node(
        "spark-bridge", mesh=mesh, data_dir=work / "bridge", interfaces=["127.0.0.1"], mdns=False
    ) as node:
        node.topic("alerts", groups=["pager"])  # alerts wait for the pager, however late
        with zmesh.spark.Bridge(node, topics=["metrics"], log_dir=work / "bridge-log") as bridge:
            print(
                f"bridge up: node {node.control_address}, log served at {bridge.endpoint}",
                flush=True,
            )
            peers = [
                "--mesh",
                mesh,
                "--seed",
                node.control_address,
                "--interface",
                "127.0.0.1",
                "--no-mdns",
            ]
            pager = subprocess.Popen(
                [py, str(HERE / "alerts_consumer.py"), *peers, "--data-dir", str(work / "pager")],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            try:
                run(
                    [
                        py,
                        str(HERE / "sensors.py"),
                        *peers,
                        "--sensors",
                        str(args.sensors),
                        "--readings",
                        str(args.readings),
                        "--data-dir",
                        str(work / "sensors"),
                    ],
                    env,
                    args.timeout,
                )
                logged = sum(end for _head, end in bridge.streams().values())
                print(f"bridge: {logged} readings logged", flush=True)
                run(
                    [
                        py,
                        str(HERE / "job.py"),
                        "--endpoint",
                        bridge.endpoint,
                        "--bridge-log",
                        str(work / "bridge-log"),
                        "--out",
                        str(work / "windows"),
                        "--checkpoint",
                        str(work / "checkpoint"),
                        "--threshold",
                        str(args.threshold),
                        "--master",
                        args.master,
                    ],
                    env,
                    args.timeout,
                )
                deadline = time.monotonic() + 60
                while node.status()["outbox"] and time.monotonic() < deadline:
                    time.sleep(0.1)  # the pager acks each alert it printed
                left = node.status()["outbox"]
            finally:
                pager.terminate()
                pager.wait(30)
            alerts = bridge.stats().get("published", 0)
    if left:
        raise SystemExit(f"{left} alerts were not acknowledged by the pager")
    print(f"pipeline done: {alerts} alerts published, windows in {work / 'windows'}", flush=True)


if __name__ == "__main__":
    main()
