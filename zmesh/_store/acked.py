"""The consumer's dedupe window: ``acked`` (see store.py), bitmaps of what this node acked.

Key: producer(16) + chunk(8) + lane; value: a bitmap of the chunk's ``CHUNK`` sequences
(bit ``seq % CHUNK`` of byte ``seq % CHUNK // 8``, least significant bit first), set once
this node acked the sequence from that lane; trailing zero bytes are left out. One put per
chunk touched by a transaction instead of one per ack, and pruning below the producer's
floor deletes whole chunks. Sequences are the producer's, shared by all its topics, so a
lane that gets a small share of them costs up to ``CHUNK // 8`` bytes per acked message;
a busy lane costs about one bit.

A producer's part of the window also holds when it was last heard from: key producer(16)
+ ``HEARD`` (no lane: lanes are never empty), value the clock's observed time (a double).
It sorts after every chunk of the producer, so no prune below a floor reaches it. A
producer that sent nothing for ``dedupe_window_s`` has its part forgotten whole
(``seen_forget``): one gone for good (a worker with a data dir of its own for each run)
would otherwise keep its last chunks here for good (_engine/inbox/consumer.py).

Stores written before the window was kept as bitmaps had one empty ``seen`` entry per
acked message (producer(16) + seq(8) + lane); ``migrate_seen`` turns them into bitmaps
once, at open. A part of ``Store``, kept apart because only the consumer uses it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import lmdb

from ..errors import StoreError
from .batch import WriteBatch
from .chunks import CHUNK as CHUNK  # (re-exported: the Spark bridge's window uses it)
from .chunks import SHIFT, chunk_masks
from .damage import read_failed
from .deletes import delete_prefix
from .health import Health
from .keys import u64

_SHIFT = SHIFT
_BYTES = CHUNK // 8
_masks = chunk_masks  # (the name the Spark bridge's window imports)
HEARD = b"\xff" * 8  # (in place of a chunk: above any, seq >> SHIFT < 2**54)
_STAMP = struct.Struct(">d")


def _key(producer: bytes, chunk: int, lane: bytes) -> bytes:
    return producer + u64(chunk) + lane


def _add(txn: Any, db: Any, producer: bytes, lane: bytes, seqs: Sequence[int]) -> None:
    """Set the bits of ``seqs``: one read and one write per chunk they fall in."""
    if seqs:
        _add_masks(txn, db, producer, lane, chunk_masks(seqs))


def _add_masks(txn: Any, db: Any, producer: bytes, lane: bytes, masks: dict[int, int]) -> None:
    """Set the bits of ``masks`` (chunk -> bits). A bitmap is a little-endian int of
    ``CHUNK`` bits."""
    for chunk, mask in masks.items():
        key = _key(producer, chunk, lane)
        old = txn.get(key, db=db)
        if old:
            mask |= int.from_bytes(old, "little")
        txn.put(key, mask.to_bytes(_BYTES, "little").rstrip(b"\0"), db=db)


class WindowState(NamedTuple):
    tops: dict[tuple[bytes, str], int]  # the highest sequence acked per (producer, lane)
    heard: dict[bytes, float]  # when each producer was last heard from, as saved


class AckedWindow:
    """The window's reads and writes; ``Store`` provides the environment and database."""

    env: Any
    acked: Any
    path: str
    health: Health

    def seen_filter(self, producer: bytes, lane: bytes, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` this node acked from (producer, lane) and still remembers.

        A window LMDB cannot read (a damaged store, health.py) remembers none of the
        rest: they are handled again, as after the window was pruned."""
        out: set[int] = set()
        try:
            with (
                self.health.reading("the acked database", "acked"),
                self.env.begin(db=self.acked) as txn,
            ):
                get = txn.get
                bitmaps: dict[int, bytes] = {}
                for seq in seqs:
                    chunk = seq >> _SHIFT
                    bits = bitmaps.get(chunk)
                    if bits is None:
                        bits = bitmaps[chunk] = get(_key(producer, chunk, lane)) or b""
                    i = (seq & (CHUNK - 1)) >> 3
                    if i < len(bits) and bits[i] >> (seq & 7) & 1:
                        out.add(seq)
        except StoreError:
            pass  # (said by health.py)
        return out

    def window_state(self) -> WindowState:
        """What the consumer keeps of the window in memory (read at start)."""
        tops: dict[tuple[bytes, str], int] = {}
        heard: dict[bytes, float] = {}
        try:
            with self.env.begin(db=self.acked) as txn:
                for k, v in txn.cursor():
                    if len(k) == 24:  # (a producer's last-heard time: no lane)
                        if len(v) == _STAMP.size:
                            heard[bytes(k[:16])] = _STAMP.unpack(v)[0]
                        continue
                    bits = bytes(v).rstrip(b"\0")
                    if not bits:
                        continue
                    seq = (
                        (int.from_bytes(k[16:24], "big") << _SHIFT)
                        + 8 * (len(bits) - 1)
                        + bits[-1].bit_length()
                        - 1
                    )
                    key = (bytes(k[:16]), bytes(k[24:]).decode(errors="replace"))
                    tops[key] = max(seq, tops.get(key, -1))
        except lmdb.Error as exc:
            raise read_failed(exc, self.path, "the acked database") from exc
        return WindowState(tops, heard)

    def _apply_acked(self, txn: Any, b: WriteBatch) -> None:
        db = self.acked
        for producer, at in b.seen_heard.items():
            txn.put(producer + HEARD, _STAMP.pack(at), db=db)
        if b.seen_forget and self.health.deletes("acked"):
            for producer in b.seen_forget:
                delete_prefix(txn, db, producer)
        for producer, lane, seqs in b.seen_put:
            _add(txn, db, producer, lane, seqs)
        for producer, lane, masks in b.seen_masks:
            _add_masks(txn, db, producer, lane, masks)
        if b.seen_prune and self.health.deletes("acked"):
            cur = txn.cursor(db=db)
            for producer, floor, lane in b.seen_prune:
                below = floor >> _SHIFT  # chunks below this one hold only settled seqs
                if not cur.set_range(producer):
                    continue
                while True:
                    k = cur.key()
                    if not k.startswith(producer) or int.from_bytes(k[16:24], "big") >= below:
                        break
                    if k[24:] == lane:
                        if not cur.delete():
                            break
                    elif not cur.next():
                        break

    def migrate_seen(self) -> int:
        """Turn a ``seen`` db of one entry per acked message into bitmaps; returns how
        many entries it held (0 when there was none)."""
        with self.env.begin() as txn:
            if txn.get(b"seen") is None:  # the main db names every named db
                return 0
        with self.env.begin(write=True) as txn:
            old = self.env.open_db(b"seen", txn=txn, create=False)
            per_lane: dict[tuple[bytes, bytes], list[int]] = {}
            n = 0
            for k in txn.cursor(db=old).iternext(values=False):
                per_lane.setdefault((bytes(k[:16]), bytes(k[24:])), []).append(
                    int.from_bytes(k[16:24], "big")
                )
                n += 1
            for (producer, lane), seqs in per_lane.items():
                _add(txn, self.acked, producer, lane, seqs)
            txn.drop(old, delete=True)
        return n
