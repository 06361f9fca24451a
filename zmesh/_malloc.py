"""The C allocator's thresholds, set once per process for the blocks a node goes through.

LMDB allocates a transaction's dirty pages with ``malloc`` and frees them at its commit:
a run's record or a large payload is one block of tens to hundreds of pages, and one
commit holds up to ``MAX_AHEAD_BYTES`` of them; ZeroMQ's frames and the payloads copied
out of them are such blocks too. glibc maps a block above its mmap threshold on its own,
and gives the top of its heap back to the system once more than its trim threshold lies
free there. Both start at 128 KiB and rise only to the largest mapped block freed so far
(trim: twice that), so a node that commits a few MiB at a time maps, faults in and gives
back the same memory over and over (docs/performance.md, "Large payloads").

``tune`` fixes them as a node opens its store: blocks below ``MMAP_THRESHOLD`` come from
the heap, and up to ``TRIM_THRESHOLD`` of free memory stays at its top for the next
commit. Both lie within what glibc's own adjustment may reach (32 MiB, and twice that);
what it costs is at most ``TRIM_THRESHOLD`` of resident memory per arena kept for reuse.

Left alone: another C library, or an environment that chooses for itself
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_MAX_``, or a ``glibc.malloc`` tunable in ``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "OWN_SETTINGS", "environment_chooses", "tune"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 32 << 20
# The environment variables by which glibc takes its malloc settings (read at start).
OWN_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # (malloc.h)

_lock = threading.Lock()
_tuned: bool | None = None  # (None: not tried yet in this process)


def tune() -> bool:
    """Set glibc's thresholds, once per process; whether zmesh's are in force (False:
    the C library's own, or those the environment chose)."""
    global _tuned
    with _lock:
        if _tuned is None:
            _tuned = _set(os.environ)
        return _tuned


def environment_chooses(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` sets glibc's malloc settings itself (read by glibc at start)."""
    return any(name in environ for name in OWN_SETTINGS) or "glibc.malloc." in environ.get(
        "GLIBC_TUNABLES", ""
    )


def _set(environ: Mapping[str, str]) -> bool:
    if environment_chooses(environ) or not _is_glibc():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    log.debug(
        "malloc thresholds %s: mmap %d, trim %d",
        "set" if done else "refused",
        MMAP_THRESHOLD,
        TRIM_THRESHOLD,
    )
    return done


def _is_glibc() -> bool:
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # (no such name here: not glibc)
        return False
    return version.startswith("glibc")
