"""Log runs to Arrow record batches, with no Python object per message.

The source schema is fixed (``_options.BASE_DDL``); ``payloadFormat``/``payloadSchema`` append
columns decoded from each JSON or msgpack payload. A run's payloads and publish times are
wrapped as Arrow buffers as they are stored (``_runs.py``); the runs of a batch are joined
by Arrow. JSON payloads are parsed by Arrow's JSON reader into the typed columns (when
each column is of a type it reads as the source does); when that fails for a batch (a
payload that is not one JSON object, a value of the wrong type), the batch is decoded a
payload at a time, and a payload that does not decode (or is not exactly one JSON value),
or a value that does not fit its column, becomes null rather than failing the query.

This module is long because both ways of decoding must give a payload the same values
(whichever way its batch took), so the converters of each type sit beside the reader.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import math
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


def _floats(*values: float) -> pa.Array:
    return pa.Array.from_buffers(
        pa.float64(), len(values), [None, pa.py_buffer(array("d", values))]
    )


# Seconds since the epoch that a timestamp holds: years 1 to 9999, as Python's datetime.
_FIRST_S = dt.datetime.min.replace(tzinfo=UTC).timestamp()
_END_S = dt.datetime.max.replace(tzinfo=UTC).timestamp()  # (a float: 10000-01-01)
_MICROS, _FIRST, _END = _floats(1e6, _FIRST_S, _END_S)
_NO_SECONDS = pa.nulls(1, pa.float64())[0]
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
    return v if isinstance(v, str) else json.dumps(v, default=_header_json)


def _header_json(v: Any) -> Any:
    """Bytes in a header value as base64 text (as Spark's to_json writes binary)."""
    return base64.b64encode(v).decode() if isinstance(v, bytes | bytearray) else str(v)


def _decoder(fmt: str | None) -> Callable[[bytes], Any]:
    if fmt == "msgpack":
        return lambda b: msgpack.unpackb(b, raw=False)
    return json.loads


def _to_time(v: Any) -> Any:
    """A time from seconds since the epoch or ISO 8601 text (UTC unless it says); None
    for anything else, or seconds outside the years 1 to 9999 (NaN too)."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        if not _FIRST_S <= v < _END_S:
            return None
        try:
            return dt.datetime.fromtimestamp(v, UTC)
        except (OverflowError, ValueError, OSError):  # (a float rounded into year 10000)
            return None
    if isinstance(v, str):
        try:
            t = dt.datetime.fromisoformat(v)
        except ValueError:
            return None
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    return None


def _to_date(v: Any) -> Any:
    """A date from ISO 8601 text (``2024-05-01``, as the sink writes one); else None."""
    try:
        return dt.date.fromisoformat(v) if isinstance(v, str) else None
    except ValueError:
        return None


def _to_bytes(v: Any) -> Any:
    """Bytes as they are (msgpack's bin), or from base64 text (as the sink writes bytes
    in JSON, and Spark's to_json); else None."""
    if isinstance(v, bytes):
        return v
    try:
        return base64.b64decode(v, validate=True) if isinstance(v, str) else None
    except (binascii.Error, ValueError):
        return None


def _to_float(v: Any) -> Any:
    """A float column's value: an integer as the nearest float, as Arrow's JSON reader
    takes it (pyarrow refuses one a float does not hold exactly); not a bool (pyarrow
    takes True as 1.0)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
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


def _converter(typ: pa.DataType) -> Callable[[Any], Any] | None:
    """How a decoded value (not None) becomes one that ``pa.array`` takes as ``typ``, or
    None when it takes the value as it is; each gives None for a value that does not fit
    (a string for a list, where pyarrow would take its characters)."""
    if pa.types.is_timestamp(typ):
        return _to_time
    if pa.types.is_date(typ):
        return _to_date
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return _to_bytes
    if pa.types.is_decimal(typ):
        return _to_decimal(typ)
    if pa.types.is_floating(typ):
        return _to_float
    if pa.types.is_struct(typ):
        fields = [(f.name, _converter(f.type)) for f in typ]
        return lambda v: (
            {n: _convert(to, v.get(n)) for n, to in fields} if isinstance(v, dict) else None
        )
    if pa.types.is_map(typ):
        item = _converter(typ.item_type)
        return lambda v: (
            [(k, _convert(item, x)) for k, x in v.items()]
            if isinstance(v, dict) and all(isinstance(k, str) for k in v)
            else None
        )
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        item = _converter(typ.value_type)
        return lambda v: [_convert(item, x) for x in v] if isinstance(v, list) else None
    return None


def _convert(to: Callable[[Any], Any] | None, v: Any) -> Any:
    return v if to is None or v is None else to(v)


def _reads_as_source(typ: pa.DataType) -> bool:
    """Whether Arrow's JSON reader reads JSON into ``typ`` as the source does a payload
    at a time: not a date (it takes a number as days), nor binary (it keeps base64 text
    as it is), nor a map (it cannot), nor a time inside another type (it takes no number
    there, and a time at the top is read as seconds and converted)."""
    if pa.types.is_struct(typ):
        return all(_reads_as_source(f.type) for f in typ)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return _reads_as_source(typ.value_type)
    return not (
        pa.types.is_date(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_map(typ)
        or pa.types.is_timestamp(typ)
    )


def _holds_decimal(typ: pa.DataType) -> bool:
    if pa.types.is_struct(typ):
        return any(_holds_decimal(f.type) for f in typ)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return _holds_decimal(typ.value_type)
    return pa.types.is_decimal(typ)


def _column(values: list[Any], typ: pa.DataType) -> pa.Array:
    to = _converter(typ)
    if to is not None:
        values = [_convert(to, v) for v in values]
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
    """Float seconds since the epoch as a timestamp column of ``typ``: null where they
    are outside the years 1 to 9999 (NaN too), as in ``_to_time``, not wrapped around."""
    fits = pc.and_(pc.greater_equal(seconds, _FIRST), pc.less(seconds, _END))
    seconds = pc.if_else(fits, seconds, _NO_SECONDS)
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
        # columns as numbers of seconds, which are then converted. A column of a type it
        # does not read as the source does leaves every batch to the slow path.
        fields = [
            pa.field(f.name, pa.float64() if pa.types.is_timestamp(f.type) else f.type)
            for f in self.extra
        ]
        fast = all(pa.types.is_timestamp(f.type) or _reads_as_source(f.type) for f in self.extra)
        self._json_schema = pa.schema([pa.field("v", pa.struct(fields))]) if fast else None

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
        if n == 0 or self._json_schema is None:
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
        try:  # (the reader keeps a decimal with more digits than its column holds)
            for f, col in zip(self.extra, columns, strict=True):
                if _holds_decimal(f.type):
                    col.validate(full=True)
        except pa.ArrowInvalid:
            return None
        return [
            _seconds_to(f.type, col) if pa.types.is_timestamp(f.type) else col
            for f, col in zip(self.extra, columns, strict=True)
        ]


def _concat(arrays: list[pa.Array], typ: pa.DataType) -> pa.Array:
    if not arrays:
        return pa.nulls(0, typ)
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)
