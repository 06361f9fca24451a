"""Waiting, for the tests and for the worker processes they start (which have the
repository on their path): ``until`` asks a condition until it holds or a deadline
passes, the one poll loop of the suite; ``pause`` lets time pass on purpose (a handler's
work, a paced stream) and is never a way to wait for something to happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(pred: Callable[[], T], timeout: float, interval: float = 0.02) -> T | None:
    """``pred()``'s first truthy value, asked every ``interval`` seconds; None when
    ``timeout`` seconds pass without one (it is asked once more at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(interval, left))


def pause(seconds: float) -> None:
    """Let ``seconds`` pass: the time a simulated piece of work takes, or the gap of a
    paced stream. Nothing is waited for."""
    time.sleep(seconds)
