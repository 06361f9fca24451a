"""A node's status: the snapshot that ``Node.status`` and status requests return.

Never an error: a damaged store is shown (``store.damaged``, with what to do), what it
cannot read is None, and a section that cannot be had (a replica's copy whose store
fails) is shown as its error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lmdb

from ..errors import StoreError, ZMeshError

if TYPE_CHECKING:
    from .engine import Engine
    from .lane.lane import Lane
    from .outbox.outbox import Outbox


def node_status(engine: Engine) -> dict[str, Any]:
    """A snapshot for status displays (IO thread)."""
    now = time.monotonic()
    wall_now = time.time()
    outbox = engine.outbox
    lanes = []
    for lane in outbox.lanes.all.values():
        lanes.append(
            {
                "topic": lane.topic,
                "lane": lane.name,
                "group": lane.group,
                "mode": lane.mode,
                "members": [m.hex() for m in lane.members],
                "windows": [m.window for m in lane.members.values()],  # (the members' order)
                # each member's partitions (the members' order), and how many moved so far
                "assigned": [lane.assignment.owned_by(m) for m in lane.members],
                "partitions_moved": lane.assignment.moved,
                "pending": len(lane),
                "ready": lane.ready_count,
                "in_flight": lane.in_flight_count(),
                **lane.counts,
                "oldest_age_s": _oldest_age(outbox, lane, wall_now),
                "dead_letters": outbox.dead.parked(lane),
            }
        )
    return {
        "node": {
            "id": engine.node_id.hex(),
            "name": engine.config.name,
            "mesh": engine.config.mesh,
            "incarnation": engine.incarnation,
            "control_port": engine.ctrl_port,
            "data_port": engine.data_port,
            "http_address": engine.http_endpoints.get("http_address"),
            "metrics_address": engine.http_endpoints.get("metrics_address"),
        },
        "outbox": engine.outbox.depth,
        "store": {
            "path": engine.store.path,
            "map_size_bytes": engine.store.map_size_bytes,
            # (publishes held, settlements that did not fit in one commit, or acks
            # whose dedupe entries wait for room)
            "full": engine.held.full or engine.commits.full or engine.consumer.unwritten.count > 0,
            "held_publishes": engine.held.count,
            "acks_unwritten": engine.consumer.unwritten.count,
            **engine.store.disk.state(),
            "damaged": engine.store.health.state(),
            "lost": engine.store.place.lost,  # (what happened to its files: place.py)
        },
        "lanes": lanes,
        "pattern_groups": [  # (idle since: on the wall clock as it is now)
            {**pg, "idle_since": pg["idle_since"] and outbox.clock.to_wall(pg["idle_since"])}
            for pg in outbox.groups.patterns.listing()
        ],
        "subscriptions": [
            {
                "topic": s.topic,
                "group": s.group,
                "mode": s.mode,
                "delivered": s.delivered,
                "queued": s._queued(),
            }
            for s in engine.commands.local
        ],
        "peers": [p.info(now) for p in engine.mesh.peers.values()] if engine.mesh else [],
        "bans": engine.listener.bans.state(now),
        "replicas": _section("replicas", engine.replication.status),
        "counters": engine.counters.snapshot(),
    }


def _oldest_age(outbox: Outbox, lane: Lane, wall_now: float) -> float | None:
    """Seconds since the lane's oldest unsettled message was published (sequences grow
    with publish time, so it is the lane's floor); None when there is none, or its record
    cannot be read."""
    if not len(lane):
        return None
    try:
        published_at = outbox.records.published_at(lane.floor())
    except StoreError:
        return None
    return None if published_at is None else max(0.0, round(wall_now - published_at, 3))


def _section(name: str, part: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``part()``, or its error when a store under it fails."""
    try:
        return part()
    except (ZMeshError, lmdb.Error) as exc:  # (shown, not logged: status is polled)
        return {"error": f"the {name} section failed: {type(exc).__name__}: {exc}"}
