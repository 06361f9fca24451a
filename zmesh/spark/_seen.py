"""The bridge log's dedupe window: which message ids (producer, seq) it holds.

``seen``: producer(16) + chunk(8) -> updated_at (8, a double) + a bitmap of the chunk's
sequences logged (``zmesh._store.acked``'s chunks of 1,024), least significant bit first;
``seen_t``: updated_at ms(8) + seen key -> b"", the same in time order. A transaction
reads and writes each chunk it touches once (``Window``), not an entry per message; a
chunk goes once every run appended before its last change is gone (``prune``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from .._store.acked import CHUNK
from .._store.acked import _masks as _masks_of_list
from ._runs import Run

_SHIFT = CHUNK.bit_length() - 1
_STAMP = struct.Struct("<d")


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def masks(seqs: Sequence[int]) -> dict[int, int]:
    """chunk -> the bits of ``seqs`` in it. A range with a step (a partition's share of
    a batch dealt round-robin) is a comb of bits per chunk, made with one division, not
    a step per sequence."""
    if type(seqs) is not range or seqs.step < 1 or not seqs:
        return _masks_of_list(seqs)
    out: dict[int, int] = {}
    step, at, last = seqs.step, seqs.start, seqs[-1]
    while at <= last:
        chunk = at >> _SHIFT
        k = (min(last, ((chunk + 1) << _SHIFT) - 1) - at) // step + 1  # seqs in this chunk
        out[chunk] = ((1 << (step * k)) - 1) // ((1 << step) - 1) << (at & (CHUNK - 1))
        at += k * step
    return out


class Window:
    """The chunks one write transaction touches: read once, written once (``write``)."""

    def __init__(self, txn: Any, seen_db: Any, seen_t_db: Any) -> None:
        self.txn = txn
        self.seen_db = seen_db
        self.seen_t_db = seen_t_db
        # seen key -> [bits (an int), its old stamp (bytes) or None], updated in place
        self._chunks: dict[bytes, list[Any]] = {}

    def _chunk(self, key: bytes) -> list[Any]:
        entry = self._chunks.get(key)
        if entry is None:
            old = self.txn.get(key, db=self.seen_db)
            entry = self._chunks[key] = [
                0 if old is None else int.from_bytes(old[8:], "little"),
                None if old is None else bytes(old[:8]),
            ]
        return entry

    def fresh(self, run: Run) -> Run:
        """``run`` less the messages whose ids are logged, or earlier in this
        transaction; the rest are marked logged."""
        producer, seqs = run.producer, run.seqs
        found = masks(seqs)
        if any(self._chunk(producer + _u64(chunk))[0] & mask for chunk, mask in found.items()):
            # (a redelivery: rare, so found one message at a time)
            logged = {
                i
                for i, seq in enumerate(seqs)
                if self._chunk(producer + _u64(seq >> _SHIFT))[0] >> (seq & (CHUNK - 1)) & 1
            }
            run = run.without(logged)
            if not len(run):
                return run
            found = masks(run.seqs)
        for chunk, mask in found.items():
            self._chunks[producer + _u64(chunk)][0] |= mask
        return run

    def write(self, now: float) -> None:
        """Write the chunks touched, stamped ``now``."""
        txn, stamp, ms = self.txn, _STAMP.pack(now), _u64(int(now * 1000))
        for key, (bits, old_stamp) in self._chunks.items():
            if old_stamp is not None:
                txn.delete(_u64(int(_STAMP.unpack(old_stamp)[0] * 1000)) + key, db=self.seen_t_db)
            txn.put(
                key, stamp + bits.to_bytes((bits.bit_length() + 7) // 8, "little"), db=self.seen_db
            )
            txn.put(ms + key, b"", db=self.seen_t_db)


def prune(txn: Any, seen_db: Any, seen_t_db: Any, oldest: float) -> None:
    """Forget the chunks last changed by runs all gone: those changed before ``oldest``,
    when the oldest run kept was appended (infinity: none is kept)."""
    limit = _u64(int(oldest * 1000)) if oldest != float("inf") else b"\xff" * 9
    cur = txn.cursor(db=seen_t_db)
    while cur.first() and bytes(cur.key()[:8]) < limit:
        txn.delete(bytes(cur.key()[8:]), db=seen_db)
        if not cur.delete():
            break
