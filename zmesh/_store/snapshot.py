"""Snapshots: a consistent, compacted copy of a node's LMDB store into a new data dir."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import lmdb

from .._dirs import make_dir
from ..errors import ArgumentError, StoreError
from .damage import check_store_files
from .lock import held_here


def check_path(value: object, what: str) -> str:
    """A snapshot's data dir or destination: a non-empty str or os.PathLike, as a str
    (bytes or a number would become a directory named "b'x'" or "5");
    ArgumentError naming ``what`` otherwise."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str) or not path:
        raise ArgumentError(f"{what} must be a path (a str or os.PathLike), got {value!r}")
    return path


def copy_env(env: Any, dest: str) -> None:
    """Copy an open LMDB environment into ``dest/store`` (one read transaction). A copy
    that fails leaves nothing behind: what it wrote, and the directories it made."""
    target = Path(dest) / "store"
    made = _missing(target)
    make_dir(target, "the snapshot destination", lambda message: StoreError(message, str(target)))
    try:
        if any(target.iterdir()):
            raise StoreError("snapshot destination is not empty", str(target))
    except OSError as exc:  # (no permission to read it)
        raise StoreError(
            f"cannot read the snapshot destination {target}: {exc.strerror}", str(target)
        ) from exc
    try:
        env.copy(str(target), compact=True)
    except BaseException as exc:
        _undo(target, made)  # (it was empty: all it holds now is this copy's)
        if isinstance(exc, lmdb.Error):
            raise StoreError(f"snapshot failed: {exc}", str(target)) from exc
        raise


def _missing(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, the deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _undo(target: Path, made: list[Path]) -> None:
    """Remove what a failed copy wrote into ``target`` and the directories in ``made``
    (what is left of them, in the way, stays)."""
    with contextlib.suppress(OSError):
        for entry in target.iterdir():
            entry.unlink()
    for path in made:
        with contextlib.suppress(OSError):
            path.rmdir()


def snapshot_data_dir(data_dir: str, dest: str) -> None:
    """Snapshot a data dir whether or not a node (in any process) is running on it."""
    path = Path(data_dir) / "store"
    held = held_here(data_dir)
    if held is not None:
        # Open in this process, where LMDB cannot open it again: its node copies it.
        copy = held.copy() if held.copy is not None else None
        if copy is None:
            raise StoreError("the store is open in this process, but not by a node", str(path))
        copy(dest)
        return
    data = path / "data.mdb"
    if not data.exists():
        raise StoreError("no zmesh store here", str(path))
    check_store_files(path)
    try:
        env = lmdb.open(str(path), readonly=True, max_dbs=16, subdir=True)
    except lmdb.Error as exc:
        raise StoreError(f"cannot open the store to snapshot it: {exc}", str(path)) from exc
    try:
        # (a page past the file's end is a SIGBUS, not an error: no node checked this one)
        check_store_files(path, (env.info()["last_pgno"] + 1) * env.stat()["psize"])
        copy_env(env, dest)
    finally:
        env.close()
