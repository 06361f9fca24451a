"""Timeouts the public API takes: checked once, where a call may wait."""

from __future__ import annotations

from .errors import ArgumentError

# The longest a ZeroMQ poll waits in one call, in ms (its timeout is a C int): a longer
# wait polls again until its deadline.
MAX_POLL_MS = 2**31 - 1


def check_timeout(timeout: object, what: str = "timeout") -> float | None:
    """``timeout`` as seconds to wait: None (and infinity) wait without end, zero and less
    not at all. Anything but a number or None, and NaN (which compares false with
    everything: a wait loop would spin on it), raise ArgumentError."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout:
        raise ArgumentError(f"{what} must be a number of seconds or None, got {timeout!r}")
    return None if timeout == float("inf") else float(timeout)


def poll_ms(seconds: float) -> int:
    """``seconds`` (> 0, perhaps more than a poll takes) as one ZeroMQ poll's timeout in
    ms: at least 1, at most ``MAX_POLL_MS``."""
    return max(1, int(min(seconds * 1000, MAX_POLL_MS)))
