"""The messages a producer keeps for replay (IO thread only): the record bytes each topic
holds against ``retention_bytes``, reclaiming what retention lets go, and reading stored
messages by index for readers.

What may go is decided by the pure rules of retention.py; this applies them to the store.
A topic that keeps values per key (kept.py) offers retention only the values it no longer
keeps.
"""

from __future__ import annotations

import functools
from typing import Any

from ..._store.store import Store, WriteBatch, u64
from ...errors import StoreError
from ..stats import Counters
from .kept import Kept
from .lanes import Lanes
from .record import carried_bytes
from .records import Records
from .retention import (
    RECLAIM_CHUNK,
    Head,
    Indexes,
    log_entry,
    partition_prefix,
    reclaimable,
    retains,
    topic_prefix,
)
from .wallclock import WallClock

# A stored message as a reader gets it, a FetchItem's fields: (partition, index, seq, key,
# headers, published_at, payload).
FetchedItem = tuple[int, int, int, str | None, dict[str, Any] | None, float, bytes]


class Retained:
    """The retained messages of one producer: what they weigh, reclaiming, reading them."""

    def __init__(
        self,
        store: Store,
        lanes: Lanes,
        records: Records,
        indexes: Indexes,
        counters: Counters,
        clock: WallClock,
    ) -> None:
        self.store = store
        self.clock = clock  # (a message's age leaves out the wall clock's steps since)
        self.lanes = lanes
        self.records = records
        self.indexes = indexes
        self.counters = counters
        # topic -> [index entries, their record bytes]: what retention_bytes is held against
        self.totals: dict[str, list[int]] = {
            prefix[:-1].decode(): [n, size] for prefix, (n, size) in store.log_totals().items()
        }
        # Per retaining topic the entries and record bytes the last ``stage`` added, for
        # ``unstage`` to give back.
        self.staged: dict[str, list[int]] = {}
        self.kept = Kept(store, lanes, records, self.totals.keys, counters)

    def count_staged(self) -> None:
        """Add what the last ``stage`` put in ``staged`` to the totals."""
        for topic, (n, size) in self.staged.items():
            totals = self.totals.setdefault(topic, [0, 0])
            totals[0] += n
            totals[1] += size

    def unstage(self) -> None:
        """Take ``staged`` back out of the totals: its commit failed."""
        for topic, (n, size) in self.staged.items():
            totals = self.totals[topic]
            totals[0] -= n
            totals[1] -= size
        self.staged.clear()

    def index_again(
        self, topic: str, seq: int, fields: list[Any], size: int, batch: WriteBatch
    ) -> None:
        """A dead letter replayed after retention reclaimed its index entry and record
        (its record is stored again): indexed again as it was, so that retention reclaims
        it again once it is settled; nothing else would delete its record."""
        partition, published_at = fields[1], fields[5]
        index = fields[9] if len(fields) > 9 else None
        if index is None:  # (stored before messages had indexes: no entry to make)
            return
        batch.log_put.append(log_entry(topic, partition, index, seq, published_at, size))
        totals = self.totals.setdefault(topic, [0, 0])
        totals[0] += 1
        totals[1] += size
        values = self.kept.of(topic)
        if values is not None:  # (reclaimed, it was a value no longer kept)
            values.evicted[seq] = Head(seq, partition, index, size, published_at)

    def reclaim(self, batch: WriteBatch, wall: float) -> bool:
        """One bounded pass of retention over every topic with index entries; True when a
        topic has more to reclaim at once (call again soon)."""
        more = False
        for topic, totals in self.totals.items():
            if not totals[0]:
                continue
            prefix = topic_prefix(topic)
            cfg = self.lanes.config(topic)
            if cfg.keep_last:
                heads = self.kept.candidates(topic, RECLAIM_CHUNK)
            else:
                try:
                    entries = self.store.log_heads(prefix, RECLAIM_CHUNK)
                except StoreError:  # (a damaged store, said by its health: kept as it is)
                    continue
                heads = [Head.decode(seq, v) for seq, v in entries]
            n = reclaimable(
                heads,
                wall=wall,
                cfg=cfg,
                retained_bytes=totals[1],
                owed=functools.partial(self.lanes.owed, topic),
                stepped=self.clock.stepped_since,
            )
            if not n:
                continue
            retaining = retains(cfg)
            for head in heads[:n]:
                key = head.index.to_bytes(8, "big")
                batch.log_del.append(
                    (partition_prefix(topic, head.partition) + key, prefix + u64(head.seq))
                )
                totals[0] -= 1
                totals[1] -= head.size
            # (a record is gone already if it was settled while the topic did not retain)
            gone = [h.seq for h in heads[:n]]
            batch.msgs_del.extend(map(u64, self.records.forget_mem(gone)))
            if cfg.keep_last:
                self.kept.reclaimed(topic, gone)
            if retaining:
                self.counters.add("retention_reclaimed", n)
            more = more or n == RECLAIM_CHUNK
        return more

    def fetch(
        self,
        topic: str,
        cursors: dict[int, int],
        start: int | None,
        max_items: int,
        max_bytes: int,
        max_payload_bytes: int,
    ) -> tuple[list[FetchedItem], list[tuple[int, int, int, int]]]:
        """Stored messages of ``topic`` by index, for a reader.

        ``cursors``: partition -> first index wanted; ``start``: the first index of every
        other partition (None: only the partitions in ``cursors``). Returns items
        ``(partition, index, seq, key, headers, published_at, payload)`` in index order per
        partition, and per partition ``(partition, oldest stored index, next index, scanned
        up to)``: the reader continues at "scanned up to"; indexes it skipped are gone, or
        were messages with a payload past ``max_payload_bytes`` (what the reader accepts).
        """
        nexts = self.indexes.partitions(topic)
        mem = self.records.mem
        wanted = set(cursors) | (set(nexts) if start is not None else set())
        items: list[FetchedItem] = []
        heads: list[tuple[int, int, int, int]] = []
        size = 0
        for partition in sorted(wanted):
            pos = cursors.get(partition, start if start is not None else 0)
            nxt = nexts.get(partition, 0)
            budget = max_items - len(items)
            full = budget <= 0 or size >= max_bytes
            try:
                oldest, entries = self.store.log_range(
                    partition_prefix(topic, partition), pos, 0 if full else budget
                )
            except StoreError:  # (a damaged store, said by its health): the reader's gap
                heads.append((partition, nxt, nxt, nxt))
                continue
            scanned = pos
            if not full:
                stored = self.records.read([s for _i, s, _p in entries if s not in mem])
                stopped = False
                for index, seq, published_at in entries:
                    if size >= max_bytes and items:
                        stopped = True
                        break
                    scanned = index + 1
                    record = mem.get(seq) or stored.get(seq)
                    if record is None:
                        continue  # settled without retention (or damaged): not replayable
                    if len(record.payload) > max_payload_bytes:
                        self.counters.add("refused_oversized", 1)
                        continue
                    items.append(
                        (
                            partition,
                            index,
                            seq,
                            record.key,
                            record.headers,
                            published_at,
                            record.payload,
                        )
                    )
                    size += carried_bytes(record)
                if not stopped and len(entries) < budget:
                    scanned = max(scanned, nxt)  # the whole partition was read
            heads.append((partition, nxt if oldest is None else oldest, nxt, scanned))
        return items, heads
