"""The room inside a store's file: free pages a commit may take before the file grows.

On a full disk new messages may take only what the file holds free inside it (and what
the disk has beyond the room kept for settlements, disk.py). Counting every free page of
the file as room is wrong twice over:

- LMDB reuses a page only from the second commit after the one that freed it (a write
  transaction takes free pages of transactions older than the last committed one). The
  acks that just deleted a backlog freed its pages for the commit after next, not the
  next one: a commit of new messages counted on them grows the file instead, and on a
  full disk it fails, with ENOSPC, in the room kept for settlements.
- A page freed since the oldest read transaction began (a snapshot being copied, a check
  of a damaged store) is not reused while it lasts.

So the pages free after each commit are noted while the disk is tight, and the next
commit counts only those free after both of the last two commits (the pages the last one
freed are not among them), less those LMDB's own free list takes. Readers are not seen:
their pages, and a large record that finds no run of free pages long enough (its
overflow pages are contiguous), are what the margin kept free on the disk is for; a
commit of new messages that fails with ENOSPC anyway holds its publishes and leaves the
disk's reserve alone (store.py). Pages past the last one in use that the file already
has (written by a commit that failed, ENOSPC half way) are room too: the file does not
grow to reuse them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

HISTORY = 2  # commits whose free pages are remembered


class FileRoom:
    """Free pages of one store's file, as the last commits left them (IO thread)."""

    def __init__(self, env: Any, dbs: Sequence[Any], data_file: str, psize: int) -> None:
        self._env = env
        self._dbs = dbs
        self._data_file = data_file
        self._psize = psize
        self.tight = False  # the disk has little room: note each commit's free pages
        self._free_after: dict[int, int] = {}  # txnid -> pages free once it committed

    def used_pages(self) -> int:
        """Pages the databases' trees hold (branch, leaf, overflow)."""
        with self._env.begin() as txn:
            return sum(_pages(txn.stat(db)) for db in self._dbs) + _pages(self._env.stat())

    def committed(self) -> None:
        """A commit went through: note what it left free, while the disk is tight."""
        if self.tight:
            info = self._env.info()
            self._note(info["last_txnid"], info["last_pgno"] + 1 - self.used_pages())
        elif self._free_after:
            self._free_after.clear()

    def _note(self, txnid: int, free: int) -> None:
        self._free_after[txnid] = free
        for old in [t for t in self._free_after if t <= txnid - HISTORY]:
            del self._free_after[old]

    def reusable_pages(self, end: int, used: int) -> int:
        """Free pages inside the file the next commit may take: those free after the last
        commit and the one before it (not known: none), less the free list's own."""
        txnid = self._env.info()["last_txnid"]
        self._note(txnid, end - used)
        before = self._free_after.get(txnid - 1)
        if before is None:
            return 0
        free = min(before, end - used)
        # The two meta pages and the free list's pages (a page lists ~500 free ones).
        return max(0, free - 2 - free // 256)

    def tail_pages(self, end: int) -> int:
        """Pages the file has past the last one in use (a failed commit wrote them)."""
        try:
            size = os.stat(self._data_file).st_size
        except OSError:
            return 0
        return max(0, size // self._psize - end)

    def inside_bytes(self) -> int:
        """Bytes the file holds that the next commits may take without growing it."""
        end = self._env.info()["last_pgno"] + 1
        used = self.used_pages()
        return (self.reusable_pages(end, used) + self.tail_pages(end)) * self._psize


def _pages(stat: Any) -> int:
    return int(stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"])
