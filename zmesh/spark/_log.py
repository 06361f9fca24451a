"""The bridge's log: an LMDB environment of its own, written by the bridge thread only.

Databases (keys are big-endian so LMDB's order is numeric order):

- ``meta``:    ``next_sid`` -> u32.
- ``streams``: stream name ``topic/partition`` -> sid(4) + head(8) + end(8): the first
  retained offset and the next offset to assign. Offsets start at 0 and have no gaps.
- ``log``:     sid(4) + offset(8) -> msgpack [producer(16 bytes), seq, key, headers,
  published_at, appended_at, payload]; immutable once written.
- ``ids``:     producer(16) + seq(8) -> sid(4) + offset(8): upstream redeliveries are dropped
  by message id; an entry leaves with the record it points at.
- ``readers``: name -> msgpack {"topics": [..] or None, "wm": {stream: offset}, "seen_at"}:
  the offsets below which a streaming query will never read again.
- ``sink``:    row id -> msgpack [stored_at, producer, seq]: rows the sink already published;
  ``sink_t``: stored_at ms(8) + row id -> b"", the same in time order for pruning.

Other processes on the host open the environment read-only (``open_reader``); a process
that holds the writer reuses its handle, since LMDB forbids one file open twice per process.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from ._errors import BridgeError, LogFullError

log = logging.getLogger(__name__)

_pack = msgpack.Packer(use_bin_type=True).pack
_OPEN: dict[str, BridgeLog] = {}
RECORD_OVERHEAD = 64  # keys, the ids entry and node headers, per record (estimate)
_OPEN_LOCK = threading.Lock()


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _int(b: bytes) -> int:
    return int.from_bytes(b, "big")


@dataclass(slots=True, frozen=True)
class Incoming:
    """One received message, as the bridge appends it."""

    stream: str
    producer: bytes
    seq: int
    key: str | None
    headers: dict | None
    published_at: float
    payload: bytes


class BridgeLog:
    """Per-partition offset log, dedupe window, reader watermarks and sink row ids."""

    def __init__(self, log_dir: str | Path, *, map_size_bytes: int = 1 << 30,
                 max_log_bytes: int | None = None, readonly: bool = False) -> None:
        self.log_dir = Path(log_dir)
        self.path = str(self.log_dir / "log")
        self.map_size_bytes = map_size_bytes
        # Below the map size, so that a full log still has the pages a prune needs.
        self.max_log_bytes = max_log_bytes or map_size_bytes // 2
        self.used_bytes = 0  # pages in use, measured after each commit (writer only)
        self.readonly = readonly
        self._lock_fd: int | None = None
        self._inode = 0
        self._bounds: dict[str, list[int]] = {}  # writer only: name -> [sid, head, end]
        self._next_sid = 1
        try:
            if not readonly:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                self._lock_fd = os.open(self.log_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.env = lmdb.open(self.path, map_size=map_size_bytes, max_dbs=8, subdir=True,
                                 readonly=readonly, create=not readonly, sync=False,
                                 metasync=False, readahead=False, max_readers=256)
            self.db = {name: self.env.open_db(name.encode(), create=not readonly)
                       for name in ("meta", "streams", "log", "ids", "readers", "sink",
                                    "sink_t")}
        except BlockingIOError as exc:
            self._close_lock()
            raise BridgeError(f"bridge log {self.log_dir} is in use by another bridge") from exc
        except (OSError, lmdb.Error) as exc:
            self._close_lock()
            raise BridgeError(f"cannot open bridge log {self.path}: {exc}") from exc
        if not readonly:
            self._reload_bounds()
            self._measure()

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
        return self._read(lambda txn: {
            bytes(k).decode(): (_int(v[4:12]), _int(v[12:20]))
            for k, v in txn.cursor(db=self.db["streams"])})

    def read(self, stream: str, start: int, end: int, max_records: int,
             max_bytes: int = 32 << 20) -> tuple[int, list[bytes]]:
        """Records of ``stream`` from ``start`` (or the head, if later) up to ``end``.

        Returns (offset of the first record returned, records); fewer than asked when
        limits are hit. A first offset above ``start`` means retention removed the gap.
        """
        return self._read(self._range, stream, start, end, max_records, max_bytes)

    def _range(self, txn: Any, stream: str, start: int, end: int, max_records: int,
               max_bytes: int) -> tuple[int, list[bytes]]:
        out: list[bytes] = []
        meta = txn.get(stream.encode(), db=self.db["streams"])
        if meta is None:
            return start, out
        sid, head = meta[:4], _int(meta[4:12])
        end = min(end, _int(meta[12:20]))
        first = max(start, head)
        cur = txn.cursor(db=self.db["log"])
        if first >= end or not cur.set_key(sid + _u64(first)):
            return first, out
        size, want = 0, min(max_records, end - first)
        append = out.append
        for value in cur.iternext(keys=False):
            append(value)
            size += len(value)
            if len(out) >= want or size >= max_bytes:
                break
        return first, out

    def readers(self) -> dict[str, dict]:
        return self._read(lambda txn: {bytes(k).decode(): _unpack(v)
                                       for k, v in txn.cursor(db=self.db["readers"])})

    def stat(self) -> dict[str, int]:
        return self._read(lambda txn: {name: txn.stat(self.db[name])["entries"]
                                       for name in ("log", "ids", "sink", "readers")})

    # -- writes (bridge thread) -------------------------------------------------------------

    def _write(self, fn: Any, *args: Any) -> Any:
        try:
            with self.env.begin(write=True) as txn:
                result = fn(txn, *args)
        except lmdb.MapFullError as exc:
            self._reload_bounds()
            raise LogFullError(self.path, self.map_size_bytes) from exc
        except lmdb.Error as exc:
            self._reload_bounds()
            raise BridgeError(f"bridge log write failed: {exc}") from exc
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
            self._bounds = {bytes(k).decode(): [_int(v[:4]), _int(v[4:12]), _int(v[12:20])]
                            for k, v in txn.cursor(db=self.db["streams"])}

    def _put_bounds(self, txn: Any, name: str) -> None:
        sid, head, end = self._bounds[name]
        txn.put(name.encode(), sid.to_bytes(4, "big") + _u64(head) + _u64(end),
                db=self.db["streams"])

    def append(self, items: Iterable[Incoming], now: float) -> tuple[int, int, int]:
        """Append in one transaction, dropping message ids already logged.

        Returns (items taken, appended, duplicates); fewer items are taken than given
        when the log reaches ``max_log_bytes``: the caller hands the rest back.
        """
        return self._write(self._append, list(items), now)

    def _append(self, txn: Any, items: list[Incoming], now: float) -> tuple[int, int, int]:
        ids_db, log_db = self.db["ids"], self.db["log"]
        touched: set[str] = set()
        added = dups = taken = 0
        room = self.max_log_bytes - self.used_bytes
        for it in items:
            mid = it.producer + _u64(it.seq)
            if txn.get(mid, db=ids_db) is not None:
                dups += 1
                taken += 1
                continue
            record = _pack([it.producer, it.seq, it.key, it.headers, it.published_at, now,
                            it.payload])
            # Pages fill about half on random inserts: count a record twice.
            room -= 2 * (len(record) + RECORD_OVERHEAD)
            if room < 0:
                break
            bounds = self._bounds.get(it.stream)
            if bounds is None:
                bounds = self._bounds[it.stream] = [self._next_sid, 0, 0]
                self._next_sid += 1
                txn.put(b"next_sid", self._next_sid.to_bytes(4, "big"), db=self.db["meta"])
            loc = bounds[0].to_bytes(4, "big") + _u64(bounds[2])
            txn.put(loc, record, db=log_db)
            txn.put(mid, loc, db=ids_db)
            bounds[2] += 1
            touched.add(it.stream)
            added += 1
            taken += 1
        for name in touched:
            self._put_bounds(txn, name)
        return taken, added, dups

    def set_watermark(self, reader: str, topics: list[str] | None, wm: dict[str, int],
                      now: float) -> None:
        """Register ``reader`` (if new) and move its watermarks forward, never back."""
        self._write(self._set_watermark, reader, topics, wm, now)

    def _set_watermark(self, txn: Any, reader: str, topics: list[str] | None,
                       wm: dict[str, int], now: float) -> None:
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

    def prune(self, now: float, *, retain_s: float, retain_records: int = 0,
              reader_ttl_s: float | None = None, max_delete: int = 20_000) -> int:
        """Delete records every covering reader has passed, older than ``retain_s`` and
        beyond the last ``retain_records`` of their stream; returns how many went (a
        bounded number per call: call again while it returns more than 0)."""
        return self._write(self._prune, now, retain_s, retain_records, reader_ttl_s,
                           max_delete)

    def _prune(self, txn: Any, now: float, retain_s: float, retain_records: int,
               reader_ttl_s: float | None, max_delete: int) -> int:
        readers = {bytes(k).decode(): _unpack(v) for k, v in txn.cursor(db=self.db["readers"])}
        if reader_ttl_s is not None:
            for name, rec in list(readers.items()):
                if now - rec.get("seen_at", now) > reader_ttl_s:
                    log.warning("bridge reader %r silent for over %gs: dropped; retention "
                                "no longer waits for it", name, reader_ttl_s)
                    txn.delete(name.encode(), db=self.db["readers"])
                    del readers[name]
        cutoff = now - retain_s
        deleted = freed = 0
        # Each deletion copies its page first: a transaction freeing too much at once
        # could need more free pages than a nearly full map has.
        max_free = max(1 << 16, self.max_log_bytes // 16)
        for name, bounds in self._bounds.items():
            sid, head, end = bounds
            topic = name.rpartition("/")[0]
            stop = end - retain_records
            for rec in readers.values():
                if rec["topics"] is None or topic in rec["topics"]:
                    stop = min(stop, rec["wm"].get(name, 0))
            off = head
            while off < stop and deleted < max_delete and freed < max_free:
                loc = sid.to_bytes(4, "big") + _u64(off)
                raw = txn.get(loc, db=self.db["log"])
                if raw is not None:
                    producer, seq, _k, _h, _p, appended_at, _payload = _unpack(raw)
                    if appended_at > cutoff:
                        break
                    freed += len(raw) + RECORD_OVERHEAD
                    txn.delete(loc, db=self.db["log"])
                    txn.delete(producer + _u64(seq), db=self.db["ids"])
                off += 1
                deleted += 1
            if off != head:
                bounds[1] = off
                self._put_bounds(txn, name)
        return deleted

    def sink_filter(self, row_ids: list[bytes]) -> set[bytes]:
        """The row ids the sink already published."""
        return self._read(lambda txn: {r for r in row_ids
                                       if txn.get(r, db=self.db["sink"]) is not None})

    def sink_put(self, rows: list[tuple[bytes, str, int]], now: float) -> None:
        """Remember published rows: (row id, producer hex, seq)."""
        def put(txn: Any) -> None:
            stamp = _u64(int(now * 1000))
            for rid, producer, seq in rows:
                txn.put(rid, _pack([now, producer, seq]), db=self.db["sink"])
                txn.put(stamp + rid, b"", db=self.db["sink_t"])
        self._write(put)

    def sink_prune(self, now: float, window_s: float, max_delete: int = 20_000) -> int:
        def prune(txn: Any) -> int:
            limit = _u64(int((now - window_s) * 1000))
            cur = txn.cursor(db=self.db["sink_t"])
            n = 0
            while n < max_delete and cur.first() and cur.key()[:8] < limit:
                txn.delete(cur.key()[8:], db=self.db["sink"])
                cur.delete()
                n += 1
            return n
        return self._write(prune)
