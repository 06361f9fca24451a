"""The rows the bridge's sink published, in its log, for a retried task to find.

``sink``: a task's positional rows, task + 0 + last row(8) -> msgpack [first row,
stored_at, producer, first seq] (a cursor put at task + 0 + row lands on the range that
may hold the row); or a row id of its own (``idColumns``) -> msgpack [stored_at,
producer, seq]. ``sink_t``: stored_at ms(8) + sink key -> b"", the same in time order for
pruning after ``sink_window_s``. Functions of a transaction: ``BridgeLog`` runs them.
"""

from __future__ import annotations

from typing import Any

import msgpack

_pack = msgpack.Packer(use_bin_type=True).pack
Entry = tuple[bytes, list[Any]]
# LMDB keys hold 511 bytes at most; the longest here is ``sink_t``'s, a time and a sink
# key (a row id, at most a msg_id's 256 bytes; or a task, a NUL and its last row).
MAX_TASK_BYTES = 511 - 8 - 9


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def id_entries(rows: list[tuple[bytes, str, int]], now: float) -> list[Entry]:
    """Entries for rows with ids of their own: (row id, producer hex, seq)."""
    return [(rid, [now, producer, seq]) for rid, producer, seq in rows]


def range_entries(task: bytes, ranges: list[tuple[int, int, str, int]], now: float) -> list[Entry]:
    """Entries saying that rows [first, end) of ``task`` were published from (producer,
    seq) on, for each (first, end, producer, seq) of ``ranges``."""
    return [
        (task + b"\0" + _u64(end - 1), [first, now, producer, seq])
        for first, end, producer, seq in ranges
    ]


def published(txn: Any, sink: Any, row_ids: list[bytes]) -> set[bytes]:
    """Those of ``row_ids`` published."""
    return {r for r in row_ids if txn.get(r, db=sink) is not None}


def covered(txn: Any, sink: Any, task: bytes, first: int, end: int) -> list[tuple[int, int]]:
    """The ranges [a, b) of rows [first, end) of ``task`` published, in order."""
    out: list[tuple[int, int]] = []
    cur = txn.cursor(db=sink)
    prefix = task + b"\0"
    if not cur.set_range(prefix + _u64(first)):
        return out
    for key, value in cur:
        if not key.startswith(prefix):
            break
        a, b = msgpack.unpackb(value)[0], int.from_bytes(key[-8:], "big") + 1
        if a >= end:
            break
        out.append((max(a, first), min(b, end)))
    return out


def write(txn: Any, sink: Any, sink_t: Any, entries: list[Entry], now: float) -> None:
    stamp = _u64(int(now * 1000))
    for key, value in entries:
        txn.put(key, _pack(value), db=sink)
        txn.put(stamp + key, b"", db=sink_t)


def prune(txn: Any, sink: Any, sink_t: Any, now: float, window_s: float, max_delete: int) -> int:
    """Forget up to ``max_delete`` entries older than ``window_s``; how many went."""
    limit = _u64(int((now - window_s) * 1000))
    cur = txn.cursor(db=sink_t)
    n = 0
    while n < max_delete and cur.first() and cur.key()[:8] < limit:
        txn.delete(cur.key()[8:], db=sink)
        cur.delete()
        n += 1
    return n
