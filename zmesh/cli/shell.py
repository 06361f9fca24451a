"""The commands of ``zmesh sub --exec`` and ``zmesh reply --exec``, run with sh in a
session of their own: a command that runs too long, or one running when zmesh is
stopped, is killed with everything it started (``subprocess.run``'s timeout kills sh
alone, and a pipeline or a child of sh would run on)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from .stopflag import StopFlag

POLL_S = 0.1  # a wait for a command looks for a stop signal this often
REAP_S = 1.0  # how long a killed command's pipes are drained for, at most


@dataclass(frozen=True, slots=True)
class Ran:
    """How a command ended: its exit code (None when it was killed: ``timed_out``, or a
    stop signal came), and what it printed when that was captured."""

    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False


def run_shell(
    cmd: str,
    stdin: bytes,
    timeout_s: float,
    stop: StopFlag,
    env: dict[str, str] | None = None,
    capture: bool = False,
) -> Ran:
    """Run ``cmd`` with sh, ``stdin`` on its standard input (its output captured, or
    zmesh's own); after ``timeout_s`` seconds, or once ``stop`` is set, its process group
    is killed (SIGKILL)."""
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(
        cmd,
        shell=True,
        stdin=subprocess.PIPE,
        stdout=pipe,
        stderr=pipe,
        env=env,
        start_new_session=True,  # (its own process group: killed as one)
    )
    deadline = time.monotonic() + timeout_s
    given: bytes | None = stdin  # (given once: a later call goes on writing it)
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                out, err = proc.communicate(given, timeout=max(0.0, min(POLL_S, left)))
            except subprocess.TimeoutExpired:
                given = None
                if left <= POLL_S or stop.is_set():
                    _kill(proc)
                    return Ran(None, timed_out=not stop.is_set())
                continue
            return Ran(proc.returncode, out or b"", err or b"")
    except BaseException:
        _kill(proc)
        raise


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command's process group (sh is not reaped yet: its id is still its
    group's), then reap sh and close its pipes."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=REAP_S)
    except subprocess.TimeoutExpired:  # (a pipe held by a child that left the group)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
