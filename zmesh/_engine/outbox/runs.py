"""Batches stored as one record: the runs of a producer's outbox (IO thread only).

A ``publish_many`` of plain messages (priority 0, no expiry or schedule), or plain
``publish()`` calls staged together, to a topic that has groups, retains nothing and is
not latest-wins is stored as a *run*: one record in the ``runs`` db and one entry per lane
in ``pruns``, where a message published alone has a record and an entry per lane of its
own. Each message of a run is still owed, sent, acked, retried and parked on its own;
only what LMDB holds is per run.

A lane's entry is deleted once that lane owes none of the run, and rewritten with the
offsets it still owes (and their attempts) when it settles part of the run or a message's
attempts change: a restart neither sends again what was acked nor forgets what was
parked. A lane that owes the run's tail (a group acking in order) writes only the offset
it owes from: settling part of a run costs the same for a run of any length. The record
is deleted once no lane owes any of the run.

A ``memory`` topic's batches are runs too, held in RAM only (``Producer.mem_runs``: the
decoded record, never packed) and written as a record and its entries if they spill
(``stored``); until then nothing of them is in LMDB.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from ..._numbers import le_bytes
from ..._protocol.codec import LARGE_PAYLOAD_BYTES
from ..._store.store import WriteBatch, pack, pend_key, u64
from ..lane.blocks import block_parts, one_block

if TYPE_CHECKING:
    from ..lane.lane import Lane

RUN_ENTRY_BYTES = 100  # what a run's decoded record holds per message besides its payload
# What one run record holds at most: larger batches are stored as several runs. (Large
# LMDB values need contiguous free pages; a lane that settles part of a run rewrites its
# entry, a step per message of the run: the cost of a run grows with it, its gain does not.)
RUN_MAX_BYTES = 256 << 10
RUN_MAX_MESSAGES = 512
# A run of at most this many messages with a large payload (LARGE_PAYLOAD_BYTES, the size
# that also travels as a frame of its own) is joined from its pieces (run_record): below
# it, msgpack's two copies of a payload cost less than a Python step for it.
JOINED_MAX_MESSAGES = 64
_RECORD_HEADER = b"\x97"  # a msgpack array of a record's 7 fields
_BIN32 = struct.Struct(">BI")  # msgpack's bin 32 header: 0xc6, then the length
_array_header = msgpack.Packer(use_bin_type=True).pack_array_header


@dataclass(slots=True)
class Run:
    """What the producer knows of one stored run."""

    first: int  # its first sequence; the others follow it
    count: int
    topic: str
    # Each message's partition ("B", or "H" when one is past 255), as stored; None when
    # all are in partition ``one`` (a keyless batch's: made again when written).
    parts: array[int] | None
    left: int  # its messages still in the outbox
    owed: dict[int, int]  # lane id -> its messages that lane still owes
    stored: bool = True  # in LMDB (a ``memory`` topic's run is not, until it spills)
    nbytes: int = -1  # its payloads' bytes, or more; -1: not known (a run loaded at restart)
    one: int = -1

    def partitions(self) -> array[int]:
        parts = self.parts
        return block_parts(one_block(self.one, self.count)) if parts is None else parts

    def seqs(self) -> list[int]:
        return list(range(self.first, self.first + self.count))


def run_record(fields: list[Any]) -> bytes:
    """The ``runs`` value of a batch, from its decoded form ``[topic, partitions, keys,
    headers, published_at, payloads, indexes]`` (``keys`` None when no message has one;
    ``published_at`` one time for the whole run, or an array of doubles, one per message;
    ``partitions`` and ``indexes`` arrays too: each array stored as its bytes, packed with
    no step per message; see ``staging._allocate``).

    A run with a payload of ``LARGE_PAYLOAD_BYTES`` or more is the same bytes, joined
    from its pieces: each such payload copied once, straight into the record, where
    msgpack copies it into its buffer and out of that again."""
    topic, partitions, keys, headers, published_at, payloads, indexes = fields
    head = [
        topic,
        le_bytes(partitions),
        keys,
        headers,
        published_at if type(published_at) is float else le_bytes(published_at),
    ]
    if len(payloads) > JOINED_MAX_MESSAGES or max(map(len, payloads)) < LARGE_PAYLOAD_BYTES:
        return pack([*head, payloads, le_bytes(indexes)])
    pieces = [_RECORD_HEADER, *map(pack, head), _array_header(len(payloads))]
    for payload in payloads:
        if len(payload) < LARGE_PAYLOAD_BYTES:
            pieces.append(pack(payload))
        else:
            pieces += (_BIN32.pack(0xC6, len(payload)), payload)
    pieces.append(pack(le_bytes(indexes)))
    return b"".join(pieces)


def run_entry(
    parts: array[int], offsets: list[int] | int | None = None, attempts: list[int] | None = None
) -> bytes:
    """A ``pruns`` value: the run's partitions (a bin of a byte each, or a list past 255:
    the entry does not say how many there are), the offsets a lane owes (None: all; an
    int: those from it to the run's end) and their attempts (None: none handed out
    yet)."""
    return pack([parts.tobytes() if parts.typecode == "B" else parts.tolist(), offsets, attempts])


def lane_entry(lane: Lane, run: Run, owed_count: int | None = None) -> bytes | None:
    """What ``lane`` owes of ``run`` as its ``pruns`` value; None when it owes none.

    ``owed_count``: how many of the run the lane owes (``Run.owed``), when known. If that
    is every sequence from the lane's floor to the run's end (a group acking in order) and
    no message of the lane has attempts of its own, the entry is known with no look at
    each sequence: the offset the lane owes from. Found by a look at each, a tail owed
    with no attempts is written the same way."""
    end = run.first + run.count
    if owed_count is not None and not lane.entries:
        start = max(run.first, lane.floor())
        if owed_count == end - start:
            return (
                run_entry(run.partitions(), None if start == run.first else start - run.first)
                if owed_count
                else None
            )
    owed = lane.owed_among(range(run.first, end))
    if not owed:
        return None
    entries = lane.entries
    attempts = [e.attempt if (e := entries.get(s)) is not None else 0 for s in owed]
    offsets: list[int] | int | None = None
    if len(owed) < run.count:
        tail = owed[-1] == end - 1 and len(owed) == end - owed[0]  # (ascending, distinct)
        offsets = (
            owed[0] - run.first if tail and not any(attempts) else [s - run.first for s in owed]
        )
    return run_entry(run.partitions(), offsets, attempts if any(attempts) else None)


class Runs:
    """The runs in a producer's outbox, found by any of their sequences."""

    def __init__(self) -> None:
        # Sorted firsts and ends (first + count) of the runs, after a sentinel that is
        # below every sequence, so a bisect never lands before the start.
        self._starts: list[int] = [-1]
        self._ends: list[int] = [-1]
        self.by_first: dict[int, Run] = {}

    def __len__(self) -> int:
        return len(self.by_first)

    def add(self, run: Run) -> None:
        starts = self._starts
        if run.first > starts[-1]:  # (the usual case: a new run is the highest)
            starts.append(run.first)
            self._ends.append(run.first + run.count)
        else:
            i = bisect_left(starts, run.first)
            starts.insert(i, run.first)
            self._ends.insert(i, run.first + run.count)
        self.by_first[run.first] = run

    def _remove(self, first: int) -> None:
        del self.by_first[first]
        i = bisect_left(self._starts, first)
        del self._starts[i], self._ends[i]

    def find(self, seq: int) -> Run | None:
        """The run holding ``seq``, or None."""
        i = bisect_right(self._starts, seq) - 1
        return self.by_first[self._starts[i]] if i and seq < self._ends[i] else None

    def split(self, seqs: Sequence[int]) -> tuple[list[int], dict[int, int]]:
        """The sequences of ``seqs`` in no run, and how many are in each run (by its first
        sequence). One step per run and per gap between runs, none per sequence (a
        ``range`` is not even copied)."""
        return self._split(seqs if type(seqs) is range else sorted(seqs))

    def _split(self, s: Sequence[int]) -> tuple[list[int], dict[int, int]]:
        """``split`` of ascending ``s``."""
        singles: list[int] = []
        hits: dict[int, int] = {}
        pos = 0
        for first, n in self.pieces(s):
            if first < 0:
                singles += s[pos : pos + n]
            else:
                hits[first] = n
            pos += n
        return singles, hits

    def pieces(self, s: Sequence[int]) -> list[tuple[int, int]]:
        """Ascending ``s`` cut where it enters or leaves a run, in order: (the run's first
        sequence, or -1 for sequences in no run; how many of ``s`` in a row). One step
        per run and per gap between runs. (In a ``range`` of step 1 a sequence's place
        follows from its value: a bisect in a range makes an int per probe.)"""
        starts, ends = self._starts, self._ends
        n, pos = len(s), 0
        out: list[tuple[int, int]] = []
        if type(s) is range and s.step == 1:
            base = s.start
            while pos < n:
                seq = base + pos
                j = bisect_right(starts, seq) - 1  # the last run starting at or below it
                if j and seq < ends[j]:
                    hi = min(n, ends[j] - base)
                    out.append((starts[j], hi - pos))
                else:  # in no run, with the rest below the next run's start
                    hi = min(n, starts[j + 1] - base) if j + 1 < len(starts) else n
                    out.append((-1, hi - pos))
                pos = hi
            return out
        while pos < n:
            j = bisect_right(starts, s[pos]) - 1  # the last run starting at or below it
            if j and s[pos] < ends[j]:
                hi = bisect_left(s, ends[j], pos)
                out.append((starts[j], hi - pos))
            else:  # in no run, with the rest below the next run's start
                hi = bisect_left(s, starts[j + 1], pos) if j + 1 < len(starts) else n
                out.append((-1, hi - pos))
            pos = hi
        return out

    def owed_elsewhere(
        self, seqs: Sequence[int], other_ids: list[int]
    ) -> tuple[list[int], Sequence[int]]:
        """What the runs' counts tell of ``seqs`` and the lanes ``other_ids``: those of
        runs none of those lanes owes any of (first list), and those to ask the lanes
        about one by one (of no run, or of a run they owe part of). Those of a run one of
        them owes whole are in neither. One step per run, none per sequence."""
        ordered = seqs if type(seqs) is range else sorted(seqs)
        singles, hits = self._split(ordered)
        if not hits:
            return [], seqs
        free: list[int] = []
        for first in hits:
            run = self.by_first[first]
            counts = [run.owed.get(i, 0) for i in other_ids]
            if run.count in counts:
                continue  # (another lane owes all of it)
            lo = bisect_left(ordered, first)
            (singles if any(counts) else free).extend(
                ordered[lo : bisect_left(ordered, first + run.count, lo)]
            )
        return free, singles

    def settled(
        self, lane: Lane, lane_id: int, seqs: Sequence[int], batch: WriteBatch
    ) -> list[int]:
        """``lane`` no longer owes ``seqs``: its entries of their runs are deleted or
        rewritten. Returns the sequences of no run."""
        singles, hits = self.split(seqs)
        for first, n in hits.items():
            run = self.by_first[first]
            owed = run.owed.get(lane_id, 0) - n
            if owed > 0:
                run.owed[lane_id] = owed
            else:
                run.owed.pop(lane_id, None)
            if run.stored:
                batch.prun_set[pend_key(lane_id, first)] = (
                    lane_entry(lane, run, owed) if owed > 0 else None
                )
        return singles

    def rewrite(self, lane: Lane, lane_id: int, seqs: list[int], batch: WriteBatch) -> list[int]:
        """The attempts of ``seqs`` at ``lane`` changed: rewrite its entries of their runs.
        Returns the sequences of no run."""
        singles, hits = self.split(seqs)
        for first in hits:
            run = self.by_first[first]
            if run.stored:
                batch.prun_set[pend_key(lane_id, first)] = lane_entry(lane, run)
        return singles

    def owe_again(
        self, lane: Lane, lane_id: int, seq: int, in_outbox: bool, batch: WriteBatch
    ) -> bool:
        """``lane`` owes ``seq`` again (a dead letter replayed, already added to the lane;
        ``in_outbox``: another lane still owed it). False when ``seq`` is in no run."""
        run = self.find(seq)
        if run is None:
            return False
        if not in_outbox:
            run.left += 1
        run.owed[lane_id] = run.owed.get(lane_id, 0) + 1
        if run.stored:
            batch.prun_set[pend_key(lane_id, run.first)] = lane_entry(lane, run)
        return True

    def gone(self, seqs: Sequence[int], batch: WriteBatch) -> tuple[list[int], list[int]]:
        """``seqs`` left the outbox: a run none of whose messages is left is deleted.
        Returns the sequences of no run, and the first sequences of the runs deleted."""
        singles, hits = self.split(seqs)
        ended = []
        for first, n in hits.items():
            run = self.by_first[first]
            run.left -= n
            if run.left <= 0:
                if run.stored:
                    batch.runs_del.append(u64(first))
                    batch.del_bytes += run.nbytes if run.nbytes >= 0 else RUN_MAX_BYTES
                self._remove(first)
                ended.append(first)
        return singles, ended
