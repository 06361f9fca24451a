"""Whether a store's files are still those its node opened (``_store/place.py``): a data
dir deleted, moved away, or replaced under a running node."""

from __future__ import annotations

import shutil
from pathlib import Path

from zmesh._store.place import Place


def _data_dir(path: Path) -> Path:
    (path / "store").mkdir(parents=True)
    (path / "LOCK").write_text("1\n")
    (path / "store" / "data.mdb").write_bytes(b"\0" * 8192)
    return path


def test_files_left_alone_are_the_same(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path / "d")
    place = Place(data_dir, data_dir / "store" / "data.mdb")
    (data_dir / "store" / "data.mdb").write_bytes(b"\1" * 8192)  # (written in place)
    assert place.check() is None and place.lost is None


def test_a_deleted_data_dir_is_found_and_stays_found(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path / "d")
    place = Place(data_dir, data_dir / "store" / "data.mdb")
    shutil.rmtree(data_dir)
    what = place.check()
    assert what == f"{data_dir} was deleted or moved away while the node ran"
    _data_dir(data_dir)  # made again, empty: still not the node's files
    assert place.check() == what


def test_a_data_file_replaced_in_its_place_is_found(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path / "d")
    data_file = data_dir / "store" / "data.mdb"
    place = Place(data_dir, data_file)
    other = tmp_path / "other.mdb"
    other.write_bytes(b"\0" * 8192)
    other.replace(data_file)  # (a restore over a running node)
    what = place.check()
    assert what is not None and str(data_file) in what and "not the file" in what


def test_a_replaced_lock_file_is_found(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path / "d")
    place = Place(data_dir, data_dir / "store" / "data.mdb")
    # (held open, as the node holds it: its inode is not given to the new file)
    with open(data_dir / "LOCK", "rb"):
        (data_dir / "LOCK").unlink()
        (data_dir / "LOCK").write_text("2\n")
        what = place.check()
    assert what is not None and str(data_dir / "LOCK") in what
