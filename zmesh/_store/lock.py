"""The data dir's lock file: who holds the store, and how its last holder left it.

``LOCK`` is flock'ed by the process whose node has the store open, and holds that
process's pid while it does (what DataDirLockedError tells another node). A clean close
replaces the pid with ``clean SIZE MTIME_NS INODE CTIME_NS`` of ``data.mdb`` as it was
left; a close after the node met damage (health.py) with ``damaged``. A node that opens
the store and finds anything else there (a pid: its holder died without closing it;
``damaged``; or a data file that is not the one a clean close left: restored, copied,
changed while stopped) has its store checked before LMDB reads it (see check.py).

The change time is what gives away a file written in place with its modification time
put back (``rsync --inplace -t``, ``touch -r``): no one but the kernel sets it. Damage
that changes no metadata (bit rot) gets past this; the node meets it as reads LMDB
refuses (health.py).

The data dirs this process holds are listed (``held_here``): LMDB opens an environment
once per process, so a snapshot of one of them copies through its owner (``own``), whose
open environment it reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DataDirLockedError, StoreError

log = logging.getLogger(__name__)

LOCK_FILE = "LOCK"  # in the data dir
_CLEAN = "clean"
_DAMAGED = "damaged"

# The data dirs this process holds, by real path (take_lock adds one, let_go removes it).
_held: dict[str, LockedDir] = {}
_held_lock = threading.Lock()


class LockedDir:
    """What a store keeps open: the data dir's lock file and, once opened, the LMDB
    environment. Released once: by ``Store.close()``, or when the store is collected.
    ``copy``: how its owner snapshots the open store into a new data dir (``own``)."""

    __slots__ = ("env", "lock_fd", "data_file", "previous", "key", "copy")

    def __init__(self, lock_fd: int, data_file: Path, previous: str, key: str) -> None:
        self.lock_fd = lock_fd
        self.data_file = data_file
        self.previous = previous  # what the lock file said before this process took it
        self.key = key  # (the data dir's real path)
        self.env: Any = None
        self.copy: weakref.WeakMethod[Callable[[str], None]] | None = None

    def unclean(self) -> str | None:
        """Why the store must be checked before it is used; None when its data file is
        exactly as the last clean close left it (or there is none yet)."""
        try:
            st = self.data_file.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"its data file cannot be looked at ({exc.strerror})"
        word, *fields = self.previous.split() or [""]
        if word.isdigit():
            return f"the node that had it open (pid {word}) did not close it"
        if word == _DAMAGED:
            return "its last node found it damaged"
        if word != _CLEAN:
            return "nothing says how its last node left it"
        # (a lock file of a release that did not record the change time: the rest)
        if fields != stamp(st)[: max(len(fields), 3)]:
            return "its data file changed after its node closed it"
        return None

    def replaced(self) -> bool:
        """Whether the data file may hold an earlier state than its last node left (a
        snapshot restored, a copy): nothing says how that node left it, or it changed after
        a clean close. Not a crash (a pid): that node's last commit is in it."""
        word = (self.previous.split() or [""])[0]
        return (
            self.data_file.exists()
            and not word.isdigit()
            and word != _DAMAGED
            and (word != _CLEAN or self.unclean() is not None)
        )

    def lost(self) -> str | None:
        """Why the store is gone: its data file is missing where the lock file says a
        node had one (None: a new data dir, or the file is there)."""
        word = (self.previous.split() or [""])[0]
        if word.isdigit():
            how = f"had it open (pid {word})"
        elif word in (_CLEAN, _DAMAGED):
            how = "closed it cleanly" if word == _CLEAN else "found it damaged"
        else:
            return None
        if self.data_file.exists() or self.data_file.is_symlink():
            return None
        return (
            f"{self.data_file} is gone, where the data dir's {LOCK_FILE} says its last node "
            f"{how}: restore the store from a snapshot (zmesh snapshot, Node.snapshot), or "
            f"delete {LOCK_FILE} to start this node afresh with an empty store (what it "
            "had not delivered would be lost)"
        )


def stamp(st: os.stat_result) -> list[str]:
    """What a clean close records of the data file: size, mtime, inode, ctime."""
    return [str(st.st_size), str(st.st_mtime_ns), str(st.st_ino), str(st.st_ctime_ns)]


def let_go(held: LockedDir, *, sync: bool, damaged: bool = False) -> None:
    """Close the environment, then the lock file (which frees the data dir); ``sync``: a
    clean close, recorded in the lock file (``damaged``: as the close of a store found
    damaged, which the next start checks)."""
    with _held_lock:
        if _held.get(held.key) is held:
            del _held[held.key]
    try:
        if held.env is not None:
            if sync:
                held.env.sync(True)
            held.env.close()
            if sync:
                _mark_closed(held, damaged)
        else:  # never opened here (a start that failed): the store is as it was found
            with contextlib.suppress(OSError):
                _write(held.lock_fd, f"{held.previous}\n" if held.previous else "")
    finally:
        os.close(held.lock_fd)


def _mark_closed(held: LockedDir, damaged: bool) -> None:
    try:
        if damaged:
            text = f"{_DAMAGED}\n".encode()
        else:
            text = f"{_CLEAN} {' '.join(stamp(held.data_file.stat()))}\n".encode()
        _write(held.lock_fd, text.decode())
    except OSError as exc:  # (a full disk: the next start checks the store, no harm)
        log.info("cannot record the clean close of %s: %s", held.data_file, exc)


def _write(lock_fd: int, text: str) -> None:
    """Replace what the lock file says."""
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, text.encode(), 0)


def collected(held: LockedDir, data_dir: str) -> None:
    """A store dropped without close() (its Node was never started, or never closed): let
    go of the data dir, so a node of this process can open it again."""
    log.warning("data dir %s released: its node was dropped without close()", data_dir)
    try:
        let_go(held, sync=True)
    except Exception as exc:  # lmdb.Error, OSError: nobody is left to raise it to
        log.error("closing the store of data dir %s failed: %s", data_dir, exc)


def _read(lock_fd: int) -> str:
    try:
        return os.pread(lock_fd, 200, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _holder_pid(lock_fd: int) -> int | None:
    """The pid the holder of a data dir's lock wrote into it, if it can be read."""
    text = _read(lock_fd)
    return int(text) if text.isdigit() else None


def _flock(lock_fd: int) -> bool:
    """Take the exclusive lock of a data dir's lock file; False when another has it."""
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def take_lock(data_dir: Path, data_file: Path) -> LockedDir:
    """The data dir's lock file, opened and flock'ed, with this process's pid written in."""
    path = data_dir / LOCK_FILE
    try:
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(
            f"cannot open the data dir's lock file {path}: {exc.strerror}", str(data_dir)
        ) from exc
    if not _flock(lock_fd):
        holder = _holder_pid(lock_fd)
        if holder == os.getpid():
            # Held in this process: perhaps by a node dropped without close(), which the
            # node's own reference cycles keep until the collector runs (see collected).
            gc.collect()
        if holder != os.getpid() or not _flock(lock_fd):
            os.close(lock_fd)
            raise DataDirLockedError(str(data_dir), holder)
    previous = _read(lock_fd)
    # Only what DataDirLockedError tells a node that finds the lock taken (and what says
    # the store was not closed cleanly): no harm if not written (a full disk).
    with contextlib.suppress(OSError):
        _write(lock_fd, f"{os.getpid()}\n")
    held = LockedDir(lock_fd, data_file, previous, os.path.realpath(data_dir))
    with _held_lock:
        _held[held.key] = held
    return held


def held_here(data_dir: str | Path) -> LockedDir | None:
    """The lock this process holds on ``data_dir``, if it holds one."""
    with _held_lock:
        return _held.get(os.path.realpath(data_dir))


def own(data_dir: str | Path, copy: Callable[[str], None]) -> None:
    """Say how the holder of ``data_dir`` (a node's store) snapshots it: ``copy(dest)``,
    a bound method, kept weakly (the registry keeps no store alive)."""
    held = held_here(data_dir)
    if held is not None:
        held.copy = weakref.WeakMethod(copy)
