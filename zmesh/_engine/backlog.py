"""What a lane's backlog looks like to an operator: the age of its oldest unsettled message
and how many of its messages are parked as dead letters. Read at status time, on the IO
thread, so every status reply (and the HTTP API built on them) carries both."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._store.keys import u32
from .._store.store import unpackb

if TYPE_CHECKING:
    from .lane import Lane
    from .producer import Producer

# Field of an outbox record (msgs layout, runs' messages alike) that holds its publish time.
PUBLISHED_AT = 5


def oldest_age_s(producer: Producer, lane: Lane, wall_now: float) -> float | None:
    """Seconds since the lane's oldest unsettled message was published; None when the lane
    owes nothing (or its record can no longer be read). Sequences grow with publish time,
    so the oldest is the lane's floor."""
    if not len(lane):
        return None
    record = producer.record(lane.floor())
    if record is None:
        return None
    published_at = unpackb(record)[PUBLISHED_AT]
    return max(0.0, round(wall_now - float(published_at), 3))


def parked(producer: Producer, lane_id: int) -> int:
    """Dead letters of the lane still parked: its ``dead`` entries (keys only, no value
    decoded) less those replayed and not yet settled again, which the producer keeps in
    memory."""
    store = producer.store
    prefix = u32(lane_id)
    count = 0
    with store.env.begin(db=store.dead) as txn:
        cur = txn.cursor()
        if cur.set_range(prefix):
            for key in cur.iternext(keys=True, values=False):
                if not key.startswith(prefix):
                    break
                count += 1
    replayed = sum(1 for lid, _seq in producer.dead.replayed if lid == lane_id)
    return count - replayed
