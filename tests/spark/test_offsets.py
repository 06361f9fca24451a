"""Pure parts of zmesh.spark: offset arithmetic, partition plans, options, wire, config."""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys

import pytest

import zmesh.spark
import zmesh.spark._errors
from zmesh.errors import ArgumentError, ConfigError, DecodeError
from zmesh.spark import BridgeConfig, BridgeError
from zmesh.spark._ddl import payload_ddl
from zmesh.spark._offsets import (
    advance,
    cap,
    check_order,
    check_spec,
    count,
    parse_spec,
    plan,
    qualify,
    qualify_all,
    resolve,
    rows_for_bytes,
    select,
    split,
    topic_of,
)
from zmesh.spark._options import SinkOptions, SourceOptions
from zmesh.spark._publisher import gaps
from zmesh.spark._wire import (
    Reply,
    Request,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)

BOUNDS = {"a/0": (0, 10), "a/1": (5, 8), "b/0": (0, 0)}


def test_public_names_are_sorted_and_complete() -> None:
    names = zmesh.spark.__all__
    assert names == sorted(names) and len(set(names)) == len(names), names
    # Complete: every class and function of zmesh.spark in the package namespace, and
    # every error it defines, is exported; nothing is exported that is not one of them.
    # ZMeshDataSource is the one lazy name (it imports pyspark on first use).
    defined = {
        name
        for name, obj in vars(zmesh.spark).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__.startswith("zmesh.spark")
    }
    assert set(names) == defined | {"ZMeshDataSource"}
    errors = {
        name
        for name, obj in vars(zmesh.spark._errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, Exception)
        and obj.__module__ == "zmesh.spark._errors"
    }
    assert errors <= set(names), f"errors not exported: {sorted(errors - set(names))}"
    for name in names:
        if name == "ZMeshDataSource" and importlib.util.find_spec("pyspark") is None:
            continue  # its ImportError is test_importable_without_pyspark's
        assert inspect.getdoc(getattr(zmesh.spark, name)), f"zmesh.spark.{name} has no docstring"


def test_importable_without_pyspark() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None; import zmesh.spark as s; "
        "b = s.Bridge; s.BridgeConfig\n"
        "try:\n    s.ZMeshDataSource\nexcept ImportError as e:\n    print('ok', e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.startswith("ok") and "zmesh[spark]" in out


def test_select_and_resolve() -> None:
    assert set(select(BOUNDS, ["a"])) == {"a/0", "a/1"}
    assert select(BOUNDS, None) == BOUNDS
    assert resolve("earliest", BOUNDS) == {"a/0": 0, "a/1": 5, "b/0": 0}
    assert resolve("latest", BOUNDS) == {"a/0": 10, "a/1": 8, "b/0": 0}
    assert resolve({"a/0": 3}, BOUNDS) == {"a/0": 3, "a/1": 5, "b/0": 0}
    assert resolve({"a/0": 3}, BOUNDS, missing="latest") == {"a/0": 3, "a/1": 8, "b/0": 0}
    assert resolve("earliest", BOUNDS, missing="latest") == {"a/0": 0, "a/1": 5, "b/0": 0}


def test_parse_spec() -> None:
    assert parse_spec(" LATEST ", "x") == "latest"
    assert parse_spec('{"a/0": 4}', "x") == {"a/0": 4}
    with pytest.raises(ArgumentError, match="must be 'earliest', 'latest' or a JSON object"):
        parse_spec("soon", "startingOffsets")
    # (a JSON true is no offset 1, though Python's bool is an int)
    for bad in (
        '{"a": 1}',
        '{"a/0": -1}',
        '{"a/0": 1.5}',
        "[1]",
        '{"a/0": true}',
        '{"a/0": false}',
    ):
        with pytest.raises(ArgumentError, match="to offsets >= 0"):
            parse_spec(bad, "startingOffsets")


def test_check_order_refuses_a_start_after_the_end() -> None:
    check_order({"L:a/0": 3, "L:a/1": 5}, {"L:a/0": 3, "L:a/1": 9})
    with pytest.raises(
        ArgumentError,
        match=re.escape(
            "start L:a/1 at 5 (by startingOffsets), after where endingOffsets ends it (4)"
        ),
    ):
        check_order({"L:a/0": 3, "L:a/1": 5}, {"L:a/0": 3, "L:a/1": 4})


def test_check_spec_names_only_the_sources_streams_within_their_logs() -> None:
    bounds = {"L1:a/0": (2, 10), "L2:a/0": (0, 4)}
    check_spec({"L1:a/0": 10, "L2:a/0": 0}, bounds, ["L1", "L2"], "startingOffsets")
    check_spec({"L1:a/0": 11}, bounds, ["L1", "L2"], "endingOffsets", past_end=True)
    for offsets, refusal in [
        ({"L1:a/0": 11}, "puts L1:a/0 at 11, beyond the end of its log (10)"),
        ({"L1:b/0": 1}, "names L1:b/0, a stream the source does not read; it reads"),
        ({"L9:a/0": 1}, "names L9:a/0, of log L9: the source's bridges' logs are ['L1', 'L2']"),
    ]:
        with pytest.raises(ArgumentError, match=re.escape(f"startingOffsets {refusal}")):
            check_spec(offsets, bounds, ["L1", "L2"], "startingOffsets")


def test_advance_takes_everything_without_a_limit() -> None:
    assert advance({"a/0": 2}, {"a/0": 10, "a/1": 3}) == {"a/0": 10, "a/1": 3}
    assert advance({"a/0": 2, "z/9": 4}, {"a/0": 2}) == {"a/0": 2, "z/9": 4}


def test_advance_shares_a_row_limit_in_proportion() -> None:
    start = {"a/0": 0, "a/1": 0}
    end = advance(start, {"a/0": 300, "a/1": 100}, max_rows=100)
    assert count(start, end) == 100
    assert end == {"a/0": 75, "a/1": 25}
    # a tiny limit still makes progress, and repeated calls reach the end
    pos = dict(start)
    for _ in range(400):
        pos = advance(pos, {"a/0": 300, "a/1": 100}, max_rows=1)
    assert pos == {"a/0": 300, "a/1": 100}


def test_advance_refuses_a_log_behind_the_checkpoint() -> None:
    with pytest.raises(BridgeError, match="deleted or replaced"):
        advance({"a/0": 50}, {"a/0": 10})


def test_cap_for_available_now() -> None:
    assert cap({"a/0": 10, "a/1": 4}, {"a/0": 7}) == {"a/0": 7, "a/1": 4}


def test_plan_cuts_even_partitions_in_a_stable_order() -> None:
    start = {"a/0": 0, "a/1": 5}
    end = {"a/0": 10, "a/1": 8, "b/0": 0}
    parts = plan(start, end, min_partitions=2, max_per_partition=100)
    assert parts == plan(dict(start), dict(end), min_partitions=2, max_per_partition=100)
    assert len(parts) == 2
    flat = [r for p in parts for r in p]
    assert sum(e - b for _s, b, e in flat) == 13
    assert flat[0] == ("a/0", 0, 7) and flat[1] == ("a/0", 7, 10) and flat[2] == ("a/1", 5, 8)
    many = plan({}, {"a/0": 1000}, min_partitions=1, max_per_partition=300)
    assert [p[0][2] - p[0][1] for p in many] == [250, 250, 250, 250]
    assert plan({"a/0": 5}, {"a/0": 5}) == []
    assert len(plan({}, {"a/0": 1}, min_partitions=4)) == 1


def test_plan_fills_whole_waves_of_tasks() -> None:
    sizes = [
        p[0][2] - p[0][1] for p in plan({}, {"a/0": 1000}, min_partitions=2, max_per_partition=300)
    ]
    assert sizes == [250, 250, 250, 250]
    assert len(plan({}, {"a/0": 1000}, min_partitions=3, max_per_partition=300)) == 6
    assert len(plan({}, {"a/0": 1000}, min_partitions=2)) == 2, "one wave on two cores"
    assert len(plan({}, {"a/0": 5}, min_partitions=4)) == 4


def test_streams_are_named_by_their_bridge_log() -> None:
    name = qualify("9f3a61c2", "metrics.raw/3")
    assert name == "9f3a61c2:metrics.raw/3" and split(name) == ("9f3a61c2", "metrics.raw/3")
    assert topic_of(name) == topic_of("metrics.raw/3") == "metrics.raw"
    with pytest.raises(BridgeError, match="does not name its bridge"):
        split("metrics/3")
    # offsets named without a bridge (a user's, or an older checkpoint's): the only one's
    assert qualify_all({"a/0": 4, "L1:a/1": 2}, ["L1"]) == {"L1:a/0": 4, "L1:a/1": 2}
    assert qualify_all({"L1:a/0": 4}, ["L1", "L2"]) == {"L1:a/0": 4}
    with pytest.raises(ArgumentError, match="which of the bridges"):
        qualify_all({"a/0": 4}, ["L1", "L2"])


def test_rows_for_bytes_by_average_record_size() -> None:
    sizes = {"a/0": (0, 100, 10_000), "a/1": (0, 100, 30_000)}  # 100 and 300 bytes each
    assert rows_for_bytes(20_000, {}, sizes) == 100  # 200 bytes on average
    assert rows_for_bytes(20_000, {"a/1": 100}, sizes) == 200, "only a/0 waits"
    assert rows_for_bytes(1, {}, sizes) == 1, "at least one"
    assert rows_for_bytes(5, {"a/0": 100, "a/1": 100}, sizes) == 1


def test_gaps_between_published_ranges() -> None:
    assert gaps(0, 10, []) == [(0, 10)]
    assert gaps(0, 10, [(2, 4), (6, 12)]) == [(0, 2), (4, 6)]
    assert gaps(5, 10, [(0, 7)]) == [(7, 10)]
    assert gaps(0, 10, [(0, 10)]) == []


def test_source_options() -> None:
    opts = SourceOptions.parse(
        {
            "endpoint": "tcp://127.0.0.1:5",
            "topics": "a, b",
            "maxrecordsperbatch": "10",
            "startingoffsets": "latest",
        }
    )
    assert opts.topics == ("a", "b") and opts.max_records_per_batch == 10
    assert opts.starting == "latest" and opts.ending is None
    with pytest.raises(ArgumentError, match="reader"):
        opts.require_reader()
    with pytest.raises(ArgumentError, match="endpoint"):
        SourceOptions.parse({})
    with pytest.raises(ArgumentError, match="unknown zmesh source option"):
        SourceOptions.parse({"endpoint": "tcp://h:1", "maxrecords": "5"})
    with pytest.raises(ArgumentError, match="maxRecordsPerBatch"):
        SourceOptions.parse({"endpoint": "tcp://h:1", "maxrecordsperbatch": "0"})
    with pytest.raises(ArgumentError, match="go together"):
        SourceOptions.parse({"endpoint": "tcp://h:1", "payloadformat": "json"})
    with pytest.raises(BridgeError):
        SourceOptions.parse({"endpoint": "h:1"})
    two = SourceOptions.parse(
        {
            "endpoint": "tcp://h:1, tcp://h:2",
            "path": "/a,/b",
            "maxRecordsPerTrigger": "7",
            "maxBytesPerTrigger": "1000",
        },
        4,
    )
    assert two.endpoints == ("tcp://h:1", "tcp://h:2") and two.paths == ("/a", "/b")
    assert (two.max_records_per_batch, two.max_bytes_per_batch) == (7, 1000)
    assert two.min_partitions == 4, "the session's parallelism, when register() found it"
    assert opts.min_partitions == 2 and opts.max_bytes_per_batch is None
    with pytest.raises(ArgumentError, match="twice"):
        SourceOptions.parse({"endpoint": "tcp://h:1,tcp://h:1"})
    with pytest.raises(ArgumentError, match="one limit"):
        SourceOptions.parse(
            {"endpoint": "tcp://h:1", "maxRecordsPerTrigger": "5", "maxRecordsPerBatch": "6"}
        )


@pytest.mark.parametrize(
    ("option", "maximum"),
    [
        ("requestTimeoutMs", 86_400_000),
        ("fetchMaxRecords", 1_000_000),
        ("minPartitions", 100_000),
        ("maxRecordsPerTrigger", 2**63 - 1),
        ("maxRecordsPerBatch", 2**63 - 1),
        ("maxBytesPerTrigger", 2**63 - 1),
        ("maxRecordsPerPartition", 2**63 - 1),
        ("batchRows", 1_000_000),
    ],
)
def test_numeric_options_have_a_maximum(option: str, maximum: int) -> None:
    """A value past what its use can take (a JVM long, a poll's wait, what a bridge sends
    in a fetch) is refused naming the option, not met later as an OverflowError."""
    parse = SinkOptions.parse if option == "batchRows" else SourceOptions.parse
    parse({"endpoint": "tcp://h:1", option.lower(): str(maximum)})
    for bad in (maximum + 1, 10**30):
        with pytest.raises(ArgumentError, match=f"option {option} must be an integer from 1 to"):
            parse({"endpoint": "tcp://h:1", option.lower(): str(bad)})


def test_payload_schema_is_checked_on_its_own() -> None:
    assert payload_ddl("sensor STRING, n long, `a``b` decimal, s struct<d: date> comment 'x'") == (
        "`sensor` string, `n` bigint, `a``b` decimal(10,0), `s` struct<`d`: date> COMMENT 'x'"
    )
    assert payload_ddl("m map<string, array<timestamp_ntz>>, b binary") == (
        "`m` map<string,array<timestamp_ntz>>, `b` binary"
    )
    for ddl, refusal in [
        ("x intt", "field x has type 'intt', which payloadSchema does not take: boolean,"),
        ("x decimal(50,2)", "decimal(50,2) of field x: the precision must be 1 to 38"),
        ("x decimal(5,6)", "decimal(5,6) of field x: the precision must be 1 to 38"),
        ("x int not null", "field x is NOT NULL, but a payload may lack it"),
        ("s struct<a: int NOT NULL>", "field s.a is NOT NULL"),
        ("x variant", "field x has type 'variant'"),
        ("x interval day to second", "field x has type 'interval'"),
        ("x array<void>", "field x has type 'void'"),
        ("x char(3)", "field x has type 'char'"),
        ("x map<int,string>", "map<int,...> of field x: a map's keys must be strings"),
        ("x array<int", "expected '>' after array<int in field x, found the end"),
        ("x int,", "expected a field name, found the end"),
        ("x int y", "expected ',' after field x, found 'y'"),
    ]:
        with pytest.raises(
            ArgumentError, match=re.escape(f"option payloadSchema {ddl!r}: {refusal}")
        ):
            payload_ddl(ddl)
    with pytest.raises(ArgumentError, match="option payloadSchema 'x intt'"):
        SourceOptions.parse(
            {"endpoint": "tcp://h:1", "payloadformat": "json", "payloadschema": "x intt"}
        )


def test_sink_options() -> None:
    opts = SinkOptions.parse(
        {"endpoint": "tcp://h:1", "topic": "alerts", "idcolumns": "sensor, window_start"}
    )
    assert opts.id_columns == ("sensor", "window_start") and opts.payload_format == "json"
    assert opts.endpoints == ("tcp://h:1",) and opts.batch_rows == 10_000
    assert SinkOptions.parse({"endpoint": "tcp://h:1,tcp://h:2"}).endpoints == (
        "tcp://h:1",
        "tcp://h:2",
    )
    with pytest.raises(ConfigError):
        SinkOptions.parse({"endpoint": "tcp://h:1", "topic": "bad topic"})


def test_wire_round_trip() -> None:
    req = Request("fetch", 7, {"stream": "a/0", "start": 1}, (b"x",))
    assert decode_request(encode_request(req)) == req
    rep = Reply(7, True, {"first": 1}, parts=(b"r1", b"r2"))
    assert decode_reply(encode_reply(rep)) == rep
    for bad in ([], [b"\xc1"], [b"\x80"], encode_request(Request("nope", 1, {}))):
        with pytest.raises(DecodeError):
            decode_request(bad)


def test_bridge_config() -> None:
    cfg = BridgeConfig(topics=["a"], log_dir="x")
    assert cfg.topics == ("a",) and cfg.group == "spark"
    with pytest.raises(ConfigError, match="topics"):
        BridgeConfig(topics="a", log_dir="x")
    with pytest.raises(ConfigError, match="bind"):
        BridgeConfig(topics=["a"], log_dir="x", bind="127.0.0.1:5")
    with pytest.raises(ConfigError, match="unknown key"):
        BridgeConfig.from_mapping({"topics": ["a"], "log_dir": "x", "retain": 1})
    with pytest.raises(ConfigError, match="retain_s"):
        BridgeConfig.from_mapping({"topics": ["a"], "log_dir": "x", "retain_s": -1})
    for table, refusal in [
        ({"topics": ["a"]}, "b.toml: [bridge] needs log_dir"),
        (
            {"topics": ["readings.*"], "log_dir": "x"},
            "b.toml: [bridge]: BridgeConfig.topics holds the pattern 'readings.*': a bridge "
            "consumes topics by name",
        ),
        ({"topics": ["a b"], "log_dir": "x"}, "b.toml: [bridge]: BridgeConfig.topics: topic name"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(refusal)):
            BridgeConfig.from_mapping(table, source="b.toml")
