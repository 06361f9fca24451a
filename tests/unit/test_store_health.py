"""Damage a running store meets (health.py), and what a clean close records (lock.py)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import lmdb
import pytest

from zmesh._store.health import Health, lmdb_error
from zmesh._store.lock import LOCK_FILE, let_go, take_lock
from zmesh.errors import StoreError


def _health(tmp_path: Path) -> Health:
    # (no data file: the check it starts finds that at once, with no child process)
    return Health(str(tmp_path / "store"), contextlib.nullcontext)


def test_a_read_lmdb_refuses_is_a_store_error_naming_the_remedies(tmp_path):
    health = _health(tmp_path)
    assert health.state() is None and health.deletes("msgs")
    with pytest.raises(StoreError) as err, health.reading("the msgs database", "msgs"):
        raise lmdb.CorruptedError("mdb_get: MDB_CORRUPTED: Located page was wrong type")
    assert isinstance(err.value.__cause__, lmdb.CorruptedError)
    assert "reading the msgs database failed (mdb_get: MDB_CORRUPTED" in str(err.value)
    assert f"zmesh store salvage {tmp_path} NEW_DIR" in str(err.value)
    assert not health.deletes("msgs") and health.deletes("pend")
    health.close()  # (waits for the check the first failure started)
    state = health.state()
    assert state is not None
    assert state["error"].startswith("reading the msgs database failed")
    assert state["databases"] == ["msgs"] and state["reads_failed"] == 1
    assert state["remedy"].startswith(f"zmesh store check {tmp_path} lists what is damaged")
    assert "cannot read it" in state["check"]


def test_py_lmdb_system_errors_are_unwrapped_and_other_errors_are_not_damage(tmp_path):
    health = _health(tmp_path)
    try:
        raise SystemError("returned a result with an exception set") from lmdb.BadTxnError("x")
    except SystemError as exc:
        assert isinstance(lmdb_error(exc), lmdb.BadTxnError)
    assert lmdb_error(SystemError("no cause")) is None
    with (
        pytest.raises(StoreError, match="reading the ids database failed") as err,
        health.reading("the ids database", "ids"),
    ):
        raise lmdb.ReadersFullError("mdb_txn_begin: MDB_READERS_FULL")
    assert "damaged" not in str(err.value)
    assert health.state() is None and health.deletes("ids")  # (not damage: nothing noted)
    with pytest.raises(ValueError), health.reading("the ids database"):
        raise ValueError("not LMDB's")
    health.close()


def test_a_clean_close_records_the_change_time_and_a_damaged_one_says_so(tmp_path):
    data = tmp_path / "store" / "data.mdb"
    data.parent.mkdir()
    data.write_bytes(b"\0" * 8192)
    lock = tmp_path / LOCK_FILE

    def close(damaged: bool = False) -> None:
        held = take_lock(tmp_path, data)
        held.env = _Env()
        let_go(held, sync=True, damaged=damaged)

    def why() -> str | None:
        """Why a start would check the store (what it finds is left as it was)."""
        found = lock.read_text()
        held = take_lock(tmp_path, data)
        os.close(held.lock_fd)
        lock.write_text(found)
        return held.unclean()

    close()
    assert why() is None
    # Written in place with its modification time put back: its change time says so.
    st = data.stat()
    with open(data, "r+b") as f:
        f.write(b"\1")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert why() == "its data file changed after its node closed it"
    close()
    # A lock file written before the change time was recorded: the rest is compared.
    lock.write_text(" ".join(lock.read_text().split()[:4]) + "\n")
    assert why() is None
    close(damaged=True)
    assert why() == "its last node found it damaged"


class _Env:
    """What let_go closes of an environment."""

    def sync(self, force: bool) -> None:
        pass

    def close(self) -> None:
        pass
