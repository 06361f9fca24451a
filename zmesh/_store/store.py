"""The node's LMDB environment: one file set per data dir, written by one thread.

Databases (keys are big-endian so LMDB's order is numeric order):

- ``meta``:  node identity and counters (``node_id``, ``incarnation``, ``next_seq``,
  ``next_lane``) and the store's ``format`` (format.py: a later one is refused at open).
- ``msgs``:  seq(8) -> msgpack [topic, partition, key, headers, priority, published_at,
  expires_at, deliver_at, payload, index]: the outbox; immutable once written.
- ``pend``:  lane_id(4) + seq(8) -> msgpack [partition, priority, attempt, expires_at,
  deliver_at]: what each lane still owes. A message leaves ``msgs`` when no lane owes it.
- ``runs``:  first seq(8) -> msgpack [topic, partitions, keys, headers, published_at,
  payloads, indexes]: a batch of plain messages stored as one record (one element per
  message in each column, partitions, indexes and publish times (one for the whole run,
  or one each) as little-endian bytes, lists in records written before; keys nil when
  none has one; see _engine/outbox/runs.py and damage.decode_run).
- ``pruns``: lane_id(4) + first seq(8) -> msgpack [partitions, offsets, attempts]: what a
  lane still owes of a run (partitions a bin of a byte each, or a list past 255; offsets
  nil: all of it, an int: from that one to the end, else a list; attempts nil: none
  handed out yet, else one per offset owed).
- ``lanes``: msgpack [topic, lane] -> msgpack [lane_id, group, mode, idle_since,
  assigned]: every group this producer has learned of, remembered so an offline group
  accumulates its backlog; ``idle_since`` (wall clock; nil while it has members, or
  absent) is when it last had no member, for ``TopicConfig.group_inactive_expiry_s``;
  ``assigned`` (absent until each partition had a member) the partitions' homes (the
  member each belongs to, lane/assignment.py), [the distinct members, each partition's
  index among them]: a restart, or a taker of the lanes, starts from them.
- ``acked``: producer(16) + chunk(8) + lane -> bitmap: the consumer's dedupe window of
  acked messages, pruned below each producer's announced floor (see acked.py).
- ``dead``:  lane_id(4) + seq(8) -> msgpack [state, reason, attempts, failed_at, history,
  record]: parked messages of a lane (see _engine/outbox/deadletters.py).
- ``peers``: node id(16) -> "endpoint[ key]": peers this node knew, contacted again after
  a restart so a node whose ports changed is found without mDNS or seeds.
- ``ids``:   caller-chosen msg_id -> seq(8) + stored_at(8): the producer's idempotency
  window; ``ids_t``: stored_at(8) + msg_id -> b"", the same in time order for pruning
  (stored_at the node's observed time, outbox/wallclock.py).
- ``rlog``:  topic + NUL + partition(2) + index(8) -> seq(8) + published_at(8): the
  index of every message of a topic per partition, what replay reads (_engine/outbox/retention.py).
- ``rtime``: topic + NUL + seq(8) -> partition(2) + index(8) + size(4) + published_at(8):
  the same entries in publish order, what retention reclaims from the oldest.
- ``rnext``: topic + NUL + partition(2) -> next index(8), so indexes are never reused even
  when retention reclaimed every entry of a partition.
- ``bad``:   db name + b"\\0" + key -> the raw value of a record that could not be decoded,
  set aside so the node starts and an operator can inspect it (see damage.py).

This module is long because the Store is the one owner of the LMDB environment (opening
it, growing its map, its reads, the commit of a loop's write batch); keys, batches,
pages, damage (and the damage a running node's reads meet, health.py), disk room and
snapshots are modules of their own. No read or commit lets an ``lmdb`` error out: a read
LMDB refuses is a StoreError, or, for an outbox record, a record left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import msgpack

from .._dirs import make_dir
from ..errors import StoreError, StoreFullError
from .acked import AckedWindow
from .batch import WriteBatch as WriteBatch  # (re-exported: the engine's one import)
from .check import check_store
from .damage import (
    Corrupt,
    advice,
    check_store_files,
    decode_run,
    number_column,
    read_failed,
    remedy,
    run_offsets,
)
from .deletes import delete_each, delete_prefix
from .disk import NEW_STORE_MIN_BYTES, Disk
from .format import FORMAT, check_format
from .format import KEY as FORMAT_KEY
from .health import DAMAGE_ERRORS, Health, lmdb_error
from .keys import pend_key as pend_key
from .keys import u32 as u32
from .keys import u64 as u64
from .lock import LockedDir, collected, let_go, take_lock
from .logindex import LogIndex
from .pages import MappedPages
from .place import Place
from .room import FileRoom
from .snapshot import copy_env

log = logging.getLogger(__name__)
T = TypeVar("T")  # what a decoder makes of a record
# A ``pend`` value: (partition, priority, attempt, expires_at, deliver_at), times None when
# unset.
PendingValue = tuple[int, int, int, float | None, float | None]
# (topic, lane, lane_id, group, mode, idle_since, assigned)
LaneEntry = tuple[str, str, int, str, str, float | None, list[bytes] | None]
# A ``pruns`` value: (partitions, offsets: None for all, a range or an ascending list,
# attempts: None, or one per offset owed). The partitions are an array[int]; Any while the
# lane's PlainRun, which restart hands them to, declares a list[int].
RunEntry = tuple[Any, range | list[int] | None, list[int] | None]
# A ``dead`` value: [state, reason, attempts, failed_at, history, record], as msgpack lists it.
DeadValue = list[Any]

# Pages of the map new messages leave free (see Store._would_fill): at least this many,
# and at least 1/RESERVE_FRACTION of the map.
RESERVE_MIN_PAGES = 16
PENDING_VALUES_KEPT = 4096  # distinct pending values decoded once each by iter_pending
RESERVE_FRACTION = 64
SCAN_RELEASE_BYTES = 2 << 20  # keys and values read by a scan between two releases

_packb = msgpack.Packer(use_bin_type=True).pack


def unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


pack: Callable[[Any], bytes] = _packb  # msgpack with bin types (IO thread only)


class Store(LogIndex, AckedWindow):
    """The LMDB environment of one node's data dir."""

    def __init__(self, data_dir: str, map_size_bytes: int) -> None:
        self.data_dir = Path(data_dir)
        self.path = str(self.data_dir / "store")
        self.map_size_bytes = map_size_bytes
        self.corrupt: list[Corrupt] = []  # records reads skipped, for the engine to set aside
        self.health = Health(self.path, self._frozen)  # damage met by reads (health.py)
        # set_mapsize needs every transaction of this process closed; the only reads off
        # the IO thread (snapshots) hold this lock, and growing the map takes it.
        self._resize_lock = threading.Lock()
        make_dir(self.data_dir, "data dir", lambda message: StoreError(message, data_dir))
        held = self._held = take_lock(self.data_dir, Path(self.path) / "data.mdb")
        # A Node created and dropped without close() (an exception before its `with`, a
        # REPL) lets go of the data dir when collected, not only when the process exits.
        # Not at exit: the OS frees the lock then, and a node's IO thread may still run.
        self._release = weakref.finalize(self, collected, held, str(self.data_dir))
        self._release.atexit = False
        self.disk = Disk(self.data_dir)
        try:
            lost = held.lost()
            if lost is not None:
                raise StoreError(lost, self.path)
            check_store_files(Path(self.path))
            # (read before the store is opened: opening it writes the data file)
            self._replaced = held.replaced()
            self._check_if_unclean(held)
            self._check_room_for_new()
            try:
                migrated = self._open_env(held)
            except lmdb.Error as exc:
                raise self._open_error(exc) from exc
            self.place = Place(self.data_dir, Path(self.path) / "data.mdb")
            self.make_reserve()
        except BaseException:
            self._release.detach()
            with contextlib.suppress(Exception):  # (the environment may be half open)
                let_go(held, sync=False)
            raise
        if migrated:
            log.info(
                "%s: the dedupe window's %d entries are kept as bitmaps from now on",
                self.path,
                migrated,
            )

    def _check_if_unclean(self, held: LockedDir) -> None:
        """Walk the store for damage (check.py) unless it is as a clean close left it;
        StoreError naming the data file and the remedies when it is damaged."""
        why = held.unclean()
        if why is None:
            return
        size = held.data_file.stat().st_size
        log.warning(
            "checking the store %s (%.1f MiB) for damage before opening it: %s",
            self.path,
            size / (1 << 20),
            why,
        )
        report = check_store(self.path)
        if not report.sound:
            raise StoreError(f"{report.summary()}; {advice(self.path)}", self.path)
        log.warning("store %s checked in %.1fs: sound", self.path, report.seconds)

    def _open_env(self, held: LockedDir) -> int:
        """Open the environment and its databases; how many dedupe entries were migrated."""
        self.env = held.env = lmdb.open(
            self.path,
            map_size=self.map_size_bytes,
            max_dbs=16,
            subdir=True,
            sync=False,
            metasync=False,
            readahead=False,
            max_readers=64,
        )
        self.meta = self.env.open_db(b"meta")
        self.msgs = self.env.open_db(b"msgs")
        self.pend = self.env.open_db(b"pend")
        self.runs = self.env.open_db(b"runs")
        self.pruns = self.env.open_db(b"pruns")
        self.lanes = self.env.open_db(b"lanes")
        self.acked = self.env.open_db(b"acked")
        self.dead = self.env.open_db(b"dead")
        self.ids = self.env.open_db(b"ids")
        self.ids_t = self.env.open_db(b"ids_t")
        self.peers = self.env.open_db(b"peers")
        self.rlog = self.env.open_db(b"rlog")
        self.rtime = self.env.open_db(b"rtime")
        self.rnext = self.env.open_db(b"rnext")
        self.bad = self.env.open_db(b"bad")
        self._dbs = (
            self.meta,
            self.msgs,
            self.pend,
            self.runs,
            self.pruns,
            self.lanes,
            self.acked,
            self.dead,
            self.ids,
            self.ids_t,
            self.peers,
            self.rlog,
            self.rtime,
            self.rnext,
            self.bad,
        )
        self._psize = self.env.stat()["psize"]
        self._overflow = self._psize // 2 - 32  # larger values go to overflow pages
        with self.env.begin(db=self.meta) as txn:
            check_format(txn.get(FORMAT_KEY), self.path)  # (before anything is written)
        self.pages = MappedPages(os.path.join(self.path, "data.mdb"))
        self.room = FileRoom(self.env, self._dbs, os.path.join(self.path, "data.mdb"), self._psize)
        # A map grown before (or used past map_size_bytes) reopens at its real size.
        self.map_size_bytes = self.env.info()["map_size"]
        return self.migrate_seen()

    def _check_room_for_new(self) -> None:
        """Refuse to make a new store on a disk without room for it (a full disk would
        kill the process where LMDB writes its lock file through a memory map)."""
        if (Path(self.path) / "data.mdb").exists():
            return
        free = self.disk.free_bytes()
        if free is not None and free < NEW_STORE_MIN_BYTES:
            raise StoreFullError(
                self.path, self.map_size_bytes, disk=self.disk.describe(), free_bytes=free
            )

    def full_error(self, waited_s: float | None = None) -> StoreFullError:
        """The StoreFullError of the store as it is: its disk's, or its map's."""
        if self.disk.full:
            return StoreFullError(
                self.path,
                self.map_size_bytes,
                waited_s,
                disk=self.disk.describe(),
                free_bytes=self.disk.free_bytes(),
            )
        return StoreFullError(self.path, self.map_size_bytes, waited_s)

    def _disk_full(self, exc: BaseException, release: bool = True) -> StoreFullError | None:
        """What a failed write means when the disk is full: the reserve is released (its
        room lets the next commit through; not for a commit of new messages, ``release``
        False: the reserve is for settlements) and the error to raise; None otherwise."""
        if not self.disk.is_full_error(exc):
            return None
        self.disk.full = True
        if release:
            self.disk.release_reserve()
        return self.full_error()

    def make_reserve(self) -> bool:
        """Make the disk's reserve again when there is room for it (disk.py): on the disk,
        or, for the margin beside it, inside the store's file (room.py). Never in a data
        dir that is no longer the store's (place.py)."""
        if self.disk.reserve_held:
            return True
        if self.place.lost is not None:
            return False
        return self.disk.make_reserve(self.room.inside_bytes)

    def clear_stale_readers(self) -> int:
        """(IO thread, each heartbeat.) Free the reader slots of processes that ended
        inside a read transaction of this store (a copier killed mid-copy); how many. LMDB
        reuses no page freed since such a slot's snapshot while it stays: every commit
        would grow the file instead, until the node restarts."""
        try:
            cleared = int(self.env.reader_check())
        except lmdb.Error:
            return 0
        if cleared:
            log.warning(
                "freed %d reader slot(s) of %s that ended processes left (killed while "
                "reading it): LMDB reused none of the pages freed since they began",
                cleared,
                self.path,
            )
        return cleared

    def lost(self) -> StoreError | None:
        """(IO thread.) None while the store's files are those the node opened
        (place.py); else the StoreError that refuses new publishes (``lost_error``)."""
        first = self.place.lost is None
        if self.place.check() is None:
            self.disk.check_reserve()
            return None
        if first:
            self.disk.reserve_held = False  # (gone with the data dir, or not this store's)
        return self.lost_error()

    def lost_error(self) -> StoreError | None:
        """(Any thread.) The StoreError that refuses new publishes once ``lost`` found
        the store's files gone, saying what happened and what to do; None until then."""
        what = self.place.lost
        if what is None:
            return None
        return StoreError(
            f"{what}: the node's store lives on only in files no name reaches, and is lost "
            "when the node stops (its id and its unacknowledged messages with it), so new "
            "publishes are refused; Node.snapshot(NEW_DIR) copies it as it is into a new "
            "data dir, to start this node from there (in place of this one); otherwise "
            "close the node once its consumers drained what it holds",
            self.path,
        )

    def _open_error(self, exc: lmdb.Error) -> StoreError:
        """What failing to open the environment means: a map this host cannot map (a
        configuration error: moving the data dir aside would not help), or a damaged
        store."""
        if isinstance(exc, lmdb.MemoryError):  # ENOMEM: mmap refused a map that large
            data = Path(self.path) / "data.mdb"
            used = data.stat().st_size if data.is_file() else 0
            if used <= self.map_size_bytes:
                return StoreError(
                    f"map_size_bytes {self.map_size_bytes} cannot be mapped on this host "
                    f"({exc}): lower map_size_bytes (to grow the map only when it fills "
                    "up, set max_map_size_bytes) or raise the process's address-space limit "
                    "(ulimit -v)",
                    self.path,
                )
            return StoreError(
                f"the store's data file of {used} bytes (more than map_size_bytes "
                f"{self.map_size_bytes}) cannot be mapped on this host ({exc}): raise the "
                "process's address-space limit (ulimit -v), or run the node on a host that "
                "can map it",
                self.path,
            )
        return StoreError(
            f"cannot open the LMDB store ({exc}); if it is damaged, {remedy(self.path)}", self.path
        )

    def close(self) -> None:
        if self._release.detach() is not None:  # (not twice; not again when collected)
            if self.place.check() is not None:
                log.error(
                    "closing the store %s: %s; what it held is gone with its files",
                    self.path,
                    self.place.lost,
                )
            self.health.close()  # (its check holds a read transaction)
            let_go(self._held, sync=True, damaged=self.health.damaged)

    def snapshot(self, dest: str) -> None:
        """A consistent, compacted copy of this store into the data dir ``dest``."""
        with self._resize_lock:
            copy_env(self.env, dest)

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        """While a check walks the file (health.py): a read transaction, so that no commit
        reuses a page of the last committed tree, and the map is not grown."""
        with self._resize_lock, self.env.begin():
            yield

    def grow(self, limit: int) -> bool:
        """Double the map, up to ``limit`` bytes (IO thread only); False when it cannot."""
        new = min(limit, self.map_size_bytes * 2)
        if new <= self.map_size_bytes or not self._resize_lock.acquire(blocking=False):
            return False  # at the limit, or a snapshot is reading: try again later
        try:
            self.pages.remapped()  # (before: a failed resize may have unmapped it too)
            self.env.set_mapsize(new)
        except lmdb.Error as exc:
            log.error("could not grow the LMDB map of %s to %d bytes: %s", self.path, new, exc)
            return False
        finally:
            self._resize_lock.release()
        log.warning(
            "LMDB map of %s grown from %d to %d bytes (max_map_size_bytes %d)",
            self.path,
            self.map_size_bytes,
            new,
            limit,
        )
        self.map_size_bytes = new
        return True

    def _scan(self, db: Any, name: str, decode: Callable[[bytes, bytes], Any]) -> Iterator[Any]:
        """Decoded records of ``db``; those that fail to decode go to ``self.corrupt``."""
        scanned = 0
        try:
            with self.env.begin(db=db) as txn:
                for k, v in txn.cursor():
                    # A scan maps the db's pages and, by the kernel's fault-around, cached
                    # pages beside them (other dbs' pages): let go of them as it goes.
                    scanned += len(k) + len(v)
                    if scanned >= SCAN_RELEASE_BYTES:
                        self.pages.release()
                        scanned = 0
                    try:
                        yield decode(k, v)
                    except Exception as exc:  # any decoding failure means a damaged record
                        self.corrupt.append(
                            Corrupt(name, bytes(k), bytes(v), f"{type(exc).__name__}: {exc}")
                        )
        except (lmdb.Error, SystemError) as exc:
            error = lmdb_error(exc)
            if error is None:
                raise
            raise read_failed(error, self.path, f"the {name} database") from exc
        self.pages.release()  # (the whole db was read: a restart's pending entries)

    def take_corrupt(self) -> list[Corrupt]:
        out, self.corrupt = self.corrupt, []
        return out

    # -- identity -------------------------------------------------------------------------

    def open_identity(self) -> tuple[bytes, int, int, int]:
        """(node id, incarnation, next seq, next lane id); bumps the incarnation.

        On a full disk the reserve is released for it (a node restarted there must start,
        to drain its outbox)."""
        try:
            return self._open_identity()
        except lmdb.Error as exc:
            if self._disk_full(exc) is None:
                raise self._open_error(exc) from exc
        try:
            return self._open_identity()
        except lmdb.Error as exc:
            raise self.full_error() if self.disk.full else self._open_error(exc) from exc

    def _open_identity(self) -> tuple[bytes, int, int, int]:
        with self._write() as txn:
            node_id = txn.get(b"node_id", db=self.meta)
            known = node_id is not None
            if node_id is None:
                node_id = os.urandom(16)
                txn.put(b"node_id", node_id, db=self.meta)
            incarnation = (
                int.from_bytes(txn.get(b"incarnation", b"\0" * 8, db=self.meta), "big") + 1
            )
            # A store put back from a snapshot (or a copy) of a node that went on after it:
            # that node's later life used incarnations and sequences this store never saw,
            # and its peers and consumers remember them (a later life's hellos win, and a
            # sequence they acked is dropped as a duplicate: new messages lost, their
            # receipts acked). Past them by the clock: a later life never reaches it.
            restored = self._replaced and known
            if restored:
                incarnation = max(incarnation, time.time_ns() // 1_000_000)
            txn.put(b"incarnation", u64(incarnation), db=self.meta)
            txn.put(FORMAT_KEY, u32(FORMAT), db=self.meta)  # (a later one was refused)
            next_seq = int.from_bytes(txn.get(b"next_seq", b"\0" * 8, db=self.meta), "big")
            # Sequences allocated but never committed before a crash are skipped: resume
            # past the highest one stored, whatever the counter says.
            cur = txn.cursor(db=self.msgs)
            if cur.last():
                next_seq = max(next_seq, int.from_bytes(cur.key(), "big") + 1)
            cur = txn.cursor(db=self.runs)
            if cur.last():
                run = decode_run(cur.value())
                first = int.from_bytes(cur.key(), "big")
                next_seq = max(next_seq, first + (len(run[1]) if run is not None else 1))
            if restored:
                next_seq = max(next_seq, time.time_ns() // RESTORED_SEQ_NS)
                txn.put(b"next_seq", u64(next_seq), db=self.meta)
                log.warning(
                    "%s holds an earlier state than its node left (a snapshot put back, a "
                    "copy): its sequences go on from %d and its incarnation from %d, past any "
                    "its later life used",
                    self.path,
                    next_seq,
                    incarnation,
                )
            next_lane = int.from_bytes(txn.get(b"next_lane", u32(1), db=self.meta), "big")
        self.env.sync(True)
        return node_id, incarnation, max(next_seq, 1), next_lane

    # -- reads ----------------------------------------------------------------------------

    def iter_lanes(self) -> Iterator[LaneEntry]:
        """(topic, lane, lane_id, group, mode, idle_since, assigned) of every remembered
        lane; ``assigned``: its partitions' homes (a member each), or None."""

        def decode(k: bytes, v: bytes) -> LaneEntry:
            topic, lane = unpackb(k)
            lane_id, group, mode, *rest = unpackb(v)
            idle = rest[0] if rest else None
            if len(rest) > 2 or not (idle is None or type(idle) in (int, float)):
                raise ValueError("not a lane")
            assigned = None
            if len(rest) == 2:
                members, index = rest[1]
                if not all(type(m) is bytes for m in members):
                    raise ValueError("not a lane's homes")
                assigned = [members[i] for i in index]
            return (
                str(topic),
                str(lane),
                int(lane_id),
                str(group),
                str(mode),
                None if idle is None else float(idle),
                assigned,
            )

        yield from self._scan(self.lanes, "lanes", decode)

    def iter_pending(self) -> Iterator[tuple[int, int, PendingValue]]:
        """(lane_id, seq, (partition, priority, attempt, expires_at, deliver_at))."""
        # Most values repeat (a plain message's is the same for every message of its
        # partition): each distinct value is decoded once.
        known: dict[bytes, PendingValue] = {}

        def decode(k: bytes, v: bytes) -> tuple[int, int, PendingValue]:
            value = known.get(v)
            if value is None:
                fields = unpackb(v)
                if not isinstance(fields, list) or len(fields) != 5:
                    raise ValueError("not a pending entry")
                value = tuple(fields)
                if len(known) < PENDING_VALUES_KEPT:
                    known[v] = value
            if len(k) != 12:
                raise ValueError("not a pending entry")
            return int.from_bytes(k[:4], "big"), int.from_bytes(k[4:], "big"), value

        yield from self._scan(self.pend, "pend", decode)

    def iter_pruns(self) -> Iterator[tuple[int, int, RunEntry]]:
        """(lane_id, first seq, (partitions, offsets, attempts)) of every run entry, its
        partitions an array, its offsets None (all owed), a range or a list (see
        ``runs.run_entry``), each within the run, its attempts None or one per offset."""

        def decode(k: bytes, v: bytes) -> tuple[int, int, RunEntry]:
            value = unpackb(v)
            if len(k) != 12 or not isinstance(value, list) or len(value) != 3:
                raise ValueError("not a run entry")
            parts, offsets, attempts = value
            parts = number_column(parts, len(parts), "BH") if parts else None
            if parts is None:
                raise ValueError("not a run entry")
            offsets = run_offsets(offsets, len(parts))
            if attempts is not None and not (
                type(attempts) is list
                and len(attempts) == len(offsets or parts)
                and set(map(type, attempts)) <= {int}
                and min(attempts) >= 0
            ):
                raise ValueError("bad attempts in a run entry")
            return (
                int.from_bytes(k[:4], "big"),
                int.from_bytes(k[4:], "big"),
                (parts, offsets, attempts),
            )

        yield from self._scan(self.pruns, "pruns", decode)

    def get_messages(self, seqs: list[int]) -> dict[int, bytes]:
        """The records of ``seqs`` (those that exist and can be read), as their bytes."""
        return self._get("msgs", seqs)

    def get_runs(self, firsts: list[int]) -> dict[int, bytes]:
        """The records of the runs starting at ``firsts`` (those that exist and can be
        read)."""
        return self._get("runs", firsts)

    def _get(self, name: str, seqs: list[int]) -> dict[int, bytes]:
        found = self.read_decoded(name, seqs, bytes)[0]
        return {seq: rec for seq, (rec, _size) in found.items()}

    def read_decoded(
        self, name: str, seqs: list[int], decode: Callable[[memoryview], T | None]
    ) -> tuple[dict[int, tuple[T, int]], dict[int, bytes], list[int]]:
        """The records of ``seqs`` in the ``msgs`` or ``runs`` db (``name``), decoded in
        the read transaction from LMDB's own pages: no copy of a record is made to decode
        it (what ``decode`` returns owns its bytes). Returns seq -> (fields, the record's
        size); as their bytes, the records ``decode`` found damaged (None); and the
        sequences whose record LMDB refused to read (a damaged page: health.py)."""
        out: dict[int, tuple[T, int]] = {}
        bad: dict[int, bytes] = {}
        unreadable: list[int] = []
        sizes = []
        db = getattr(self, name)
        rest = seqs
        while rest:
            seq = -1  # (the one whose read failed; -1: the transaction did not begin)
            try:
                with self.env.begin(db=db, buffers=True) as txn:
                    get = txn.get
                    for seq in rest:
                        rec = get(u64(seq))
                        if rec is not None:
                            fields = decode(rec)
                            sizes.append(len(rec))
                            if fields is None:
                                bad[seq] = bytes(rec)
                            else:
                                out[seq] = (fields, len(rec))
                rest = []
            except lmdb.Error as exc:
                # A failed read leaves its transaction unusable: the rest are read in
                # another one.
                error = self.health.failed(exc, f"reading the {name} database", name)
                if seq < 0 or not isinstance(exc, DAMAGE_ERRORS):
                    raise error from exc
                unreadable.append(seq)
                rest = rest[rest.index(seq) + 1 :]
        self.pages.add(self._mapped(sizes))
        return out, bad, unreadable

    def _mapped(self, sizes: Iterable[int]) -> int:
        """The bytes of the map reading records of ``sizes`` touches: a large record has
        overflow pages of its own (and its deletion maps the first one again)."""
        big, extra = self._overflow, 3 * self._psize
        return sum(n if n < big else n + extra for n in sizes)

    def known_peers(self) -> dict[bytes, tuple[str, bytes]]:
        """(control endpoint, CURVE key or b"") of the peers this node knew before."""

        def decode(k: bytes, v: bytes) -> tuple[bytes, tuple[str, bytes]]:
            ep, _, key = bytes(v).decode().partition(" ")
            return bytes(k), (ep, key.encode())

        return dict(self._scan(self.peers, "peers", decode))

    def meta_value(self, key: bytes) -> bytes | None:
        """A value of ``meta`` (None: absent)."""
        with self.health.reading("the meta database", "meta"), self.env.begin(db=self.meta) as txn:
            value = txn.get(key)
        return None if value is None else bytes(value)

    def lookup_ids(self, msg_ids: list[bytes], since: float) -> dict[bytes, int]:
        """Sequences of msg_ids already published within the idempotency window: stored
        at ``since`` or later (the heartbeats' pruning of older ones may lag behind)."""
        out = {}
        with self.health.reading("the ids database", "ids"), self.env.begin(db=self.ids) as txn:
            for mid in msg_ids:
                v = txn.get(mid)
                if v is not None and (len(v) < 16 or struct.unpack(">d", v[8:16])[0] >= since):
                    out[mid] = int.from_bytes(v[:8], "big")
        return out

    def get_dead(self, lane_id: int, seq: int) -> DeadValue | None:
        with self.health.reading("the dead database", "dead"), self.env.begin(db=self.dead) as txn:
            value = txn.get(pend_key(lane_id, seq))
        return None if value is None else unpackb(value)

    def count_dead(self, lane_id: int) -> int:
        """How many ``dead`` entries ``lane_id`` has, counted by their keys alone."""
        prefix = u32(lane_id)
        count = 0
        with self.health.reading("the dead database", "dead"), self.env.begin(db=self.dead) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    count += 1
        return count

    def iter_all_dead(self) -> Iterator[tuple[int, int, DeadValue]]:
        def decode(k: bytes, v: bytes) -> tuple[int, int, DeadValue]:
            value = unpackb(v)
            if not isinstance(value, list) or len(value) != 6:
                raise ValueError("not a dead letter")
            return int.from_bytes(k[:4], "big"), int.from_bytes(k[4:], "big"), value

        yield from self._scan(self.dead, "dead", decode)

    def iter_dead(self, lane_id: int) -> Iterator[tuple[int, DeadValue]]:
        with self.health.reading("the dead database", "dead"), self.env.begin(db=self.dead) as txn:
            cur = txn.cursor()
            prefix = u32(lane_id)
            if cur.set_range(prefix):
                for k, v in cur:
                    if not k.startswith(prefix):
                        break
                    yield int.from_bytes(k[4:], "big"), unpackb(v)

    # -- writes ---------------------------------------------------------------------------

    def _write(self) -> Any:
        return self.env.begin(write=True)

    def commit(self, batch: WriteBatch) -> None:
        """Apply a batch in one transaction; StoreFullError when the map or the disk has
        no room for it."""
        grows = bool(batch.msgs_put or batch.runs_put)
        try:
            if grows and self._would_fill(batch):
                raise self.full_error()
            with self._write() as txn:
                self._apply(txn, batch)
        except lmdb.MapFullError as exc:
            self.disk.full = False
            raise StoreFullError(self.path, self.map_size_bytes) from exc
        except (lmdb.Error, SystemError) as exc:
            error = lmdb_error(exc)
            if error is None:
                raise
            # (new messages never take the reserve: their commit fails, the rest may not)
            full = self._disk_full(error, release=not grows)
            if full is not None:
                raise full from exc
            if isinstance(error, DAMAGE_ERRORS):
                raise self.health.failed(error, "a commit") from exc
            raise StoreError(f"LMDB write failed: {error}", self.path) from exc
        if grows:
            self.disk.full = False
        self.room.tight = not self.disk.reserve_held or self.disk.tight()
        self.room.committed()
        if batch.fsync:
            self.env.sync(True)
        # Records written or deleted and, per pending entry, deletion or outbox entry, about
        # a leaf slot each.
        self.pages.add(
            batch.msgs_bytes
            + batch.del_bytes
            + 32
            * (
                batch.pending_entries()
                + len(batch.pend_del)
                + len(batch.msgs_del)
                + len(batch.prun_set)
            )
        )

    def _would_fill(self, batch: WriteBatch) -> bool:
        """True when the new messages would eat into the reserve of the map.

        LMDB reuses the pages a commit frees only from the second commit after it, so a
        map filled to the last page may never commit again, not even the acks that would
        empty it. New messages therefore stop RESERVE short of the end; deletions, dead
        letters and the rest may use the reserve.
        """
        psize = self._psize
        capacity = self.map_size_bytes // psize
        reserve = max(RESERVE_MIN_PAGES, capacity // RESERVE_FRACTION)
        # Records (8-byte keys, node headers) and pending entries (12-byte keys, values of
        # about 12 bytes), twice over: split leaves are half full, and a record too large
        # for a leaf takes whole overflow pages. A run's record (up to 256 KiB of
        # payloads) takes its overflow pages, filled, and a slot in a leaf.
        runs_bytes = sum(len(v) for _k, v in batch.runs_put)
        need = (
            2
            * (
                batch.msgs_bytes
                - runs_bytes
                + 40 * len(batch.msgs_put)
                + 40 * batch.pending_entries()
            )
            // psize
            + 2
            + (runs_bytes + 2 * psize * len(batch.runs_put)) // psize
        )
        end = self.env.info()["last_pgno"] + 1  # pages of the file in use, free ones too
        room = self.disk.room_bytes(need * psize)  # (None: unknown, no limit)
        if capacity - end >= need + reserve and (room is None or room // psize >= need):
            return False  # the untouched end of the map is room enough: no need to count
        used = self.room.used_pages()
        if used + need + reserve > capacity:
            self.disk.full = False
            return True
        if room is None:
            self.disk.full = False
            return False
        # Free pages inside the file are reused before it grows, but only from the second
        # commit after the one that freed them (room.py).
        inside = self.room.reusable_pages(end, used) + self.room.tail_pages(end)
        self.disk.full = need > room // psize + inside
        return self.disk.full

    def _prune_ids(self, txn: Any, before: float, limit: int = 10_000) -> None:
        cur = txn.cursor(db=self.ids_t)
        if not cur.first():
            return
        for _ in range(limit):
            k = cur.key()
            if not k or struct.unpack(">d", k[:8])[0] >= before:
                return
            v = txn.get(k[8:], db=self.ids)
            if v is not None and v[8:16] == k[:8]:  # (not an id published again since)
                txn.delete(k[8:], db=self.ids)
            if not cur.delete():
                return

    def _apply(self, txn: Any, b: WriteBatch) -> None:
        # Nothing is deleted from a database known to be damaged (health.py): LMDB would
        # move records from or into its damaged pages.
        deletes = self.health.deletes
        # First: a rebuilt record may be put back under the key set aside here.
        for name, key, value in b.quarantine:
            txn.put(name.encode() + b"\0" + key, value, db=self.bad)
            if deletes(name):
                txn.delete(key, db=getattr(self, name))
        if b.msgs_put:
            txn.cursor(db=self.msgs).putmulti(b.msgs_put, append=False)
        if b.pend_put or b.pend_runs:
            put = txn.cursor(db=self.pend).putmulti
            put(b.pend_put)
            for prefix, seqs, values in b.pend_runs:
                put(zip(map(prefix.__add__, seqs), values, strict=True))
        if b.runs_put:
            txn.cursor(db=self.runs).putmulti(b.runs_put)
        if b.prun_put:
            txn.cursor(db=self.pruns).putmulti(b.prun_put)
        if b.prun_set:  # (rewritten or deleted as settling left them; after the puts)
            cursor = txn.cursor(db=self.pruns)
            gone = deletes("pruns")
            for k, v in b.prun_set.items():
                if v is not None:
                    cursor.put(k, v)
                elif gone and cursor.set_key(k):
                    cursor.delete()
        if b.lanes_put:
            txn.cursor(db=self.lanes).putmulti(b.lanes_put)
        for key, lane_id in b.lanes_del:
            if deletes("lanes") and _lane_id(txn.get(key, db=self.lanes)) in (lane_id, None):
                # (not a lane made again under its key, in this batch: a new id)
                txn.delete(key, db=self.lanes)
            for name in ("pend", "pruns", "dead"):
                if deletes(name):
                    delete_prefix(txn, getattr(self, name), u32(lane_id))
        if b.dead_put:
            txn.cursor(db=self.dead).putmulti(b.dead_put)
        for mid, seq, at in b.ids_put:
            stamp = struct.pack(">d", at)
            txn.put(mid, u64(seq) + stamp, db=self.ids)
            txn.put(stamp + mid, b"", db=self.ids_t)
        if b.ids_prune_before and deletes("ids") and deletes("ids_t"):
            self._prune_ids(txn, b.ids_prune_before)
        for k, v in b.meta_put.items():
            txn.put(k, v, db=self.meta)
        for k, v in b.peers_put.items():
            txn.put(k, v, db=self.peers)
        for name, keys in (
            ("peers", b.peers_del),
            ("pend", b.pend_del),
            ("msgs", b.msgs_del),
            ("runs", b.runs_del),
            ("dead", b.dead_del),
        ):
            if keys and deletes(name):
                delete_each(txn, getattr(self, name), keys)
        if b.log_put or b.log_next or b.log_del:
            self._apply_log(txn, b)
        if b.seen_put or b.seen_masks or b.seen_prune or b.seen_heard or b.seen_forget:
            self._apply_acked(txn, b)


# A restored store's sequences go on from the clock in these units: a node's later life,
# started after the snapshot, stays below it unless it published more than 10 million
# messages a second on average since it started (and stays below 2**63 for 29,000 years).
RESTORED_SEQ_NS = 100


def _lane_id(value: bytes | None) -> int | None:
    """The id a ``lanes`` entry holds (None: no entry, or one that cannot be read)."""
    if value is None:
        return None
    try:
        fields = unpackb(value)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    return fields[0] if isinstance(fields, list) and fields and type(fields[0]) is int else None
