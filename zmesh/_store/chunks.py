"""The dedupe window's chunks: a sequence's chunk, and the bits of sequences per chunk.

A chunk is ``CHUNK`` consecutive sequences of one producer; the window (acked.py) keeps a
bitmap per chunk, and a write batch may carry acks' bits as masks per chunk (batch.py).
Kept apart from acked.py so that the write batch can split acks into pieces by chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._seqs import consecutive

CHUNK = 1024  # sequences per bitmap
SHIFT = CHUNK.bit_length() - 1


def chunk_masks(seqs: Sequence[int]) -> dict[int, int]:
    """chunk -> the bits of ``seqs`` in it, as an int (bit ``seq % CHUNK``)."""
    first, last = seqs[0], seqs[-1]
    if consecutive(seqs):
        # A run of consecutive sequences (what one member acked, mostly): a range of bits
        # per chunk, with no Python call per sequence.
        masks = {}
        for chunk in range(first >> SHIFT, (last >> SHIFT) + 1):
            lo = max(first, chunk << SHIFT) & (CHUNK - 1)
            hi = min(last, ((chunk + 1) << SHIFT) - 1) & (CHUNK - 1)
            masks[chunk] = ((1 << (hi - lo + 1)) - 1) << lo
        return masks
    masks = {}
    for seq in seqs:
        chunk = seq >> SHIFT
        masks[chunk] = masks.get(chunk, 0) | 1 << (seq & (CHUNK - 1))
    return masks
