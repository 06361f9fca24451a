"""The zmesh sink in a real local SparkSession: rows become messages, once per row id."""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import zmesh
from tests.conftest import wait_members, wait_until

from .conftest import Bridged, Collector, needs_spark, stream_to_end

pytestmark = needs_spark


@pytest.fixture
def collect(make_node: Callable[..., zmesh.Node]) -> Callable[..., Collector]:
    def make(b: Bridged, topic: str, group: str = "checker") -> Collector:
        node = make_node(f"consumer-{topic}", seeds=[b.node.control_address])
        c = Collector(node, topic, group)
        wait_members(b.node, topic, group, 1)
        return c

    return make


def settled(b: Bridged) -> None:
    wait_until(lambda: b.node.status()["outbox"] == 0, 30, what="bridge outbox drained")


def test_batch_write_publishes_each_row_once(
    spark: Any, bridged: Callable[..., Bridged], collect: Callable[..., Collector]
) -> None:
    b = bridged()
    out = collect(b, "out")
    df = (
        spark.range(0, 300)
        .selectExpr(
            "cast(id as string) as key",
            "id",
            "id * 1.5 as value",
            "map('n', cast(id as string)) as headers",
        )
        .repartition(3)
    )
    writer = (
        df.write.format("zmesh")
        .mode("append")
        .option("endpoint", b.endpoint)
        .option("topic", "out")
        .option("writeId", "backfill-1")
    )
    writer.save()
    wait_until(lambda: len(out) >= 300, 30, what="300 rows handled")
    writer.save()  # the same job again: every row id is known
    settled(b)
    assert len(out) == 300
    assert b.bridge.stats()["publish_duplicates"] == 300
    bodies = {json.loads(m.payload)["id"]: m for m in out.messages}
    assert sorted(bodies) == list(range(300))
    m = bodies[7]
    assert json.loads(m.payload) == {"id": 7, "value": 10.5}
    assert m.key == "7" and m.headers == {"n": "7"}


def test_payload_and_topic_columns(
    spark: Any, bridged: Callable[..., Bridged], collect: Callable[..., Collector]
) -> None:
    b = bridged()
    a, z = collect(b, "t-a"), collect(b, "t-z")
    df = spark.createDataFrame(
        [("t-a", b"raw-1"), ("t-z", b"raw-2"), ("t-a", b"raw-3")], "topic string, payload binary"
    )
    df.write.format("zmesh").mode("append").option("endpoint", b.endpoint).save()
    wait_until(lambda: len(a) == 2 and len(z) == 1, 30, what="rows routed by topic")
    assert sorted(m.payload for m in a.messages) == [b"raw-1", b"raw-3"]
    with pytest.raises(Exception, match="only appends"):
        df.write.format("zmesh").mode("overwrite").option("endpoint", b.endpoint).save()


def test_stream_write_from_the_zmesh_source(
    spark: Any, bridged: Callable[..., Bridged], collect: Callable[..., Collector], tmp_path: Path
) -> None:
    b = bridged()
    out = collect(b, "copies")
    b.publish("readings", 500)
    stream_to_end(
        spark,
        {"endpoint": b.endpoint, "reader": "copier", "maxRecordsPerBatch": 200},
        "zmesh",
        columns=("key", "payload"),
        endpoint=b.endpoint,
        topic="copies",
        checkpointLocation=str(tmp_path / "ck"),
    )
    wait_until(lambda: len(out) >= 500, 30, what="500 copies handled")
    settled(b)
    assert len(out) == 500
    assert {json.loads(m.payload)["i"] for m in out.messages} == set(range(500))


def test_columns_every_task_would_fail_on_are_refused_when_the_writer_is_made(
    spark: Any, bridged: Callable[..., Bridged]
) -> None:
    b = bridged()
    df = spark.range(0, 100).selectExpr("cast(id as int) as sensor", "id % 10 as window")
    cases = [
        (
            df.write.option("topic", "out").option("idColumns", "sensor,windw"),
            r"option idColumns names no column \['windw'\]; the columns are \['sensor', 'window'\]",
        ),
        (df.write, "needs option topic, or a 'topic' column"),
        (
            df.selectExpr("sensor as payload").write.option("topic", "out"),
            "column payload must be binary or string, got int",
        ),
        (
            df.selectExpr("'x' as payload", "'n=1' as headers").write.option("topic", "out"),
            "column headers must be a map of string keys to strings, binary, booleans or "
            r"numbers \(not decimals\), as map<string,string>, got string",
        ),
        (
            df.selectExpr("'x' as payload", "map(1, 'x') as headers").write.option("topic", "out"),
            "column headers must be a map .* got map<int,string>",
        ),
        (
            df.selectExpr("'x' as payload", "map('t', now()) as headers").write.option(
                "topic", "o"
            ),
            "column headers must be a map .* got map<string,timestamp>",
        ),
        (
            df.selectExpr("'x' as payload", "sensor as key").write.option("topic", "out"),
            r"column key must be string or binary \(UTF-8 text\), got int",
        ),
    ]
    for writer, refusal in cases:
        with pytest.raises(Exception, match=f"(?s)data source writer.*{refusal}"):
            writer.format("zmesh").mode("append").option("endpoint", b.endpoint).save()
    assert b.bridge.stats().get("published", 0) == 0


def test_msgpack_rows_keep_every_digit_of_a_decimal_and_read_back_as_written(
    spark: Any, bridged: Callable[..., Bridged], collect: Callable[..., Collector]
) -> None:
    """msgpack has no decimal: the sink writes its digits as a string, and the source
    reads such a string (or a number) into a decimal column of ``payloadSchema``."""
    b = bridged(topics=("readings", "out"))
    out = collect(b, "out")
    df = spark.sql(
        "select 7 as i, cast(1.50 as decimal(10, 2)) as dec, "
        "cast(12345678901234567.123456789 as decimal(38, 9)) as big, "
        "cast(null as decimal(5, 1)) as none"
    )
    df.write.format("zmesh").mode("append").option("endpoint", b.endpoint).option(
        "topic", "out"
    ).option("payloadFormat", "msgpack").save()
    wait_until(lambda: len(out) == 1 and b.logged("out") == 1, 30, what="the row handled")
    assert msgpack.unpackb(out.messages[0].payload) == {
        "i": 7,
        "dec": "1.50",
        "big": "12345678901234567.123456789",
        "none": None,
    }
    back = (
        spark.read.format("zmesh")
        .option("endpoint", b.endpoint)
        .option("topics", "out")
        .option("payloadFormat", "msgpack")
        .option(
            "payloadSchema", "i int, dec decimal(10, 2), big decimal(38, 9), none decimal(5, 1)"
        )
        .load()
        .select("i", "dec", "big", "none")
    )
    assert [tuple(r) for r in back.collect()] == [tuple(df.first())]


def test_rows_without_a_payload_become_json_as_spark_to_json_writes_it(
    spark: Any, bridged: Callable[..., Bridged], collect: Callable[..., Collector]
) -> None:
    b = bridged()
    out = collect(b, "out")
    df = spark.sql(
        "select map('k', 1) as m, map(2, 'x') as by_int, cast('NaN' as double) as nan, "
        "array(1.5D, cast('Infinity' as double), cast('-Infinity' as double)) as inf, "
        "timestamp'2024-05-01 10:00:00.123456' as ts, date'2024-05-01' as d, "
        "cast(1.50 as decimal(10, 2)) as dec, X'00ff' as bin, cast(null as string) as none, "
        "cast(0.1 as float) as f32, cast(12345678901234567.123456789 as decimal(38, 9)) as big, "
        "cast(0.0000001 as decimal(10, 9)) as tiny, array(cast(2.25 as decimal(5, 2))) as decs, "
        "named_struct('x', 1, 'y', cast(null as int), 'z', map('a', cast('NaN' as double))) "
        "as st"
    )
    df.write.format("zmesh").mode("append").option("endpoint", b.endpoint).option(
        "topic", "out"
    ).save()
    wait_until(lambda: len(out) == 1, 30, what="the row handled")
    spark_json = df.selectExpr("to_json(struct(*))").first()[0]

    def strict(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    # Numbers compared as written (a float would hide the digits): a 4-byte float with
    # its own digits, not the double it reads as; a decimal with all of its digits.
    payload = out.messages[0].payload.decode()
    exact = {"parse_float": decimal.Decimal}
    assert json.loads(payload, parse_constant=strict, **exact) == json.loads(spark_json, **exact)
    assert '"f32":0.1,' in payload and '"big":12345678901234567.123456789,' in payload


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_dates_bytes_and_times_read_back_as_written(
    spark: Any, bridged: Callable[..., Bridged], fmt: str
) -> None:
    """A date (ISO text), bytes (base64 in JSON, bin in msgpack) and times, at the top and
    inside an array or a struct, read back by payloadSchema as the sink wrote them; a
    time no timestamp holds (1e20 seconds, from another producer) is null, not a failed
    task."""
    b = bridged(topics=("readings", "out"))
    df = spark.sql(
        "select 7 as i, timestamp'2024-05-01 10:00:00.123' as ts, date'2024-05-01' as d, "
        "X'00ff' as bin, array(timestamp'1999-12-31 23:59:59', cast(null as timestamp)) "
        "as times, named_struct('d', date'1970-01-02', 'b', X'01') as s"
    )
    df.write.format("zmesh").mode("append").option("endpoint", b.endpoint).option(
        "topic", "out"
    ).option("payloadFormat", fmt).save()
    pack = msgpack.packb if fmt == "msgpack" else lambda v: json.dumps(v).encode()
    b.producer.publish("out", pack({"i": 8, "ts": 1e20, "times": [1e20]})).wait_acked(30)
    wait_until(lambda: b.logged("out") == 2, 30, what="both rows logged")
    back = (
        spark.read.format("zmesh")
        .option("endpoint", b.endpoint)
        .option("topics", "out")
        .option("payloadFormat", fmt)
        .option(
            "payloadSchema",
            "i int, ts timestamp, d date, bin binary, times array<timestamp>, "
            "s struct<d: date, b: binary>",
        )
        .load()
        .select(*df.columns)
        .orderBy("i")
    )
    assert [tuple(r) for r in back.collect()] == [
        tuple(df.first()),
        (8, None, None, None, [None], None),
    ]


def test_a_binary_key_is_taken_as_utf8_text(
    spark: Any, bridged: Callable[..., Bridged], collect: Callable[..., Collector]
) -> None:
    b = bridged()
    out = collect(b, "out")

    def write(key: str) -> None:
        spark.sql(f"select 'x' as payload, {key} as key").write.format("zmesh").mode(
            "append"
        ).option("endpoint", b.endpoint).option("topic", "out").save()

    write("X'6b31'")
    wait_until(lambda: len(out) == 1, 30, what="the row handled")
    assert out.messages[0].key == "k1"
    refusal = "column key is binary and holds b'\\xff', which is not UTF-8 text"
    with pytest.raises(Exception, match=re.escape(refusal)):
        write("X'ff'")
