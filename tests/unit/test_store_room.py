"""The room inside a store's file (``_store/room.py``): the pages a commit freed are not
room for the next commit, only for the one after it, as LMDB reuses them. A real LMDB
environment; its file is grown and emptied by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from zmesh._store.room import FileRoom

VALUE = b"v" * 16_000  # overflow pages of their own: 4 pages each


@pytest.fixture
def env(tmp_path: Path) -> Iterator[lmdb.Environment]:
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=2, sync=False)
    yield env
    env.close()


def _commit(env: lmdb.Environment, room: FileRoom, db: object, put=(), delete=()) -> None:
    with env.begin(write=True, db=db) as txn:
        for key in put:
            txn.put(key, VALUE)
        for key in delete:
            txn.delete(key)
    room.committed()


def test_the_pages_a_commit_freed_are_room_only_from_the_second_commit_after_it(
    env: lmdb.Environment, tmp_path: Path
) -> None:
    db = env.open_db(b"d")
    room = FileRoom(env, [db], str(tmp_path / "data.mdb"), env.stat()["psize"])
    room.tight = True
    keys = [b"%04d" % i for i in range(200)]
    _commit(env, room, db, put=keys)  # (800 pages or so)
    _commit(env, room, db, put=[b"x"])

    def reusable() -> int:
        end = env.info()["last_pgno"] + 1
        return room.reusable_pages(end, room.used_pages())

    before = reusable()
    assert before < 50
    _commit(env, room, db, delete=keys)  # frees them all
    end = env.info()["last_pgno"] + 1
    assert end - room.used_pages() > 700  # free in the file...
    assert reusable() <= before + 10  # ...but not for the next commit
    _commit(env, room, db, put=[b"y"])
    assert reusable() > 700  # the commit after it may take them
    # What the file has past the last page in use counts as room too.
    end = env.info()["last_pgno"] + 1
    assert room.tail_pages(end) == 0
    with open(tmp_path / "data.mdb", "ab") as f:
        f.truncate((end + 10) * env.stat()["psize"])
    assert room.tail_pages(env.info()["last_pgno"] + 1) >= 10


def test_without_the_last_commits_free_pages_nothing_inside_counts(
    env: lmdb.Environment, tmp_path: Path
) -> None:
    db = env.open_db(b"d")
    room = FileRoom(env, [db], str(tmp_path / "data.mdb"), env.stat()["psize"])
    keys = [b"%04d" % i for i in range(100)]
    _commit(env, room, db, put=keys)
    _commit(env, room, db, delete=keys)
    _commit(env, room, db, put=[b"y"])  # (not noted: the disk was not tight)
    end = env.info()["last_pgno"] + 1
    assert room.reusable_pages(end, room.used_pages()) == 0  # (not known: none)
