"""What benchmark workers share: events out, commands in, payloads, clocks, RSS.

A worker writes JSON lines on stdout (``emit``) and reads commands on stdin (``Commands``);
``{"cmd": "stop"}`` or the end of stdin asks it to finish. Latency payloads carry their
sending time from ``time.monotonic()``, which on Linux is CLOCK_MONOTONIC: one clock for
every process of the machine, so a consumer can subtract a producer's stamp.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import struct
import sys
import threading
import time
from typing import Any

PAYLOAD_BYTES = 100
ORPHAN_GRACE_S = 5.0  # a worker whose parent is gone exits after at most this long
_STAMP = struct.Struct("<d")
_stdout_lock = threading.Lock()


def emit(event: str, **data: Any) -> None:
    """One event line to the parent."""
    line = json.dumps({"event": event, **data})
    with _stdout_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB: VmHWM, the peak of its own
    memory since it started. (Not ``ru_maxrss``: Linux keeps that across exec, so a child
    would report at least the RSS of the process that forked it.)"""
    peak = _status(("VmHWM",)).get("VmHWM")
    if peak is not None:
        return peak
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def rss_now() -> dict[str, float]:
    """Current resident memory in MiB: anonymous (Python objects, heap) and file-backed
    (mapped files such as LMDB's data.mdb, which the kernel may reclaim)."""
    return _status(("VmRSS", "RssAnon", "RssFile"))


def _status(keys: tuple[str, ...]) -> dict[str, float]:
    """Those of ``keys`` that /proc/self/status gives (kB there), in MiB."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = round(int(rest.split()[0]) / 1024.0, 1)
    except OSError:
        pass
    return out


def cpu_s() -> float:
    """CPU seconds (user + system) this process has used so far, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def payload(fill: int = 0, size: int = PAYLOAD_BYTES) -> bytes:
    return bytes([fill % 256]) * size


def stamped() -> bytes:
    """A 100-byte payload starting with the sending time (CLOCK_MONOTONIC, system-wide)."""
    return _STAMP.pack(time.monotonic()) + b"x" * (PAYLOAD_BYTES - _STAMP.size)


def latency_s(data: bytes | memoryview) -> float:
    return time.monotonic() - _STAMP.unpack_from(data)[0]


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds (nearest rank)."""
    if not samples:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "samples": 0}
    s = sorted(samples)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * len(s)) - 1))] * 1000.0

    return {
        "p50_ms": round(rank(0.50), 4),
        "p99_ms": round(rank(0.99), 4),
        "max_ms": round(s[-1] * 1000.0, 4),
        "samples": len(s),
    }


class Commands:
    """Commands from the parent, read on a daemon thread; ``stopping`` is a plain flag so
    hot loops can check it for the price of an attribute read."""

    def __init__(self) -> None:
        self.stopping = False
        self._q: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="bench-commands").start()

    def _read(self) -> None:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                cmd = json.loads(line)
            except ValueError:
                continue
            if cmd.get("cmd") == "stop":
                self.stopping = True
            self._q.put(cmd)
        # The end of stdin without a stop: the parent is gone (its pipes closed with it).
        # The loops that check ``stopping`` end the worker; this ends one that does not.
        if not self.stopping:
            orphaned = threading.Timer(ORPHAN_GRACE_S, os._exit, (3,))
            orphaned.daemon = True
            orphaned.start()
        self.stopping = True
        self._q.put({"cmd": "stop"})

    def check(self) -> None:
        """Raise SystemExit if the parent asked the worker to stop (or is gone)."""
        if self.stopping:
            raise SystemExit(0)

    def wait(self, name: str, timeout: float) -> dict[str, Any]:
        """The next command called ``name``; raises TimeoutError, or SystemExit on stop."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {name!r} command within {timeout:g}s")
            try:
                cmd = self._q.get(timeout=remaining)
            except queue.Empty:
                continue
            if cmd.get("cmd") == name:
                return cmd
            if cmd.get("cmd") == "stop":
                raise SystemExit(0)

    def wait_stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.01)
