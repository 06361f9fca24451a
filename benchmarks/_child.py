"""Parent side of a benchmark child process: spawn, talk in JSON lines, always clean up.

A child is ``python -m benchmarks.worker ROLE PARAMS_JSON``. It writes one JSON object per
line on stdout (``{"event": ..., ...}``) and reads commands the same way on stdin. Its
stderr goes to a log file whose tail is shown when it fails.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from zmesh._malloc import MMAP_THRESHOLD, TRIM_THRESHOLD, environment_chooses

ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 10.0
# Every child runs with the allocator thresholds a zmesh node sets for its own process
# (zmesh/_malloc.py), given to glibc through its environment: the raw baselines and the
# peers' clients meet the same allocator as zmesh (unless this environment sets its own).
ALLOCATOR = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
}


def py_spy() -> str | None:
    """The py-spy beside this Python (its virtualenv), else on the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


class BenchError(RuntimeError):
    """A scenario could not be measured (a child failed, hung or said something odd)."""


class Child:
    """One worker process and its event stream."""

    def __init__(
        self, role: str, params: dict[str, Any], workdir: Path, profile_dir: Path | None = None
    ) -> None:
        self.role = role
        self.name = params.get("name", role)
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{self.name}-{os.getpid()}-{time.monotonic_ns()}.log"
        env = dict(os.environ)
        if not environment_chooses(env):
            env.update(ALLOCATOR)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "benchmarks.worker", role, json.dumps(params)]
        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
            spy = py_spy()
            if spy is None:
                raise BenchError("--profile needs py-spy: pip install py-spy")
            # --gil: sample only the thread holding the GIL, i.e. where Python time goes.
            cmd = [
                spy,
                "record",
                "--format",
                "raw",
                "--threads",
                "--gil",
                "--rate",
                "250",
                "--output",
                str(profile_dir.resolve() / f"{self.name}.txt"),
                "--",
                *cmd,
            ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
                cwd=str(ROOT),
            )
        except BaseException:
            self._log.close()
            raise
        self.cmdline = shlex.join(cmd)
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read, daemon=True, name=f"bench-reader-{self.name}"
        )
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                self._events.put(json.loads(line))
            except ValueError:
                self._events.put({"event": "noise", "line": line})
        self._events.put(None)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        """Wait for ``event``; raise BenchError when the child fails, exits or is late."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"{self.name}: no {event!r} within {timeout:g}s{self.tail()}")
            try:
                msg = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                self._events.put(None)  # keep reporting the exit to later calls
                code = self.proc.wait(5)
                raise BenchError(f"{self.name} exited ({code}) before {event!r}{self.tail()}")
            if msg.get("event") == "error":
                raise BenchError(
                    f"{self.name} failed: {msg.get('error')}\n{msg.get('traceback', '')}"
                )
            if msg.get("event") == event:
                return msg

    def send(self, cmd: str, **data: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"cmd": cmd, **data}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it exited; expect() reports that

    def tail(self, lines: int = 25) -> str:
        try:
            self._log.flush()
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ("\n--- stderr of " + self.name + " ---\n" + "\n".join(text)) if text else ""

    def stop(self) -> None:
        """Ask it to stop, then terminate and kill it by pid if it does not."""
        if self.proc.poll() is None:
            self.send("stop")
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with suppress(OSError):
                    stream.close()
        self._log.close()


class Children:
    """Every child a scenario started; all of them are stopped when the scenario ends."""

    def __init__(self, workdir: Path, profile_dir: Path | None = None) -> None:
        self.workdir = workdir
        self.profile_dir = profile_dir
        self.started: list[Child] = []

    def start(self, role: str, **params: Any) -> Child:
        child = Child(role, params, self.workdir / "logs", self.profile_dir)
        self.started.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.started):
            try:
                child.stop()
            except Exception as exc:  # keep stopping the others
                print(
                    f"warning: stopping {child.name} (pid {child.proc.pid}): {exc}", file=sys.stderr
                )


@contextmanager
def children(workdir: Path, profile_dir: Path | None = None) -> Iterator[Children]:
    group = Children(workdir, profile_dir)
    try:
        yield group
    finally:
        group.stop_all()
