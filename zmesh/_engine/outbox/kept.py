"""The values a producer keeps per key (``TopicConfig.keep_last``), IO thread only.

A topic with ``keep_last = N`` keeps the latest N messages of every key (messages without
a key are one key) after every group acked them: what ``Node.last`` reads, what a
``deliver="last_per_key"`` subscription gets first. Every message of such a topic is the
latest of its key when it is stored, so it joins its key's values then; the value it
pushes out (the N+1th newest) is *evicted*. Such a topic retains its messages
(``retention.retains``): settling leaves the records, and the retention pass deletes
the evicted ones once no lane owes them (and, with ``retention_s`` or
``retention_bytes`` too, once those let them go). The values live in memory, per topic,
and are read back from the topic's ``rtime`` entries and records the first time they are
needed after a start.

A new lane of a ``last_per_key`` subscription owes the kept values of its topic
(``seed``); an ephemeral one is sent them when the producer learns of it
(ephemeral.py); ``read`` serves ``Node.last``.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from ..._store.store import Store, WriteBatch
from ..._subjects import matcher
from ...errors import StoreError
from ..lane.lane import Lane
from ..stats import Counters
from .lanes import Lanes
from .owing import mono_offset, owe_record
from .record import Record, carried_bytes
from .records import Records
from .retention import Head, topic_prefix

READ_CHUNK = 1000  # records read at a time when the values are loaded


class Values:
    """The kept values of one topic: per key its latest ``n`` sequences."""

    __slots__ = ("n", "by_key", "kept", "evicted")

    def __init__(self, n: int) -> None:
        self.n = n
        self.by_key: dict[str | None, deque[int]] = {}
        self.kept: dict[int, Head] = {}  # seq -> its index entry, for every kept value
        self.evicted: dict[int, Head] = {}  # no longer kept: deleted once nobody owes it

    def add(self, key: str | None, head: Head) -> None:
        seqs = self.by_key.get(key)
        if seqs is None:
            seqs = self.by_key[key] = deque()
        seqs.append(head.seq)
        self.kept[head.seq] = head
        while len(seqs) > self.n:
            old = seqs.popleft()
            self.evicted[old] = self.kept.pop(old)


class Kept:
    """The kept values of one producer's topics."""

    def __init__(
        self,
        store: Store,
        lanes: Lanes,
        records: Records,
        retained_topics: Callable[[], Iterable[str]],
        counters: Counters,
    ) -> None:
        self.store = store
        self.lanes = lanes
        self.records = records
        self.counters = counters
        self._retained_topics = retained_topics  # (the topics with index entries)
        self._topics: dict[str, Values] = {}

    def of(self, topic: str) -> Values | None:
        """The kept values of ``topic`` (loaded from the store when first asked for after
        a start, or after its ``keep_last`` changed); None when it keeps none."""
        n = self.lanes.config(topic).keep_last
        values = self._topics.get(topic)
        if not n:
            if values is not None:
                del self._topics[topic]
            return None
        if values is None or values.n != n:
            values = self._topics[topic] = self._load(topic, n)
        return values

    def _load(self, topic: str, n: int) -> Values:
        values = Values(n)
        try:
            entries = self.store.log_heads(topic_prefix(topic), 1 << 62)
        except StoreError:  # (a damaged store, said by its health): none can be read
            entries = []
        heads = [Head.decode(seq, v) for seq, v in entries]
        for start in range(0, len(heads), READ_CHUNK):
            chunk = heads[start : start + READ_CHUNK]
            found = self.records_of([h.seq for h in chunk])
            for head in chunk:
                record = found.get(head.seq)
                if record is None:  # (a memory message not spilled before a restart)
                    values.evicted[head.seq] = head
                else:
                    values.add(record.key, head)
        return values

    def records_of(self, seqs: list[int]) -> dict[int, Record]:
        """The records of ``seqs`` that are still stored (in memory or in LMDB)."""
        mem = self.records.mem
        out = {seq: mem[seq] for seq in seqs if seq in mem} if mem else {}
        out.update(self.records.read([seq for seq in seqs if seq not in out]))
        return out

    def added(self, entries: Iterable[tuple[str, str | None, Head]]) -> None:
        """Messages of topics that keep values were stored: each is its key's latest."""
        for topic, key, head in entries:
            values = self.of(topic)
            seq = head.seq  # (known already when loaded from the store since)
            if values is not None and seq not in values.kept and seq not in values.evicted:
                values.add(key, head)

    # -- retention ------------------------------------------------------------------------

    def candidates(self, topic: str, limit: int) -> list[Head]:
        """The oldest evicted values of ``topic``, in publish order: what retention may
        delete (none if the topic keeps no values)."""
        values = self.of(topic)
        if values is None or not values.evicted:
            return []
        return [values.evicted[s] for s in heapq.nsmallest(limit, values.evicted)]

    def reclaimed(self, topic: str, seqs: Iterable[int]) -> None:
        values = self._topics.get(topic)
        if values is not None:
            for seq in seqs:
                values.evicted.pop(seq, None)

    # -- delivering -----------------------------------------------------------------------

    def topics(self, pattern: str) -> list[str]:
        """The topics matching ``pattern`` that keep values, in name order."""
        covers = matcher(pattern)
        return sorted(t for t in self._retained_topics() if covers(t) and self.of(t) is not None)

    def latest(self, topic: str, after: int = -1) -> Iterator[tuple[int, Record]]:
        """The kept values of ``topic`` above sequence ``after`` that are still stored and
        not expired, oldest first (their records read a chunk at a time)."""
        values = self.of(topic)
        if values is None:
            return
        seqs = sorted(s for s in values.kept if s > after)
        wall = time.time()
        for start in range(0, len(seqs), READ_CHUNK):
            chunk = seqs[start : start + READ_CHUNK]
            found = self.records_of(chunk)
            for seq in chunk:
                r = found.get(seq)
                if r is not None and not (r.expires_at and r.expires_at <= wall):
                    yield seq, r

    def seed(self, lane: Lane, batch: WriteBatch, now: float) -> int:
        """A new lane of a ``last_per_key`` subscription owes its topic's kept values
        first; returns how many. (Its messages have lower sequences than any published
        from now on, so they come first in each partition.)"""
        offset = mono_offset()
        others = [o for o in self.lanes.of_topic(lane.topic, unclaimed=True) if o is not lane]
        mem = self.records.mem
        added = newly_owed = 0
        for seq, r in self.latest(lane.topic):
            if seq in lane:
                continue
            owe_record(lane, seq, r, now, offset, None if seq in mem else batch)
            if not any(seq in o for o in others):
                newly_owed += 1  # (back in the outbox: settled everywhere before)
            added += 1
        self.records.depth += newly_owed
        self.counters.add("kept_values_owed", added)
        return added

    def read(
        self,
        pattern: str,
        after: tuple[str, int] | None,
        max_items: int,
        max_bytes: int,
        max_payload_bytes: int,
    ) -> tuple[list[tuple[str, int, int | None, int, Record]], bool]:
        """Kept values of the topics ``pattern`` matches, in (topic, sequence) order from
        just after ``after``: items ``(topic, partition, index, seq, record)``, and
        whether more are left. A payload past ``max_payload_bytes`` is left out."""
        items: list[tuple[str, int, int | None, int, Record]] = []
        size = 0
        for topic in self.topics(pattern):
            if after is not None and topic < after[0]:
                continue
            start = after[1] if after is not None and topic == after[0] else -1
            for seq, r in self.latest(topic, start):
                if len(items) >= max_items or (size >= max_bytes and items):
                    return items, True
                if len(r.payload) > max_payload_bytes:
                    self.counters.add("refused_oversized", 1)
                    continue
                items.append((topic, r.partition, r.part_index, seq, r))
                size += carried_bytes(r)
        return items, False
