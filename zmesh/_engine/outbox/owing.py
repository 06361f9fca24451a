"""Owing a stored message to a lane from its record (IO thread only): its times on the
monotonic clock the lanes run on, and its pending entry.

Publishes join their lanes as they are staged (staging.py); a record is owed again from
what the store holds when a pending entry is rebuilt at a start (restart.py) and when a
new lane owes the values a topic keeps (kept.py).
"""

from __future__ import annotations

import time

from ..._store.store import WriteBatch, pack, pend_key
from ..lane.lane import Lane
from .record import Record


def mono_offset() -> float:
    """monotonic - wall clock, from two adjacent readings: what turns a UNIX time into a
    monotonic one. (Pairing the loop's ``now`` with a later wall reading would move every
    schedule earlier by the time in between.)"""
    return time.monotonic() - time.time()


def mono_at(wall_at: float | None, offset: float) -> float:
    """A wall-clock instant on the monotonic clock (0.0 when unset)."""
    return wall_at + offset if wall_at else 0.0


def owe_record(
    lane: Lane, seq: int, r: Record, now: float, offset: float, batch: WriteBatch | None
) -> None:
    """``lane`` owes ``seq`` (first attempt), as its record says; its pending entry is
    written with ``batch`` (None: a ``memory`` message, which has none)."""
    lane.add(
        seq,
        r.partition,
        r.priority,
        0,
        now=now,
        not_before=mono_at(r.deliver_at, offset),
        expires_at=mono_at(r.expires_at, offset),
    )
    if batch is not None:
        value = pack([r.partition, r.priority, 0, r.expires_at, r.deliver_at])
        batch.pend_put.append((pend_key(lane.id, seq), value))
