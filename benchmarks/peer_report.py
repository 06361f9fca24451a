"""The peers beside zmesh and raw pyzmq: one row per measure, one column per system.

Every figure is a median of the same run's repetitions; ``zmesh ÷ peer`` divides zmesh's
figure by the peer's (above 1: zmesh's is higher, which for msgs/s is better and for
milliseconds, seconds, MB or CPU is worse).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from .peer_servers import PEER_NAMES
from .scen_peers import PEER_KINDS, scenario_name

Metric = Callable[[dict[str, Any]], float | None]


def _key(name: str) -> Metric:
    return lambda med: med.get(name)


def _cpu_total(med: dict[str, Any]) -> float | None:
    cpu = med.get("cpu_us_per_msg")
    return sum(cpu.values()) if cpu else None


def _backlog_rss(med: dict[str, Any]) -> float | None:
    """The RSS of what holds an offline backlog: zmesh's producer, a peer's server."""
    return med.get("server_rss_after_publish_mb", med.get("producer_rss_after_publish_mb"))


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    kind: str  # the peers' scenario kind (scen_peers.KINDS)
    zmesh: str | None  # zmesh's scenario
    raw: str | None  # raw pyzmq's scenario
    metric: Metric
    digits: int = 0
    acks: bool | None = True  # a row of acked delivery (the brokers'), of none (Zenoh's), any


ROWS = (
    Row(
        "msgs/s, publish + consume, ack each",
        "each",
        "zmesh_process",
        "raw_pushpull_1",
        _key("rate"),
    ),
    Row(
        "CPU µs/msg, all processes, ack each",
        "each",
        "zmesh_process",
        "raw_pushpull_1",
        _cpu_total,
        2,
    ),
    Row(
        "msgs/s, batches, one ack per batch",
        "batch",
        "zmesh_batch_process",
        "raw_pushpull_100",
        _key("rate"),
    ),
    Row("msgs/s, no acks (Zenoh)", "each", None, "raw_pushpull_1", _key("rate"), acks=False),
    Row(
        "p50 ms at 1,000 msgs/s",
        "latency",
        "latency_zmesh_process",
        "latency_raw",
        _key("p50_ms"),
        3,
        acks=None,
    ),
    Row(
        "p99 ms at 1,000 msgs/s",
        "latency",
        "latency_zmesh_process",
        "latency_raw",
        _key("p99_ms"),
        3,
        acks=None,
    ),
    Row(
        "MB RSS holding the offline backlog",
        "offline_backlog",
        "offline_backlog",
        None,
        _backlog_rss,
        1,
    ),
    Row("msgs/s, that backlog drained", "offline_backlog", "offline_backlog", None, _key("rate")),
    Row(
        "s to first message, restart with a backlog",
        "restart",
        "restart_first_message",
        None,
        _key("first_message_s"),
        3,
    ),
    Row("msgs/s after that restart", "restart", "restart_first_message", None, _key("rate")),
)


def _peer_scenario(row: Row, peer: str) -> str | None:
    """The brokers fill the rows of acked delivery, Zenoh (no acks) the others."""
    if row.kind not in PEER_KINDS[peer] or row.acks not in (None, peer != "zenoh"):
        return None
    return scenario_name(peer, row.kind)


def _value(scenarios: dict[str, Any], name: str | None, metric: Metric) -> float | None:
    if name is None:
        return None
    med = scenarios.get(name, {}).get("median")
    return metric(med) if med else None


def rows(scenarios: dict[str, Any], ran: list[str]) -> list[dict[str, Any]]:
    """The table as JSON: each row's raw, zmesh and peer figures with their ratios."""
    out = []
    for row in ROWS:
        zmesh = _value(scenarios, row.zmesh, row.metric)
        raw = _value(scenarios, row.raw, row.metric)
        peers: dict[str, Any] = {}
        for peer in ran:
            name = _peer_scenario(row, peer)
            value = _value(scenarios, name, row.metric)
            if name is None or value is None:
                continue
            peers[peer] = {
                "scenario": name,
                "value": value,
                "zmesh_over_peer": zmesh / value if zmesh is not None and value else None,
                "over_raw": value / raw if raw else None,
            }
        if peers:
            out.append(
                {
                    "row": row.label,
                    "digits": row.digits,
                    "raw": raw,
                    "zmesh": zmesh,
                    "zmesh_over_raw": zmesh / raw if zmesh is not None and raw else None,
                    "peers": peers,
                }
            )
    return out


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(doc_rows: list[dict[str, Any]], ran: list[str], title: str) -> Table:
    tab = Table(title=title, title_justify="left")
    tab.add_column("measure (median)", justify="left")
    tab.add_column("raw pyzmq", justify="right")
    tab.add_column("zmesh (÷ raw)", justify="right")
    for peer in ran:
        tab.add_column(f"{PEER_NAMES[peer]} (zmesh ÷ it)", justify="right")
    for r in doc_rows:
        d = r["digits"]
        zmesh = _fmt(r["zmesh"], d)
        if r["zmesh_over_raw"] is not None and r["row"].startswith("msgs/s"):
            zmesh += f" ({r['zmesh_over_raw']:.3f})"
        cells = []
        for peer in ran:
            cell = r["peers"].get(peer)
            if cell is None:
                cells.append("-")
                continue
            text = _fmt(cell["value"], d)
            if cell["zmesh_over_peer"] is not None:
                text += f" ({cell['zmesh_over_peer']:.2f})"
            elif cell["over_raw"] is not None:
                text += f" ({cell['over_raw']:.3f} × raw)"
            cells.append(text)
        tab.add_row(r["row"], _fmt(r["raw"], d), zmesh, *cells)
    return tab
