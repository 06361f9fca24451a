"""Damage met while the node runs: reads LMDB refuses, and the check they start.

A store is walked for damage before LMDB opens it unless its data file is as a clean close
left it (lock.py). Damage that leaves the file looking so (bit rot: its size, times and
inode unchanged) gets past that, and shows as a read LMDB refuses (MDB_CORRUPTED,
MDB_PAGE_NOTFOUND, and the MDB_BAD_TXN after them). The store never lets such an
``lmdb`` error out: a record it cannot read is left out as a damaged one is (its messages
are settled as lost), any other read fails with StoreError. ``Health`` notes each:

- the first is logged at ERROR with the remedies, and starts the walk of check.py (in a
  child process, from a thread of its own: it takes about 20 s per GiB) on the tree of
  the last commit, which a read transaction held meanwhile keeps from being reused;
- a database a read failed in, or that the walk finds damaged, has nothing deleted from
  it from then on: a deletion beside a damaged page makes LMDB move records from or into
  it, which fails the whole commit (and could abort the process). Its records stay until
  the store is salvaged;
- ``state()`` is what ``status()["store"]["damaged"]`` shows, and a store found damaged
  is closed as damaged (lock.py), so that its next start walks it and refuses it with the
  remedies.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import lmdb

from ..errors import StoreError
from .check import CheckReport, check_store
from .damage import advice, read_failed, remedy

log = logging.getLogger(__name__)

# What LMDB says of a page or transaction it cannot trust: the store is damaged. (Other
# errors of a read, readers or memory running out, are not damage.)
DAMAGE_ERRORS: tuple[type[lmdb.Error], ...] = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.BadTxnError,
    lmdb.PanicError,
    lmdb.InvalidError,
    lmdb.IncompatibleError,
    lmdb.VersionMismatchError,
    lmdb.BadChecksumError,
    lmdb.ProblemError,
)


def lmdb_error(exc: BaseException) -> lmdb.Error | None:
    """The ``lmdb.Error`` behind ``exc``: itself, or the cause of the SystemError that
    py-lmdb raises when LMDB fails the transaction under a cursor's call
    (``Cursor.delete`` beside a damaged page); None for anything else."""
    if isinstance(exc, lmdb.Error):
        return exc
    cause = exc.__cause__
    return cause if isinstance(exc, SystemError) and isinstance(cause, lmdb.Error) else None


@contextlib.contextmanager
def raising(as_store_error: Callable[[lmdb.Error], StoreError]) -> Iterator[None]:
    """What LMDB raises inside (itself, or behind py-lmdb's SystemError) raised as the
    StoreError ``as_store_error`` makes of it; any other error as it is."""
    try:
        yield
    except (lmdb.Error, SystemError) as exc:
        error = lmdb_error(exc)
        if error is None:
            raise
        raise as_store_error(error) from exc


def at_start(what: str, path: str) -> AbstractContextManager[None]:
    """A read of the start that LMDB refuses is the StoreError of a damaged store: the
    node does not start (it is not a node's damage to go on with)."""
    return raising(lambda error: read_failed(error, path, what))


class Health:
    """The damage a store's reads met (IO thread; the check's thread sets ``report``)."""

    def __init__(self, path: str, hold: Callable[[], AbstractContextManager[Any]]) -> None:
        self.path = path
        # What keeps the last commit's pages as they are while the check reads them.
        self._hold = hold
        self.first: str | None = None  # the first damage, as its StoreError says it
        self.failures = 0  # reads (and commits) LMDB refused for damage
        self.dbs: frozenset[str] = frozenset()  # databases nothing is deleted from
        self.report: CheckReport | None = None  # the check's, once it is done
        self._thread: threading.Thread | None = None
        self._check: subprocess.Popen[str] | None = None
        self._closing = False

    @property
    def damaged(self) -> bool:
        return self.first is not None

    def failed(self, exc: lmdb.Error, what: str, db: str | None = None) -> StoreError:
        """The StoreError of ``exc``, raised by ``what`` ("reading the msgs database"),
        in the database ``db`` when known; damage is noted, and said once."""
        if not isinstance(exc, DAMAGE_ERRORS):
            return StoreError(f"{what} failed ({exc})", self.path)
        error = StoreError(
            f"{what} failed ({exc}): the store is damaged; {remedy(self.path)}", self.path
        )
        self.failures += 1
        known = self.dbs
        if db is not None and db not in known:
            self.dbs = known | {db}
        if self.first is None:
            self.first = f"{what} failed ({exc})"
            log.error(
                "%s; the node goes on: outbox records it cannot read are settled as lost, "
                "nothing more is deleted from a damaged database, and the store is walked "
                "for damage now (and at its next start)",
                error,
            )
            self._start_check()
        elif self.dbs is not known:  # (one line for each database it meets)
            log.error("%s of the damaged store %s failed too (%s)", what, self.path, exc)
        return error

    def reading(self, what: str, db: str | None = None) -> AbstractContextManager[None]:
        """Raise a read of ``what`` ("the msgs database") that LMDB refuses as StoreError
        (see ``failed``), never as an ``lmdb`` error."""
        return raising(lambda error: self.failed(error, f"reading {what}", db))

    def deletes(self, db: str) -> bool:
        """Whether records may be deleted from ``db`` (not known to be damaged)."""
        return db not in self.dbs

    def state(self) -> dict[str, Any] | None:
        """For status: None while no damage was met; else the first, the databases
        found damaged, how many reads failed, the check's finding (None while it runs)
        and what to do. Never raises."""
        if self.first is None:
            return None
        report = self.report
        return {
            "error": self.first,
            "databases": sorted(self.dbs),
            "reads_failed": self.failures,
            "check": None if report is None else report.summary(),
            "remedy": advice(self.path),
        }

    def close(self) -> None:
        """Stop a check still running (its child is killed), and wait for its thread."""
        self._closing = True
        check, thread = self._check, self._thread
        if check is not None and check.poll() is None:
            with contextlib.suppress(OSError):
                check.kill()
        if thread is not None:
            thread.join()

    def _start_check(self) -> None:
        self._thread = threading.Thread(
            target=self._run_check, daemon=True, name=f"zmesh-store-check-{self.path}"
        )
        self._thread.start()

    def _started(self, check: subprocess.Popen[str]) -> None:
        self._check = check
        if self._closing:  # (closed while the child started: it need not run)
            check.kill()

    def _run_check(self) -> None:
        try:
            with self._hold():
                report = check_store(self.path, self._started)
        except Exception as exc:  # (the environment failed under it: nobody to raise to)
            log.error("the check of the damaged store %s could not run: %s", self.path, exc)
            return
        self.report = report
        if self._closing:
            return
        if report.sound:
            # (a damaged page the last commits no longer reach, or a failure of LMDB's own)
            log.warning(
                "store %s checked in %.1fs after a read failed: its last commit is sound",
                self.path,
                report.seconds,
            )
            return
        self.dbs = self.dbs | {db for db in report.damaged() if not db.startswith("LMDB")}
        log.error("%s; %s", report.summary(), advice(self.path))
