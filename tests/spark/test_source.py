"""The zmesh source in a real local SparkSession: batch reads of the retained log between
offsets, streaming reads with read limits and Trigger.AvailableNow, decoded payloads."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import zmesh.spark

from .conftest import Bridged, Pair, needs_spark, stream_to_end

pytestmark = needs_spark


def test_batch_read_returns_the_retained_log_between_offsets(
    spark: Any, bridged: Callable[..., Bridged]
) -> None:
    b = bridged()
    b.publish("readings", 400)
    streams = b.bridge.streams()
    reader = spark.read.format("zmesh").option("endpoint", b.endpoint)
    df = reader.load()
    assert df.columns == [
        "topic",
        "partition",
        "offset",
        "key",
        "payload",
        "headers",
        "producer",
        "timestamp",
    ]
    rows = df.collect()
    assert len(rows) == 400
    assert {json.loads(r.payload)["i"] for r in rows} == set(range(400))
    assert {r.producer for r in rows} == {b.producer.id}
    assert all(r.headers == {"i": str(json.loads(r.payload)["i"])} for r in rows)
    # between offsets: a JSON object per stream; unnamed streams start at their head
    (s1, (_h1, e1)), (s2, (_h2, e2)) = sorted(streams.items())[:2]
    start = json.dumps({s1: 2, s2: e2})
    end = json.dumps({s1: e1 - 1, s2: e2})
    part = (
        reader.option("startingOffsets", start)
        .option("endingOffsets", end)
        .load()
        .where(f"partition in ({s1.split('/')[1]}, {s2.split('/')[1]})")
        .collect()
    )
    assert sorted((r.partition, r.offset) for r in part) == [
        (int(s1.split("/")[1]), o) for o in range(2, e1 - 1)
    ]
    with pytest.raises(Exception, match="payloadSchema, not .schema"):
        spark.read.format("zmesh").schema("a int").option("endpoint", b.endpoint).load().collect()
    # the same read straight from the log directory (same-host readers)
    local = spark.read.format("zmesh").option("endpoint", b.endpoint).load(b.log_dir)
    assert sorted(local.select("offset", "payload").collect()) == sorted(
        df.select("offset", "payload").collect()
    )


def test_batch_read_after_retention_and_data_loss(
    spark: Any, bridged: Callable[..., Bridged]
) -> None:
    b = bridged(retain_s=0.0)
    b.publish("readings", 100)
    b.bridge.prune()
    assert b.logged() == 100 and all(h == e for h, e in b.bridge.streams().values())
    reader = spark.read.format("zmesh").option("endpoint", b.endpoint)
    assert reader.load().count() == 0
    stream = next(iter(b.bridge.streams()))
    old = reader.option("startingOffsets", json.dumps({stream: 0}))
    with pytest.raises(Exception, match="no longer in the bridge log"):
        old.load().collect()
    assert old.option("failOnDataLoss", "false").load().count() == 0


def test_stream_with_read_limit_and_available_now(
    spark: Any, bridged: Callable[..., Bridged], tmp_path: Path
) -> None:
    b = bridged()
    b.publish("readings", 1000)
    query = stream_to_end(
        spark,
        {"endpoint": b.endpoint, "reader": "limits", "maxRecordsPerBatch": 300, "minPartitions": 3},
        "parquet",
        path=str(tmp_path / "out"),
        checkpointLocation=str(tmp_path / "ck"),
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    out = spark.read.parquet(str(tmp_path / "out"))
    assert out.count() == 1000
    assert out.select("topic", "partition", "offset").distinct().count() == 1000
    # several Spark partitions per micro-batch (minPartitions=3): files per batch
    files = [p for p in (tmp_path / "out").glob("part-*.parquet")]
    assert len(files) >= 4 * 3
    # the bridge knows how far the query went, for retention
    marks = b.bridge.readers()["limits"]["wm"]
    assert marks == {s: end for s, (_h, end) in b.bridge.streams().items()}
    # nothing new: a second run reads nothing; new messages: it reads just those
    b.publish("readings", 50, start=1000)
    query = stream_to_end(
        spark,
        {"endpoint": b.endpoint, "reader": "limits"},
        "parquet",
        path=str(tmp_path / "out"),
        checkpointLocation=str(tmp_path / "ck"),
    )
    assert spark.read.parquet(str(tmp_path / "out")).count() == 1050


def test_stream_decodes_json_and_msgpack_payloads(
    spark: Any, bridged: Callable[..., Bridged], tmp_path: Path
) -> None:
    b = bridged(topics=("readings", "packed"))
    b.publish("readings", 20)
    for r in [
        b.producer.publish("packed", msgpack.packb({"i": i, "value": i / 2})) for i in range(10)
    ] + [b.producer.publish("packed", b"\xc1 not msgpack")]:
        r.wait_acked(30)
    schema = "sensor string, value double, i long"
    got = {}
    for topic, fmt in (("readings", "json"), ("packed", "msgpack")):
        stream_to_end(
            spark,
            {
                "endpoint": b.endpoint,
                "reader": f"decode-{topic}",
                "topics": topic,
                "payloadFormat": fmt,
                "payloadSchema": schema,
            },
            "memory",
            name=f"decoded_{topic}",
        )
        got[topic] = spark.sql(f"select * from decoded_{topic}").collect()
    assert sorted((r.i, r.sensor, r.value) for r in got["readings"]) == [
        (i, f"sensor-{i % 5}", float(i % 97)) for i in range(20)
    ]
    packed = sorted(got["packed"], key=lambda r: (r.i is None, r.i))
    assert [(r.i, r.value, r.sensor) for r in packed[:10]] == [(i, i / 2, None) for i in range(10)]
    assert (packed[10].i, packed[10].value) == (None, None), "an undecodable payload is null"
    assert {r.topic for r in packed} == {"packed"}


def test_two_bridges_of_one_group_read_as_one_stream(
    spark: Any, bridged_pair: Callable[..., Pair], tmp_path: Path
) -> None:
    pair = bridged_pair()
    # Keyed by number, over all 16 partitions, which the two bridges share (a keyless
    # batch goes to one partition: six of them could all land on one bridge's).
    for r in [
        pair.first.producer.publish_many(
            "readings",
            [json.dumps({"i": i}).encode() for i in range(k, k + 100)],
            keys=[str(i) for i in range(k, k + 100)],
        )
        for k in range(0, 600, 100)
    ]:
        r.wait_acked(30)
    assert pair.first.logged() > 0 and pair.second.logged() > 0, "both bridges took a share"
    assert pair.logged() == 600
    ids = {pair.first.bridge.log_id, pair.second.bridge.log_id}
    rows = spark.read.format("zmesh").option("endpoint", pair.endpoints).load().collect()
    assert sorted(json.loads(r.payload)["i"] for r in rows) == list(range(600))
    query = stream_to_end(
        spark,
        {"endpoint": pair.endpoints, "reader": "both", "maxRecordsPerTrigger": 250},
        "parquet",
        path=str(tmp_path / "out"),
        checkpointLocation=str(tmp_path / "ck"),
    )
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [250, 250, 100]
    out = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(json.loads(r.payload)["i"] for r in out) == list(range(600))
    # its offsets name each stream by its bridge's log; each bridge knows the query's marks
    offsets = query.lastProgress["sources"][0]["endOffset"]
    ends = json.loads(offsets) if isinstance(offsets, str) else offsets
    assert {s.split(":")[0] for s in ends if s != "partitions"} == ids
    assert ends["partitions"] >= 1, "the last batch's partition count, for its replay"
    for b in (pair.first, pair.second):
        marks = b.bridge.readers()["both"]["wm"]
        assert marks == {s: end for s, (_h, end) in b.bridge.streams().items()}
    # offsets named without a bridge cannot say which of the two they are of
    with pytest.raises(Exception, match="which of the bridges"):
        (
            spark.read.format("zmesh")
            .option("endpoint", pair.endpoints)
            .option("startingOffsets", '{"readings/0": 1}')
            .load()
            .collect()
        )


def test_what_the_source_cannot_read_is_refused_before_its_reader_is_registered(
    spark: Any, bridged: Callable[..., Bridged], tmp_path: Path
) -> None:
    b = bridged()
    b.publish("readings", 20)
    stream, (_head, end) = next(iter(b.bridge.streams().items()))
    beyond = (
        json.dumps({stream: end + 100}),
        f"startingOffsets puts {b.bridge.log_id}:{stream} at {end + 100}, beyond the end of "
        f"its log ({end})",
    )
    typo = (
        "readngs",
        "option topics names ['readngs'], which no bridge of the source "
        "consumes or has logged; they consume ['readings']",
    )
    cases = [
        ("startingOffsets", *beyond),
        ("startingOffsets", '{"readngs/0": 1}', "readngs/0, a stream the source does not read"),
        ("endingOffsets", '{"readngs/0": 1}', "a stream the source does not read"),
        ("startingOffsets", json.dumps({f"0badc0de:{stream}": 1}), "of log 0badc0de"),
        ("topics", *typo),
        ("payloadSchema", "i int, `Offset` int", "payloadSchema repeats the column(s) ['offset']"),
        # payloadSchema checked on its own: not a PARSE_SYNTAX_ERROR at the source's columns,
        # nor a NOT NULL field failing in the JVM, nor a type decoded as nulls
        ("payloadSchema", "i intt", "option payloadSchema 'i intt': field i has type 'intt'"),
        ("payloadSchema", "i decimal(50,2)", "decimal(50,2) of field i: the precision must be"),
        ("payloadSchema", "i int not null", "option payloadSchema 'i int not null': field i is"),
        ("payloadSchema", "i interval day to second", "field i has type 'interval', which"),
        ("startingOffsets", json.dumps({stream: True}), "to offsets >= 0"),
    ]
    for option, value, refusal in cases:
        with pytest.raises(Exception, match=re.escape(refusal)):
            (
                spark.read.format("zmesh")
                .option("endpoint", b.endpoint)
                .option("payloadFormat", "json")
                .option("payloadSchema", "i int")
                .option(option, value)
                .load()
                .collect()
            )
    # a batch read whose start is after its end, as Kafka's source refuses it (not 0 rows)
    with pytest.raises(Exception, match=re.escape(f"start {b.bridge.log_id}:{stream} at {end} ")):
        (
            spark.read.format("zmesh")
            .option("endpoint", b.endpoint)
            .option("startingOffsets", json.dumps({stream: end}))
            .option("endingOffsets", json.dumps({stream: end - 1}))
            .load()
            .collect()
        )
    for option, value, refusal in [
        ("startingOffsets", *beyond),
        ("topics", *typo),
        ("endingOffsets", "latest", "option endingOffsets is for batch reads"),
    ]:
        with pytest.raises(Exception, match=re.escape(refusal)):
            stream_to_end(
                spark,
                {"endpoint": b.endpoint, "reader": "mistaken", option: value},
                "noop",
                checkpointLocation=str(tmp_path / option),
            )
    assert b.bridge.readers() == {}


def test_a_topic_added_to_a_query_is_read_from_its_first_retained_offset(
    spark: Any, bridged: Callable[..., Bridged], tmp_path: Path
) -> None:
    # Retention runs when the test says (once at start, then not for an hour).
    b = bridged(topics=("a", "b"), retain_s=0.0, prune_interval_s=3600.0)
    b.publish("a", 30)
    b.publish("b", 30)

    def run(topics: str) -> None:
        stream_to_end(
            spark,
            {"endpoint": b.endpoint, "reader": "growing", "topics": topics},
            "parquet",
            path=str(tmp_path / "out"),
            checkpointLocation=str(tmp_path / "ck"),
        )

    run("a")
    b.bridge.prune()  # b, which no query reads, goes
    assert all(h == e for s, (h, e) in b.bridge.streams().items() if s.startswith("b/"))
    run("a,b")  # b is new to the query: none of it was the query's to lose
    b.publish("b", 20, start=30)
    run("a,b")
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted((r.topic, json.loads(r.payload)["i"]) for r in rows) == [
        *(("a", i) for i in range(30)),
        *(("b", i) for i in range(30, 50)),
    ]


def registered_environment(spark: Any) -> dict[str, str]:
    """The environment map of the Python function Spark holds for the ``zmesh`` format."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    env = manager.lookupDataSource("zmesh").dataSourceCls().envVars()
    return {str(k): str(env.get(k)) for k in env.keySet().toArray()}


def test_streaming_queries_only_replace_the_registered_sources_environment(
    spark: Any, bridged: Callable[..., Bridged], tmp_path: Path
) -> None:
    """Each streaming query's source runner puts its variables into the one environment
    map of the registered format, unsynchronized; queries starting together could corrupt
    it if those puts inserted keys. register() puts the keys there first, so a query's
    runner only sets their values."""
    zmesh.spark.register(spark)  # (a fresh map: earlier tests' queries filled the old one)
    before = registered_environment(spark)
    assert {"SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE"} <= set(before)
    b = bridged()
    b.publish("readings", 10)
    query = stream_to_end(
        spark,
        {"endpoint": b.endpoint, "reader": "environment"},
        "noop",
        checkpointLocation=str(tmp_path / "ck"),
    )
    assert sum(p["numInputRows"] for p in query.recentProgress) == 10
    after = registered_environment(spark)
    assert set(after) == set(before), "the runner inserted keys"
    assert after["SPARK_PYTHON_RUNTIME"] == before["SPARK_PYTHON_RUNTIME"]
    assert all(after[k] for k in zmesh.spark._RUNNER_ENVIRONMENT), "the runner set them"
    assert "SPARK_LOCAL_DIRS" not in spark.sparkContext.environment, "only the source's map"
