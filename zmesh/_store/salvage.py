"""Copying what can be read of a damaged store into a new one (``zmesh store salvage``).

The damaged store is never opened through LMDB (which may abort the process on it) and
never written: the walk of ``lmdb.verify`` (check.py) reads it page by page, and every
record of every database it can reach and read is put into a new store. When a meta page
is damaged, the other one is used (it holds the transaction before the last one). A
damaged branch page cuts the walk off from the pages under it: afterwards, every leaf
page that nothing reaches and the free list does not hold is read as well, and the
records of the outbox's databases in it (``msgs``, ``runs``, ``pend``, ``pruns``,
``dead``: each recognised by its key and its decoded value) are copied too, unless the
walk copied that key already. A damaged leaf page loses its records; a damaged overflow
page, its record. The damaged data dir stays as it was, set aside for a post-mortem.

The walk uses the verifier's internals (``_Verifier``): lmdb is pinned to the major
version they were read from, and the salvage tests read damaged stores through them.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
from lmdb import verify as _verify

from .._dirs import make_dir
from ..errors import StoreError
from .damage import decode_or_none, decode_record, decode_run

COPY_BATCH = 10_000  # records per write transaction of the new store
_PAGE_SIZES = (4096, 8192, 16384, 32768, 65536, 2048, 1024, 512)


@dataclass(slots=True)
class SalvageReport:
    """What a salvage copied, and what it could not."""

    source: str
    dest: str
    copied: Counter[str] = field(default_factory=Counter)  # database -> records copied
    expected: dict[str, int] = field(default_factory=dict)  # database -> records it had
    unreadable: Counter[str] = field(default_factory=Counter)  # records with a bad value
    problems: list[str] = field(default_factory=list)  # what the walk found damaged
    meta: str = ""  # which meta page the walk started from
    orphans: Counter[str] = field(default_factory=Counter)  # database -> records found
    #                                                    in pages nothing reaches

    def lost(self) -> dict[str, int]:
        """Records of each database that were not copied."""
        return {db: n - self.copied[db] for db, n in self.expected.items() if n > self.copied[db]}


class _Reader(_verify._Verifier):
    """The verifier's walk, handing on every record of a named database it can read."""

    def __init__(self, f: Any, filesize: int, sink: Any, report: SalvageReport) -> None:
        super().__init__(f, filesize)
        self.sink = sink
        self.report = report

    def detect_engine(self) -> None:
        try:
            super().detect_engine()
        except _verify.VerifyError:
            # Meta page 0 is damaged: recognise the engine from meta page 1.
            for psize in _PAGE_SIZES:
                off = _magic_at(self._read_at(psize, 64))
                eng = None if off is None else _verify._ENGINES.get(off)
                if off is not None and eng is not None:
                    self.hdrsz, self.pagebase, self.eng = off, eng["pagebase"], eng  # type: ignore[assignment]
                    return
            raise

    def load_metas(self) -> None:
        try:
            super().load_metas()
            self.report.meta = "the last committed one"
        except _verify.VerifyError as exc:
            self._one_meta(exc)

    def _one_meta(self, exc: Exception) -> None:
        """Start from whichever meta page is sound (the verifier wants both)."""
        best = None
        for psize in _PAGE_SIZES:
            for pgno in (0, 1):
                try:
                    meta = self._read_meta(pgno, psize)
                except _verify.VerifyError:
                    continue
                if (
                    meta.magic == _verify.MDB_MAGIC
                    and meta.psize == psize
                    and meta.version == self.eng["version"]
                    and (best is None or meta.txnid > best[1].txnid)
                ):
                    best = (psize, meta, pgno)
            if best is not None:
                break
        if best is None:
            raise exc
        self.psize, self.meta, pgno = best
        self.next_pgno = self.meta.last_pg + 1
        self.report.meta = f"meta page {pgno} (the other is damaged: {exc})"
        self.err(f"meta page {1 - pgno} is damaged: {exc}")

    # ``ctx``: the verifier's state of one database's walk (its name, the db's stat, page
    # and entry counts, a key comparer), a dict of values of every kind.
    def _walk_page(self, ctx: dict[str, Any], pgno: int, depth: int) -> None:
        if ctx["name"].startswith("main/") and depth == 1:
            self.report.expected[ctx["name"][5:]] = ctx["db"].entries
        super()._walk_page(ctx, pgno, depth)

    def _leaf_value(
        self,
        ctx: dict[str, Any],
        pgno: int,
        i: int,
        buf: bytes,
        o: int,
        nflags: int,
        ksize: int,
        dsize: int,
        key: bytes,
    ) -> None:
        super()._leaf_value(ctx, pgno, i, buf, o, nflags, ksize, dsize, key)
        name = ctx["name"]
        if (
            ctx["is_free"]
            or not name.startswith("main/")
            or nflags & (_verify.F_SUBDATA | _verify.F_DUPDATA)
        ):
            return
        db = name[5:]
        doff = o + 8 + (_verify._even(ksize) if self.eng["has_txnid"] else ksize)
        if nflags & _verify.F_BIGDATA:
            value = self._overflow(buf, doff, dsize)
        else:
            value = bytes(buf[doff : doff + dsize]) if doff + dsize <= self.psize else None
        if value is None:
            self.report.unreadable[db] += 1
        else:
            self.sink(db, key, value)

    def orphans(self, copied: Any) -> None:
        """Read the leaf pages the walk did not reach (nor the free list hold): what was
        under a damaged branch page. ``copied(db, key)``: whether the walk copied it."""
        for pgno in range(_verify.NUM_METAS, self.next_pgno):
            if self.live[pgno] or self.free[pgno]:
                continue
            buf = self.read_page(pgno)
            if (
                buf is None
                or self._pg_pgno(buf, 0) != pgno
                or self._pg_flags(buf, 0) & _verify._TYPE_MASK != _verify.P_LEAF
            ):
                continue
            for key, value in self._records(buf):
                db = _outbox_db(key, value)
                if db is not None and not copied(db, key):
                    self.sink(db, key, value)
                    self.report.orphans[db] += 1

    def _records(self, buf: bytes) -> list[tuple[bytes, bytes]]:
        """The plain records of a leaf page (those it holds whole, or in sound overflow
        pages)."""
        bounds = self._check_btree_bounds(buf, 0, self.psize, "an unreached leaf page")
        if bounds is None:
            return []
        out = []
        for i in range(bounds[1]):
            o = self._node_off(buf, 0, i)
            if o + 8 > self.psize:
                continue
            lo, hi, nflags, ksize = (_verify._U16.unpack_from(buf, o + 2 * j)[0] for j in range(4))
            dsize = lo | hi << 16
            doff = o + 8 + (_verify._even(ksize) if self.eng["has_txnid"] else ksize)
            if doff > self.psize or nflags & (_verify.F_SUBDATA | _verify.F_DUPDATA):
                continue
            value = (
                self._overflow(buf, doff, dsize)
                if nflags & _verify.F_BIGDATA
                else (bytes(buf[doff : doff + dsize]) if doff + dsize <= self.psize else None)
            )
            if value is not None:
                out.append((bytes(buf[o + 8 : o + 8 + ksize]), value))
        return out

    def _overflow(self, buf: bytes, doff: int, dsize: int) -> bytes | None:
        """The value kept in overflow pages, when their first page is one."""
        if doff + 8 > self.psize:
            return None
        first = _verify._U64.unpack_from(buf, doff)[0]
        need = (self.hdrsz - 1 + dsize) // self.psize + 1
        if first < _verify.NUM_METAS or first + need > self.next_pgno:
            return None
        extent = self.read_extent(first, need)
        if (
            extent is None
            or self._pg_pgno(extent, 0) != first
            or self._pg_flags(extent, 0) & _verify._TYPE_MASK != _verify.P_OVERFLOW
            or self._pg_pages(extent, 0) != need
        ):
            return None
        return bytes(extent[self.hdrsz : self.hdrsz + dsize])


def _outbox_db(key: bytes, value: bytes) -> str | None:
    """Which of the outbox's databases a record found in an unreached page is of (see
    store.py for their keys and values), if it is one of them."""
    if len(key) == 8:
        if decode_record(value) is not None:
            return "msgs"
        return "runs" if decode_run(value) is not None else None
    if len(key) == 12:
        fields = decode_or_none(value)
        if isinstance(fields, list):
            return {5: "pend", 3: "pruns", 6: "dead"}.get(len(fields))
    return None


def _magic_at(head: bytes) -> int | None:
    """Where LMDB's magic number is in the first bytes of a meta page (the size of the
    page header, which tells the engine), if it is there."""
    for off in range(0, len(head) - 3, 4):
        if _verify._U32.unpack_from(head, off)[0] == _verify.MDB_MAGIC:
            return off
    return None


class _Writer:
    """The new store, written in transactions of COPY_BATCH records."""

    def __init__(self, dest: Path, size_hint: int, report: SalvageReport) -> None:
        self.env = lmdb.open(
            str(dest),
            map_size=max(1 << 30, 2 * size_hint),
            max_dbs=16,
            subdir=True,
            sync=False,
            metasync=False,
        )
        self.dbs: dict[str, Any] = {}
        self.pending: list[tuple[str, bytes, bytes]] = []
        self.report = report

    def has(self, db: str, key: bytes) -> bool:
        """Whether ``key`` of ``db`` was copied already."""
        self.flush()
        handle = self.dbs.get(db)
        if handle is None:
            return False
        with self.env.begin(db=handle) as txn:
            return txn.get(key) is not None

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.pending.append((db, key, value))
        if len(self.pending) >= COPY_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        with self.env.begin(write=True) as txn:
            for db, key, value in self.pending:
                handle = self.dbs.get(db)
                if handle is None:
                    handle = self.dbs[db] = self.env.open_db(db.encode(), txn=txn)
                txn.put(key, value, db=handle)
                self.report.copied[db] += 1
        self.pending.clear()

    def close(self) -> None:
        self.flush()
        self.env.sync(True)
        self.env.close()


def salvage(data_dir: str | Path, dest: str | Path) -> SalvageReport:
    """Copy every readable record of the store of ``data_dir`` into a new store in the
    data dir ``dest`` (which must not hold one). The source is only read."""
    source = Path(data_dir) / "store" / "data.mdb"
    target = Path(dest) / "store"
    if not source.is_file():
        raise StoreError("no zmesh store here", str(source.parent))
    make_dir(target, "the salvage destination", lambda m: StoreError(m, str(target)))
    if any(target.iterdir()):
        raise StoreError("the salvage destination holds a store already", str(target))
    report = SalvageReport(str(source), str(target))
    size = source.stat().st_size
    writer = _Writer(target, size, report)
    try:
        with open(source, "rb") as f:
            reader = _Reader(f, os.fstat(f.fileno()).st_size, writer.put, report)
            try:
                report.problems = list(reader.verify())
            except _verify.VerifyError as exc:
                report.problems = [str(exc)]
            else:
                reader.orphans(writer.has)
    finally:
        writer.close()
    return report
