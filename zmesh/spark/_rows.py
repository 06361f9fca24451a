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
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import msgpack
import pyarrow as pa

from ..errors import ArgumentError
from ._options import SinkOptions

SPECIAL = ("topic", "key", "headers", "payload")
MAX_REQUEST_BYTES = 8 << 20


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
            raise ArgumentError(f"column {what} must be a string, got {col.type}") from exc
    return col.to_pylist()


def _payloads(batch: pa.RecordBatch, opts: SinkOptions) -> list[bytes]:
    names = batch.schema.names
    if "payload" not in names:
        rest = batch.select([n for n in names if n not in SPECIAL])
        return [encode_row(row, opts.payload_format) for row in rest.to_pylist()]
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
