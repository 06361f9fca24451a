"""The stop flag of the CLI's signal handlers: set by a handler that lands while the main
thread waits on it (threading.Event's lock, held in its wait, would block that handler
for good), many times a second, in a child process of its own (pytest-timeout has
SIGALRM here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from zmesh.cli.stopflag import StopFlag

ROOT = str(Path(__file__).resolve().parents[2])

CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from zmesh.cli.stopflag import StopFlag

    box, handled = [StopFlag()], [0]

    def handler(*_):
        handled[0] += 1
        box[0].set()

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)  # (every 0.5 ms)
    waits, deadline = 0, time.monotonic() + 20.0
    while (handled[0] < 2000 or waits < 2000) and time.monotonic() < deadline:
        box[0].wait(0.0002)
        box[0] = StopFlag()
        waits += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    print(handled[0], waits)
    """
)


def test_a_signal_handler_sets_the_flag_while_the_main_thread_waits_on_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr[-2000:]
    handled, waits = map(int, done.stdout.split())
    assert handled >= 2000 and waits >= 2000  # (the handler landed inside many waits)


def test_wait_returns_once_set_from_another_thread_and_at_its_timeout() -> None:
    flag = StopFlag()
    assert flag.wait(0.01) is False and not flag.is_set()
    setter = threading.Timer(0.05, flag.set)
    setter.start()
    try:
        assert flag.wait(10) is True
    finally:
        setter.join()
    assert flag.is_set() and flag.wait(0) is True
    flag.set()  # (again: nothing more)
    assert flag.wait() is True
