"""Acks sent while a full store could not take their dedupe bits: the consumer's window
(acked.py), kept in memory until the store has room.

An ack is written to the window in the loop's commit and sent only after it. On a full
disk that commit is tried again with the disk's reserve, then in pieces
(_engine/commit.py); when even a piece of the acks' bits does not fit, the choice is to
roll the acks back or to send them without their bits. Rolled back, the messages come
again after their ack timeout and reach the handlers again, every one of them, for as
long as the disk stays full (a redelivery storm that also keeps the producer's outbox
from draining). Sent, their producers delete the messages and send none of them again,
so the handlers see each once. That is what is done: the bits are kept here, consulted
as the window is (a copy already on its way, sent again before the ack arrived, is
dropped and acked again), and written once a try (every RETRY_S) finds room.

What is given up meanwhile is the window's memory across a restart of this node: a
message whose ack its producer never committed (the ack lost, the producer killed before
its commit) and that comes again after this node restarted is handled again. That is
the at-least-once the window only narrows, and it is counted (``acks_unwritten``). A
transaction's acks are never sent so: they are rolled back with its publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .batch import WriteBatch
from .chunks import CHUNK, SHIFT, chunk_masks

RETRY_S = 1.0  # how often the bits are tried again
PIECE_CHUNKS = 200  # chunks per commit of them


class UnwrittenAcks:
    """Per (producer, lane), chunk -> the bits of acks sent but not in the window."""

    def __init__(self) -> None:
        self._bits: dict[tuple[bytes, bytes], dict[int, int]] = {}
        self.count = 0  # sequences kept
        self._retry_at = 0.0

    def add(self, pieces: Iterable[WriteBatch]) -> int:
        """Keep the dedupe bits of ``pieces`` (``seen_put``, ``seen_masks``), which were
        not committed; returns how many acks were not kept before."""
        new = 0
        for piece in pieces:
            parts = [(p, lane, chunk_masks(seqs)) for p, lane, seqs in piece.seen_put if seqs]
            for producer, lane, masks in parts + piece.seen_masks:
                kept = self._bits.setdefault((producer, lane), {})
                for chunk, bits in masks.items():
                    old = kept.get(chunk, 0)
                    if bits & ~old:
                        new += (bits & ~old).bit_count()
                        kept[chunk] = old | bits
        self.count += new
        return new

    def seen(self, producer: bytes, lane: str, seqs: Sequence[int], top: int) -> set[int]:
        """Those of ``seqs`` (up to ``top``, the highest acked) kept here."""
        kept = self._bits.get((producer, lane.encode()))
        if not kept:
            return set()
        return {s for s in seqs if s <= top and kept.get(s >> SHIFT, 0) >> (s & (CHUNK - 1)) & 1}

    def forget_below(self, producer: bytes, lane: bytes, floor: int) -> None:
        """The producer settled every sequence below ``floor`` and sends none of them
        again: the chunks wholly below it need no remembering (as the window's)."""
        kept = self._bits.get((producer, lane))
        if kept is None:
            return
        below = floor >> SHIFT
        for chunk in [c for c in kept if c < below]:
            self.count -= kept.pop(chunk).bit_count()
        if not kept:
            del self._bits[(producer, lane)]

    def forget(self, producer: bytes) -> None:
        """``producer``'s part of the window is forgotten (its bits with it)."""
        for key in [k for k in self._bits if k[0] == producer]:
            self.count -= sum(bits.bit_count() for bits in self._bits.pop(key).values())

    def write(self, commit: Callable[[WriteBatch], None], now: float) -> int | None:
        """When a try is due, commit the bits kept, in pieces, each committed one let go
        of; returns how many acks were let go once all are written, None otherwise (a
        piece that did not fit, with its error raised by ``commit``, leaves the rest for
        the next try: StoreError)."""
        if not self._bits or now < self._retry_at:
            return None
        self._retry_at = now + RETRY_S
        batch = WriteBatch(
            seen_masks=[
                (producer, lane, dict(masks)) for (producer, lane), masks in self._bits.items()
            ]
        )
        written = 0
        for piece in batch.seen_pieces(PIECE_CHUNKS):
            commit(piece)
            written += self._written(piece)
        return written

    def _written(self, piece: WriteBatch) -> int:
        gone = 0
        for producer, lane, masks in piece.seen_masks:
            kept = self._bits.get((producer, lane))
            if kept is None:
                continue
            for chunk, bits in masks.items():
                old = kept.pop(chunk, 0)
                gone += (old & bits).bit_count()
                if old & ~bits:
                    kept[chunk] = old & ~bits
            if not kept:
                del self._bits[(producer, lane)]
        self.count -= gone
        return gone
