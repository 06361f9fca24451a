"""The disk under a store: how much room it has left, and the reserve kept for settlements.

LMDB never writes a page in place: even a commit that only deletes (acks, expiry, purges)
copies the pages it changes to free ones, and pages freed by a commit become reusable only
two commits later. On a full disk such a commit needs fresh pages at the end of
``data.mdb``, cannot get them, and fails; the outbox can then never drain, not even after
a restart. So new messages stop while the disk still has ``MARGIN_BYTES`` free, and the
data dir holds a reserve file (``RESERVE``, ``RESERVE_BYTES`` allocated on the disk):
when a commit finds the disk full anyway (something else filled it, or the node was killed
and restarted on it), the reserve is deleted and its room lets the settlements commit.
While it is gone, new messages leave its size free too, and it is made again once the disk
has that room.

ENOSPC is the disk's own word for it; LMDB also reports EIO when a write of its pages is
cut short by a filling disk, which is taken as a full disk only while the disk is nearly
full.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

RESERVE_FILE = "RESERVE"  # in the data dir
RESERVE_BYTES = 4 << 20  # the reserve file: room for settlements on a full disk
MARGIN_BYTES = 1 << 20  # new messages leave at least this much of the disk free
# A new store (no data file yet) is not made on a disk with less room than this: LMDB's
# lock file is written through a memory map, where a full disk is a SIGBUS, not an error.
NEW_STORE_MIN_BYTES = 2 * MARGIN_BYTES
RESERVE_RETRY_S = 5.0  # how often a missing reserve is tried again
# A disk with more room than this for new messages is looked at (a system call) at most
# every ROOM_LOOK_S, not at every commit: what the store writes meanwhile is taken off the
# room last seen. Another process that fills more than this in less is met by the reserve.
ROOM_PLENTY_BYTES = 256 << 20
ROOM_LOOK_S = 1.0

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, file system type, source) of the file system holding ``path``."""
    path = Path(os.path.realpath(path))
    best = ("/", "?", "?")
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == Path(point) or Path(point) in path.parents) and len(point) >= len(
                    best[0]
                ):
                    best = (point, fields[2], fields[0])
    except OSError:
        pass
    return best


def _allocate(fd: int, size: int) -> None:
    """Give the file ``fd`` ``size`` bytes of blocks on its disk (not a sparse file):
    posix_fallocate, or zeros written where the file system has no fallocate."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    chunk = b"\0" * (1 << 20)
    for _ in range(size // len(chunk)):
        os.write(fd, chunk)
    os.fsync(fd)


class Disk:
    """The file system of one data dir: free bytes, and the reserve file in it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.reserve_path = data_dir / RESERVE_FILE
        self._next_reserve_try = 0.0
        self._free_seen: int | None = None  # free bytes last looked at, less what was spent
        self._look_after = 0.0  # when the disk is looked at again, however much room
        self._warned = False
        self.full = False  # the last look found no room for new messages
        # Whether the reserve file is there (this node makes and deletes it; a look at the
        # file each commit would cost a system call).
        self.reserve_held = self.reserve_path.is_file()

    def free_bytes(self) -> int | None:
        """Bytes an unprivileged writer may still use on the disk; None when unknown."""
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def kept_free(self) -> int:
        """Bytes new messages must leave free: the margin, plus the reserve's size while
        the reserve file is gone (so that it can be made again)."""
        return MARGIN_BYTES + (0 if self.reserve_held else RESERVE_BYTES)

    def room_bytes(self, spend: int = 0) -> int | None:
        """Bytes new messages may still take on the disk (None: unknown, no limit), before
        a commit that takes at most ``spend`` of them.

        Looked at anew every ROOM_LOOK_S, or when the room last seen, less what commits
        spent since, comes within ROOM_PLENTY_BYTES of none."""
        now = time.monotonic()
        free = self._free_seen
        if (
            free is None
            or now >= self._look_after
            or free - spend < self.kept_free() + ROOM_PLENTY_BYTES
        ):
            free = self.free_bytes()
            self._look_after = now + ROOM_LOOK_S
            if free is None:
                self._free_seen = None
                return None
        self._free_seen = free - spend
        return free - self.kept_free()

    def state(self) -> dict[str, bool | int | None]:
        """For status: the disk's free bytes, whether it is full for new messages, whether
        the reserve is held. Never raises."""
        free = self.free_bytes()
        return {
            "disk_full": self.full or (free is not None and free < self.kept_free()),
            "disk_free_bytes": free,
            "disk_reserve_held": self.reserve_held,
        }

    def describe(self) -> str:
        """The disk, for messages: its mount point, type and source."""
        point, fstype, source = mount_of(self.data_dir)
        return f"{point} ({fstype} {source})"

    def tight(self) -> bool:
        """Whether the room last seen for new messages is within ROOM_PLENTY_BYTES of
        none (no look at the disk)."""
        free = self._free_seen
        return free is not None and free < self.kept_free() + ROOM_PLENTY_BYTES

    def make_reserve(self, inside: Callable[[], int] | None = None) -> bool:
        """Make the reserve file when it is missing and the disk has room for it (then
        at most every RESERVE_RETRY_S); True when it is held afterwards.

        Room for it means its size and the margin besides. The store's file never
        shrinks, so a disk it filled once may never again have that much free; but the
        pages its settlements freed are room for the store as good as the disk's (and
        new messages leave the margin free of them too, store.py): ``inside()``, the
        bytes the store may take inside its file, counts towards the margin. The reserve
        itself must be on the disk."""
        if self.reserve_held:
            return True
        now = time.monotonic()
        if now < self._next_reserve_try:
            return False
        self._next_reserve_try = now + RESERVE_RETRY_S
        free = self.free_bytes()
        if free is not None and free < RESERVE_BYTES + MARGIN_BYTES:
            # taking it now would leave the store itself without room, unless its file
            # holds that room
            if free < RESERVE_BYTES or inside is None:
                return False
            if free + inside() < RESERVE_BYTES + MARGIN_BYTES:
                return False
        tmp = self.reserve_path.with_name(RESERVE_FILE + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _allocate(fd, RESERVE_BYTES)
            finally:
                os.close(fd)
            os.replace(tmp, self.reserve_path)
            self.reserve_held = True
            self.full = False  # (it had room for the reserve and the margin besides)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if exc.errno not in _FULL_ERRNOS and not self._warned:
                self._warned = True  # (tried again every RESERVE_RETRY_S: said once)
                log.warning("cannot make the disk reserve %s: %s", self.reserve_path, exc)
            return False
        log.info("disk reserve %s of %d bytes made", self.reserve_path, RESERVE_BYTES)
        return True

    def check_reserve(self) -> None:
        """A reserve held whose file is gone (deleted, or replaced by something else) is
        held no more: said once, and made again when the disk has room for it. Until
        then the store keeps the larger margin (``kept_free``)."""
        if self.reserve_held and not self.reserve_path.is_file():
            self.reserve_held = False
            log.warning(
                "the disk reserve %s is gone: the store keeps %d bytes of the disk free "
                "instead until it is made again",
                self.reserve_path,
                MARGIN_BYTES + RESERVE_BYTES,
            )

    def release_reserve(self) -> bool:
        """Delete the reserve file, giving its room to the store; True when there was one."""
        if not self.reserve_held:  # (none, or gone: check_reserve said so)
            return False
        self.reserve_held = False
        try:
            self.reserve_path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("cannot release the disk reserve %s: %s", self.reserve_path, exc)
            return False
        self._next_reserve_try = time.monotonic() + RESERVE_RETRY_S
        log.warning(
            "the disk of %s is full: its reserve of %d bytes was released so that "
            "acks and other settlements can commit",
            self.data_dir,
            RESERVE_BYTES,
        )
        return True

    def is_full_error(self, exc: BaseException) -> bool:
        """Whether a failed write (an LMDB error, an OSError) means the disk is full:
        ENOSPC or EDQUOT, or EIO while the disk has less than the margin free."""
        code = getattr(exc, "errno", None)
        text = str(exc)
        if code in _FULL_ERRNOS or any(os.strerror(e) in text for e in _FULL_ERRNOS):
            return True
        if code == errno.EIO or os.strerror(errno.EIO) in text:
            free = self.free_bytes()
            return free is not None and free < MARGIN_BYTES + RESERVE_BYTES
        return False
