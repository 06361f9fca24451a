"""The demo's worker processes (``python -m zmesh.cli.demo_worker`` children): started
with their stdout read into events, sent commands on stdin, stopped by pid whatever
happens (a line, then SIGTERM, then SIGKILL)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TAIL_LINES = 15


class Child:
    """One worker process and the thread that turns its stdout into events."""

    def __init__(
        self, name: str, proc: subprocess.Popen[bytes], reader: threading.Thread, log: Path
    ) -> None:
        self.name = name
        self.proc = proc
        self.reader = reader
        self.log = log
        self.expected_exit = False


class Fleet:
    """The demo's worker processes, each stopped by pid, whatever happens."""

    def __init__(self, root: Path, log_level: str) -> None:
        self.root = root
        self.log_level = log_level
        self.events: queue.Queue[tuple[str, int, dict[str, Any]]] = queue.Queue()
        self.children: dict[str, Child] = {}
        self.retired: list[Child] = []
        pkg_root = str(Path(__file__).resolve().parents[2])
        self.env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            PYTHONPATH=pkg_root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )

    def start(self, name: str, args: list[str]) -> Child:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("ab") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "zmesh.cli.demo_worker",
                    *args,
                    "--log-level",
                    self.log_level,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env,
                start_new_session=True,
            )  # Ctrl-C reaches the demo, which stops the children
        reader = threading.Thread(
            target=self._read, args=(name, proc), daemon=True, name=f"demo-read-{name}"
        )
        child = Child(name, proc, reader, log)
        self.children[name] = child
        reader.start()
        return child

    def _read(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                event = {"event": "noise", "line": raw.decode(errors="replace").rstrip()}
            self.events.put((name, proc.pid, event))
        self.events.put((name, proc.pid, {"event": "exit"}))

    def send(self, name: str, line: str) -> None:
        """A command line on a child's stdin (``go``, ``stop``)."""
        child = self.children.get(name)
        if child is None or child.proc.stdin is None:
            return
        try:
            child.proc.stdin.write(line.encode() + b"\n")
            child.proc.stdin.flush()
        except OSError:  # gone: its exit event tells the rest
            pass

    def kill(self, name: str) -> None:
        """SIGKILL a child, as a crash would, and reap it."""
        child = self.children.pop(name)
        child.expected_exit = True
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=10)
        self.retired.append(child)

    def is_expected(self, name: str, pid: int) -> bool:
        child = self.children.get(name)
        return child is None or child.proc.pid != pid or child.expected_exit

    def stop(self, names: list[str], grace_s: float) -> None:
        """Ask children to stop, wait up to ``grace_s``, then SIGTERM, then SIGKILL."""
        chosen = [self.children[n] for n in names if n in self.children]
        for child in chosen:
            child.expected_exit = True
            _close_stdin(child.proc, b"stop\n")
        deadline = time.monotonic() + grace_s
        for child in chosen:
            _reap(child.proc, max(0.1, deadline - time.monotonic()))

    def close(self, grace_s: float) -> None:
        """Stop every child by pid and release pipes and reader threads."""
        self.stop(list(self.children), grace_s)
        for child in [*self.children.values(), *self.retired]:
            _reap(child.proc, 0.1)
            child.reader.join(timeout=5)
            if child.proc.stdout is not None:
                child.proc.stdout.close()
        self.retired.extend(self.children.values())
        self.children.clear()

    def tail(self, name: str) -> str:
        child = self.children.get(name) or next(
            (c for c in reversed(self.retired) if c.name == name), None
        )
        if child is None or not child.log.exists():
            return ""
        lines = child.log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        return "\n".join(f"  {line}" for line in lines)


def _close_stdin(proc: subprocess.Popen[bytes], last: bytes) -> None:
    if proc.stdin is None or proc.stdin.closed:
        return
    try:
        if proc.poll() is None:
            proc.stdin.write(last)
        proc.stdin.close()
    except OSError:  # the child is already gone
        pass


def _reap(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    """Wait for a child; SIGTERM it, then SIGKILL it, if it does not exit."""
    for step in (None, proc.terminate, proc.kill):
        if step is not None:
            if proc.poll() is not None:
                break
            step()
        try:
            proc.wait(timeout=wait_s if step is None else 5)
            break
        except subprocess.TimeoutExpired:
            continue
    _close_stdin(proc, b"")
