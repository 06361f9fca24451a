"""The message index of retaining topics: ``rlog``, ``rtime`` and ``rnext`` (see store.py).

Written in the store's transactions (``_apply_log``), read by replay and by the retention
pass (_engine/retention.py, _engine/retained.py). A part of ``Store``, kept apart because
it is the one thing only retention and replay use.
"""

from __future__ import annotations

import struct
from typing import Any

from .batch import WriteBatch
from .health import Health, at_start
from .keys import u64


class LogIndex:
    """The index's reads and writes; ``Store`` provides the environment and databases."""

    env: Any
    path: str
    health: Health
    rlog: Any
    rtime: Any
    rnext: Any

    def _apply_log(self, txn: Any, b: WriteBatch) -> None:
        for log_key, log_value, time_key, time_value in b.log_put:
            txn.put(log_key, log_value, db=self.rlog)
            txn.put(time_key, time_value, db=self.rtime)
        for k, n in dict(b.log_next).items():  # the last of each partition
            txn.put(k, u64(n), db=self.rnext)
        if b.log_del:  # (not from a damaged database: health.py)
            rlog, rtime = self.health.deletes("rlog"), self.health.deletes("rtime")
            for log_key, time_key in b.log_del:
                if rlog:
                    txn.delete(log_key, db=self.rlog)
                if rtime:
                    txn.delete(time_key, db=self.rtime)

    def next_indexes(self) -> dict[bytes, int]:
        """topic + NUL + partition(2) -> the next index to allocate there.

        The larger of the stored counter and the last stored index + 1, like next_seq: an
        index is never handed out twice, also after a crash.
        """
        out: dict[bytes, int] = {}
        with at_start("the rlog database", self.path), self.env.begin() as txn:
            for k, v in txn.cursor(db=self.rnext):
                out[bytes(k)] = int.from_bytes(v, "big")
            cur = txn.cursor(db=self.rlog)
            positioned = cur.first()
            while positioned:
                prefix = bytes(cur.key())[:-8]
                # Indexes stay below 2**63: this key sorts past every index of the partition.
                positioned = cur.set_range(prefix + b"\xff" * 8)
                if positioned:
                    cur.prev()
                else:
                    cur.last()
                last = int.from_bytes(cur.key()[-8:], "big")
                out[prefix] = max(out.get(prefix, 0), last + 1)
                if positioned:
                    cur.next()
        return out

    def log_heads(self, topic_prefix: bytes, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` oldest entries of a topic in publish order: (seq, rtime value)."""
        out: list[tuple[int, bytes]] = []
        with (
            self.health.reading("the rtime database", "rtime"),
            self.env.begin(db=self.rtime) as txn,
        ):
            cur = txn.cursor()
            if cur.set_range(topic_prefix):
                for k, v in cur:
                    if not k.startswith(topic_prefix) or len(out) >= limit:
                        break
                    out.append((int.from_bytes(k[len(topic_prefix) :], "big"), bytes(v)))
        return out

    def log_totals(self) -> dict[bytes, tuple[int, int]]:
        """topic + NUL -> (entries, record bytes) of the index, read once at start."""
        out: dict[bytes, tuple[int, int]] = {}
        with at_start("the rtime database", self.path), self.env.begin(db=self.rtime) as txn:
            for k, v in txn.cursor():
                prefix = bytes(k[:-8])
                n, size = out.get(prefix, (0, 0))
                out[prefix] = (n + 1, size + int.from_bytes(v[10:14], "big"))
        return out

    def log_range(
        self, partition_prefix: bytes, start: int, limit: int
    ) -> tuple[int | None, list[tuple[int, int, float]]]:
        """(oldest stored index, up to ``limit`` entries (index, seq, published_at) from
        ``start``) of one partition of a topic."""
        out: list[tuple[int, int, float]] = []
        oldest = None
        with self.health.reading("the rlog database", "rlog"), self.env.begin(db=self.rlog) as txn:
            cur = txn.cursor()
            if cur.set_range(partition_prefix) and cur.key()[:-8] == partition_prefix:
                oldest = int.from_bytes(cur.key()[-8:], "big")
                if cur.set_range(partition_prefix + u64(max(start, 0))):
                    for k, v in cur:
                        if k[:-8] != partition_prefix or len(out) >= limit:
                            break
                        out.append(
                            (
                                int.from_bytes(k[-8:], "big"),
                                int.from_bytes(v[:8], "big"),
                                struct.unpack(">d", v[8:16])[0],
                            )
                        )
        return oldest, out
