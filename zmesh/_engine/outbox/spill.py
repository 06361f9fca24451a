"""``memory`` durability past its budget (IO thread only): the oldest messages and runs
held in RAM are written to LMDB, as ``process`` stores them, until half the budget is
left. A commit that fails takes them back into RAM (``unspill``), as they were."""

from __future__ import annotations

import heapq
from itertools import repeat
from typing import Any

from ..._store.store import WriteBatch, pack, pend_key, u64
from ..stats import Counters
from .lanes import Lanes
from .record import Record
from .records import Records, mem_size
from .runs import RUN_ENTRY_BYTES, Run, lane_entry, run_entry, run_record


class Spill:
    """Spilling one producer's ``memory`` messages to LMDB past its memory budget."""

    def __init__(
        self, lanes: Lanes, records: Records, counters: Counters, memory_budget_bytes: int
    ) -> None:
        self.lanes = lanes
        self.records = records
        self.counters = counters
        self.budget = memory_budget_bytes
        # Spilled by the last ``spill``, for ``unspill``: messages, and runs with their
        # record and size.
        self._spilled: list[tuple[int, Record]] = []
        self._spilled_runs: list[tuple[Run, list[Any], int]] = []

    def begin(self) -> None:
        """A new stage: nothing of it spilled yet."""
        self._spilled.clear()
        self._spilled_runs.clear()

    def over(self) -> bool:
        return self.records.mem_bytes > self.budget

    def spill(self, batch: WriteBatch, staged: list[Record], new_runs: list[Run]) -> None:
        """Write the oldest memory messages and runs to LMDB (a record and pending entries
        each) until half the budget is left. ``staged``: the records the current stage
        kept in memory, which no lane owes yet (every lane of their topic will);
        ``new_runs``: the runs it staged (owed whole)."""
        records = self.records
        mem, mem_runs = records.mem, records.mem_runs
        excess = records.mem_bytes - self.budget // 2
        singles: list[int] = []
        runs: list[int] = []
        freed = 0
        # Oldest first across both (each in the order kept: by sequence, mostly).
        for first, is_run in heapq.merge(zip(mem, repeat(False)), zip(mem_runs, repeat(True))):
            if freed >= excess:
                break
            if is_run:
                runs.append(first)
                freed += mem_runs[first][1]
            else:
                singles.append(first)
                freed += mem_size(mem[first])
        records.mem_bytes -= freed
        new_records = set(map(id, staged)) if singles else set()
        for seq in singles:
            record = mem.pop(seq)
            self._spilled.append((seq, record))
            packed = pack(record)
            batch.msgs_put.append((u64(seq), packed))
            batch.msgs_bytes += len(packed)
            owing = (
                self.lanes.receiving(record.topic)
                if id(record) in new_records
                else self.lanes.owing(record.topic, seq)
            )
            for lane in owing:
                batch.pend_put.append(
                    (
                        pend_key(lane.id, seq),
                        pack(
                            [
                                record.partition,
                                record.priority,
                                lane.attempt(seq),
                                record.expires_at,
                                record.deliver_at,
                            ]
                        ),
                    )
                )
        new = {run.first: run for run in new_runs}
        for first in runs:
            decoded, size = mem_runs.pop(first)
            run = new.get(first) or records.runs.by_first[first]
            run.stored = True
            self._spilled_runs.append((run, decoded, size))
            packed = run_record(decoded)
            batch.runs_put.append((u64(first), packed))
            batch.msgs_bytes += len(packed)
            records.decoded.keep_run(first, decoded, len(packed) + RUN_ENTRY_BYTES * run.count)
            by_id = {lane.id: lane for lane in self.lanes.receiving(run.topic)}
            whole = run_entry(decoded[1]) if first in new else None
            for lane_id, owed in run.owed.items():
                entry = whole or lane_entry(by_id[lane_id], run, owed)
                if entry is not None:
                    batch.prun_put.append((pend_key(lane_id, first), entry))
        self.counters.add(
            "spilled", len(singles) + sum(run.count for run, _f, _s in self._spilled_runs)
        )

    def unspill(self, new_runs: set[int], new_seqs: set[int]) -> None:
        """The commit that held the last ``spill`` failed: what it wrote is in RAM again
        (the messages and runs of that stage excepted: they were never stored)."""
        records = self.records
        for seq, record in self._spilled:
            if seq not in new_seqs:
                records.mem[seq] = record
                records.mem_bytes += mem_size(record)
        self._spilled.clear()
        for run, decoded, size in self._spilled_runs:
            if run.first not in new_runs:  # (older runs: in RAM again, as before the spill)
                run.stored = False
                records.decoded.forget_runs([run.first])
                records.mem_runs[run.first] = (decoded, size)
                records.mem_bytes += size
        self._spilled_runs.clear()
