"""Log runs to Arrow record batches (no Spark): slices of runs, keys and headers, and
payloads decoded by Arrow's JSON reader or, when it cannot, one at a time."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess

import msgpack
import pyarrow as pa
import pytest

from tests.conftest import reap, spawn
from zmesh.spark._arrow import RecordConverter
from zmesh.spark._options import BASE_COLUMNS
from zmesh.spark._runs import Run, columns, encode

from .conftest import needs_spark

pytestmark = needs_spark

P1, P2 = bytes(range(16)), bytes(range(16, 32))
T0 = 1_700_000_000.0
TS = pa.timestamp("us", tz="UTC")


def schema(*extra: tuple[str, pa.DataType]) -> pa.Schema:
    types = {
        "string": pa.string(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "binary": pa.binary(),
        "map<string,string>": pa.map_(pa.string(), pa.string()),
        "timestamp": TS,
    }
    return pa.schema([(name, types[t]) for name, t in BASE_COLUMNS] + list(extra))


def record(
    payloads: list[bytes],
    producer: bytes = P1,
    first_seq: int = 0,
    keys: list | None = None,
    headers: list | None = None,
) -> bytes:
    n = len(payloads)
    return encode(
        Run(
            producer,
            range(first_seq, first_seq + n),
            [T0 + i for i in range(n)],
            payloads,
            keys,
            headers,
        ),
        T0 + 100,
    )


def test_runs_and_slices_of_runs_become_one_batch() -> None:
    conv = RecordConverter(schema(), None)
    a = columns(
        record([b"a0", b"a1", b"a2"], keys=["k0", None, "k2"], headers=[None, {"h": 1}, {"s": "x"}])
    )
    b = columns(record([b"b0", b"b1"], producer=P2, first_seq=7))
    conv.add("t/3", 10, a, 1, 3)  # offsets 10, 11 are a's messages 1, 2
    conv.add("t/3", 12, b, 0, 2)
    conv.add("u/0", 0, a, 0, 1)
    assert conv.rows == 5
    batch = conv.batch()
    assert conv.rows == 0 and batch.schema == schema()
    rows = batch.to_pylist()
    assert [(r["topic"], r["partition"], r["offset"]) for r in rows] == [
        ("t", 3, 10),
        ("t", 3, 11),
        ("t", 3, 12),
        ("t", 3, 13),
        ("u", 0, 0),
    ]
    assert [r["payload"] for r in rows] == [b"a1", b"a2", b"b0", b"b1", b"a0"]
    assert [r["key"] for r in rows] == [None, "k2", None, None, "k0"]
    assert [r["headers"] for r in rows] == [[("h", "1")], [("s", "x")], None, None, None]
    assert [r["producer"] for r in rows] == [P1.hex(), P1.hex(), P2.hex(), P2.hex(), P1.hex()]
    assert rows[0]["timestamp"] == dt.datetime.fromtimestamp(T0 + 1, dt.UTC)


def test_json_payloads_become_typed_columns() -> None:
    conv = RecordConverter(
        schema(("sensor", pa.string()), ("value", pa.float64()), ("i", pa.int64()), ("ts", TS)),
        "json",
    )
    bodies = [
        json.dumps(
            {"sensor": f"s{i}", "value": i / 2, "i": i, "ts": T0 + i, "other": [1, 2]}
        ).encode()
        for i in range(5)
    ]
    conv.add("t/0", 0, columns(record(bodies)), 0, 5)
    rows = conv.batch().to_pylist()
    assert [(r["sensor"], r["value"], r["i"]) for r in rows] == [
        (f"s{i}", i / 2, i) for i in range(5)
    ]
    assert rows[2]["ts"] == dt.datetime.fromtimestamp(T0 + 2, dt.UTC)


@pytest.mark.parametrize("bad", [b"not json", b"", b"[1, 2]", b'{"i": "seven"}', b'{"sensor": 3}'])
def test_a_payload_that_does_not_fit_gives_nulls_not_a_failure(bad: bytes) -> None:
    conv = RecordConverter(schema(("sensor", pa.string()), ("i", pa.int64()), ("ts", TS)), "json")
    good = [
        json.dumps({"sensor": "s", "i": i, "ts": "2024-05-01T10:00:00+00:00"}).encode()
        for i in range(3)
    ]
    conv.add("t/0", 0, columns(record([good[0], bad, *good[1:]])), 0, 4)
    rows = conv.batch().to_pylist()
    assert [r["i"] for r in rows] == [0, None, 1, 2]
    assert [r["sensor"] for r in rows] == ["s", None, "s", "s"]
    assert rows[0]["ts"] == dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)
    assert rows[1]["payload"] == bad


# Payloads, and the "i" each gives: a payload that is not one JSON value gives null, and
# never shifts another's values.
ONE_VALUE_CASES = [
    ([b"null", b'{"i": 2}'], [None, 2]),
    ([b'{"i": 10}\n{"i": 11}', b"", b'{"i": 12}'], [None, None, 12]),
    ([b'{"i": 10} {"i": 11}', b"  ", b'{"i": 12}'], [None, None, 12]),
    ([b'{"i": 10}{"i": 11}', b'{"i": 12}'], [None, 12]),
    ([b'{"i": 10}\r{"i": 11}', b"\n", b'{"i": 12}'], [None, None, 12]),
    ([b'{"i":', b'10}{"i": 11}'], [None, None]),
    ([b'{\n  "i": 13\n}', b'{"i": 14}'], [13, 14]),
]


def decoded_i(payloads: list[bytes]) -> list[int | None]:
    conv = RecordConverter(schema(("i", pa.int64())), "json")
    conv.add("t/0", 0, columns(record(payloads)), 0, len(payloads))
    return [r["i"] for r in conv.batch().to_pylist()]


def test_a_payload_is_one_json_value_or_gives_nulls() -> None:
    # Decoded in a child process: Arrow's JSON reader has crashed its process on some
    # input (a batch whose first payload is null), which fails this test, not the run.
    child = spawn(
        [
            "-c",
            "import json; from tests.spark.test_arrow import ONE_VALUE_CASES, decoded_i; "
            "print(json.dumps([decoded_i(payloads) for payloads, _i in ONE_VALUE_CASES]))",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        out, _ = child.communicate(timeout=60)
    finally:
        reap(child)
    assert child.returncode == 0
    assert json.loads(out) == [i for _payloads, i in ONE_VALUE_CASES]


def test_msgpack_payloads_are_decoded_one_at_a_time() -> None:
    conv = RecordConverter(schema(("i", pa.int64()), ("value", pa.float64())), "msgpack")
    bodies = [msgpack.packb({"i": i, "value": i / 4}) for i in range(3)] + [b"\xc1"]
    conv.add("t/0", 0, columns(record(bodies)), 0, 4)
    assert [(r["i"], r["value"]) for r in conv.batch().to_pylist()] == [
        (0, 0.0),
        (1, 0.25),
        (2, 0.5),
        (None, None),
    ]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_decimal_field_is_read_from_its_digits_or_a_number(fmt: str) -> None:
    """Rounded half up to the column's scale; null when not a number or too large."""
    dec = pa.decimal128(6, 2)
    conv = RecordConverter(schema(("d", dec)), fmt)
    values: list = ["1.50", "1.505", 2.25, 3, "nope", "NaN", "123456.7", None]
    if fmt == "json":
        bodies = [json.dumps({"d": v}).encode() for v in values]
    else:
        bodies = [msgpack.packb({"d": v}) for v in values]
    conv.add("t/0", 0, columns(record(bodies)), 0, len(bodies))
    D = decimal.Decimal
    assert [r["d"] for r in conv.batch().to_pylist()] == [
        D("1.50"),
        D("1.51"),
        D("2.25"),
        D("3.00"),
        None,
        None,
        None,
        None,
    ]


def decoded(fields: list[tuple[str, pa.DataType]], fmt: str, values: list[dict]) -> list[dict]:
    """``values`` as payloads of ``fmt``, decoded into ``fields``."""
    pack = msgpack.packb if fmt == "msgpack" else lambda v: json.dumps(v).encode()
    bodies = [pack(v) for v in values]
    conv = RecordConverter(schema(*fields), fmt)
    conv.add("t/0", 0, columns(record(bodies)), 0, len(bodies))
    return [{name: r[name] for name, _t in fields} for r in conv.batch().to_pylist()]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_seconds_a_timestamp_cannot_hold_give_null(fmt: str) -> None:
    """Outside the years 1 to 9999 (and NaN, which msgpack carries): null, the same by
    Arrow's JSON reader (not wrapped around to year -290308) as a payload at a time
    (not an OverflowError failing the task)."""
    ts = [1e20, -1e20, 1e300, -62135596801, 253402300800, T0, 1e20]
    if fmt == "msgpack":
        ts.append(float("nan"))
    rows = decoded(
        [("i", pa.int32()), ("ts", TS)], fmt, [{"i": i, "ts": t} for i, t in enumerate(ts)]
    )
    assert [r["i"] for r in rows] == list(range(len(ts)))
    assert [r["ts"] for r in rows] == [None] * 5 + [dt.datetime.fromtimestamp(T0, dt.UTC)] + [
        None
    ] * (len(ts) - 6)
    edge = decoded([("ts", TS)], fmt, [{"ts": -62135596800}, {"ts": 253402300799}])
    assert [r["ts"] for r in edge] == [
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC),
    ]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_dates_bytes_and_nested_values_are_read_as_the_sink_writes_them(fmt: str) -> None:
    """A date from its ISO text, bytes from base64 text (JSON) or as they are (msgpack's
    bin), and times, dates, bytes inside arrays, maps and structs converted as at the
    top; a value of another shape is null, never taken apart (a string as a list)."""
    fields = [
        ("d", pa.date32()),
        ("b", pa.binary()),
        ("times", pa.list_(TS)),
        ("days", pa.map_(pa.string(), pa.date32())),
        ("s", pa.struct([("b", pa.binary()), ("f", pa.float64())])),
    ]
    blob = b"\x00\xff" if fmt == "msgpack" else "AP8="
    good = {
        "d": "2024-05-01",
        "b": blob,
        "times": [T0, "2024-05-01T12:00:00+02:00", 1e20],
        "days": {"first": "2024-05-01"},
        "s": {"b": blob, "f": 0.5, "other": 1},
    }
    bad = {"d": 19000, "b": "not base64!", "times": "ab", "days": [1], "s": {"f": True}}
    assert decoded(fields, fmt, [good, bad]) == [
        {
            "d": dt.date(2024, 5, 1),
            "b": b"\x00\xff",
            "times": [
                dt.datetime.fromtimestamp(T0, dt.UTC),
                dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC),
                None,
            ],
            "days": [("first", dt.date(2024, 5, 1))],
            "s": {"b": b"\x00\xff", "f": 0.5},
        },
        {"d": None, "b": None, "times": None, "days": None, "s": {"b": None, "f": None}},
    ]
