"""A Spark standalone cluster on 127.0.0.1: a master and one worker, each a JVM of its own
started from the PySpark installation (``spark-class``), on ports the system picks.

``standalone(dir)`` yields the master's ``spark://`` URL once the worker has registered,
and stops both (by pid) when it ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

START_TIMEOUT_S = 120.0
WORKER_CORES = 2
WORKER_MEMORY = "2g"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env(work: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(_spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(work / "worker"),
        "SPARK_LOG_DIR": str(work),
        "PYSPARK_PYTHON": sys.executable,
    }


def _start(cls: str, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(_spark_home() / "bin" / "spark-class"), cls, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen) -> re.Match[str]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise RuntimeError(f"no {pattern!r} in {log.name} (exit code {proc.poll()}):\n{tail}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def standalone(work: Path, enabled: bool = True) -> Iterator[str | None]:
    """A master and one worker; yields the master's URL (None when not ``enabled``)."""
    if not enabled:
        yield None
        return
    work.mkdir(parents=True, exist_ok=True)
    env = _env(work)
    started: list[subprocess.Popen] = []
    try:
        master_log = work / "master.log"
        master = _start(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            master_log,
            env,
        )
        started.append(master)
        url = _wait_for(master_log, r"Starting Spark master at (spark://\S+)", master).group(1)
        worker_log = work / "worker.log"
        worker = _start(
            "org.apache.spark.deploy.worker.Worker",
            [
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                str(WORKER_CORES),
                "--memory",
                WORKER_MEMORY,
                url,
            ],
            worker_log,
            env,
        )
        started.append(worker)
        _wait_for(worker_log, r"Successfully registered with master", worker)
        yield url
    finally:
        for proc in reversed(started):
            _stop(proc)
