"""A node's status: the snapshot that ``Node.status`` and status requests return."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine


def node_status(engine: Engine) -> dict:
    """A snapshot for status displays (IO thread)."""
    now = time.monotonic()
    lanes = []
    for (topic, name), lane in engine.producer.lanes.items():
        group, mode = engine.producer.lane_meta[(topic, name)]
        lanes.append({
            "topic": topic, "lane": name, "group": group, "mode": mode,
            "members": [m.hex() for m in lane.members],
            "windows": [m.window for m in lane.members.values()],  # (the members' order)
            "pending": len(lane), "ready": lane.ready_count,
            "in_flight": lane.in_flight_count(), **lane.counts,
        })
    return {
        "node": {"id": engine.node_id.hex(), "name": engine.config.name,
                 "mesh": engine.config.mesh, "incarnation": engine.incarnation,
                 "control_port": engine.ctrl_port, "data_port": engine.data_port},
        "outbox": engine.producer.depth,
        "store": {"path": engine.store.path, "map_size_bytes": engine.store.map_size_bytes,
                  "full": engine.held.full, "held_publishes": engine.held.count,
                  **engine.store.disk.state()},
        "lanes": lanes,
        "subscriptions": [{"topic": s.topic, "group": s.group, "mode": s.mode,
                           "delivered": s.delivered, "queued": s._queued()}
                          for s in engine._local_subs],
        "peers": [p.info(now) for p in engine.mesh.peers.values()] if engine.mesh else [],
        "bans": engine.listener.bans.state(now),
        "counters": engine.counters.snapshot(),
    }
