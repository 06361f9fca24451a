"""Sink rows as publish requests: a task's record batches cut into chunks of consecutive
rows, each column taken whole from Arrow (no Python step per row when the rows carry a
``payload`` column and no ``idColumns``).

A chunk's rows are named by the task and their places in it (``first`` on), so the
bridge remembers what it published as ranges; with ``idColumns`` each row also gets an
id from those columns' values.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import json
import math
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import msgpack
import pyarrow as pa

from ..errors import ArgumentError
from ._options import SinkOptions

SPECIAL = ("topic", "key", "headers", "payload")
MAX_REQUEST_BYTES = 8 << 20
_F32 = struct.Struct("<f")


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
        return format(v, "f")  # (all of its digits: msgpack has no decimal, a float has 16)
    return v


def _float(v: float) -> float | str:
    if math.isfinite(v):
        return v
    return "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"


def _float32(v: float) -> float | str:
    """A 4-byte float as Java writes it: the fewest digits that read back as the same
    float (0.1, where the double it is read as has 0.10000000149011612)."""
    if not math.isfinite(v):
        return _float(v)
    for digits in range(6, 10):  # (9 always do)
        short = float(f"{v:.{digits}g}")
        if _F32.unpack(_F32.pack(short))[0] == v:
            return short
    return v


def _timestamp(v: dt.datetime) -> str:
    text = v.isoformat(timespec="milliseconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _spark_json(typ: pa.DataType) -> Callable[[Any], Any] | None:
    """How Spark's to_json writes a value of ``typ``, as a function of its Python value
    (not None), or None when json.dumps writes that value so already: a struct without
    its null fields, a map as an object, a float that is not finite as "NaN", "Infinity"
    or "-Infinity" (a 4-byte one with its own digits), a timestamp to the millisecond
    with its offset, binary as base64. A decimal is kept for ``_exact``."""
    if pa.types.is_struct(typ):
        return _object(typ)
    if pa.types.is_map(typ):
        key, item = _spark_json(typ.key_type), _spark_json(typ.item_type)
        return lambda v: {
            k if key is None else key(k): x if x is None or item is None else item(x)
            for k, x in v.items()
        }
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        item = _spark_json(typ.value_type)
        return None if item is None else lambda v: [x if x is None else item(x) for x in v]
    if pa.types.is_floating(typ):
        return _float32 if pa.types.is_float32(typ) else _float
    if pa.types.is_timestamp(typ):
        return _timestamp
    if pa.types.is_date(typ):
        return dt.date.isoformat
    if pa.types.is_decimal(typ):
        return None  # (kept: _exact writes its digits as a JSON number, as Spark does)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return lambda v: base64.b64encode(v).decode()
    return None


def _object(typ: pa.StructType) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A struct of ``typ`` as Spark's to_json writes it (its null fields left out)."""
    fields = [(f.name, _spark_json(f.type)) for f in typ]
    return lambda v: {
        name: x if to is None else to(x) for name, to in fields if (x := v[name]) is not None
    }


def encode_rows(batch: pa.RecordBatch, fmt: str) -> list[bytes]:
    """Rows without a ``payload`` column as objects of their columns: in JSON as Spark's
    to_json writes them, or in msgpack."""
    rows = batch.to_pylist(maps_as_pydicts="strict")
    if fmt == "msgpack":
        pack = msgpack.Packer(default=_msgpackable, use_bin_type=True).pack
        return [pack(row) for row in rows]
    to = _object(pa.struct(list(batch.schema)))
    if any(map(_has_decimal, batch.schema.types)):
        return [_exact(to(row)).encode() for row in rows]
    return [_dumps(to(row)).encode() for row in rows]


_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _exact(v: Any) -> str:
    """JSON text of ``v`` with each decimal's own digits (``str`` of a Decimal is Java's
    BigDecimal.toString: 1.10, 1E-7), where json would take it as a float first."""
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dict):  # (a key that is not a string as its JSON text, as json does)
        pairs = ((k if isinstance(k, str) else _exact(k), x) for k, x in v.items())
        return "{" + ",".join(f"{_dumps(k)}:{_exact(x)}" for k, x in pairs) + "}"
    if isinstance(v, list):
        return "[" + ",".join(map(_exact, v)) + "]"
    return _dumps(v)


def _has_decimal(typ: pa.DataType) -> bool:
    if pa.types.is_decimal(typ):
        return True
    if pa.types.is_struct(typ):
        return any(_has_decimal(f.type) for f in typ)
    if pa.types.is_map(typ):
        return _has_decimal(typ.key_type) or _has_decimal(typ.item_type)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return _has_decimal(typ.value_type)
    return False


def content_id(prefix: str, row: dict[str, Any], id_columns: tuple[str, ...]) -> str:
    """A row's id from the values of ``id_columns`` (for plans whose row order within a
    partition is not deterministic)."""
    values = json.dumps([row.get(c) for c in id_columns], default=_jsonable, separators=(",", ":"))
    return f"{prefix}:{hashlib.sha256(values.encode()).hexdigest()[:32]}"


@dataclass(slots=True)
class Chunk:
    """Consecutive rows of a task, from its row ``first`` on, as one publish request."""

    first: int
    payloads: list[bytes]
    topics: list[str] | None  # per row, when the sink has no topic option
    keys: list[str | None] | None  # None: no row has a key
    headers: list[dict[str, Any] | None] | None  # None: no row has headers
    ids: list[str] | None  # with idColumns: each row's id

    def only(self, places: list[int]) -> Chunk:
        """A chunk of the rows at ``places`` only (rows with ids, which need not be
        consecutive); it is named by the first of them."""

        def pick(col: list[Any] | None) -> list[Any] | None:
            return None if col is None else [col[i] for i in places]

        payloads = [self.payloads[i] for i in places]
        return Chunk(
            self.first + places[0],
            payloads,
            pick(self.topics),
            pick(self.keys),
            pick(self.headers),
            pick(self.ids),
        )

    def frames(self) -> tuple[bytes, ...]:
        pack = msgpack.Packer(use_bin_type=True).pack
        return tuple(
            pack(col) for col in (self.payloads, self.topics, self.keys, self.headers, self.ids)
        )


def _strings(col: pa.Array | None, what: str) -> list[Any] | None:
    """A column's values as strings, or None when it is absent or all null."""
    if col is None or col.null_count == len(col):
        return None
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        try:
            col = col.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                bad = next(v for v in col.to_pylist() if v is not None and not _utf8(v))
                raise ArgumentError(
                    f"column {what} is binary and holds {bad[:32]!r}, which is not UTF-8 text"
                ) from exc
            raise ArgumentError(f"column {what} must be a string, got {col.type}") from exc
    return col.to_pylist()


def _utf8(b: bytes) -> bool:
    try:
        b.decode()
    except UnicodeDecodeError:
        return False
    return True


def _payloads(batch: pa.RecordBatch, opts: SinkOptions) -> list[bytes]:
    names = batch.schema.names
    if "payload" not in names:
        rest = batch.select([n for n in names if n not in SPECIAL])
        return encode_rows(rest, opts.payload_format)
    col = batch.column("payload")
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary() if pa.types.is_string(col.type) else pa.large_binary())
    elif not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise ArgumentError(f"column payload must be binary or string, got {col.type}")
    if col.null_count:
        raise ArgumentError("column payload has nulls: every message needs a body")
    return col.to_pylist()


def chunks(batches: Iterator[pa.RecordBatch], opts: SinkOptions, prefix: str) -> Iterator[Chunk]:
    """The task's rows as chunks of at most ``opts.batch_rows`` rows and about
    MAX_REQUEST_BYTES of payloads each, in order."""
    first = 0
    for batch in batches:
        names = batch.schema.names
        payloads = _payloads(batch, opts)
        topics = None if opts.topic is not None else _strings(batch.column("topic"), "topic")
        if topics is not None and None in topics:
            raise ArgumentError(
                "column topic has nulls: give each row a topic, or set the topic option"
            )
        keys = _strings(batch.column("key"), "key") if "key" in names else None
        headers = None
        if "headers" in names and batch.column("headers").null_count < batch.num_rows:
            headers = [None if h is None else dict(h) for h in batch.column("headers").to_pylist()]
        ids = None
        if opts.id_columns:
            rows = batch.select(list(opts.id_columns)).to_pylist()
            ids = [content_id(prefix, row, opts.id_columns) for row in rows]
        ends = list(accumulate(map(len, payloads)))
        start = 0
        while start < len(payloads):
            stop = min(len(payloads), start + opts.batch_rows)
            base = ends[start - 1] if start else 0
            stop = max(start + 1, min(stop, bisect_right(ends, base + MAX_REQUEST_BYTES)))

            def cut(col: list[Any] | None, a: int = start, b: int = stop) -> list[Any] | None:
                return None if col is None else col[a:b]

            yield Chunk(
                first + start, payloads[start:stop], cut(topics), cut(keys), cut(headers), cut(ids)
            )
            start = stop
        first += len(payloads)
