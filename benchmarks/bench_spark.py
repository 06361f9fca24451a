"""Mesh to Spark and back, with every part in a process of its own (needs ``zmesh[spark]``).

    python -m benchmarks.bench_spark [--rows 1000000] [--reps 2] [--bridges 1]
                                     [--batch-rows 250000] [--cluster]
                                     [--json PATH] [--results-dir DIR] [--quick]

Each repetition, on 127.0.0.1 with ephemeral ports:

1. ``zmesh_process``: plain delivery to an acking consumer (the benchmark suite's scenario),
   ``--rows`` messages;
2. ingest: the same producer (the same role, count and API) into ``--bridges`` bridges of
   one group, each a process: messages logged and acked per second, and its ratio to 1;
3. ``--rows`` JSON readings of about 100 bytes published into the bridges (the rows of
   the Spark stages);
4. a Spark driver process (``local[2]``, or with ``--cluster`` also a standalone master
   with one worker) measures: the read path alone (log records to Arrow, no Spark); the
   SparkSession's start; ``readStream`` of every row in micro-batches of ``--batch-rows``
   (``Trigger.AvailableNow``) into ``noop``, the first query of the session (cold) and
   again, then decoding the JSON into typed columns: each query's first batch done after
   ``start()``, and its steady rate (the batches after the first, from the first's end to
   the last's); a batch read; the yardstick, the same rows as Parquet files of a
   micro-batch each read by Spark's streaming file source (also with ``from_json``);
   and the sink: the rows written back into the mesh, per second until stored and until
   a consumer group acked them all;
5. ``zmesh_batch_process`` (``publish_many`` / ``fetch`` + ``ack_many``), ``--rows``
   messages: the sink's yardstick.

Prints a table of every repetition's figures with the issue's targets, and writes them as
JSON (``--json``; ``--results-dir`` writes spark.json and spark.txt there).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import machine, scen_zmesh
from ._child import Children, children
from .sizes import FULL
from .spark_cluster import standalone

INGEST_TOPIC, ROWS_TOPIC, SINK_TOPIC = "bench", "readings", "sink"
GROUP, SINK_GROUP = "spark", "sink-readers"

# (figure, unit, bound, "min"/"max" or None, the text of the target)
FIGURES: tuple[tuple[str, str, float | None, str | None, str], ...] = (
    ("zmesh_process", "msgs/s", None, None, "plain delivery"),
    ("ingest", "msgs/s", None, None, "publish -> bridge log -> ack"),
    ("ingest_ratio", "x", 0.8, "min", ">= 0.8 x zmesh_process"),
    ("ingest_json_publish_many", "msgs/s", None, None, "the JSON rows, publish_many"),
    ("arrow", "rows/s", None, None, "read path alone, no Spark"),
    ("session_s", "s", None, None, "SparkSession start"),
    ("python_source_first_batch_s", "s", None, None, "floor: a 1-row Python source, cold"),
    ("stream_cold_first_batch_s", "s", 5.0, "max", "<= 5 s after start()"),
    ("stream_cold_steady", "rows/s", 200_000, "min", ">= 200k rows/s"),
    ("stream_first_batch_s", "s", 5.0, "max", "<= 5 s after start()"),
    ("stream_steady", "rows/s", 200_000, "min", ">= 200k rows/s"),
    ("stream_json_first_batch_s", "s", 5.0, "max", "<= 5 s after start()"),
    ("stream_json_steady", "rows/s", 100_000, "min", ">= 100k rows/s"),
    ("batch", "rows/s", None, None, "spark.read into noop"),
    ("parquet_first_batch_s", "s", None, None, "yardstick: Parquet stream"),
    ("parquet_steady", "rows/s", None, None, "yardstick: Parquet stream"),
    ("parquet_json_first_batch_s", "s", None, None, "yardstick: + from_json"),
    ("parquet_json_steady", "rows/s", None, None, "yardstick: + from_json"),
    ("sink_floor", "rows/s", None, None, "floor: to a Python writer that drops them"),
    ("sink_first_acked", "rows/s", None, None, "the session's first zmesh write"),
    ("sink_stored", "rows/s", None, None, "df.write until stored"),
    ("sink_acked", "rows/s", None, None, "df.write until a group acked"),
    ("zmesh_batch_process", "msgs/s", None, None, "publish_many, fetch + ack_many"),
    ("sink_ratio", "x", 0.5, "min", ">= 0.5 x zmesh_batch_process"),
)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_spark", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--rows", type=int, help="messages of each stage (1,000,000; quick 30,000)")
    ap.add_argument("--reps", type=int, help="repetitions, each reported (2; quick 1)")
    ap.add_argument("--bridges", type=int, default=1, help="bridge processes in the group")
    ap.add_argument(
        "--batch-rows",
        type=int,
        help="rows per micro-batch, maxRecordsPerTrigger (a quarter of --rows)",
    )
    ap.add_argument("--master", default="local[2]", help="the driver's master")
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="also run the Spark stages on a standalone master with one worker",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run: few rows, one run")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--results-dir", type=Path, help="write spark.json and spark.txt here")
    args = ap.parse_args(argv)
    args.rows = args.rows or (30_000 if args.quick else 1_000_000)
    args.reps = args.reps or (1 if args.quick else 2)
    args.batch_rows = args.batch_rows or max(1, args.rows // 4)
    if args.rows < 1000 or args.reps < 1 or args.bridges < 1 or args.batch_rows < 1:
        ap.error("--rows >= 1000, and --reps, --bridges, --batch-rows >= 1")
    return args


def _deadline(rows: int) -> float:
    return FULL.deadline(rows, 2_000.0) + 300.0


def _rate(rows: int, seconds: float) -> float:
    return rows / seconds if seconds > 0 else 0.0


def _ingest(
    kids: Children, work: Path, args: argparse.Namespace, out: dict[str, Any]
) -> list[dict[str, Any]]:
    """Bridges (left running) fed by the suite's producer; returns their ready events."""
    mesh, n, deadline_s = f"bench-{uuid.uuid4().hex[:10]}", args.rows, _deadline(args.rows)
    prod = kids.start(
        "zmesh_producer",
        name="producer",
        mesh=mesh,
        data_dir=str(work / "producer"),
        topic=INGEST_TOPIC,
        durability="process",
        groups=[GROUP],
        api="message",
        batch=FULL.batch,
        warmup=FULL.warmup,
        count=n,
        rate=0.0,
        deadline_s=deadline_s,
        members=args.bridges,
    )
    control = prod.expect("ready", 30)["control"]
    bridges = [
        kids.start(
            "spark_bridge",
            name=f"bridge-{i}",
            mesh=mesh,
            data_dir=str(work / f"bridge-{i}"),
            log_dir=str(work / f"log-{i}"),
            seeds=[control],
            topics=[INGEST_TOPIC, ROWS_TOPIC],
            sink_topic=SINK_TOPIC,
            sink_group=SINK_GROUP,
            deadline_s=deadline_s,
        )
        for i in range(args.bridges)
    ]
    ready = [b.expect("ready", 60) for b in bridges]
    res = prod.expect("result", deadline_s)
    prod.stop()
    out["ingest"] = _rate(n, res["t1"] - res["t0"])
    out["ingest_cpu_us_per_msg_producer"] = res["cpu_s"] * 1e6 / n
    for b in bridges:
        b.send("do", what="stats")
    stats = [b.expect("stats", 30) for b in bridges]
    out["bridge_stats"] = [s["stats"] for s in stats]
    out["bridge_rss_mb"] = [s["rss_mb"] for s in stats]
    # The rows of the Spark stages: JSON readings, into the same bridges.
    jp = kids.start(
        "spark_json_producer",
        name="json-producer",
        mesh=mesh,
        data_dir=str(work / "json-producer"),
        topic=ROWS_TOPIC,
        group=GROUP,
        count=n,
        members=args.bridges,
        seeds=[r["control"] for r in ready],
        deadline_s=deadline_s,
    )
    jp.expect("ready", 30)
    res = jp.expect("result", deadline_s)
    jp.stop()
    out["ingest_json_publish_many"] = _rate(n, res["t1"] - res["t0"])
    out["payload_bytes"] = res["payload_bytes"]
    for r, b in zip(ready, bridges, strict=True):
        r["child"], r["mesh"] = b, mesh
    return ready


def _spark(
    kids: Children,
    work: Path,
    args: argparse.Namespace,
    bridges: list[dict[str, Any]],
    master: str,
    conf: dict[str, str],
    out: dict[str, Any],
) -> None:
    """The driver's stages, then the sink's rows until acked downstream."""
    n, deadline_s = args.rows, _deadline(args.rows)
    mesh = bridges[0]["mesh"]
    consumer = kids.start(
        "zmesh_consumer",
        name="sink-consumer",
        mesh=mesh,
        data_dir=str(work / f"sink-consumer-{uuid.uuid4().hex[:6]}"),
        seeds=[b["control"] for b in bridges],
        topic=SINK_TOPIC,
        group=SINK_GROUP,
        api="batch",
        fetch=FULL.batch,
        deadline_s=deadline_s,
        expect=2 * n,
    )
    consumer.expect("ready", 30)
    floor = kids.start(
        "spark_floor",
        name="floor",
        work=str(work / "floor"),
        master=master,
        conf=conf,
        deadline_s=deadline_s,
    )
    got = floor.expect("floor", 300)
    out["python_source_first_batch_s"] = got["first_batch_s"]
    floor.stop()
    driver = kids.start(
        "spark_driver",
        name="driver",
        work=str(work / "driver"),
        endpoints=[b["endpoint"] for b in bridges],
        log_dirs=[b["log_dir"] for b in bridges],
        master=master,
        conf=conf,
        rows=n,
        batch_rows=args.batch_rows,
        topic=ROWS_TOPIC,
        sink_topic=SINK_TOPIC,
        deadline_s=deadline_s,
    )
    session = driver.expect("session", 300)
    out["session_s"] = session["seconds"]
    out["parallelism"] = session["parallelism"]
    arrow = driver.expect("arrow", deadline_s)
    out["arrow"] = _rate(arrow["rows"], arrow["seconds"])
    for figure in ("stream_cold", "stream", "stream_json"):
        got = driver.expect("stream_json" if figure == "stream_json" else "stream", deadline_s)
        _stream_figures(out, figure, got, n)
    out["batch"] = _rate(n, driver.expect("batch", deadline_s)["seconds"])
    for figure in ("parquet", "parquet_json"):
        _stream_figures(out, figure, driver.expect(figure, deadline_s), n)
    out["sink_floor"] = _rate(n, driver.expect("sink_floor", deadline_s)["seconds"])
    for name in ("first", "timed"):
        driver.send("sink")
        written = driver.expect("sink_written", deadline_s)
        for b in bridges:
            b["child"].send("do", what="drained")
        drained = max(b["child"].expect("drained", deadline_s)["t"] for b in bridges)
        prefix = "sink_first" if name == "first" else "sink"
        out[f"{prefix}_stored"] = _rate(n, written["t1"] - written["t0"])
        out[f"{prefix}_acked"] = _rate(n, drained - written["t0"])
    consumer.send("stop")
    got = consumer.expect("result", 60)
    if got["count"] != 2 * n:
        raise RuntimeError(f"the sink's consumer got {got['count']} of {2 * n} rows")
    driver.stop()
    consumer.stop()


def _stream_figures(out: dict[str, Any], figure: str, got: dict[str, Any], n: int) -> None:
    if got["rows"] != n:
        raise RuntimeError(f"{figure} read {got['rows']} of {n} rows")
    out[f"{figure}_first_batch_s"] = got["first_batch_s"]
    out[f"{figure}_steady"] = got.get("steady_rows_per_s", 0.0)
    out[f"{figure}_batches"] = got["batch_seconds"]


def _reference(name: str, work: Path, rows: int) -> float:
    sizes = dataclasses.replace(FULL, zmesh=rows, zmesh_batch=rows)
    return float(scen_zmesh.SCENARIOS[name](work / name, sizes)["rate"])


def _rep(
    work: Path,
    args: argparse.Namespace,
    master: str,
    conf: dict[str, str],
    cluster_master: str | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"zmesh_process": _reference("zmesh_process", work, args.rows)}
    with children(work) as kids:
        bridges = _ingest(kids, work, args, out)
        _spark(kids, work, args, bridges, master, conf, out)
        if cluster_master is not None:
            cluster: dict[str, Any] = {}
            _spark(kids, work, args, bridges, cluster_master, conf, cluster)
            out["cluster"] = cluster
    out["zmesh_batch_process"] = _reference("zmesh_batch_process", work, args.rows)
    out["ingest_ratio"] = out["ingest"] / out["zmesh_process"]
    out["sink_ratio"] = out["sink_acked"] / out["zmesh_batch_process"]
    if "cluster" in out:
        out["cluster"]["sink_ratio"] = out["cluster"]["sink_acked"] / out["zmesh_batch_process"]
    return out


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "s":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def _met(value: float | None, bound: float | None, kind: str | None) -> str | None:
    if value is None or bound is None or kind is None:
        return None
    return "met" if (value >= bound if kind == "min" else value <= bound) else "missed"


def table(reps: list[dict[str, Any]], title: str) -> Table:
    tab = Table(title=title)
    tab.add_column("figure")
    for i in range(len(reps)):
        tab.add_column(f"run {i + 1}", justify="right")
    tab.add_column("unit")
    tab.add_column("target / what")
    tab.add_column("status")
    sections = [("", reps)]
    if any("cluster" in r for r in reps):
        sections.append(("cluster ", [r.get("cluster", {}) for r in reps]))
    for prefix, rows in sections:
        for name, unit, bound, kind, text in FIGURES:
            values = [r.get(name) for r in rows]
            if all(v is None for v in values):
                continue
            status = {_met(v, bound, kind) for v in values} - {None}
            tab.add_row(
                prefix + name,
                *[_fmt(v, unit) for v in values],
                unit,
                text,
                "/".join(sorted(status)) or "",
            )
    return tab


def _write(args: argparse.Namespace, doc: dict[str, Any], tab: Table) -> None:
    """The JSON to ``--json`` and, with the table as text, to ``--results-dir``."""
    text = json.dumps(doc, indent=2, default=str) + "\n"
    paths = [args.json] if args.json else []
    if args.results_dir:
        paths.append(args.results_dir / "spark.json")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if args.results_dir:
        with open(os.devnull, "w") as devnull:
            rec = Console(record=True, width=200, file=devnull)
            rec.print(tab)
            (args.results_dir / "spark.txt").write_text(rec.export_text())


def run(argv: list[str] | None = None) -> int:
    args = _args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    err = Console(stderr=True)
    started = _dt.datetime.now(_dt.UTC)
    load_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="zmesh-bench-spark-"))
    conf = {"spark.sql.shuffle.partitions": "2"}
    reps: list[dict[str, Any]] = []
    try:
        with standalone(root / "cluster", enabled=args.cluster) as cluster_master:
            for rep in range(args.reps):
                err.print(f"[dim]run {rep + 1}/{args.reps}[/] ...")
                t0 = time.monotonic()
                work = root / f"run-{rep}"
                try:
                    reps.append(_rep(work, args, args.master, conf, cluster_master))
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                reps[-1]["seconds"] = round(time.monotonic() - t0, 1)
                reps[-1]["python_speed_s"] = machine.python_speed()
                err.print(f"run {rep + 1} done in {reps[-1]['seconds']:.0f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    desc = machine.describe()
    desc["load_average_start"] = [round(x, 2) for x in load_start]
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    title = (
        f"zmesh mesh-to-Spark ({args.rows:,} rows, {args.bridges} bridge(s), "
        f"{args.master}{', standalone' if args.cluster else ''}) - {desc['cpus']} CPUs, "
        f"Python {desc['python']}, zmesh {desc['git_commit']}"
    )
    tab = table(reps, title)
    console.print(tab)
    doc = {
        "schema": "zmesh-bench-spark/1",
        "started_at": started.isoformat(timespec="seconds"),
        "rows": args.rows,
        "reps": args.reps,
        "bridges": args.bridges,
        "batch_rows": args.batch_rows,
        "master": args.master,
        "cluster": args.cluster,
        "machine": desc,
        "runs": reps,
        "median": {
            name: statistics.median(r[name] for r in reps)
            for name, *_rest in FIGURES
            if all(name in r for r in reps)
        },
    }
    _write(args, doc, tab)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
