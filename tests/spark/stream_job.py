"""Streaming queries in a driver process of its own, for tests that SIGKILL the driver.

    python tests/spark/stream_job.py '{"endpoint": ..., "queries": [...], "trigger": ...}'

Each query reads the bridge's log under its own reader name and checkpoint, and writes
either a Parquet directory (``{"sink": "parquet", "out": ...}``) or back into the mesh
(``{"sink": "zmesh", "topic": ...}``). ``trigger`` "continuous" runs until killed;
"available-now" drains what the log holds and exits 0.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from zmesh.spark._local import local_session as build_session


def start(spark: Any, cfg: dict[str, Any], q: dict[str, Any]) -> Any:
    df = (
        spark.readStream.format("zmesh")
        .option("endpoint", cfg["endpoint"])
        .option("reader", q["reader"])
        .option("maxRecordsPerBatch", cfg["max_records"])
        .load()
    )
    if q["sink"] == "parquet":
        writer = df.writeStream.format("parquet").option("path", q["out"])
    else:
        writer = (
            df.select("key", "payload")
            .writeStream.format("zmesh")
            .option("endpoint", cfg["endpoint"])
            .option("topic", q["topic"])
        )
    writer = writer.option("checkpointLocation", q["checkpoint"])
    if cfg["trigger"] == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    spark = build_session("zmesh-stream-job")
    queries = [start(spark, cfg, q) for q in cfg["queries"]]
    print("STARTED", flush=True)
    for query in queries:
        query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
