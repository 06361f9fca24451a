"""The Spark job: sensor readings from the mesh, windowed aggregates per sensor to Parquet,
and alerts above a threshold back into the mesh.

    python job.py --master 'local[*]' --endpoint tcp://127.0.0.1:7601 --out var/windows \
        --checkpoint var/ck

or on a cluster (see docs/spark.md):

    spark-submit --master spark://host:7077 job.py --endpoint tcp://bridge-host:7601 ...

One streaming query reads the bridge's log (offsets are the bridge's log offsets, kept in
the checkpoint) and aggregates per sensor and event-time window. Each micro-batch of
closed windows is written idempotently, so a batch Spark replays after a crash changes
nothing: the Parquet files of batch N replace ``batch=N/``, and the alerts are published
through the bridge with ids from (query, batch, sensor, window), which it publishes once.
"""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import zmesh.spark

READING_SCHEMA = "sensor string, ts double, value double, heartbeat boolean"


def aggregates(spark: Any, args: argparse.Namespace) -> Any:
    """Per sensor and event-time window: readings, average and maximum."""
    source = (
        spark.readStream.format("zmesh")
        .option("endpoint", args.endpoint)
        .option("reader", "metrics-windows")
        .option("topics", "metrics")
        .option("payloadFormat", "json")
        .option("payloadSchema", READING_SCHEMA)
    )
    if args.bridge_log:
        source = source.option("path", args.bridge_log)  # same host: read the log directly
    events = (
        source.load()
        .select(
            "sensor",
            F.col("ts").cast("timestamp").alias("event_time"),
            "value",
            F.col("heartbeat").isNull().alias("real"),
        )
        .withWatermark("event_time", f"{args.watermark_s} seconds")
    )
    # Heartbeats move the watermark so every real window closes. They are left out after
    # the aggregation, not before: a filter would be pushed below the watermark.
    real = F.col("real")
    return (
        events.groupBy("sensor", F.window("event_time", f"{args.window_s} seconds"))
        .agg(
            F.count(F.when(real, 1)).alias("readings"),
            F.round(F.avg(F.when(real, F.col("value"))), 3).alias("avg_value"),
            F.max(F.when(real, F.col("value"))).alias("max_value"),
        )
        .where(F.col("readings") > 0)
        .select(
            "sensor",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "readings",
            "avg_value",
            "max_value",
        )
    )


def write_batch(args: argparse.Namespace) -> Any:
    def write(windows: Any, batch_id: int) -> None:
        spark = windows.sparkSession
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
        windows = windows.persist()
        windows.write.mode("overwrite").parquet(f"{args.out}/batch={batch_id}")
        (
            windows.where(F.col("avg_value") > args.threshold)
            .withColumn("key", F.col("sensor"))
            .write.format("zmesh")
            .mode("append")
            .option("endpoint", args.endpoint)
            .option("topic", "alerts")
            .option("writeId", f"{query_id}:{batch_id}")
            .option("idColumns", "sensor,window_start")
            .save()
        )
        windows.unpersist()

    return write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="the bridge's tcp://host:port")
    parser.add_argument("--bridge-log", help="the bridge's log dir, if on this host")
    parser.add_argument("--out", required=True, help="Parquet directory of the windows")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--threshold", type=float, default=75.0, help="alert above this avg")
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--watermark-s", type=int, default=5)
    parser.add_argument("--master", help="e.g. local[*]; leave unset under spark-submit")
    parser.add_argument(
        "--trigger", choices=("available-now", "continuous"), default="available-now"
    )
    args = parser.parse_args()

    builder = SparkSession.builder.appName("zmesh-metrics-pipeline")
    if args.master:
        builder = builder.master(args.master)
    spark = (
        builder.config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    zmesh.spark.register(spark)

    writer = (
        aggregates(spark, args)
        .writeStream.outputMode("append")
        .foreachBatch(write_batch(args))
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="2 seconds")
    writer.start().awaitTermination()
    windows = spark.read.parquet(args.out).drop("batch")
    print(f"job: {windows.count()} windows in {args.out}", flush=True)
    windows.orderBy("sensor", "window_start").show(100, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
