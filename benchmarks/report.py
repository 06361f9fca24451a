"""Medians, ratios, targets, the printed table and the JSON document of a run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from .scen_zmesh import DRAIN_REFERENCE, MEMORY_BUDGET_BYTES


@dataclass(frozen=True, slots=True)
class Target:
    """``scenario.metric OP bound`` (times ``baseline.metric`` when a baseline is named)."""

    scenario: str
    metric: str
    op: str
    bound: float
    baseline: str | None
    text: str

    def evaluate(self, scenarios: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "metric": self.metric,
            "op": self.op,
            "bound": self.bound,
            "baseline": self.baseline,
            "target": self.text,
            "value": None,
            "ratio": None,
            "met": None,
        }
        entry = scenarios.get(self.scenario, {})
        value = _metric(entry.get("median", {}), self.metric)
        if value is None:
            return out
        out["value"] = value
        measured = value
        if self.baseline is not None:
            base = scenarios.get(self.baseline, {}).get("reps", [])
            ratio = paired_ratio(entry.get("reps", []), base, self.metric)
            if ratio is None:
                return out
            measured = out["ratio"] = ratio
        out["met"] = measured >= self.bound if self.op == ">=" else measured <= self.bound
        return out


def paired_ratio(reps: list[dict[str, Any]], base: list[dict[str, Any]], path: str) -> Any:
    """The median of the repetitions' ratios of ``path`` to ``base``'s, each repetition
    paired with the baseline's of the same round (``rep``); None when no round has both.

    The two of a round ran minutes apart, where a run's rounds are up to half an hour
    apart and the host's speed drifts over that: a ratio of medians could divide a fast
    round's figure by a slow one's."""
    base_of = {r.get("rep", i): _metric(r, path) for i, r in enumerate(base)}
    ratios = [
        value / ref
        for i, r in enumerate(reps)
        if (value := _metric(r, path)) is not None and (ref := base_of.get(r.get("rep", i)))
    ]
    return statistics.median(ratios) if ratios else None


def _metric(median: dict[str, Any], path: str) -> Any:
    """``median``'s value at ``path`` (dotted: ``rss_mb.producer``); None if absent."""
    value: Any = median
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


TARGETS = (
    Target("zmesh_process", "rate", ">=", 0.6, "raw_pushpull_1", ">= 0.6 x raw PUSH/PULL 1/frame"),
    Target(
        "zmesh_batch_process",
        "rate",
        ">=",
        0.2,
        "raw_pushpull_100",
        ">= 0.2 x raw PUSH/PULL 100/frame",
    ),
    Target("zmesh_fsync", "rate", ">=", 0.6, "zmesh_process", ">= 0.6 x zmesh_process"),
    Target("zmesh_memory", "rate", ">=", 1.3, "zmesh_process", ">= 1.3 x zmesh_process"),
    Target("latency_zmesh_process", "p50_ms", "<=", 2.5, "latency_raw", "p50 <= 2.5 x raw p50"),
    Target("latency_zmesh_process", "p99_ms", "<=", 5.0, "latency_raw", "p99 <= 5 x raw p99"),
    Target("zmesh_16k", "rate", ">=", 0.7, "raw_pushpull_16k", ">= 0.7 x raw MB/s, 16 KiB"),
    Target("zmesh_256k", "rate", ">=", 0.6, "raw_pushpull_256k", ">= 0.6 x raw MB/s, 256 KiB"),
    Target("zmesh_256k", "rss_mb.producer", "<=", 150.0, None, "producer peak RSS <= 150 MB"),
    Target(
        "fanout_4_groups", "rate", ">=", 0.5, "zmesh_process", "each group >= 0.5 x zmesh_process"
    ),
    Target("zmesh_replicas_2", "rate", ">=", 0.5, "zmesh_process", ">= 0.5 x zmesh_process"),
    Target(
        "latency_zmesh_replicas_2",
        "p99_ms",
        "<=",
        2.0,
        "latency_zmesh_process",
        "p99 <= 2 x latency_zmesh_process",
    ),
    # Not one of the issue's: idle lanes must not slow a busy one (they did, before).
    Target("zmesh_many_lanes", "rate", ">=", 0.8, "zmesh_process", ">= 0.8 x zmesh_process"),
    Target(
        "zmesh_shared_2_members",
        "rate",
        ">=",
        0.95,
        "zmesh_process",
        ">= 0.95 x zmesh_process (one member)",
    ),
    Target(
        "offline_backlog",
        "producer_rss_after_publish_mb",
        "<=",
        40.0,
        None,
        "producer peak RSS <= 40 MB",
    ),
    Target(
        "offline_backlog", "rate", ">=", 0.5, DRAIN_REFERENCE, f"drain >= 0.5 x {DRAIN_REFERENCE}"
    ),
    Target(
        "memory_offline_budget",
        "rss_over_base_mb",
        "<=",
        4 * MEMORY_BUDGET_BYTES / (1 << 20),
        None,
        "RSS <= base + 4 x the 2 MiB budget",
    ),
    Target("restart_first_message", "first_message_s", "<=", 0.3, None, "first message <= 0.3 s"),
)

# The raw baseline each scenario's "x raw" column divides by (latency: p50 by raw p50).
RAW_BASELINE = {
    "zmesh_batch_process": "raw_pushpull_100",
    "zmesh_16k": "raw_pushpull_16k",
    "zmesh_256k": "raw_pushpull_256k",
    "raw_dealer_router_lmdb_100": "raw_pushpull_100",
    "raw_dealer_router_lmdb_16k": "raw_pushpull_16k",
    "raw_dealer_router_lmdb_256k": "raw_pushpull_256k",
    "latency_raw": "latency_raw",
    "latency_raw_contract": "latency_raw",
    "latency_zmesh_process": "latency_raw",
    "latency_zmesh_replicas_2": "latency_raw",
}


def raw_baseline(name: str) -> str:
    """The raw scenario ``name``'s "x raw" column divides by (a peer's by its kind)."""
    if name in RAW_BASELINE:
        return RAW_BASELINE[name]
    if name.startswith("latency_"):
        return "latency_raw"
    return "raw_pushpull_100" if name.endswith("_batch") else "raw_pushpull_1"


def median_of(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-key median of numbers, recursively through dicts; other values from the last rep."""
    out: dict[str, Any] = {}
    for key in reps[-1]:
        vals = [r[key] for r in reps if key in r]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
            out[key] = statistics.median(vals)
        elif all(isinstance(v, dict) for v in vals):
            out[key] = median_of(vals)
        else:
            out[key] = vals[-1]
    return out


def summarize(raw: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Scenario entries (median, rate, paired ratio to raw) and the evaluated targets."""
    scenarios: dict[str, Any] = {}
    for name, entry in raw.items():
        reps = entry["reps"]
        scenarios[name] = {
            "reps": reps,
            "errors": entry["errors"],
            "median": median_of(reps) if reps else {},
        }
        scenarios[name]["rate"] = scenarios[name]["median"].get("rate")
    for name, entry in scenarios.items():
        base = raw_baseline(name)
        metric = "p50_ms" if base == "latency_raw" else "rate"
        entry["baseline"] = base
        entry["ratio_metric"] = metric
        entry["ratio"] = paired_ratio(
            entry["reps"], scenarios.get(base, {}).get("reps", []), metric
        )
    targets = [t.evaluate(scenarios) for t in TARGETS if t.scenario in scenarios]
    return scenarios, targets


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _rss(rss: dict[str, float]) -> str:
    prod = [v for k, v in rss.items() if k.startswith("producer")]
    cons = [v for k, v in rss.items() if k.startswith("consumer")]
    return f"{_num(max(prod) if prod else None)} / {_num(max(cons) if cons else None)}"


def _status(met: bool | None) -> str:
    return {True: "[green]met[/]", False: "[red]missed[/]", None: "[yellow]n/a[/]"}[met]


def _target_value(t: dict[str, Any]) -> str:
    if t["ratio"] is not None:
        return f"{t['ratio']:.3f} x"
    unit = " s" if t["metric"].endswith("_s") else " MB" if ("_mb" in t["metric"]) else ""
    return _num(t["value"], 2) + unit


def table(scenarios: dict[str, Any], targets: list[dict[str, Any]], title: str) -> Table:
    tab = Table(title=title, title_justify="left")
    for col, just in (
        ("scenario", "left"),
        ("msgs/s", "right"),
        ("x raw", "right"),
        ("raw baseline", "left"),
        ("p50 / p99 ms", "right"),
        ("RSS MB prod / cons", "right"),
        ("target", "left"),
        ("measured", "right"),
        ("status", "left"),
    ):
        tab.add_column(col, justify=just)  # type: ignore[arg-type]
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for t in targets:
        by_scenario.setdefault(t["scenario"], []).append(t)
    for name, entry in scenarios.items():
        med = entry["median"]
        if not med:
            tab.add_row(name, "-", "-", "-", "-", "-", "failed", "-", "[red]error[/]")
            continue
        lat = "-"
        if "p50_ms" in med:
            lat = f"{med['p50_ms']:.3f} / {med['p99_ms']:.3f}"
        ratio = "-" if entry["ratio"] is None else f"{entry['ratio']:.3f}"
        if entry["ratio"] is not None and entry["ratio_metric"] == "p50_ms":
            ratio += " (p50)"
        extra = ""
        if name == "restart_first_message":
            extra = f" (first msg {med['first_message_s']:.2f} s)"
        rows = by_scenario.get(name) or [None]
        for i, t in enumerate(rows):
            head = (
                (
                    name + extra,
                    _num(entry["rate"]),
                    ratio,
                    entry["baseline"],
                    lat,
                    _rss(med.get("rss_mb", {})),
                )
                if i == 0
                else ("", "", "", "", "", "")
            )
            tail = (
                ("-", "-", "-") if t is None else (t["target"], _target_value(t), _status(t["met"]))
            )
            tab.add_row(*head, *tail)
    return tab
