"""What the outbox keeps in memory to send without reading or packing again: records kept
decoded (``Decoded``) and batch columns kept packed (``Packed``), each bounded in bytes,
the oldest going first (``oldest``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

from ..._protocol.codec import PackedColumns
from .record import Record

DECODED_KEPT_BYTES = 32 << 20  # what the records kept decoded may take (two windows)
PACKED_KEPT_BYTES = 4 << 20  # what the batch columns kept packed may take
_ENTRY_BYTES = 440  # a record's decoded fields and its map entry, besides the payload
_SEQ_KEY_BYTES = 40  # a sequence in a tuple: its pointer and its int object

_payload: Callable[[Record], bytes] = attrgetter("payload")
_run_size: Callable[[tuple[list[Any], int]], int] = itemgetter(1)  # a kept run's bytes as counted
_kept_size: Callable[[tuple[PackedColumns, int]], int] = itemgetter(1)  # packed columns' too

K = TypeVar("K")  # a map's keys (sequences, mostly)
F = TypeVar("F")  # what it keeps per key


def oldest(kept: dict[K, F], excess: int, size: Callable[[F], int]) -> tuple[list[K], int]:
    """The first (oldest) keys of ``kept`` whose sizes reach ``excess``, and their total,
    found in one pass: taking them one by one from the front of the dict would walk the
    slots of every one taken before (quadratic in what is taken)."""
    keys: list[K] = []
    total = 0
    for key, value in kept.items():
        if total >= excess:
            break
        total += size(value)
        keys.append(key)
    return keys, total


class Decoded:
    """The fields of stored records, kept from staging (while a member is there to take
    them and the map is under its limit) or from their first read (for a topic with
    several lanes) until the message leaves the outbox, so sending them needs no read and
    no decoding. Past ``limit`` bytes the oldest go first, at the start of a dispatch call
    only: one that found a record here must find it again (a group far behind the others
    reads its records again)."""

    __slots__ = ("fields", "runs", "bytes", "limit")

    def __init__(self, limit: int = DECODED_KEPT_BYTES) -> None:
        self.fields: dict[int, Record] = {}  # in the order kept: the oldest first
        # Runs (runs.py) kept whole: first sequence -> (decoded record, bytes as counted)
        self.runs: dict[int, tuple[list[Any], int]] = {}
        self.bytes = 0
        self.limit = limit

    def keep(self, seq: int, record: Record) -> None:
        self.fields[seq] = record
        self.bytes += len(record.payload) + _ENTRY_BYTES

    def forget(self, seqs: Iterable[int]) -> None:
        """Drop what is kept of ``seqs`` (messages that left the outbox)."""
        gone = list(filter(None, map(self.fields.pop, seqs, repeat(None))))
        if gone:
            self.bytes -= sum(map(len, map(_payload, gone))) + _ENTRY_BYTES * len(gone)

    def keep_run(self, first: int, record: list[Any], size: int) -> None:
        """Keep a run's decoded record (``size``: the bytes it counts for)."""
        self.runs[first] = (record, size)
        self.bytes += size

    def forget_runs(self, firsts: Iterable[int]) -> None:
        for first in firsts:
            kept = self.runs.pop(first, None)
            if kept is not None:
                self.bytes -= kept[1]

    def trim(self) -> None:
        """Drop the oldest past the limit (runs first: a run is sent whole, soon after it
        is kept, while single messages wait for the other lanes)."""
        excess = self.bytes - self.limit
        if self.runs:
            firsts, freed = oldest(self.runs, excess, _run_size)
            self.forget_runs(firsts)
            excess -= freed
        if excess > 0:
            seqs, _ = oldest(self.fields, excess, lambda r: len(r.payload) + _ENTRY_BYTES)
            self.forget(seqs)


def _packed_size(columns: PackedColumns) -> int:
    before, after, extra = columns
    return len(before) + sum(map(len, after)) + sum(map(len, extra))


def _key_size(seqs: tuple[int, ...] | range) -> int:
    """What a batch's sequences take as its key: a tuple holds a pointer and an int
    object per sequence (about a third of what a 100-byte message packs to)."""
    return 0 if type(seqs) is range else _SEQ_KEY_BYTES * len(seqs)


class Packed:
    """Batch columns packed for one lane of a topic with several groups, by their
    sequences: the other lanes send the same messages, mostly in the same batches, in
    the same dispatch or a later one. The newest are kept, up to ``limit`` bytes, their
    keys counted."""

    __slots__ = ("columns", "bytes", "limit")

    def __init__(self, limit: int = PACKED_KEPT_BYTES) -> None:
        # sequences -> (their packed columns, bytes as counted)
        self.columns: dict[tuple[int, ...] | range, tuple[PackedColumns, int]] = {}
        self.bytes = 0
        self.limit = limit

    def get(self, seqs: tuple[int, ...] | range) -> PackedColumns | None:
        kept = self.columns.get(seqs)
        return None if kept is None else kept[0]

    def keep(self, seqs: tuple[int, ...] | range, columns: PackedColumns) -> None:
        size = _packed_size(columns) + _key_size(seqs)
        self.columns[seqs] = (columns, size)
        self.bytes += size
        if self.bytes > self.limit:
            drop, freed = oldest(self.columns, self.bytes - self.limit // 2, _kept_size)
            for key in drop:
                del self.columns[key]
            self.bytes -= freed
