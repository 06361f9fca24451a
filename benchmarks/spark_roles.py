"""Mesh-to-Spark benchmark roles, each a process of its own (``python -m benchmarks.worker``):
a bridge node, a producer of JSON readings, and a Spark driver.

Every node binds 127.0.0.1 only, with mDNS off, and finds its peers by seed. Times are
``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine) unless
named ``wall``; Spark's progress reports are in wall-clock time.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import zmesh
import zmesh.spark

from ._wio import Commands, cpu_s, emit, rss_mb
from .zmesh_roles import _wait, _wait_members

READING_SCHEMA = "sensor string, ts double, value double, i long"
SENSORS = 50
PUBLISH_BATCH = 1000


def _node(p: dict[str, Any], name: str, **extra: Any) -> zmesh.Node:
    return zmesh.Node(
        name,
        mesh=p["mesh"],
        data_dir=p["data_dir"],
        interfaces=["127.0.0.1"],
        mdns=False,
        seeds=p.get("seeds", []),
        **extra,
    ).start()


def reading(i: int, pad: str) -> bytes:
    """A JSON reading of about 100 bytes, as an edge sensor would send one."""
    return json.dumps(
        {"sensor": f"s{i % SENSORS}", "ts": 1.7e9 + i / 1000, "value": i * 0.5, "i": i, "pad": pad},
        separators=(",", ":"),
    ).encode()


def spark_bridge(p: dict[str, Any], cmds: Commands) -> None:
    """A bridge node on ``topics``; the sink's topic declared for its consumer group.

    Commands (``{"cmd": "do", "what": ...}``): ``drained`` answers once the node's outbox
    is empty (every sink row acked by its group); ``stats``, the bridge's counters."""
    deadline = time.monotonic() + p["deadline_s"]
    node = _node(
        p,
        p.get("name", "bridge"),
        map_size_bytes=8 << 30,
        max_outbox_messages=p.get("max_outbox", 2_000_000),
    )
    try:
        if p.get("sink_topic"):
            node.topic(p["sink_topic"], groups=[p["sink_group"]])
        bridge = zmesh.spark.Bridge(
            node, topics=p["topics"], log_dir=p["log_dir"], map_size_bytes=16 << 30, retain_s=3600.0
        ).start()
        try:
            emit(
                "ready",
                control=node.control_address,
                endpoint=bridge.endpoint,
                log_id=bridge.log_id,
                log_dir=p["log_dir"],
            )
            while True:
                cmd = cmds.wait("do", deadline - time.monotonic())
                if cmd["what"] == "drained":
                    cpu0 = cpu_s()
                    _wait(
                        lambda: node.status()["outbox"] == 0,
                        deadline - time.monotonic(),
                        "the sink's rows acked",
                        cmds,
                        0.005,
                    )
                    emit("drained", t=time.monotonic(), cpu_s=cpu_s() - cpu0, stats=bridge.stats())
                elif cmd["what"] == "stats":
                    emit("stats", stats=bridge.stats(), rss_mb=rss_mb(), cpu_s=cpu_s())
        finally:
            bridge.close()
    finally:
        node.close()


def spark_json_producer(p: dict[str, Any], cmds: Commands) -> None:
    """Publish ``count`` JSON readings with ``publish_many`` (keyed by sensor), then wait
    until the group acked them all."""
    deadline = time.monotonic() + p["deadline_s"]
    node = _node(
        p, "json-producer", max_outbox_messages=p["count"] + 10_000, map_size_bytes=8 << 30
    )
    try:
        topic = p["topic"]
        node.topic(topic, groups=[p["group"]])
        emit("ready", control=node.control_address)
        _wait_members(node, topic, [p["group"]], 60.0, cmds, p.get("members", 1))
        pad = "x" * 30
        t0 = time.monotonic()
        last = None
        for start in range(0, p["count"], PUBLISH_BATCH):
            cmds.check()
            if time.monotonic() > deadline:
                raise TimeoutError("publishing the readings ran past the deadline")
            idx = range(start, min(p["count"], start + PUBLISH_BATCH))
            last = node.publish_many(
                topic, [reading(i, pad) for i in idx], keys=[f"s{i % SENSORS}" for i in idx]
            )
        assert last is not None
        _wait(
            lambda: node.status()["outbox"] == 0,
            deadline - time.monotonic(),
            "every reading acked",
            cmds,
            0.005,
        )
        emit("result", t0=t0, t1=time.monotonic(), payload_bytes=len(reading(0, pad)))
        cmds.wait_stop(p["deadline_s"])
    finally:
        node.close()


# -- the driver ---------------------------------------------------------------------------


def _progress(query: Any, started_wall: float) -> dict[str, Any]:
    """A finished query's batches: when the first was done after ``start()``, and the
    steady rate of the rest (from the first's end to the last's)."""
    import datetime as dt

    batches = []
    for prog in query.recentProgress:
        rows = prog["numInputRows"]
        if not rows:
            continue
        begun = dt.datetime.fromisoformat(prog["timestamp"].replace("Z", "+00:00"))
        done = begun.timestamp() + prog["batchDuration"] / 1000.0
        batches.append((done, rows, prog["batchDuration"] / 1000.0))
    if not batches:
        raise RuntimeError(f"query {query.name} read nothing: {query.lastProgress}")
    batches.sort()
    first_done = batches[0][0]
    out: dict[str, Any] = {
        "rows": sum(b[1] for b in batches),
        "batches": len(batches),
        "first_batch_s": round(first_done - started_wall, 3),
        "first_batch_rows": batches[0][1],
        "batch_seconds": [round(b[2], 3) for b in batches],
        "total_s": round(batches[-1][0] - started_wall, 3),
    }
    rest = sum(b[1] for b in batches[1:])
    if rest:
        out["steady_rows_per_s"] = rest / max(1e-6, batches[-1][0] - first_done)
    return out


def _stream(spark: Any, reader: Any, sink_work: Path, name: str) -> dict[str, Any]:
    query = (
        reader.writeStream.format("noop")
        .queryName(name)
        .option("checkpointLocation", tempfile.mkdtemp(dir=sink_work))
        .trigger(availableNow=True)
    )
    started = time.time()
    running = query.start()
    running.awaitTermination()
    return _progress(running, started)


def _ticks() -> type:
    """A Python streaming data source of one row per micro-batch, an Arrow batch as the
    zmesh source yields: what Spark's Python data source machinery costs a query by
    itself (its Python workers, its planning, Arrow in the JVM)."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class TickReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"tick": 0}

        def latestOffset(self) -> dict:
            return {"tick": 1}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            return [InputPartition(i) for i in range(start["tick"], end["tick"])]

        def read(self, partition: InputPartition) -> Any:
            yield pa.RecordBatch.from_arrays(
                [pa.array([partition.value], pa.int32())], names=["tick"]
            )

    class Ticks(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ticks"

        def schema(self) -> str:
            return "tick int"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return TickReader()

    return Ticks


def _drop() -> type:
    """A Python data source whose writer drops what Spark hands it: what Spark costs a
    sink by itself."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class DropWriter(DataSourceArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _batch in iterator:
                pass
            return WriterCommitMessage()

    class Drop(DataSource):
        @classmethod
        def name(cls) -> str:
            return "drop"

        def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
            return DropWriter()

    return Drop


def spark_floor(p: dict[str, Any], cmds: Commands) -> None:
    """The floor of a first batch: a fresh SparkSession's first query, over a Python
    streaming source that reads one row (``_ticks``)."""
    from zmesh.spark._local import local_session

    t0 = time.monotonic()
    spark = local_session("zmesh-bench-floor", p["master"], p.get("conf", {}))
    session_s = time.monotonic() - t0
    try:
        spark.dataSource.register(_ticks())
        work = Path(p["work"])
        work.mkdir(parents=True, exist_ok=True)
        emit(
            "floor",
            session_s=session_s,
            **_stream(spark, spark.readStream.format("ticks").load(), work, "ticks"),
        )
    finally:
        spark.stop()


def spark_driver(p: dict[str, Any], cmds: Commands) -> None:
    """Start a SparkSession (``master``) and measure, in this order: the read path alone
    (records to Arrow, no Spark), streaming queries into ``noop`` (the first one cold, in a
    fresh session), a batch read, the same rows as a Parquet stream, and the sink.

    ``sink`` ends with ``sink_written``: the parent asks the bridge when the rows were
    acked downstream."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from zmesh.spark._local import local_session
    from zmesh.spark._log import BridgeLog
    from zmesh.spark._offsets import plan, qualify, resolve
    from zmesh.spark._options import BASE_DDL, SourceOptions
    from zmesh.spark._source import read_ranges

    work = Path(p["work"])
    work.mkdir(parents=True, exist_ok=True)
    endpoints, n, per_batch = p["endpoints"], p["rows"], p["batch_rows"]
    topic = p["topic"]
    ep = ",".join(endpoints)

    t0 = time.monotonic()
    spark = local_session("zmesh-bench-spark", p["master"], p.get("conf", {}))
    emit(
        "session", seconds=time.monotonic() - t0, parallelism=spark.sparkContext.defaultParallelism
    )
    try:
        # The read path alone: every log's records of the topic to Arrow, in this process.
        t0 = time.monotonic()
        rows = 0
        for log_dir in p["log_dirs"]:
            log = BridgeLog.open_reader(log_dir)
            bounds = {
                qualify(log.log_id, s): b
                for s, b in log.streams().items()
                if s.startswith(topic + "/")
            }
            ranges = [
                r
                for part in plan(resolve("earliest", bounds), resolve("latest", bounds))
                for r in part
            ]
            opts = SourceOptions.parse({"endpoint": ep, "path": log_dir})
            schema = StructType.fromDDL(BASE_DDL)
            rows += sum(b.num_rows for b in read_ranges(opts, schema, ranges, {}, None))
        arrow_s = time.monotonic() - t0
        emit("arrow", rows=rows, seconds=arrow_s)

        def source(decode: bool) -> Any:
            reader = (
                spark.readStream.format("zmesh")
                .option("endpoint", ep)
                .option("topics", topic)
                .option("reader", f"bench-{time.time_ns()}")
                .option("maxRecordsPerTrigger", per_batch)
            )
            if p.get("local_path"):
                reader = reader.option("path", ",".join(p["log_dirs"]))
            if decode:
                reader = reader.option("payloadFormat", "json").option(
                    "payloadSchema", READING_SCHEMA
                )
            return reader.load()

        emit("stream", cold=True, **_stream(spark, source(False), work, "zmesh_noop_cold"))
        emit("stream", cold=False, **_stream(spark, source(False), work, "zmesh_noop"))
        emit("stream_json", **_stream(spark, source(True), work, "zmesh_json"))

        t0 = time.monotonic()
        (
            spark.read.format("zmesh")
            .option("endpoint", ep)
            .option("topics", topic)
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        )
        emit("batch", rows=n, seconds=time.monotonic() - t0)

        # The yardstick: the same rows, as Parquet files of a batch's rows each, read by
        # Spark's own streaming file source.
        parquet = work / "parquet"
        (
            spark.read.format("zmesh")
            .option("endpoint", ep)
            .option("topics", topic)
            .load()
            .repartition(max(1, round(n / per_batch)))
            .write.mode("overwrite")
            .parquet(str(parquet))
        )
        schema = spark.read.parquet(str(parquet)).schema
        files = (
            spark.readStream.format("parquet")
            .schema(schema)
            .option("maxFilesPerTrigger", 1)
            .load(str(parquet))
        )
        emit("parquet", **_stream(spark, files, work, "parquet_noop"))
        decoded = files.select(
            F.from_json(F.col("payload").cast("string"), READING_SCHEMA).alias("r")
        ).select("r.*")
        emit("parquet_json", **_stream(spark, decoded, work, "parquet_json"))

        # The sink: the payloads cached (no keys, as zmesh_batch_process publishes them).
        # Its floor first: the same rows handed to a Python writer that drops them.
        df = spark.read.parquet(str(parquet)).select("payload").cache()
        assert df.count() == n
        spark.dataSource.register(_drop())
        for _ in range(2):  # (the first warms the writers up)
            t0 = time.monotonic()
            df.write.format("drop").mode("append").save()
        emit("sink_floor", seconds=time.monotonic() - t0)
        for name in ("first", "timed"):  # (the first: the session's first zmesh write)
            cmds.wait("sink", p["deadline_s"])
            t0 = time.monotonic()
            (
                df.write.format("zmesh")
                .mode("append")
                .option("endpoint", ep)
                .option("topic", p["sink_topic"])
                .save()
            )
            emit("sink_written", name=name, t0=t0, t1=time.monotonic())
        df.unpersist()
        cmds.wait_stop(p["deadline_s"])
    finally:
        spark.stop()


ROLES = {
    "spark_bridge": spark_bridge,
    "spark_json_producer": spark_json_producer,
    "spark_driver": spark_driver,
    "spark_floor": spark_floor,
}
