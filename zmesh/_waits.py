"""Timeouts the public API takes: checked once, where a call may wait."""

from __future__ import annotations

from .errors import ArgumentError


def check_timeout(timeout: object, what: str = "timeout") -> float | None:
    """``timeout`` as seconds to wait: None (and infinity) wait without end, zero and less
    not at all. Anything but a number or None, and NaN (which compares false with
    everything: a wait loop would spin on it), raise ArgumentError."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout:
        raise ArgumentError(f"{what} must be a number of seconds or None, got {timeout!r}")
    return None if timeout == float("inf") else float(timeout)
