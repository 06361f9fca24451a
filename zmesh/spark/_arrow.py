"""Log records to Arrow record batches, and sink rows to payloads.

The source schema is fixed (``BASE_DDL``); ``payloadFormat``/``payloadSchema`` append
columns decoded from each JSON or msgpack payload. A payload that does not decode, or a
value that does not fit its column, becomes null rather than failing the query.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Callable
from typing import Any

import msgpack
import pyarrow as pa

BASE_COLUMNS = (
    ("topic", "string"), ("partition", "int"), ("offset", "bigint"), ("key", "string"),
    ("payload", "binary"), ("headers", "map<string,string>"), ("producer", "string"),
    ("timestamp", "timestamp"),
)
BASE_DDL = ", ".join(f"`{n}` {t}" for n, t in BASE_COLUMNS)
UTC = dt.UTC


def source_ddl(payload_schema: str | None) -> str:
    return BASE_DDL if not payload_schema else f"{BASE_DDL}, {payload_schema}"


def _header_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _decoder(fmt: str | None) -> Callable[[bytes], Any]:
    if fmt == "msgpack":
        return lambda b: msgpack.unpackb(b, raw=False)
    return json.loads


def _to_time(v: Any) -> Any:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return dt.datetime.fromtimestamp(v, UTC)
    if isinstance(v, str):
        try:
            t = dt.datetime.fromisoformat(v)
        except ValueError:
            return None
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    return v


def _column(values: list[Any], typ: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(typ):
        values = [_to_time(v) for v in values]
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        out = []
        for v in values:
            try:
                pa.array([v], type=typ)
                out.append(v)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                out.append(None)
        return pa.array(out, type=typ)


class RecordConverter:
    """Builds record batches matching the Spark schema exactly (as PySpark checks)."""

    def __init__(self, arrow_schema: pa.Schema, payload_format: str | None) -> None:
        self.schema = arrow_schema
        self.extra = [arrow_schema.field(i) for i in range(len(BASE_COLUMNS),
                                                            len(arrow_schema))]
        self.decode = _decoder(payload_format)
        self._headers_type = arrow_schema.field("headers").type
        self._time_type = arrow_schema.field("timestamp").type

    def convert(self, stream: str, first: int, records: list[bytes]) -> pa.RecordBatch:
        topic, _, part = stream.rpartition("/")
        n = len(records)
        keys: list[Any] = []
        payloads: list[bytes] = []
        headers: list[Any] = []
        producers: list[str] = []
        stamps: list[int] = []
        unpack = msgpack.unpackb
        for raw in records:
            producer, _seq, key, hdrs, published_at, _appended, payload = unpack(raw)
            keys.append(key)
            payloads.append(payload)
            headers.append(None if not hdrs else
                           [(k, _header_value(v)) for k, v in hdrs.items()])
            producers.append(producer.hex())
            stamps.append(int(published_at * 1_000_000))
        arrays = [
            pa.array([topic] * n, pa.string()),
            pa.array([int(part)] * n, pa.int32()),
            pa.array(range(first, first + n), pa.int64()),
            pa.array(keys, pa.string()),
            pa.array(payloads, pa.binary()),
            pa.array(headers, self._headers_type),
            pa.array(producers, pa.string()),
            pa.array(stamps, pa.int64()).cast(self._time_type),
        ]
        if self.extra:
            arrays.extend(self._decoded(payloads))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _decoded(self, payloads: list[bytes]) -> list[pa.Array]:
        rows: list[dict] = []
        for p in payloads:
            try:
                d = self.decode(p)
            except Exception:  # json and msgpack raise many unrelated types
                d = None
            rows.append(d if isinstance(d, dict) else {})
        return [_column([r.get(f.name) for r in rows], f.type) for f in self.extra]


# -- sink side ------------------------------------------------------------------------------

def _jsonable(v: Any) -> Any:
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)  # a JSON number, as Spark's to_json writes it
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    raise TypeError(f"cannot encode {type(v).__name__} as JSON")


def _msgpackable(v: Any) -> Any:
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v


def encode_row(row: dict[str, Any], fmt: str) -> bytes:
    """A row without a ``payload`` column becomes a JSON or msgpack object of its columns."""
    if fmt == "msgpack":
        return msgpack.packb(row, default=_msgpackable, use_bin_type=True)
    return json.dumps(row, default=_jsonable, separators=(",", ":")).encode()
