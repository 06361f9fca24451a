"""Subjects and request/reply: round trips against raw DEALER/ROUTER, and publishing to
many topics by pattern against by name, in the same run.

    python -m benchmarks.bench_subjects [--reps 3] [--quick] [--json PATH]
                                        [--results-dir DIR]

Each repetition, on 127.0.0.1 with ephemeral ports, every node or socket in a process of
its own (``subject_roles.py``):

1. request/reply round trips of 100 bytes for ``--seconds``: raw DEALER/ROUTER (the
   ROUTER sends each request back), then ``Node.request`` to a ``Node.serve`` of a
   ``process`` and of a ``memory`` topic; one request at a time (p50/p99 are one round
   trip), then 16 at a time (16 DEALERs; 16 requesting threads of one node, served by 16
   handler threads);
2. publishing to 10,000 topics, each owed to a group declared on it by name (``flat``) or
   on one of 1,000 patterns matching it (``patterns``), publish to stored: every topic's
   first message (timed apart: a pattern's lane of the topic is made then), then
   ``--messages`` messages round-robin over them;
3. in this process, the matching itself: 10,000 topics against 1,000 patterns with the
   token trie, against testing each pattern in turn.

Prints a table of the medians with the issue's targets, and writes every repetition as
JSON (``--json``; ``--results-dir`` writes subjects.json and subjects.txt there).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from zmesh._subjects import SubjectTrie, matcher

from . import machine
from ._child import children
from .subject_roles import subject_names

TOPICS, PATTERNS = 10_000, 1_000

# (figure, unit, bound, "min"/"max" or None, what)
FIGURES: tuple[tuple[str, str, float | None, str | None, str], ...] = (
    ("rr_raw", "rt/s", None, None, "raw DEALER/ROUTER, 1 in flight"),
    ("rr_raw_p50_ms", "ms", None, None, "raw, one round trip"),
    ("rr_raw_p99_ms", "ms", None, None, "raw, one round trip"),
    ("rr_zmesh_process", "rt/s", None, None, "request/serve, process topic, 1 in flight"),
    ("rr_zmesh_process_p50_ms", "ms", None, None, "zmesh, one round trip"),
    ("rr_zmesh_process_p99_ms", "ms", None, None, "zmesh, one round trip"),
    ("rr_zmesh_memory", "rt/s", None, None, "request/serve, memory topic, 1 in flight"),
    ("rr_zmesh_memory_p50_ms", "ms", None, None, "zmesh, one round trip"),
    ("rr_zmesh_memory_p99_ms", "ms", None, None, "zmesh, one round trip"),
    ("rr_raw_16", "rt/s", None, None, "raw, 16 in flight"),
    ("rr_zmesh_memory_16", "rt/s", None, None, "zmesh memory topic, 16 in flight"),
    ("rr_zmesh_memory_16_p99_ms", "ms", None, None, "zmesh, 16 in flight"),
    ("first_flat", "topics/s", None, None, "each topic's first message, by name"),
    ("first_patterns", "topics/s", None, None, "each topic's first: matched, lane made"),
    ("first_ratio", "x", None, None, "first messages, patterns / flat"),
    ("publish_flat", "msgs/s", None, None, "10,000 topics, a group each by name"),
    ("publish_patterns", "msgs/s", None, None, "10,000 topics, groups of 1,000 patterns"),
    ("publish_ratio", "x", 0.9, "min", ">= 0.9 x flat topics"),
    ("publish_flat_cpu_us_per_msg", "us", None, None, "publisher CPU a message, by name"),
    ("publish_patterns_cpu_us_per_msg", "us", None, None, "publisher CPU a message, patterns"),
    ("publish_cpu_ratio", "x", 0.9, "min", "flat CPU / patterns CPU (steadier on a busy host)"),
    ("match_trie", "topics/s", None, None, "topic -> its patterns, token trie"),
    ("match_each", "topics/s", None, None, "topic -> its patterns, one pattern at a time"),
)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_subjects", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--reps", type=int, help="repetitions (3; quick 1)")
    ap.add_argument("--seconds", type=float, help="seconds of round trips per figure (5)")
    ap.add_argument(
        "--messages",
        type=int,
        help="messages published round-robin after the first of each topic (50,000)",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run: short, one repetition")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--results-dir", type=Path, help="write subjects.json and subjects.txt here")
    args = ap.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.seconds = args.seconds or (0.5 if args.quick else 5.0)
    # (5 a topic: past about 6 messages of each of 10,000 topics in the outbox at once,
    # every lane's window of sequences is sparse and is shrunk every few messages, with
    # or without patterns: docs/subjects.md)
    args.messages = args.messages or (20_000 if args.quick else 50_000)
    return args


def _round_trips(work: Path, args: argparse.Namespace, out: dict[str, Any]) -> None:
    common = {"seconds": args.seconds, "warmup": 20 if args.quick else 500, "deadline_s": 600}
    for name, inflight in (("rr_raw", 1), ("rr_raw_16", 16)):
        with children(work / name) as kids:
            server = kids.start("rr_raw_server", name="server", deadline_s=600)
            endpoint = server.expect("ready", 30)["endpoint"]
            client = kids.start(
                "rr_raw_client", name="client", endpoint=endpoint, inflight=inflight, **common
            )
            _take(out, name, client.expect("result", args.seconds + 120))
    for name, durability, inflight in (
        ("rr_zmesh_process", "process", 1),
        ("rr_zmesh_memory", "memory", 1),
        ("rr_zmesh_memory_16", "memory", 16),
    ):
        mesh = f"bench-{uuid.uuid4().hex[:10]}"
        with children(work / name) as kids:
            server = kids.start(
                "rr_zmesh_server",
                name="server",
                mesh=mesh,
                data_dir=str(work / name / "server"),
                durability=durability,
                concurrency=inflight,
                deadline_s=600,
            )
            control = server.expect("ready", 30)["control"]
            client = kids.start(
                "rr_zmesh_client",
                name="client",
                mesh=mesh,
                data_dir=str(work / name / "client"),
                seeds=[control],
                durability=durability,
                inflight=inflight,
                **common,
            )
            _take(out, name, client.expect("result", args.seconds + 120))


def _take(out: dict[str, Any], name: str, result: dict[str, Any]) -> None:
    out[name] = result["rate"]
    for key in ("p50_ms", "p99_ms"):
        out[f"{name}_{key}"] = result[key]
    out[f"{name}_cpu_us_per_rt"] = result["cpu_us_per_rt"]


def _publishing(work: Path, args: argparse.Namespace, out: dict[str, Any]) -> None:
    for mode in ("flat", "patterns"):
        with children(work / mode) as kids:
            pub = kids.start(
                "subj_publisher",
                name=f"publisher-{mode}",
                mesh=f"bench-{uuid.uuid4().hex[:10]}",
                data_dir=str(work / mode / "publisher"),
                mode=mode,
                topics=TOPICS,
                patterns=PATTERNS,
                count=args.messages,
                deadline_s=600,
            )
            pub.expect("ready", 120)
            res = pub.expect("result", 600)
            if res["lanes"] != TOPICS:
                raise RuntimeError(f"{mode}: {res['lanes']} lanes, not one per topic")
            out[f"publish_{mode}"] = res["rate"]
            out[f"publish_{mode}_cpu_us_per_msg"] = res["cpu_us_per_msg"]
            out[f"first_{mode}"] = res["first_rate"]
            out[f"first_{mode}_cpu_us_per_msg"] = res["first_cpu_us_per_msg"]
    out["publish_ratio"] = out["publish_patterns"] / out["publish_flat"]
    out["publish_cpu_ratio"] = (
        out["publish_flat_cpu_us_per_msg"] / out["publish_patterns_cpu_us_per_msg"]
    )
    out["first_ratio"] = out["first_patterns"] / out["first_flat"]


def _matching(out: dict[str, Any]) -> None:
    topics, patterns = subject_names(TOPICS, PATTERNS)
    patterns = [*patterns[: PATTERNS // 2], *(f"site.*.m{m}" for m in range(PATTERNS // 2))]
    trie: SubjectTrie[str] = SubjectTrie()
    for p in patterns:
        trie.add(p, p)
    t0 = time.perf_counter()
    found = sum(len(trie.match(t)) for t in topics)
    out["match_trie"] = len(topics) / (time.perf_counter() - t0)
    tests = [matcher(p) for p in patterns]
    sample = topics[:1000]
    t0 = time.perf_counter()
    each = sum(sum(1 for test in tests if test(t)) for t in sample)
    out["match_each"] = len(sample) / (time.perf_counter() - t0)
    if each != sum(len(trie.match(t)) for t in sample) or not found:
        raise RuntimeError("the trie and the one-at-a-time tests disagree")


def _table(runs: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("figure")
    for i in range(len(runs)):
        table.add_column(f"run {i + 1}", justify="right")
    table.add_column("median", justify="right")
    table.add_column("unit")
    table.add_column("target / what")
    table.add_column("status")
    for name, unit, bound, kind, what in FIGURES:
        values = [r[name] for r in runs if name in r]
        if not values:
            continue
        med = statistics.median(values)
        status = ""
        if bound is not None:
            status = "met" if (med >= bound if kind == "min" else med <= bound) else "missed"
        fmt = "{:,.2f}" if unit in ("x", "ms", "us") else "{:,.0f}"
        table.add_row(name, *(fmt.format(v) for v in values), fmt.format(med), unit, what, status)
    return table


def run(argv: list[str] | None = None) -> int:
    args = _args(argv)
    runs: list[dict[str, Any]] = []
    started = _dt.datetime.now(_dt.UTC)
    err = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="zmesh-bench-subjects-") as tmp:
        for rep in range(args.reps):
            out: dict[str, Any] = {"python_speed_s": machine.python_speed()}
            work = Path(tmp) / f"rep-{rep}"
            err.print(f"[dim]rep {rep + 1}/{args.reps}[/] round trips ...")
            _round_trips(work, args, out)
            err.print(f"[dim]rep {rep + 1}/{args.reps}[/] publishing to {TOPICS:,} topics ...")
            _publishing(work, args, out)
            _matching(out)
            runs.append(out)
    info = machine.describe()
    title = (
        f"zmesh subjects and request/reply ({args.messages:,} messages, {args.seconds:g} s "
        f"of round trips) - {info.get('cpus')} CPUs, Python {info.get('python')}, "
        f"zmesh {info.get('git_commit')}"
    )
    console = Console(width=160, record=True)
    console.print(_table(runs, title))
    doc = {
        "started": started.isoformat(),
        "mode": "quick" if args.quick else "full",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": info,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
        "median": {
            name: statistics.median(r[name] for r in runs)
            for name, *_ in FIGURES
            if all(name in r for r in runs)
        },
    }
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2))
    if args.results_dir is not None:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        (args.results_dir / "subjects.json").write_text(json.dumps(doc, indent=2))
        (args.results_dir / "subjects.txt").write_text(console.export_text())
    return 0


if __name__ == "__main__":
    sys.exit(run())
