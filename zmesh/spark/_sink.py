"""The ``zmesh`` sink: each task sends its rows to a bridge, which publishes them.

Every row gets an id derived from (query, batch, partition, row) — or, with ``idColumns``,
from (query, batch, those columns' values) — and the bridge publishes a row id only once,
so a batch Spark runs again after a failure or a driver restart is dropped as duplicate.
A task returns only after the bridge has stored its rows.

Columns: ``payload`` (binary or string) is the message body; without one, the row's other
columns become a JSON (or msgpack) object. ``key`` (string) and ``headers``
(map<string,string>) are used when present; ``topic`` picks the topic per row when the
``topic`` option is not set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..errors import ArgumentError
from ._arrow import _jsonable, encode_row
from ._client import BridgeClient
from ._errors import BridgeError
from ._options import SinkOptions

__all__ = ["ZMeshBatchWriter", "ZMeshStreamWriter"]

log = logging.getLogger(__name__)

SPECIAL = ("topic", "key", "headers", "payload")
MAX_REQUEST_BYTES = 8 << 20


class SinkCommit(WriterCommitMessage):
    """What one task published (and how many of its rows were already published)."""

    def __init__(self, partition: int, published: int, duplicates: int) -> None:
        self.partition = partition
        self.published = published
        self.duplicates = duplicates

    def __repr__(self) -> str:
        return (f"SinkCommit(partition={self.partition}, published={self.published}, "
                f"duplicates={self.duplicates})")


def row_id(prefix: str, partition: int, index: int, row: dict[str, Any],
           id_columns: tuple[str, ...]) -> str:
    """The row's message id: positional by default, by content with ``idColumns``."""
    if not id_columns:
        return f"{prefix}:{partition}:{index}"
    values = json.dumps([row.get(c) for c in id_columns], default=_jsonable,
                        separators=(",", ":"))
    return f"{prefix}:{hashlib.sha256(values.encode()).hexdigest()[:32]}"


def _message(row: dict[str, Any], opts: SinkOptions) -> tuple[str, Any, Any, bytes]:
    topic = opts.topic or row.get("topic")
    if not topic:
        raise ArgumentError("the zmesh sink needs option topic, or a 'topic' column")
    key = row.get("key")
    headers = row.get("headers")
    if isinstance(headers, list):  # Arrow maps arrive as (key, value) pairs
        headers = dict(headers)
    if "payload" in row:
        payload = row["payload"]
        if isinstance(payload, str):
            payload = payload.encode()
        if not isinstance(payload, bytes):
            raise ArgumentError(f"column payload must be binary or string, got "
                                f"{type(payload).__name__}")
    else:
        body = {k: v for k, v in row.items() if k not in SPECIAL}
        payload = encode_row(body, opts.payload_format)
    return str(topic), None if key is None else str(key), headers or None, payload


def publish_partition(opts: SinkOptions, batches: Iterator[pa.RecordBatch], prefix: str,
                      partition: int) -> SinkCommit:
    """Send one task's rows to the bridge in bounded requests (executor side)."""
    published = dups = index = 0
    rows: list[list[Any]] = []
    payloads: list[bytes] = []
    size = 0
    with BridgeClient(opts.endpoint, timeout_s=opts.timeout_s) as client:
        def flush() -> None:
            nonlocal published, dups, size
            if rows:
                res = client.publish(rows, payloads)
                published += res.get("published", 0)
                dups += res.get("duplicates", 0)
                rows.clear()
                payloads.clear()
                size = 0

        for batch in batches:
            for row in batch.to_pylist():
                rid = row_id(prefix, partition, index, row, opts.id_columns)
                index += 1
                topic, key, headers, payload = _message(row, opts)
                rows.append([rid, topic, key, headers])
                payloads.append(payload)
                size += len(payload)
                if len(rows) >= opts.batch_rows or size >= MAX_REQUEST_BYTES:
                    flush()
        flush()
    return SinkCommit(partition, published, dups)


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise BridgeError("the zmesh sink writes only inside a Spark task")
    return ctx


class ZMeshBatchWriter(DataSourceArrowWriter):
    """``df.write.format("zmesh").mode("append")``: ids from ``writeId`` (default: one
    per write job), so a retried task does not publish twice; pass the same ``writeId``
    to make a whole rerun of the job idempotent."""

    def __init__(self, opts: SinkOptions, overwrite: bool) -> None:
        if overwrite:
            raise ArgumentError("the zmesh sink only appends: use mode('append')")
        self.opts = opts
        self.write_id = opts.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        return publish_partition(self.opts, iterator, self.write_id, ctx.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.debug("zmesh write %s committed: %s", self.write_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("zmesh write %s aborted; rows already published stay published "
                    "(rerun with writeId=%s to publish only the rest)", self.write_id,
                    self.write_id)


class ZMeshStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("zmesh")``: ids from (query id, batch id, partition, row)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        query = ctx.getLocalProperty("sql.streaming.queryId")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            raise BridgeError("no streaming query or batch id in this task; the zmesh "
                              "stream sink cannot derive idempotent message ids")
        return publish_partition(self.opts, iterator, f"{query}:{batch}", ctx.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.debug("zmesh stream batch %d committed: %s", batchId, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("zmesh stream batch %d aborted; when it runs again its rows are "
                    "dropped as duplicates", batchId)
