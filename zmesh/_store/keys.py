"""Keys of the store's databases: big-endian, so LMDB's order is numeric order."""

from __future__ import annotations


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def pend_key(lane_id: int, seq: int) -> bytes:
    """``pend`` and ``dead``: lane_id(4) + seq(8)."""
    return lane_id.to_bytes(4, "big") + seq.to_bytes(8, "big")
