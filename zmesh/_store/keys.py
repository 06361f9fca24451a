"""Keys of the store's databases: big-endian, so LMDB's order is numeric order.

They are ``struct`` packers, functions in C: mapped over many sequences, they cost no
Python call each.
"""

from __future__ import annotations

import struct

u64 = struct.Struct(">Q").pack
u32 = struct.Struct(">I").pack
pend_key = struct.Struct(">IQ").pack  # ``pend`` and ``dead``: (lane_id, seq) -> 4 + 8 bytes
