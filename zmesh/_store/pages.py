"""Letting go of the LMDB file pages a node has mapped.

LMDB reads through a shared, read-only memory map of ``data.mdb``. Every page a node reads
(or copies to change it) stays mapped into the process, so its resident memory grows with
the whole outbox it ever touched: after publishing 2,000,000 messages for an offline group,
150 MB of it, and as much again while the backlog drains. Those pages are the kernel's file
cache, and dropping them from the process's map (``madvise(MADV_DONTNEED)``, which for a
shared file mapping only removes the page table entries) loses nothing: a later read maps
the page again from the cache or the file. ``MappedPages`` does this after every
``RELEASE_BYTES`` of records written or read.

Linux only (the mapping is found in ``/proc/self/maps``); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

RELEASE_BYTES = 16 << 20  # records written or read between two releases
MADV_DONTNEED = 4


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def mapped_region(path: str) -> tuple[int, int] | None:
    """(address, length) of this process's mapping of the file ``path``, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].rstrip("\n") == path:
                    start, _, end = fields[0].partition("-")
                    return int(start, 16), int(end, 16) - int(start, 16)
    except OSError:
        pass
    return None


class MappedPages:
    """Counts the record bytes a store moves; past ``RELEASE_BYTES`` drops its mapping."""

    __slots__ = ("path", "moved", "released", "_on", "_region")

    def __init__(self, data_file: str) -> None:
        self.path = os.path.realpath(data_file)
        self.moved = 0  # record bytes written or read since the last release
        self.released = 0  # releases so far
        self._on = _LIBC is not None
        # Where the map is, found once (reading /proc/self/maps costs a millisecond): it
        # moves only when the store resizes it, which says so (``remapped``).
        self._region: tuple[int, int] | None = None

    def remapped(self) -> None:
        """The map was made anew (a resize): look for it again at the next release."""
        self._region = None

    def add(self, nbytes: int) -> None:
        self.moved += nbytes
        if self.moved >= RELEASE_BYTES:
            self.release()

    def release(self) -> None:
        """Drop every page of the map from this process (they stay in the file cache)."""
        self.moved = 0
        if not self._on:
            return
        region = self._region or mapped_region(self.path)
        if region is None:
            return
        self._region = region
        addr, length = region
        assert _LIBC is not None
        if _LIBC.madvise(addr, length, MADV_DONTNEED) != 0:
            err = ctypes.get_errno()
            log.warning(
                "cannot release the mapped pages of %s (%s); resident memory will "
                "include the store's pages read so far",
                self.path,
                os.strerror(err),
            )
            self._on = False
            return
        self.released += 1
