"""What of a producer's commits its replicas copy, cut into frames, and how a replica
commits it (both sides; pure but for the store read in ``SyncReader``).

A replica's copy is the producer's outbox for its replicated topics, byte for byte: the
same ``msgs``, ``runs``, ``pend``, ``pruns``, ``lanes`` and ``dead`` entries, under the
producer's own sequences and lane ids. So the producer sends what each commit wrote there
(``select``), and the replica commits it as it came (``into_batch``). A store applies a
batch's puts before its deletions, each db in a fixed order (``Writes``' field order):
cut in that order (``cut``), the parts applied one after the other end as the whole.
A new replica first gets the outbox as it stands, read from the store in parts
(``SyncReader``), with the commits made meanwhile between them in the order they were
made: each part reads what is committed when it is read, so every key ends as it is at
the producer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from ..._protocol.frames import Writes
from ..._store.keys import u32
from ..._store.store import Store, WriteBatch
from ..lane.lane import Lane

# One frame's writes at most: elements (of every list together) and bytes of keys and
# values (past it, a record goes alone in a frame of its own).
MAX_WRITES_ITEMS = 40_000
MAX_WRITES_BYTES = 512 << 10

FIELDS = tuple(f.name for f in dataclasses.fields(Writes))  # (the order a store applies)
_PUTS = frozenset(
    ("msgs_put", "pend_put", "pend_runs", "runs_put", "prun_put", "lanes_put", "dead_put")
)

_packb = msgpack.Packer(use_bin_type=True).pack


class Scope:
    """The replicated part of one producer's outbox: the records of its replicated
    topics (a record's first field is its topic: known by the packed topic after the
    record's array header) and those topics' lanes (by their ids, the first four bytes
    of a ``pend``, ``pruns`` or ``dead`` key)."""

    def __init__(self) -> None:
        self.topics: frozenset[str] = frozenset()
        self.prefixes: tuple[bytes, ...] = ()
        self.lane_ids: frozenset[bytes] = frozenset()
        self.every_lane = False  # every lane of the producer is in scope (no filtering)

    def update(self, topics: Iterable[str], lanes: Iterable[Lane]) -> None:
        self.topics = frozenset(topics)
        self.prefixes = tuple(_packb(t) for t in sorted(self.topics))
        all_lanes = list(lanes)
        ours = [lane for lane in all_lanes if lane.topic in self.topics]
        self.lane_ids = frozenset(u32(lane.id) for lane in ours)
        self.every_lane = len(ours) == len(all_lanes)

    def record(self, raw: bytes) -> bool:
        """Whether a ``msgs`` or ``runs`` value (or a ``lanes`` key) is of a replicated
        topic."""
        return raw.startswith(self.prefixes, 1)

    def keys(self, keys: list[bytes]) -> list[bytes]:
        """Those of ``keys`` (lane id + seq) of a replicated lane."""
        if self.every_lane:
            return keys
        ids = self.lane_ids
        return [k for k in keys if k[:4] in ids]

    def pairs(self, pairs: Iterable[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
        ids, every = self.lane_ids, self.every_lane
        return [(k, v) for k, v in pairs if every or k[:4] in ids]


def select(wb: WriteBatch, scope: Scope) -> Writes | None:
    """The part of a committed batch that the replicas copy; None when there is none.

    Deleted ``msgs`` and ``runs`` keys go whatever their topic (a sequence alone does not
    tell it; a replica deletes what it does not hold as a no-op)."""
    if not scope.prefixes:
        return None
    record = scope.record
    ids, every = scope.lane_ids, scope.every_lane
    w = Writes(
        msgs_put=tuple((k, v) for k, v in wb.msgs_put if record(v)),
        pend_put=tuple(scope.pairs(wb.pend_put)),
        pend_runs=tuple(
            (prefix, tuple(seqs), tuple(values))
            for prefix, seqs, values in wb.pend_runs
            if every or prefix in ids
        ),
        runs_put=tuple((k, v) for k, v in wb.runs_put if record(v)),
        prun_put=tuple(scope.pairs(wb.prun_put)),
        prun_set=tuple(scope.pairs(wb.prun_set.items())),
        lanes_put=tuple((k, v) for k, v in wb.lanes_put if record(k)),
        lanes_del=tuple((k, i) for k, i in wb.lanes_del if record(k)),
        dead_put=tuple(scope.pairs(wb.dead_put)),
        pend_del=tuple(scope.keys(wb.pend_del)),
        msgs_del=tuple(wb.msgs_del),
        runs_del=tuple(wb.runs_del),
        dead_del=tuple(scope.keys(wb.dead_del)),
    )
    if not any(getattr(w, name) for name in FIELDS):
        return None
    return w


def _size(name: str, item: Any) -> tuple[int, int]:
    """(elements, bytes) of one item of field ``name``."""
    if name == "pend_runs":
        _prefix, seqs, values = item
        return len(seqs), 20 * len(seqs)
    if type(item) is bytes:
        return 1, len(item)
    key, value = item
    return 1, len(key) + (len(value) if type(value) is bytes else 8)


def cut(w: Writes) -> Iterator[Writes]:
    """``w`` in parts of at most MAX_WRITES_ITEMS elements and MAX_WRITES_BYTES bytes (a
    larger record alone), in the order a store applies them."""
    part: dict[str, list[Any]] = {}
    items = nbytes = 0
    for name in FIELDS:
        for item in getattr(w, name):
            n, size = _size(name, item)
            if name == "pend_runs" and n > MAX_WRITES_ITEMS:
                prefix, seqs, values = item
                for i in range(0, n, MAX_WRITES_ITEMS):
                    end = i + MAX_WRITES_ITEMS
                    if part:
                        yield _writes(part)
                        part, items, nbytes = {}, 0, 0
                    part[name] = [(prefix, seqs[i:end], values[i:end])]
                    items, nbytes = len(seqs[i:end]), 20 * len(seqs[i:end])
                continue
            if part and (items + n > MAX_WRITES_ITEMS or nbytes + size > MAX_WRITES_BYTES):
                yield _writes(part)
                part, items, nbytes = {}, 0, 0
            part.setdefault(name, []).append(item)
            items += n
            nbytes += size
    if part:
        yield _writes(part)


def _writes(part: dict[str, list[Any]]) -> Writes:
    return Writes(**{name: tuple(items) for name, items in part.items()})


def puts_only(w: Writes) -> bool:
    return not any(getattr(w, name) for name in FIELDS if name not in _PUTS)


def deletes_only(w: Writes) -> bool:
    return not any(getattr(w, name) for name in _PUTS)


def into_batch(w: Writes, wb: WriteBatch) -> None:
    """Add ``w`` to a replica's write batch (after what it holds: see ``Copy.take``)."""
    wb.msgs_put.extend(w.msgs_put)
    wb.pend_put.extend(w.pend_put)
    wb.pend_runs.extend((prefix, list(seqs), list(values)) for prefix, seqs, values in w.pend_runs)
    wb.runs_put.extend(w.runs_put)
    wb.prun_put.extend(w.prun_put)
    wb.prun_set.update(w.prun_set)
    wb.lanes_put.extend(w.lanes_put)
    wb.lanes_del.extend(w.lanes_del)
    wb.dead_put.extend(w.dead_put)
    wb.pend_del.extend(w.pend_del)
    wb.msgs_del.extend(w.msgs_del)
    wb.runs_del.extend(w.runs_del)
    wb.dead_del.extend(w.dead_del)
    wb.msgs_bytes += sum(len(v) for _k, v in w.msgs_put) + sum(len(v) for _k, v in w.runs_put)


# The dbs a new replica is sent, in the order they are read, with the part of a
# ``Writes`` each fills: the lanes first (their ids), then records, then what lanes owe.
_SYNCED = (
    ("lanes", "lanes_put"),
    ("msgs", "msgs_put"),
    ("runs", "runs_put"),
    ("pend", "pend_put"),
    ("pruns", "prun_put"),
    ("dead", "dead_put"),
)


class SyncReader:
    """Reads a producer's replicated outbox from its store, a part at a time, for a new
    replica: each part from where the last ended, in a read transaction of its own."""

    def __init__(self, store: Store, scope: Scope) -> None:
        self.store = store
        self.scope = scope
        self._db = 0  # index into _SYNCED
        self._after: bytes | None = None  # the last key read of that db
        self.done = False

    def part(self) -> Writes | None:
        """The next part (None once everything was read: ``done``). A read LMDB refuses
        (a damaged store) raises StoreError: no part of this copy can be trusted whole."""
        scope = self.scope
        found: dict[str, list[Any]] = {}
        items = nbytes = 0
        while self._db < len(_SYNCED):
            name, field = _SYNCED[self._db]
            keep = scope.record if name in ("lanes", "msgs", "runs") else None
            with (
                self.store.health.reading(f"the {name} database", name),
                self.store.env.begin(db=getattr(self.store, name)) as txn,
            ):
                cur = txn.cursor()
                more = cur.set_range(self._after) if self._after is not None else cur.first()
                if more and self._after is not None and cur.key() == self._after:
                    more = cur.next()
                while more:
                    key, value = cur.key(), cur.value()
                    self._after = key
                    wanted = (
                        keep(key if name == "lanes" else value)
                        if keep is not None
                        else scope.every_lane or key[:4] in scope.lane_ids
                    )
                    if wanted:
                        found.setdefault(field, []).append((key, value))
                        items += 1
                        nbytes += len(key) + len(value)
                        if items >= MAX_WRITES_ITEMS or nbytes >= MAX_WRITES_BYTES:
                            return _writes(found)
                    more = cur.next()
            self._db += 1
            self._after = None
        self.done = True
        return _writes(found) if found else None
