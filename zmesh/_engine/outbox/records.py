"""The messages a producer's outbox holds, as the IO thread reads them (IO thread only).

A message is stored as its own ``msgs`` record or as one of a run's (runs.py); a
``memory`` topic's message or run stays in RAM until it spills. ``Records`` finds any of
them by sequence: memory ones as they are, stored ones from the records kept decoded
(``Decoded``) or read from LMDB. It also counts the outbox's messages (``depth``: what
some lane owes) and lets a message go once no lane owes it. A record that cannot be
decoded is set aside (the ``bad`` db), never crash-looped on; one that LMDB refuses to
read (a damaged page: _store/health.py) is left out the same way, and its messages are
settled as lost when they are to be sent.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from operator import itemgetter, lt, sub
from typing import Any, cast

from ..._numbers import fitting_array
from ..._protocol.codec import INLINE_PAYLOAD_BYTES, LARGE_PAYLOAD_BYTES
from ..._store.damage import decode_record, decode_run
from ..._store.store import Store, WriteBatch, pack, u64
from ..stats import Counters
from .cache import Decoded
from .record import Columns, Record, as_record, columns_of
from .runs import RUN_ENTRY_BYTES, Runs

log = logging.getLogger(__name__)

# What a ``memory`` message held in RAM costs beyond its payload, key and headers: its
# fields tuple, the floats and ints in it, and its slot in the dict.
MEM_RECORD_OVERHEAD = 200


def mem_size(record: Record) -> int:
    """The bytes a ``memory`` message counts against ``memory_budget_bytes``."""
    key, headers = record.key, record.headers
    return (
        len(record.payload)
        + MEM_RECORD_OVERHEAD
        + (len(key) if key else 0)
        + (len(pack(headers)) if headers else 0)
    )


_keys, _headers, _payloads = itemgetter(2), itemgetter(3), itemgetter(8)


def mem_total(many: list[Record]) -> int:
    """``mem_size`` summed over ``many`` records, with no Python call per message."""
    return (
        sum(map(len, map(_payloads, many)))
        + MEM_RECORD_OVERHEAD * len(many)
        + sum(map(len, filter(None, map(_keys, many))))
        + sum(len(pack(h)) for h in filter(None, map(_headers, many)))
    )


def mem_run_size(record: list[Any]) -> int:
    """What a ``memory`` run (its decoded record) counts against ``memory_budget_bytes``."""
    _t, partitions, keys, headers, _at, payloads, _i = record
    return (
        sum(map(len, payloads))
        + RUN_ENTRY_BYTES * len(partitions)
        + (sum(map(len, filter(None, keys))) if keys else 0)
        + (len(pack(headers)) if headers else 0)
    )


def run_message(run: list[Any], i: int) -> Record:
    """Message ``i`` of a decoded run record, as its own record would hold it."""
    topic, partitions, keys, headers, published_at, payloads, indexes = run
    if type(published_at) is array:
        published_at = published_at[i]
    return Record(
        topic,
        partitions[i],
        keys[i] if keys else None,
        headers,
        0,
        published_at,
        None,
        None,
        payloads[i],
        indexes[i],
    )


class Records:
    """The messages of one producer's outbox, found by sequence."""

    def __init__(self, store: Store, counters: Counters, max_message_bytes: int) -> None:
        self.store = store
        self.counters = counters
        # ``memory`` messages not spilled, and their runs (first sequence -> (decoded run
        # record, bytes counted against the budget)); ``mem_bytes`` counts both.
        self.mem: dict[int, Record] = {}
        self.mem_runs: dict[int, tuple[list[Any], int]] = {}
        self.mem_bytes = 0
        self.decoded = Decoded()  # records kept decoded to be sent (cache.py)
        self.runs = Runs()  # batches stored as one record each (runs.py)
        # No payload in the outbox is larger: what this node publishes is bounded by its
        # max_message_bytes, and it is raised for a record read back that is larger
        # (stored under an earlier config). A member accepting as much needs no check.
        self.payload_bound = max_message_bytes
        self.depth = 0  # messages in the outbox: what some lane owes

    # -- reading --------------------------------------------------------------------------

    def get(self, seq: int, batch: WriteBatch | None = None) -> Record | None:
        """The record of ``seq`` (a memory message's, a run's message, or read from LMDB
        and decoded); None when it is gone, or cannot be decoded (then set aside given
        ``batch``)."""
        record = self.mem.get(seq) or self.decoded.fields.get(seq)
        if record is None and self.runs.find(seq) is not None:
            record = self.run_messages([seq], batch).get(seq)
        if record is None:
            return self.read([seq], batch).get(seq)
        return record

    def read(self, seqs: list[int], batch: WriteBatch | None = None) -> dict[int, Record]:
        """The records of ``seqs`` read from LMDB (those that are there) and decoded; one
        that cannot be decoded is left out, and set aside given ``batch``; one that LMDB
        cannot read is left out, and counted given ``batch``."""
        found, bad, unreadable = self.store.read_decoded("msgs", seqs, decode_record)
        if batch is not None:
            for seq, raw in bad.items():
                self.set_aside(
                    "msgs", u64(seq), raw, "an outbox record: settled for every group", batch
                )
            if unreadable:
                self.unreadable("msgs", unreadable, "their messages are settled as lost")
        out: dict[int, Record] = {}
        for seq, (fields, _size) in found.items():
            record = out[seq] = as_record(fields)
            if len(record.payload) > self.payload_bound:
                self.payload_bound = len(record.payload)
        return out

    def packed(self, seq: int) -> bytes | None:
        """The stored record of ``seq`` as its bytes (a memory message's, or one of a
        run's, packed now); None if gone."""
        record = self.mem.get(seq)
        if record is None and self.runs.find(seq) is not None:
            record = self.run_messages([seq]).get(seq)
        if record is not None:
            return pack(record)
        return self.store.get_messages([seq]).get(seq)

    def published_at(self, seq: int) -> float | None:
        """When ``seq`` was published (wall clock); None if it is gone."""
        record = self.get(seq)
        return None if record is None else float(record.published_at)

    def decoded_runs(
        self, firsts: list[int], batch: WriteBatch | None = None
    ) -> dict[int, list[Any]]:
        """The decoded records of the runs starting at ``firsts``, kept decoded whole
        (``Decoded.runs``) once read. A record that cannot be decoded is left out, and set
        aside given ``batch`` (its messages are then settled as lost)."""
        kept, mem = self.decoded.runs, self.mem_runs
        out = {first: kept[first][0] for first in firsts if first in kept}
        if mem:
            out.update((first, mem[first][0]) for first in firsts if first in mem)
        absent = [first for first in firsts if first not in out]
        if not absent:
            return out
        found, bad, unreadable = self.store.read_decoded("runs", absent, decode_run)
        if batch is not None:
            for first, record in bad.items():
                self.set_aside(
                    "runs",
                    u64(first),
                    record,
                    "a run's record: its messages are settled as lost",
                    batch,
                )
            if unreadable:
                self.unreadable(
                    "runs", unreadable, "the messages of these runs are settled as lost"
                )
        for first, (fields, size) in found.items():
            self.decoded.keep_run(first, fields, size + RUN_ENTRY_BYTES * len(fields[1]))
            bound = max(map(len, fields[5]))
            if bound > self.payload_bound:
                self.payload_bound = bound
            out[first] = fields
        return out

    def run_messages(self, seqs: list[int], batch: WriteBatch | None = None) -> dict[int, Record]:
        """The records of those of ``seqs`` that runs hold (see ``decoded_runs``)."""
        _, hits = self.runs.split(seqs)
        if not hits:
            return {}
        runs = self.decoded_runs(list(hits), batch)
        out: dict[int, Record] = {}
        for seq in seqs:
            run = self.runs.find(seq)
            if run is not None and run.first in runs:
                out[seq] = run_message(runs[run.first], seq - run.first)
        return out

    def run_columns(self, seqs: list[int] | range, max_message_bytes: int) -> Columns | None:
        """The columns of ``seqs`` (a take, in ascending order) when runs hold some of them
        and the rest are kept (decoded from staging, or a ``memory`` message's record):
        taken from the runs' records with no Python step per message (read from LMDB and
        kept decoded if they are not), a lone message between runs (a publish the IO
        thread found alone) from its record. None when no run holds any, or a message of
        none is not kept, or a run cannot be read, or a payload is larger than
        ``max_message_bytes``: the per-message way then sends, sets aside or parks them."""
        if type(seqs) is not range and not all(map(lt, seqs, islice(seqs, 1, None))):
            return None
        pieces = self.runs.pieces(seqs)
        firsts = [first for first, _n in pieces if first >= 0]
        if not firsts:
            return None
        runs = self.decoded_runs(firsts)
        if len(runs) < len(firsts):
            return None
        keys: list[str | None] = []
        headers: list[dict[str, Any] | None] = []
        published_ats = array("d")  # (packed as it is: no conversion per message)
        indexes: array[int] | None = None  # (the runs' arrays, joined: likewise)
        payloads: list[bytes] = []
        pos = 0
        by_first = self.runs.by_first
        nbytes = 0  # the payloads' bytes, or more (-1 once a run's are not known)
        for first, n in pieces:
            part = seqs[pos : pos + n]
            pos += n
            if first < 0:  # (messages stored on their own, between runs)
                found = self._kept_records(part)
                if found is None:
                    return None
                alone = columns_of(found)
                if None in alone.indexes:  # (a record stored before messages had indexes)
                    return None
                part_indexes = fitting_array("Iq", cast("Sequence[int]", alone.indexes))
                payloads += alone.payloads
                keys += alone.keys
                headers += alone.headers
                published_ats += array("d", alone.published_ats)
                if nbytes >= 0:
                    big = max(map(len, alone.payloads)) >= LARGE_PAYLOAD_BYTES
                    nbytes = -1 if big else nbytes + sum(map(len, alone.payloads))
            else:
                part_indexes = self._run_piece(
                    runs[first], first, part, n, keys, headers, published_ats, payloads
                )
                run_bytes = by_first[first].nbytes
                if nbytes >= 0:
                    nbytes = run_bytes + nbytes if 0 <= run_bytes < LARGE_PAYLOAD_BYTES else -1
            if indexes is None:
                indexes = part_indexes
            elif indexes.typecode == part_indexes.typecode:
                indexes += part_indexes
            else:  # (an index past 2**32 in one of them: all as int64)
                indexes = array("q", indexes)
                indexes += array("q", part_indexes)
        if max_message_bytes < self.payload_bound and max(map(len, payloads)) > max_message_bytes:
            return None
        return Columns(
            keys,
            headers,
            published_ats,
            array("I") if indexes is None else indexes,
            payloads,
            0 <= nbytes <= INLINE_PAYLOAD_BYTES,
        )

    @staticmethod
    def _run_piece(
        run: list[Any],
        first: int,
        part: Sequence[int],
        n: int,
        keys: list[str | None],
        headers: list[dict[str, Any] | None],
        published_ats: array[float],
        payloads: list[bytes],
    ) -> array[int]:
        """Add the columns of ``part`` (``n`` ascending sequences of the run starting at
        ``first``, decoded as ``run``) to the others; returns their indexes."""
        _t, _parts, run_keys, run_headers, published_at, run_payloads, run_indexes = run
        each_at = type(published_at) is array  # (else one time for the whole run)
        if part[-1] - part[0] == n - 1:  # consecutive: slices
            at = slice(part[0] - first, part[0] - first + n)
            payloads += run_payloads[at]
            keys += run_keys[at] if run_keys else repeat(None, n)
            published_ats += published_at[at] if each_at else array("d", (published_at,)) * n
            part_indexes = run_indexes[at]
        else:  # (a scatter: one member's partitions) the places picked at C speed
            pick = itemgetter(*map(sub, part, repeat(first)))  # (n > 1: tuples)
            payloads += pick(run_payloads)
            keys += pick(run_keys) if run_keys else repeat(None, n)
            published_ats += (
                array("d", pick(published_at)) if each_at else array("d", (published_at,)) * n
            )
            part_indexes = array(run_indexes.typecode, pick(run_indexes))
        headers += repeat(run_headers, n)
        return part_indexes

    def _kept_records(self, seqs: Sequence[int]) -> list[Record] | None:
        """The records of ``seqs`` kept in RAM (``memory`` messages, or decoded from
        staging); None when one of them is not."""
        mem, kept = self.mem, self.decoded.fields
        found = [mem.get(seq) or kept.get(seq) for seq in seqs]
        return None if None in found else found  # type: ignore[return-value]

    # -- letting go -----------------------------------------------------------------------

    def forget_mem(self, seqs: Sequence[int]) -> list[int]:
        """Drop memory messages' records; returns those of ``seqs`` that had none (stored
        in LMDB)."""
        records = list(map(self.mem.pop, seqs, repeat(None)))
        self.mem_bytes -= mem_total(list(filter(None, records)))
        if None not in records:
            return []
        return [seq for seq, r in zip(seqs, records, strict=True) if r is None]

    def in_ram_only(self) -> int:
        """How many messages of ``memory`` topics the outbox holds in RAM alone (not
        spilled): what a close loses."""
        by_first = self.runs.by_first
        return len(self.mem) + sum(
            run.left for first in self.mem_runs if (run := by_first.get(first)) is not None
        )

    def forget_mem_runs(self, firsts: Iterable[int]) -> None:
        """Drop memory runs (settled, spilled or never stored) from RAM."""
        pop = self.mem_runs.pop
        for first in firsts:
            kept = pop(first, None)
            if kept is not None:
                self.mem_bytes -= kept[1]

    def leave(self, unowed: Sequence[int], keep_records: bool, batch: WriteBatch) -> None:
        """``unowed`` left the outbox (no lane owes them): their records are deleted (a
        run's with its last message) unless ``keep_records`` (a retaining topic: retention
        reclaims them), and whatever of them is kept in RAM is dropped."""
        if self.decoded.fields:
            self.decoded.forget(unowed)
        singles = unowed
        if self.runs:
            singles, ended = self.runs.gone(unowed, batch)
            if ended and self.decoded.runs:
                self.decoded.forget_runs(ended)
            if ended and self.mem_runs:
                self.forget_mem_runs(ended)
        if not keep_records:
            gone = self.forget_mem(singles) if self.mem else singles
            batch.msgs_del.extend(map(u64, gone))
        self.depth -= len(unowed)

    def unreadable(self, db: str, seqs: list[int], what_then: str) -> None:
        """Records LMDB refused to read (the store is damaged: its status says so, and
        what to do): count them, say so. Nothing can be set aside, and nothing is deleted
        from the damaged db (_store/health.py)."""
        self.counters.add("unreadable_records", len(seqs))
        log.error(
            "%d records of the %r db in %s cannot be read (first key %s), the store is damaged; %s",
            len(seqs),
            db,
            self.store.path,
            u64(seqs[0]).hex(),
            what_then,
        )

    def set_aside(self, db: str, key: bytes, value: bytes, why: str, batch: WriteBatch) -> None:
        """A record that cannot be decoded: move it to the ``bad`` db, count it, say so."""
        batch.quarantine.append((db, key, value))
        self.counters.add("corrupt_records", 1)
        log.error(
            "record %s of the %r db in %s cannot be decoded (%s); it is set aside in "
            "the 'bad' db and the node goes on without it",
            key.hex(),
            db,
            self.store.path,
            why,
        )
