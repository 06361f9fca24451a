"""The source's executor side on logs of large messages (no Spark session: ``read_ranges``
is what a read task runs, here on the bridge log's own directory)."""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zmesh.errors import ArgumentError
from zmesh.spark._log import BridgeLog
from zmesh.spark._options import SourceOptions
from zmesh.spark._runs import Run

from .conftest import Bridged, needs_spark

pytestmark = needs_spark

P1 = bytes(range(16))
T0 = 1_000_000.0


def source_schema():  # type: ignore[no-untyped-def]
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", StringType()),
            StructField("payload", BinaryType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("producer", StringType()),
            StructField("timestamp", TimestampType()),
        ]
    )


def test_a_partition_of_large_payloads_is_read_in_batches_bounded_by_bytes(
    tmp_path: Path,
) -> None:
    """A read task's records go to Spark as Arrow batches of at most 65,536 rows; with
    messages of 64 KiB those rows held 4 GiB, past the 2 GiB a binary column's int32
    offsets reach: the task failed with Arrow's 'offset overflow', and so did every
    replay of the batch. Batches are cut by bytes too: here at 64 MiB, where they held
    the whole partition (4 runs of 64 MiB, 4,096 rows)."""
    from zmesh.spark._source import read_ranges

    size, per_run, runs = 64 << 10, 1024, 4
    body = b"x" * size
    log = BridgeLog(tmp_path / "bridge-log", map_size_bytes=1 << 30)
    try:
        for r in range(runs):
            seqs = range(r * per_run, (r + 1) * per_run)
            log.append([("big/0", Run(P1, seqs, [T0] * per_run, [body] * per_run))], T0)
        log_id = log.log_id
    finally:
        log.close()
    opts = SourceOptions.parse(
        {"endpoint": "tcp://127.0.0.1:1", "path": str(tmp_path / "bridge-log")}
    )
    total = runs * per_run
    offset = 0
    for batch in read_ranges(opts, source_schema(), [(f"{log_id}:big/0", 0, total)], {}, None):
        assert batch.column("payload").nbytes <= 80 << 20
        assert batch.column("offset")[0].as_py() == offset
        offset += batch.num_rows
    assert offset == total


def test_a_number_a_decimal_field_cannot_hold_is_null_whatever_the_other_payloads(
    spark: Any, bridged: Callable[..., Bridged]
) -> None:
    """A JSON integer with more digits than a decimal field holds (1,000,000,000 in a
    decimal(10,2)) was taken by Arrow's JSON reader as it was: the batch read failed in
    Spark, and every replay of it would. A payload at a time (when another payload of
    the batch did not parse) it was null, as documented, and a large integer in a
    double field was null there rather than the double Spark's from_json gives."""
    b = bridged(topics=("nums",))
    big = 2**63
    for payload in (
        {"d": 1_000_000_000, "f": big, "n": 1},
        {"d": "1700000000", "f": 2**53 + 1, "n": 2},
        {"d": 12.345, "f": 1, "n": 3},
    ):
        b.producer.publish("nums", json.dumps(payload).encode(), key="k").wait_acked(30)
    options = {
        "endpoint": b.endpoint,
        "topics": "nums",
        "payloadFormat": "json",
        "payloadSchema": "d decimal(10,2), f double, n int",
    }
    want = [
        (None, float(big), 1),
        (None, float(2**53), 2),
        (decimal.Decimal("12.35"), 1.0, 3),
    ]
    rows = spark.read.format("zmesh").options(**options).load().orderBy("n").collect()
    assert [(r.d, r.f, r.n) for r in rows] == want
    # the same payloads beside one that does not parse (decoded one at a time)
    b.producer.publish("nums", b"{not json", key="k").wait_acked(30)
    rows = spark.read.format("zmesh").options(**options).load().orderBy("offset").collect()
    assert [(r.d, r.f, r.n) for r in rows] == [*want, (None, None, None)]


def test_binary_header_values_read_as_base64_json(
    spark: Any, bridged: Callable[..., Bridged]
) -> None:
    """Header values that are not strings are read as JSON; bytes (which zmesh's sink
    writes from a binary column of headers) were read as Python's repr, b'\\x00\\x01'."""
    b = bridged(topics=("tagged",))
    headers = {"raw": b"\x00\x01\xff", "nested": [1, b"x"], "n": 5, "s": "text"}
    b.producer.publish("tagged", b"{}", headers=headers).wait_acked(30)
    rows = spark.read.format("zmesh").options(endpoint=b.endpoint, topics="tagged").load()
    (row,) = rows.collect()
    assert row.headers == {"raw": '"AAH/"', "nested": '[1, "eA=="]', "n": "5", "s": "text"}


def test_an_empty_payload_schema_is_refused_with_its_format() -> None:
    """payloadFormat with an empty payloadSchema decoded nothing, silently."""
    with pytest.raises(ArgumentError, match="payloadFormat and payloadSchema go together"):
        SourceOptions.parse(
            {"endpoint": "tcp://127.0.0.1:1", "payloadFormat": "json", "payloadSchema": ""}
        )
