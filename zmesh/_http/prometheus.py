"""A node's status in Prometheus' text exposition format (version 0.0.4).

Written here rather than with prometheus-client: the format is a few lines of text per
family, the values are read from the node's status at each scrape (so ``/metrics`` never
disagrees with ``zmesh status``), and the HTTP API serves it without any extra installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LANE_EVENTS = (
    "acked",
    "nacked",
    "expired",
    "ack_timeouts",
    "dead_lettered",
    "superseded",
    "dead_replayed",
)
LANE_GAUGES = ("pending", "ready", "in_flight", "members", "dead_letters")

Sample = tuple[dict[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{body}}} {float(value)!r}")
    return lines


def render(status: dict[str, Any]) -> str:
    """The exposition of one node's status."""
    node = {"node": status["node"]["name"], "mesh": status["node"]["mesh"]}
    lines = _family(
        "zmesh_events_total",
        "counter",
        "Node events by kind",
        (({**node, "event": event}, n) for event, n in sorted(status["counters"].items())),
    )
    lines += _family(
        "zmesh_outbox_messages",
        "gauge",
        "Unacknowledged messages in the outbox",
        [(node, status["outbox"])],
    )
    lanes = [
        ({**node, "topic": ln["topic"], "lane": ln["lane"], "group": ln["group"] or ""}, ln)
        for ln in status["lanes"]
    ]
    for name in LANE_GAUGES:
        lines += _family(
            f"zmesh_lane_{name}",
            "gauge",
            f"Lane {name.replace('_', ' ')}",
            (
                (labels, len(ln[name]) if isinstance(ln[name], list) else ln[name])
                for labels, ln in lanes
            ),
        )
    lines += _family(
        "zmesh_lane_oldest_age_seconds",
        "gauge",
        "Age of the lane's oldest unsettled message",
        (
            (labels, ln["oldest_age_s"])
            for labels, ln in lanes
            if ln.get("oldest_age_s") is not None
        ),
    )
    lines += _family(
        "zmesh_lane_events_total",
        "counter",
        "Lane events by kind",
        (
            ({**labels, "event": event}, ln.get(event, 0))
            for labels, ln in lanes
            for event in LANE_EVENTS
        ),
    )
    alive = sum(1 for p in status["peers"] if p["alive"])
    lines += _family(
        "zmesh_peers",
        "gauge",
        "Peers by liveness",
        [
            ({**node, "alive": "true"}, alive),
            ({**node, "alive": "false"}, len(status["peers"]) - alive),
        ],
    )
    return "\n".join(lines) + "\n"
