"""The bridge's log: an LMDB environment of its own, written by the bridge thread only.

Databases (keys are big-endian so LMDB's order is numeric order):

- ``meta``:    ``next_sid`` -> u32; ``log_id`` -> the log's id (hex), which names its
  streams to readers of several bridges; ``format`` -> u32, the record format.
- ``streams``: stream name ``topic/partition`` -> sid(4) + head(8) + end(8) + bytes(8):
  the first retained offset, the next offset to assign, and the record bytes ever
  appended (their average sizes micro-batches by bytes). Offsets start at 0, no gaps.
- ``log``:     sid(4) + last offset(8) -> a run of messages (``_runs.py``) with the offsets
  up to that one: a cursor put at ``sid + offset`` lands on the run holding the offset.
  Immutable once written; retention deletes whole runs from a stream's head.
- ``seen``, ``seen_t``: the dedupe window, bitmaps of the sequences logged per producer
  (``_seen.py``). Upstream redeliveries are dropped by it.
- ``readers``: name -> msgpack {"topics": [..] or None, "wm": {stream: offset}, "seen_at"}:
  the offsets below which a streaming query will never read again.
- ``sink``, ``sink_t``: the rows the sink published, as ranges of a task's rows or by
  their ids, and their expiry order (``_sinkrows.py``).

Other processes on the host open the environment read-only (``open_reader``); a process
that holds the writer reuses its handle, since LMDB forbids one file open twice per process.

This module is long because the log's databases and every read and write of them have
one owner, documented together with the record format.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from . import _seen, _sinkrows
from ._errors import BridgeError, LogFullError
from ._runs import VERSION as FORMAT
from ._runs import Run, encode, head

log = logging.getLogger(__name__)

_pack = msgpack.Packer(use_bin_type=True).pack
_OPEN: dict[str, BridgeLog] = {}
_OPEN_LOCK = threading.Lock()
PAGE_BYTES = 4096
DBS = ("meta", "streams", "log", "seen", "seen_t", "readers", "sink", "sink_t")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _int(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _cost(record_bytes: int) -> int:
    """What a record takes of the log's budget: its bytes and, for a small one, as much
    again (pages fill about half on inserts), for a large one its last page."""
    return record_bytes + min(record_bytes, PAGE_BYTES) + 64


class BridgeLog:
    """Per-partition offset log of runs, dedupe bitmaps, reader watermarks and sink rows."""

    def __init__(
        self,
        log_dir: str | Path,
        *,
        map_size_bytes: int = 1 << 30,
        max_log_bytes: int | None = None,
        readonly: bool = False,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.path = str(self.log_dir / "log")
        self.map_size_bytes = map_size_bytes
        # Below the map size, so that a full log still has the pages a prune needs.
        self.max_log_bytes = max_log_bytes or map_size_bytes // 2
        self.used_bytes = 0  # pages in use, measured after each commit (writer only)
        self.readonly = readonly
        self._lock_fd: int | None = None
        self._inode = 0
        # writer only: name -> [sid, head, end, bytes]
        self._bounds: dict[str, list[int]] = {}
        self._next_sid = 1
        try:
            if not readonly:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                self._lock_fd = os.open(self.log_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.env = lmdb.open(
                self.path,
                map_size=map_size_bytes,
                max_dbs=len(DBS),
                subdir=True,
                readonly=readonly,
                create=not readonly,
                sync=False,
                metasync=False,
                readahead=False,
                max_readers=256,
            )
            self.db = {name: self.env.open_db(name.encode(), create=not readonly) for name in DBS}
            self.log_id = self._identify()
        except BlockingIOError as exc:
            self._close_lock()
            raise BridgeError(f"bridge log {self.log_dir} is in use by another bridge") from exc
        except (OSError, lmdb.Error) as exc:
            self._close_lock()
            raise BridgeError(f"cannot open bridge log {self.path}: {exc}") from exc
        except BridgeError:
            self.env.close()
            self._close_lock()
            raise
        if not readonly:
            self._reload_bounds()
            self._measure()

    def _identify(self) -> str:
        """The log's id and format: made when the log is, checked when it is opened."""
        meta = self.db["meta"]
        with self.env.begin(write=not self.readonly) as txn:
            log_id, fmt = txn.get(b"log_id", db=meta), txn.get(b"format", db=meta)
            if log_id is None and not self.readonly:
                if txn.stat(self.db["streams"])["entries"]:
                    fmt = b"\0\0\0\1"  # streams before ids: the first format
                else:
                    log_id = secrets.token_hex(4).encode()
                    fmt = FORMAT.to_bytes(4, "big")
                    txn.put(b"log_id", log_id, db=meta)
                    txn.put(b"format", fmt, db=meta)
        if fmt is not None and _int(fmt) != FORMAT:
            raise BridgeError(
                f"bridge log {self.path} was written in format {_int(fmt)} by "
                f"an older zmesh; this one reads format {FORMAT}: let its readers "
                "finish, then give the bridge a new log_dir"
            )
        if log_id is None:
            raise BridgeError(f"bridge log {self.path} has no id yet: open it for writing first")
        return bytes(log_id).decode()

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def open_reader(cls, log_dir: str | Path) -> BridgeLog:
        """A read-only handle, shared per process (the writer's own when it lives here)."""
        key = os.path.realpath(Path(log_dir) / "log")
        try:
            inode = os.stat(os.path.join(key, "data.mdb")).st_ino
        except OSError as exc:
            raise BridgeError(f"no bridge log at {log_dir}: {exc}") from exc
        with _OPEN_LOCK:
            found = _OPEN.get(key)
            if found is not None and found.readonly and found._inode != inode:
                found.env.close()  # the log was replaced since: never read a stale file
                found = None
            if found is None:
                found = _OPEN[key] = cls(log_dir, readonly=True)
                found._inode = inode
            return found

    def register(self) -> None:
        """Let read-only opens in this process share this (writer) handle."""
        with _OPEN_LOCK:
            _OPEN[os.path.realpath(self.path)] = self

    def close(self) -> None:
        with _OPEN_LOCK:
            key = os.path.realpath(self.path)
            if _OPEN.get(key) is self:
                del _OPEN[key]
        try:
            if not self.readonly:
                self.env.sync(True)
            self.env.close()
        finally:
            self._close_lock()

    def _close_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def sync(self) -> None:
        self.env.sync(True)

    # -- reads ----------------------------------------------------------------------------

    def _read(self, fn: Any, *args: Any) -> Any:
        """Run a read transaction; lmdb errors become BridgeError."""
        for attempt in (1, 2):
            try:
                with self.env.begin(buffers=False) as txn:
                    return fn(txn, *args)
            except lmdb.MapResizedError as exc:
                # The writer's data outgrew this reader's mapping: adopt the new size.
                if attempt == 2 or not self.readonly:
                    raise BridgeError(f"bridge log {self.path}: {exc}") from exc
                self.env.set_mapsize(0)
            except lmdb.Error as exc:
                raise BridgeError(f"cannot read bridge log {self.path}: {exc}") from exc
        raise AssertionError("unreachable")

    def streams(self) -> dict[str, tuple[int, int]]:
        """Every stream ``topic/partition`` -> (head, end): retained offsets are [head, end)."""
        return {name: (b[0], b[1]) for name, b in self.stream_sizes().items()}

    def stream_sizes(self) -> dict[str, tuple[int, int, int]]:
        """Every stream -> (head, end, record bytes ever appended)."""
        return self._read(
            lambda txn: {
                bytes(k).decode(): (_int(v[4:12]), _int(v[12:20]), _int(v[20:28]))
                for k, v in txn.cursor(db=self.db["streams"])
            }
        )

    def read(
        self, stream: str, start: int, end: int, max_records: int, max_bytes: int = 32 << 20
    ) -> tuple[int, list[tuple[int, bytes]]]:
        """The runs of ``stream`` holding offsets from ``start`` (or the head, if later)
        below ``end``: (the first offset asked for that is retained, [(the run's first
        offset, its record)]). The first run may begin before that offset and the last
        end after ``end``; runs stop once they hold ``max_records`` from the first offset
        on or ``max_bytes``. A first offset above ``start`` means retention removed the gap.
        """
        return self._read(self._runs, stream, start, end, max_records, max_bytes)

    def _runs(
        self, txn: Any, stream: str, start: int, end: int, max_records: int, max_bytes: int
    ) -> tuple[int, list[tuple[int, bytes]]]:
        out: list[tuple[int, bytes]] = []
        meta = txn.get(stream.encode(), db=self.db["streams"])
        if meta is None:
            return start, out
        sid, first = meta[:4], max(start, _int(meta[4:12]))
        end = min(end, _int(meta[12:20]))
        cur = txn.cursor(db=self.db["log"])
        if first >= end or not cur.set_range(sid + _u64(first)):
            return first, out
        want = min(max_records, end - first)
        size = 0
        for key, record in cur:
            if key[:4] != sid:
                break
            last = _int(key[4:])
            run_first = last + 1 - head(record)[1]
            if run_first >= end:
                break
            out.append((run_first, record))
            size += len(record)
            if last + 1 - first >= want or size >= max_bytes:
                break
        return first, out

    def readers(self) -> dict[str, dict[str, Any]]:
        return self._read(
            lambda txn: {
                bytes(k).decode(): _unpack(v) for k, v in txn.cursor(db=self.db["readers"])
            }
        )

    def stat(self) -> dict[str, int]:
        return self._read(
            lambda txn: {
                name: txn.stat(self.db[name])["entries"]
                for name in ("log", "seen", "sink", "readers")
            }
        )

    # -- writes (bridge thread) -------------------------------------------------------------

    def _write(self, fn: Any, *args: Any, buffers: bool = False) -> Any:
        try:
            with self.env.begin(write=True, buffers=buffers) as txn:  # type: ignore[call-overload]
                result = fn(txn, *args)
        except lmdb.MapFullError as exc:
            self._reload_bounds()
            raise LogFullError(self.path, self.map_size_bytes) from exc
        except lmdb.Error as exc:
            self._reload_bounds()
            raise BridgeError(f"bridge log write failed: {exc}") from exc
        except BaseException:
            self._reload_bounds()  # the transaction was aborted: so were its bounds
            raise
        self._measure()
        return result

    def _measure(self) -> None:
        with self.env.begin() as txn:
            stats = [txn.stat(db) for db in self.db.values()]
        stats.append(self.env.stat())
        pages = sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"] for st in stats)
        self.used_bytes = pages * stats[-1]["psize"]

    def _reload_bounds(self) -> None:
        with self.env.begin() as txn:
            self._next_sid = _int(txn.get(b"next_sid", b"\0\0\0\1", db=self.db["meta"]))
            self._bounds = {
                bytes(k).decode(): [_int(v[:4]), _int(v[4:12]), _int(v[12:20]), _int(v[20:28])]
                for k, v in txn.cursor(db=self.db["streams"])
            }

    def _put_bounds(self, txn: Any, name: str) -> None:
        sid, first, end, nbytes = self._bounds[name]
        txn.put(
            name.encode(),
            sid.to_bytes(4, "big") + _u64(first) + _u64(end) + _u64(nbytes),
            db=self.db["streams"],
        )

    def room(self) -> int:
        """Bytes of the budget left, as measured after the last commit."""
        return self.max_log_bytes - self.used_bytes

    def append(self, runs: Iterable[tuple[str, Run]], now: float) -> tuple[int, int]:
        """Append ``(stream, run)`` pairs in one transaction, each run one record, less
        the messages already logged (by message id). Returns (appended, duplicates).

        Raises LogFullError, having appended nothing, when the records would take the log
        past ``max_log_bytes``: the caller hands them back, or tries fewer.
        """
        return self._write(self._append, list(runs), now)

    def _append(self, txn: Any, runs: list[tuple[str, Run]], now: float) -> tuple[int, int]:
        window = _seen.Window(txn, self.db["seen"], self.db["seen_t"])
        records: list[tuple[str, int, bytes]] = []
        added = dups = 0
        room = self.room()
        for stream, run in runs:
            fresh = window.fresh(run)
            dups += len(run) - len(fresh)
            if not len(fresh):
                continue
            record = encode(fresh, now)
            room -= _cost(len(record))
            if room < 0:
                raise LogFullError(self.path, self.max_log_bytes)
            records.append((stream, len(fresh), record))
            added += len(fresh)
        log_db, meta = self.db["log"], self.db["meta"]
        touched: set[str] = set()
        for stream, n, record in records:
            bounds = self._bounds.get(stream)
            if bounds is None:
                bounds = self._bounds[stream] = [self._next_sid, 0, 0, 0]
                self._next_sid += 1
                txn.put(b"next_sid", self._next_sid.to_bytes(4, "big"), db=meta)
            bounds[2] += n
            bounds[3] += len(record)
            txn.put(bounds[0].to_bytes(4, "big") + _u64(bounds[2] - 1), record, db=log_db)
            touched.add(stream)
        for name in touched:
            self._put_bounds(txn, name)
        window.write(now)
        return added, dups

    def set_watermark(
        self, reader: str, topics: list[str] | None, wm: dict[str, int], now: float
    ) -> None:
        """Register ``reader`` (if new) and move its watermarks forward, never back."""
        self._write(self._set_watermark, reader, topics, wm, now)

    def _set_watermark(
        self, txn: Any, reader: str, topics: list[str] | None, wm: dict[str, int], now: float
    ) -> None:
        key = reader.encode()
        raw = txn.get(key, db=self.db["readers"])
        rec = _unpack(raw) if raw is not None else {"topics": topics, "wm": {}}
        rec["topics"] = topics
        marks = rec["wm"]
        for stream, offset in wm.items():
            if int(offset) > marks.get(stream, -1):
                marks[stream] = int(offset)
        rec["seen_at"] = now
        txn.put(key, _pack(rec), db=self.db["readers"])

    def drop_reader(self, reader: str) -> bool:
        return self._write(lambda txn: txn.delete(reader.encode(), db=self.db["readers"]))

    def prune(
        self,
        now: float,
        *,
        retain_s: float,
        retain_records: int = 0,
        reader_ttl_s: float | None = None,
        max_delete: int = 200_000,
    ) -> int:
        """Delete runs every covering reader has passed, older than ``retain_s`` and
        beyond the last ``retain_records`` of their stream; returns how many records went
        (a bounded number per call: call again while it returns more than 0)."""
        return self._write(
            self._prune, now, retain_s, retain_records, reader_ttl_s, max_delete, buffers=True
        )

    def _prune(
        self,
        txn: Any,
        now: float,
        retain_s: float,
        retain_records: int,
        reader_ttl_s: float | None,
        max_delete: int,
    ) -> int:
        readers = {bytes(k).decode(): _unpack(v) for k, v in txn.cursor(db=self.db["readers"])}
        if reader_ttl_s is not None:
            for name, rec in list(readers.items()):
                if now - rec.get("seen_at", now) > reader_ttl_s:
                    log.warning(
                        "bridge reader %r silent for over %gs: dropped; retention "
                        "no longer waits for it",
                        name,
                        reader_ttl_s,
                    )
                    txn.delete(name.encode(), db=self.db["readers"])
                    del readers[name]
        cutoff = now - retain_s
        deleted = freed = 0
        oldest = float("inf")  # when the oldest run still kept was appended
        # Each deletion copies its page first: a transaction freeing too much at once
        # could need more free pages than a nearly full map has.
        max_free = max(1 << 16, self.max_log_bytes // 16)
        cur = txn.cursor(db=self.db["log"])
        for name, bounds in self._bounds.items():
            sid, first, end = bounds[0].to_bytes(4, "big"), bounds[1], bounds[2]
            topic = name.rpartition("/")[0]
            stop = end - retain_records
            for rec in readers.values():
                if rec["topics"] is None or topic in rec["topics"]:
                    stop = min(stop, rec["wm"].get(name, 0))
            if first >= end or not cur.set_range(sid + _u64(first)):
                continue
            while True:
                key = cur.key()
                if key[:4] != sid:
                    break
                appended_at, n = head(cur.value())
                last = _int(key[4:])
                if (
                    last >= stop
                    or appended_at > cutoff
                    or deleted >= max_delete
                    or freed >= max_free
                ):
                    oldest = min(oldest, appended_at)
                    break
                freed += len(cur.value())
                deleted += n
                first = last + 1
                if not cur.delete():
                    break
            if first != bounds[1]:
                bounds[1] = first
                self._put_bounds(txn, name)
        _seen.prune(txn, self.db["seen"], self.db["seen_t"], oldest)
        return deleted

    # -- sink (``_sinkrows.py``) ---------------------------------------------------------

    def sink_filter(self, row_ids: list[bytes]) -> set[bytes]:
        """The row ids the sink already published."""
        return self._read(_sinkrows.published, self.db["sink"], row_ids)

    def sink_covered(self, task: bytes, first: int, end: int) -> list[tuple[int, int]]:
        """The ranges [a, b) of rows [first, end) of ``task`` already published, in order."""
        return self._read(_sinkrows.covered, self.db["sink"], task, first, end)

    def sink_put(self, rows: list[tuple[bytes, str, int]], now: float) -> None:
        """Remember published rows: (row id, producer hex, seq)."""
        self.sink_write(_sinkrows.id_entries(rows, now), now)

    def sink_put_ranges(
        self, task: bytes, ranges: list[tuple[int, int, str, int]], now: float
    ) -> None:
        """Remember ranges of ``task``'s rows published: (first, end, producer, seq)."""
        self.sink_write(_sinkrows.range_entries(task, ranges, now), now)

    def sink_write(self, entries: list[_sinkrows.Entry], now: float) -> None:
        """Write sink entries (``_sinkrows``'s) in one transaction."""
        self._write(_sinkrows.write, self.db["sink"], self.db["sink_t"], entries, now)

    def sink_prune(self, now: float, window_s: float, max_delete: int = 20_000) -> int:
        return self._write(
            _sinkrows.prune, self.db["sink"], self.db["sink_t"], now, window_s, max_delete
        )
