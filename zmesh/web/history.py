"""The last minutes of every lane: rate in, rate out and backlog, one point per sample.

A status holds counters since its node started, not rates: a rate is the difference of two
samples over the time between them. What entered a lane is what it still owes plus what
it settled (``views.entered``); what left it is what its groups acked. A producer that
restarted starts its counters again, so a counter that went down starts the lane afresh
rather than giving a negative rate. A point is stamped with the time its producer's status
was read (``read_at``; a collection that waits on an unreachable node ends seconds after
it read the others), else the time the caller gives. Pure: no clock is read here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .._http.views import entered, lane_rows, reached

HISTORY_POINTS = 300  # five minutes at one sample a second


@dataclass(slots=True)
class Series:
    """One lane's points, oldest first, at most ``HISTORY_POINTS`` of them."""

    node: str
    name: str  # (the producer's, as last seen)
    topic: str
    lane: str
    group: str
    t: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    rate_in: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    rate_out: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    pending: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    last: tuple[float, int, int] | None = None  # (time, entered, acked) of the last sample

    def add(self, t: float, entered_total: int, acked: int, pending: int) -> None:
        rate_in = rate_out = None
        if self.last is not None:
            t0, in0, out0 = self.last
            if t > t0 and entered_total >= in0 and acked >= out0:
                rate_in = round((entered_total - in0) / (t - t0), 3)
                rate_out = round((acked - out0) / (t - t0), 3)
        self.last = (t, entered_total, acked)
        self.t.append(t)
        self.rate_in.append(rate_in)
        self.rate_out.append(rate_out)
        self.pending.append(pending)

    def latest(self) -> dict[str, Any]:
        return {
            "key": key_of(self.node, self.topic, self.lane),
            "node": self.node,
            "name": self.name,
            "topic": self.topic,
            "lane": self.lane,
            "group": self.group,
            "t": self.t[-1],
            "rate_in": self.rate_in[-1],
            "rate_out": self.rate_out[-1],
            "pending": self.pending[-1],
        }

    def points(self) -> dict[str, Any]:
        return {
            **self.latest(),
            "t": list(self.t),
            "rate_in": list(self.rate_in),
            "rate_out": list(self.rate_out),
            "pending": list(self.pending),
        }


def key_of(node: str, topic: str, lane: str) -> str:
    return f"{node}/{topic}/{lane}"


class History:
    """Every lane's series. A lane its producer no longer has (its group removed or
    expired) is dropped at once; one of a producer that did not answer is kept, and
    dropped once no sample has shown it for ``HISTORY_POINTS`` samples (its producer
    left)."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self._seen: dict[str, int] = {}
        self._samples = 0

    def add(self, mesh: dict[str, Any], t: float) -> list[dict[str, Any]]:
        """Take one collected mesh, its statuses read at ``t`` unless it says when; the
        lanes' latest points."""
        self._samples += 1
        read_at = {node["id"]: node.get("read_at") for node in mesh["nodes"]}
        reached_ids = {node["id"] for node in reached(mesh)}
        out = []
        for lane in lane_rows(mesh):
            key = key_of(lane["node_id"], lane["topic"], lane["lane"])
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = Series(
                    lane["node_id"], lane["node"], lane["topic"], lane["lane"], lane["group"]
                )
            series.name = lane["node"]
            at = read_at.get(lane["node_id"]) or t
            series.add(at, entered(lane), int(lane.get("acked", 0)), int(lane["pending"]))
            self._seen[key] = self._samples
            out.append(series.latest())
        for key, at in list(self._seen.items()):
            if at == self._samples:
                continue
            retired = self.series[key].node in reached_ids  # (it answered without the lane)
            if retired or self._samples - at >= HISTORY_POINTS:
                del self._seen[key], self.series[key]
        return out

    def points(self) -> list[dict[str, Any]]:
        """Every lane's whole series."""
        return [s.points() for s in self.series.values()]
