"""Log runs to Arrow record batches, with no Python object per message.

The source schema is fixed (``_options.BASE_DDL``); ``payloadFormat``/``payloadSchema`` append
columns decoded from each JSON or msgpack payload. A run's payloads and publish times are
wrapped as Arrow buffers as they are stored (``_runs.py``); the runs of a batch are joined
by Arrow. JSON payloads are parsed by Arrow's JSON reader into the typed columns; when
that fails for a batch (a payload that is not one JSON object, a value of the wrong type),
the batch is decoded a payload at a time, and a payload that does not decode (or is not
exactly one JSON value), or a value that does not fit its column, becomes null rather than
failing the query.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from array import array
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ._options import BASE_COLUMNS
from ._runs import Columns

UTC = dt.UTC


def _strings(values: list[bytes]) -> pa.Array:
    """A string array of ``values`` (UTF-8) made from its buffers: no conversion of Python
    objects, whose first one makes pyarrow import pandas (a tenth of a second and more in
    each of the Python processes Spark starts for a query)."""
    ends = array("i", accumulate(map(len, values), initial=0))
    return pa.StringArray.from_buffers(
        len(values), pa.py_buffer(ends.tobytes()), pa.py_buffer(b"".join(values))
    )


def _repeat(value: pa.Array, n: int) -> pa.Array:
    """The one value of ``value``, ``n`` times."""
    return value.take(pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(bytes(4 * n))]))


_MICROS = pa.Array.from_buffers(pa.float64(), 1, [None, pa.py_buffer(array("d", [1e6]))])[0]
# Each payload p becomes the line {"v":p}, so that a line is one object, whatever p holds.
_OPEN, _CLOSE, _EMPTY = (
    pa.BinaryArray.from_buffers(
        pa.binary(),
        3,
        [None, pa.py_buffer(array("i", [0, 5, 7, 7]).tobytes()), pa.py_buffer(b'{"v":}\n')],
    )[i]
    for i in range(3)
)


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


_DECIMALS = decimal.Context(prec=80)  # (room for decimal256's 76 digits)


def _to_decimal(typ: pa.Decimal128Type | pa.Decimal256Type) -> Callable[[Any], Any]:
    """A decimal column's value from a number or its digits as a string (as zmesh's sink
    writes one in msgpack), rounded half up to the column's scale as Spark rounds; None
    for what is not a number or needs more digits than the column holds."""
    step = decimal.Decimal(1).scaleb(-typ.scale)
    limit = decimal.Decimal(10) ** (typ.precision - typ.scale)

    def to(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float | str | decimal.Decimal):
            return None
        try:
            d = decimal.Decimal(repr(v) if isinstance(v, float) else v)
            d = d.quantize(step, decimal.ROUND_HALF_UP, _DECIMALS)
        except (decimal.InvalidOperation, ValueError):
            return None
        return d if d.is_finite() and abs(d) < limit else None

    return to


def _column(values: list[Any], typ: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(typ):
        values = [_to_time(v) for v in values]
    elif pa.types.is_decimal(typ):
        to = _to_decimal(typ)
        values = [None if v is None else to(v) for v in values]
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


def _seconds_to(typ: pa.DataType, seconds: pa.Array) -> pa.Array:
    """Float seconds since the epoch as a timestamp column of ``typ``."""
    micros = pc.cast(pc.multiply(seconds, _MICROS), pa.int64(), safe=False)
    return micros.cast(typ)


class _Pending:
    """The columns of the runs read for the next record batch."""

    def __init__(self) -> None:
        self.segments: list[tuple[str, int, int]] = []  # (stream, first offset, count)
        self.producers: dict[bytes, int] = {}
        self.producer_of: list[bytes] = []  # int32 indexes into producers, per run
        self.payloads: list[pa.Array] = []
        self.stamps: list[memoryview] = []
        self.keys: list[pa.Array | int] = []  # an int: that many without a key
        self.headers: list[list[dict[str, Any] | None] | int] = []  # likewise
        self.rows = 0

    def add(self, stream: str, offset: int, c: Columns, lo: int, hi: int) -> None:
        """Messages ``lo``..``hi - 1`` of a run, the first at ``offset`` of ``stream``."""
        n = hi - lo
        seg = self.segments[-1] if self.segments else None
        if seg is not None and seg[0] == stream and seg[1] + seg[2] == offset:
            self.segments[-1] = (stream, seg[1], seg[2] + n)
        else:
            self.segments.append((stream, offset, n))
        index = self.producers.setdefault(c.producer, len(self.producers))
        self.producer_of.append(array("i", (index,)).tobytes() * n)
        payloads = pa.Array.from_buffers(
            pa.binary(), c.count, [None, pa.py_buffer(c.offsets), pa.py_buffer(c.data)]
        )
        self.payloads.append(payloads.slice(lo, n))
        self.stamps.append(memoryview(c.published_ats)[lo * 8 : hi * 8])
        self.keys.append(n if c.keys is None else pa.array(c.keys[lo:hi], pa.string()))
        self.headers.append(n if c.headers is None else c.headers[lo:hi])
        self.rows += n


class RecordConverter:
    """Builds record batches matching the Spark schema exactly (as PySpark checks)."""

    def __init__(self, arrow_schema: pa.Schema, payload_format: str | None) -> None:
        self.schema = arrow_schema
        self.extra = [arrow_schema.field(i) for i in range(len(BASE_COLUMNS), len(arrow_schema))]
        self.format = payload_format
        self.decode = _decoder(payload_format)
        self._headers_type = arrow_schema.field("headers").type
        self._time_type = arrow_schema.field("timestamp").type
        self._pending = _Pending()
        # Arrow's JSON reader parses timestamps from strings only: it reads those
        # columns as numbers of seconds, which are then converted.
        fields = [
            pa.field(f.name, pa.float64() if pa.types.is_timestamp(f.type) else f.type)
            for f in self.extra
        ]
        self._json_schema = pa.schema([pa.field("v", pa.struct(fields))])

    @property
    def rows(self) -> int:
        """Messages added since the last batch was made."""
        return self._pending.rows

    def add(self, stream: str, offset: int, c: Columns, lo: int, hi: int) -> None:
        """Take messages ``lo``..``hi - 1`` of a run, the first at ``offset`` of ``stream``."""
        self._pending.add(stream, offset, c, lo, hi)

    def batch(self) -> pa.RecordBatch:
        """The messages added since the last batch, as one record batch."""
        p, self._pending = self._pending, _Pending()
        n = p.rows
        topics, parts, offsets = [], [], []
        for stream, first, count in p.segments:
            topic, _, part = stream.rpartition("/")
            topics.append(_repeat(_strings([topic.encode()]), count))
            parts.append(
                pa.Array.from_buffers(
                    pa.int32(), count, [None, pa.py_buffer(array("i", [int(part)]) * count)]
                )
            )
            offsets.append(pa.py_buffer(array("q", range(first, first + count)).tobytes()))
        producers = _strings([p.hex().encode() for p in p.producers])
        index = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(b"".join(p.producer_of))])
        stamps = pa.Array.from_buffers(pa.float64(), n, [None, pa.py_buffer(b"".join(p.stamps))])
        payloads = _concat(p.payloads, pa.binary())
        arrays = [
            _concat(topics, pa.string()),
            _concat(parts, pa.int32()),
            pa.Array.from_buffers(
                pa.int64(), n, [None, pa.py_buffer(b"".join(b.to_pybytes() for b in offsets))]
            ),
            self._keys(p.keys),
            payloads,
            self._headers(p.headers),
            producers.take(index),
            _seconds_to(self._time_type, stamps),
        ]
        if self.extra:
            arrays.extend(self._decoded(payloads))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _keys(self, parts: list[pa.Array | int]) -> pa.Array:
        if all(isinstance(k, int) for k in parts):
            return pa.nulls(sum(parts), pa.string())
        return _concat(
            [pa.nulls(k, pa.string()) if isinstance(k, int) else k for k in parts], pa.string()
        )

    def _headers(self, parts: list[list[dict[str, Any] | None] | int]) -> pa.Array:
        typ = self._headers_type
        if all(isinstance(h, int) for h in parts):
            return pa.nulls(sum(parts), typ)  # type: ignore[arg-type]
        rows: list[Any] = []
        for h in parts:
            if isinstance(h, int):
                rows.extend([None] * h)
            else:
                rows.extend(
                    None if not d else [(k, _header_value(v)) for k, v in d.items()] for d in h
                )
        return pa.array(rows, typ)

    def _decoded(self, payloads: pa.Array) -> list[pa.Array]:
        if self.format == "json":
            fast = self._json(payloads)
            if fast is not None:
                return fast
        rows: list[dict[str, Any]] = []
        for p in payloads.to_pylist():
            try:
                d = self.decode(p)
            except Exception:  # json and msgpack raise many unrelated types
                d = None
            rows.append(d if isinstance(d, dict) else {})
        return [_column([r.get(f.name) for r in rows], f.type) for f in self.extra]

    def _json(self, payloads: pa.Array) -> list[pa.Array] | None:
        """The decoded columns by Arrow's JSON reader; None when it cannot read them all
        (then each payload is decoded on its own, and what does not fit is null).

        The reader reads each payload p as the line ``{"v":p}``: a line is one object,
        never null (a first null crashes the reader), and holds one payload whatever it
        is: one that is not one JSON value (none, or two) fails the read or gives a line
        two rows, and the counts differ."""
        n = len(payloads)
        if n == 0:
            return None
        lines = pc.binary_join_element_wise(_OPEN, payloads, _CLOSE, _EMPTY)
        _validity, ends, data = lines.buffers()
        data = data.slice(0, memoryview(ends).cast("i")[lines.offset + n])
        try:
            table = pa_json.read_json(
                pa.BufferReader(data),
                read_options=pa_json.ReadOptions(
                    use_threads=False, block_size=max(1 << 20, data.size + 1)
                ),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=self._json_schema, unexpected_field_behavior="ignore"
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != n:
            return None
        columns = table.column("v").combine_chunks().flatten()  # (a null v: nulls)
        return [
            _seconds_to(f.type, col) if pa.types.is_timestamp(f.type) else col
            for f, col in zip(self.extra, columns, strict=True)
        ]


def _concat(arrays: list[pa.Array], typ: pa.DataType) -> pa.Array:
    if not arrays:
        return pa.nulls(0, typ)
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)
