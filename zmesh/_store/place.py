"""Whether a running node's store is still where it opened it.

A data dir deleted under a running node (``rm -rf``, a cleanup job, a volume unmounted
lazily) leaves LMDB writing to files no name reaches any more: every commit succeeds,
every read works, and at close the node's id and every unacknowledged message go with
the last open descriptor. So is a data dir moved away or replaced by another (a restore
over a running node): the store LMDB writes is not the one a restart opens. Nothing in a
commit says so; ``Place.check`` does, with a few ``stat`` calls (each heartbeat): the
data dir, its ``LOCK`` and ``store/data.mdb`` must be the files (device and inode) they
were when the node opened them.

What happened is said once and kept: the node goes on delivering what it has (its open
store still works, and a consumer's acks empty it), refuses new publishes, and
``Node.snapshot`` still copies the open store into a new data dir.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .lock import LOCK_FILE

_GONE = (errno.ENOENT, errno.ENOTDIR)


class Place:
    """The files of one open store, as the node found them when it opened it."""

    def __init__(self, data_dir: Path, data_file: Path) -> None:
        self.data_dir = data_dir
        self._files = (data_dir, data_dir / LOCK_FILE, data_file)
        self._ids = [_file_id(path) for path in self._files]
        self.lost: str | None = None  # what happened to them, once found

    def check(self) -> str | None:
        """None while the store's files are those the node opened; else what happened
        (found once, then the same every time). A look that fails for another reason
        than a missing file (EACCES, EIO) says nothing either way."""
        if self.lost is None:
            for path, known in zip(self._files, self._ids, strict=True):
                if known is None:  # (not there at open: nothing to compare with)
                    continue
                try:
                    st = os.stat(path)
                except OSError as exc:
                    if exc.errno in _GONE:
                        self.lost = f"{path} was deleted or moved away while the node ran"
                        break
                    continue
                if (st.st_dev, st.st_ino) != known:
                    self.lost = (
                        f"{path} is not the file the node opened (deleted and made again, "
                        "or replaced) while the node ran"
                    )
                    break
        return self.lost


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
