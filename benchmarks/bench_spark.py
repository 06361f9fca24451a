"""Mesh to Spark: rows per second through the zmesh source (needs ``zmesh[spark]``).

    python -m benchmarks.bench_spark [--messages 200000] [--payload 100] [--reps 3]
                                     [--json PATH]

A producer node publishes ``--messages`` JSON readings; a bridge logs them (the ingest
rate is the first figure). Then a local SparkSession (local[2]) reads the whole log,
``--reps`` times each, into Spark's ``noop`` sink, which forces every row to be produced:

- ``arrow``: the source's read path alone (LMDB records to Arrow batches, no Spark);
- ``batch/net``: ``spark.read`` with records fetched over the bridge's ROUTER;
- ``batch/lmdb``: the same, reading the log directory directly (same host);
- ``stream``: a whole ``readStream`` query with Trigger.AvailableNow, 50,000 rows per
  micro-batch, start to finish (its start-up and per-batch planning included);
- ``stream+json``: the same, decoding the JSON payloads into columns.

Medians are printed as rows per second; everything binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmesh
import zmesh.spark

SCHEMA = "sensor string, value double, i long"


def ingest(work: Path, n: int, payload_bytes: int) -> tuple[zmesh.Node, zmesh.spark.Bridge,
                                                            zmesh.Node, float]:
    """Start a bridge and a producer, publish ``n`` readings; returns the ingest rate."""
    kw: dict[str, Any] = {"mesh": f"bench-{os.getpid()}", "interfaces": ["127.0.0.1"],
                          "mdns": False}
    node = zmesh.Node("bridge", data_dir=work / "bridge", **kw).start()
    bridge = zmesh.spark.Bridge(node, topics=["readings"], log_dir=work / "log",
                                map_size_bytes=8 << 30).start()
    producer = zmesh.Node("producer", data_dir=work / "producer", seeds=[node.control_address],
                          max_outbox_messages=n + 1, **kw).start()
    pad = "x" * max(0, payload_bytes - 60)
    t0 = time.perf_counter()
    receipts = []
    for i in range(n):
        body = json.dumps({"sensor": f"s{i % 50}", "value": i * 0.5, "i": i, "pad": pad})
        receipts.append(producer.publish("readings", body, key=f"s{i % 50}"))
    for r in receipts:
        r.wait_acked(300)
    rate = n / (time.perf_counter() - t0)
    assert sum(end for _h, end in bridge.streams().values()) == n
    return node, bridge, producer, rate


def timed(fn: Callable[[], Any], rows: int, reps: int) -> float:
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        rates.append(rows / (time.perf_counter() - t0))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_spark",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--payload", type=int, default=100, help="approximate payload bytes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    from pyspark.sql.types import StructType

    from zmesh.spark._arrow import BASE_DDL
    from zmesh.spark._local import local_session
    from zmesh.spark._offsets import plan, resolve
    from zmesh.spark._options import SourceOptions
    from zmesh.spark._source import read_ranges

    n = args.messages
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="zmesh-bench-spark-") as tmp:
        work = Path(tmp)
        node, bridge, producer, results["ingest"] = ingest(work, n, args.payload)
        print(f"ingest (publish -> bridge log -> ack): {results['ingest']:,.0f} msg/s",
              flush=True)
        spark = local_session("zmesh-bench")
        try:
            ep, log_dir = bridge.endpoint, str(work / "log")
            bounds = bridge.streams()
            ranges = [r for part in plan(resolve("earliest", bounds),
                                         resolve("latest", bounds)) for r in part]
            schema = StructType.fromDDL(BASE_DDL)
            opts = SourceOptions.parse({"endpoint": ep, "path": log_dir})

            def arrow() -> None:
                assert sum(b.num_rows for b in read_ranges(opts, schema, ranges)) == n

            def batch(path: str | None) -> Callable[[], None]:
                def run() -> None:
                    reader = spark.read.format("zmesh").option("endpoint", ep)
                    df = reader.load(path) if path else reader.load()
                    df.write.format("noop").mode("overwrite").save()
                return run

            def stream(decode: bool) -> Callable[[], None]:
                def run() -> None:
                    reader = (spark.readStream.format("zmesh").option("endpoint", ep)
                              .option("path", log_dir).option("reader", f"bench-{time.time_ns()}")
                              .option("maxRecordsPerBatch", 50_000))
                    if decode:
                        reader = reader.option("payloadFormat", "json").option(
                            "payloadSchema", SCHEMA)
                    ck = tempfile.mkdtemp(dir=tmp)
                    (reader.load().writeStream.format("noop").option("checkpointLocation", ck)
                     .trigger(availableNow=True).start().awaitTermination())
                return run

            batch(log_dir)()  # warm up: Python workers, code paths
            cases = {"arrow": arrow, "batch/net": batch(None), "batch/lmdb": batch(log_dir),
                     "stream": stream(False), "stream+json": stream(True)}
            for name, fn in cases.items():
                results[name] = timed(fn, n, args.reps)
                print(f"{name:12s} {results[name]:>12,.0f} rows/s", flush=True)
        finally:
            spark.stop()
            producer.close()
            bridge.close()
            node.close()
    if args.json:
        args.json.write_text(json.dumps({"messages": n, "payload_bytes": args.payload,
                                         "rows_per_s": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
