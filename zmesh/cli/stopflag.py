"""A stop flag that signal handlers may set.

``threading.Event.set()`` takes the lock that ``Event.wait()`` holds while it checks the
flag, and Python runs a signal handler in the main thread between two of its bytecodes:
a handler that sets an Event the main thread is waiting on can land inside that wait,
with the lock held, and block the process for good. ``StopFlag.set()`` takes no lock: it
sets a plain attribute and writes a byte to a pipe, which ``wait()`` selects on.
"""

from __future__ import annotations

import contextlib
import os
import select


class StopFlag:
    """``is_set``, ``set`` and ``wait`` as ``threading.Event`` has them (never cleared),
    safe to set from a signal handler and from any thread."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def set(self) -> None:
        self._set = True
        with contextlib.suppress(BlockingIOError, OSError):  # (full: already woken)
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the flag is set, waiting up to ``timeout`` seconds (None: no end) for
        it first."""
        if not self._set:
            select.select([self._read], [], [], timeout)
        return self._set

    def __del__(self) -> None:
        for fd in (getattr(self, "_read", -1), getattr(self, "_write", -1)):
            with contextlib.suppress(OSError):
                os.close(fd)
