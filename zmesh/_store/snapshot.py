"""Snapshots: a consistent, compacted copy of a node's LMDB store into a new data dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb

from ..errors import StoreError


def copy_env(env: Any, dest: str) -> None:
    """Copy an open LMDB environment into ``dest/store`` (one read transaction)."""
    target = Path(dest) / "store"
    try:
        if target.is_dir() and any(target.iterdir()):
            raise StoreError("snapshot destination is not empty", str(target))
        target.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # (a directory would have been fine)
        raise StoreError(f"snapshot destination {target} exists and is not a directory",
                         str(target)) from exc
    except OSError as exc:  # a file on the way, no such parent, no permission
        raise StoreError(f"cannot create the snapshot destination {target}: "
                         f"{exc.strerror}", str(target)) from exc
    try:
        env.copy(str(target), compact=True)
    except lmdb.Error as exc:
        raise StoreError(f"snapshot failed: {exc}", str(target)) from exc


def snapshot_data_dir(data_dir: str, dest: str) -> None:
    """Snapshot a data dir whether or not a node (in any process) is running on it."""
    path = Path(data_dir) / "store"
    if not (path / "data.mdb").exists():
        raise StoreError("no zmesh store here", str(path))
    try:
        env = lmdb.open(str(path), readonly=True, max_dbs=16, subdir=True)
    except lmdb.Error as exc:
        raise StoreError(f"cannot open the store to snapshot it: {exc}", str(path)) from exc
    try:
        copy_env(env, dest)
    finally:
        env.close()
