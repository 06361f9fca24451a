"""Shared fixtures: unique meshes, data dirs, node factories, leak checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import zmesh
from tests.waiting import until

LOOPBACK = ["127.0.0.1"]


def wait_until(
    pred: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> object:
    """Poll ``pred`` until it is truthy; fail the test with ``what`` after ``timeout``."""
    value = until(pred, timeout, interval)
    if not value:
        pytest.fail(f"timed out after {timeout}s waiting for {what}")
    return value


def fetched(sub: zmesh.Subscription, n: int) -> list[zmesh.Message]:
    """``n`` messages fetched from ``sub`` (failing the test after wait_until's timeout)."""
    got: list[zmesh.Message] = []
    wait_until(
        lambda: got.extend(sub.fetch(n - len(got), timeout=0.05)) or len(got) >= n,
        what=f"{n} messages",
    )
    return got


@pytest.fixture
def mesh_name() -> str:
    """A mesh name no other test (or machine) uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_node(tmp_path: Path, mesh_name: str) -> Iterator[Callable[..., zmesh.Node]]:
    """Start nodes bound to loopback in this test's mesh; all are closed at the end."""
    nodes: list[zmesh.Node] = []

    def make(name: str, **kw: object) -> zmesh.Node:
        kw.setdefault("mesh", mesh_name)
        kw.setdefault("data_dir", str(tmp_path / name))
        kw.setdefault("interfaces", LOOPBACK)
        kw.setdefault("mdns", False)
        kw.setdefault("heartbeat_interval_s", 0.2)
        kw.setdefault("dead_after_s", 1.5)
        node = zmesh.Node(name, **kw).start()  # type: ignore[arg-type]
        nodes.append(node)
        return node

    yield make
    # Each closed on its own: one that fails to close leaves no other running.
    first: BaseException | None = None
    for node in reversed(nodes):
        try:
            node.close()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first


def wait_members(
    node: zmesh.Node, topic: str, lane: str, count: int, timeout: float = 10.0
) -> None:
    """Wait until ``node`` as producer sees ``count`` live members in a lane."""

    def ready() -> bool:
        for ln in node.status()["lanes"]:
            if ln["topic"] == topic and ln["lane"] == lane and len(ln["members"]) == count:
                return True
        return False

    wait_until(ready, timeout, what=f"{count} members of {topic}/{lane} at {node.name}")


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves zmesh threads running."""
    before = set(threading.enumerate())
    yield

    def leaked() -> list[threading.Thread]:
        return [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name.startswith("zmesh")
        ]

    deadline = time.monotonic() + 5
    for thread in leaked():  # (ending as the test's nodes close: given 5 s in all)
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not leaked(), f"leaked threads: {leaked()}"


def run_module(args: list[str], timeout: float, cwd: str) -> tuple[int, str]:
    """Run ``python ARGS`` to its end (killed after ``timeout``): exit code, output."""
    proc = spawn(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        reap(proc)
    return proc.returncode, output.decode(errors="replace")


def spawn(args: list[str], **kw: object) -> subprocess.Popen:
    """A Python child process running this interpreter, with the repo on its path."""
    env = dict(kw.pop("env", None) or os.environ)  # type: ignore[call-overload]
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.Popen([sys.executable, *args], env=env, **kw)  # type: ignore[call-overload]


def reap(proc: subprocess.Popen) -> None:
    """End a child by its pid if it still runs, wait for it, close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def read_line(proc: subprocess.Popen, timeout: float = 60.0) -> str | bytes:
    """The next line of the child's stdout; fails the test if none comes within
    ``timeout`` (the child may hang, or print nothing). A reader thread waits for it: a
    pipe's ``readline`` has no timeout of its own. If the line never comes the thread is
    left blocked on the pipe until the child is ended (``reap``), which gives it EOF."""
    stdout = proc.stdout
    assert stdout is not None
    got: list[str | bytes] = []
    reader = threading.Thread(
        target=lambda: got.append(stdout.readline()), name=f"read-line-{proc.pid}", daemon=True
    )
    reader.start()
    reader.join(timeout)
    if not got:
        pytest.fail(f"no line from child {proc.pid} within {timeout}s (exit code {proc.poll()})")
    return got[0]


def kill_9_when(proc: subprocess.Popen, line: str | bytes, timeout: float = 60.0) -> None:
    """Wait for ``line`` on the child's stdout (failing the test after ``timeout``), then
    SIGKILL it; it is always reaped and its pipes closed."""
    try:
        got = read_line(proc, timeout)
        assert got.strip() == line, got
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        reap(proc)
