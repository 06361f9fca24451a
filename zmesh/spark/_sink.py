"""The ``zmesh`` sink: each task sends its rows to a bridge, which publishes them.

Every row is named by (query, batch, partition, its place in the partition) — or, with
``idColumns``, by (query, batch, those columns' values) — and the bridge publishes a row
only once, so a batch Spark runs again after a failure or a driver restart is dropped as
duplicate. Rows travel in chunks of consecutive rows, their columns taken whole from
Arrow (``_rows.py``), and the bridge publishes a chunk with ``publish_many``. A task
returns only after the bridge has stored its rows.

Columns: ``payload`` (binary or string) is the message body; without one, the row's other
columns become a JSON object as Spark's ``to_json`` writes it (or a msgpack one). ``key``
(string, or binary holding UTF-8 text) and ``headers`` (a map of string keys, as
map<string,string>) are used when present; ``topic`` picks the topic per row when the
``topic`` option is not set.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ..errors import ArgumentError
from ._client import BridgeClient
from ._errors import BridgeError
from ._options import SinkOptions
from ._rows import chunks

__all__ = ["ZMeshBatchWriter", "ZMeshStreamWriter"]

log = logging.getLogger(__name__)

WINDOW = 2  # chunks a task has sent and not seen stored: it reads the next meanwhile
# Types of header values that a message's headers carry as they are (msgpack packs them).
HEADER_VALUES = (
    StringType,
    BinaryType,
    BooleanType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
)


class SinkCommit(WriterCommitMessage):
    """What one task published (and how many of its rows were already published)."""

    def __init__(self, partition: int, published: int, duplicates: int) -> None:
        self.partition = partition
        self.published = published
        self.duplicates = duplicates

    def __repr__(self) -> str:
        return (
            f"SinkCommit(partition={self.partition}, published={self.published}, "
            f"duplicates={self.duplicates})"
        )


def check_columns(opts: SinkOptions, schema: StructType) -> None:
    """Refuse, when the writer is made, the columns every task would fail on (what
    depends on the rows, such as nulls, is checked as the tasks meet them)."""
    types = {f.name: f.dataType for f in schema.fields}
    if opts.topic is None and "topic" not in types:
        raise ArgumentError("the zmesh sink needs option topic, or a 'topic' column")
    topic = types.get("topic")
    if opts.topic is None and topic is not None and not isinstance(topic, StringType | BinaryType):
        raise ArgumentError(
            f"column topic must be string or binary (UTF-8 text), got {topic.simpleString()}"
        )
    payload = types.get("payload")
    if payload is not None and not isinstance(payload, BinaryType | StringType):
        raise ArgumentError(
            f"column payload must be binary or string, got {payload.simpleString()}"
        )
    key = types.get("key")
    if key is not None and not isinstance(key, StringType | BinaryType):
        raise ArgumentError(
            f"column key must be string or binary (UTF-8 text), got {key.simpleString()}"
        )
    headers = types.get("headers")
    if headers is not None and not (
        isinstance(headers, MapType)
        and isinstance(headers.keyType, StringType)
        and isinstance(headers.valueType, HEADER_VALUES)
    ):
        raise ArgumentError(
            "column headers must be a map of string keys to strings, binary, booleans or "
            f"numbers (not decimals), as map<string,string>, got {headers.simpleString()}"
        )
    unknown = [c for c in opts.id_columns if c not in types]
    if unknown:
        raise ArgumentError(
            f"option idColumns names no column {unknown}; the columns are {list(types)}"
        )


def publish_partition(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], prefix: str, partition: int
) -> SinkCommit:
    """Send one task's rows to its bridge in bounded requests (executor side). With
    several bridges, a task's partition picks one, the same every time it runs; with
    idColumns, each row's id does (see ``_publish_by_id``)."""
    if opts.id_columns and len(opts.endpoints) > 1:
        return _publish_by_id(opts, batches, prefix, partition)
    published = dups = 0
    endpoint = opts.endpoints[partition % len(opts.endpoints)]
    task = f"{prefix}:{partition}"
    with BridgeClient(endpoint, timeout_s=opts.timeout_s) as client:
        for res in client.publish(task, chunks(batches, opts, prefix), opts.topic, window=WINDOW):
            published += res.get("published", 0)
            dups += res.get("duplicates", 0)
    return SinkCommit(partition, published, dups)


def _publish_by_id(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], prefix: str, partition: int
) -> SinkCommit:
    """Send each row with an id to the bridge its id picks: a bridge remembers only the
    ids it published, so rows of one id (in several partitions, or in another partition
    when a plan that is not deterministic runs again) must all meet at one bridge."""
    published = dups = 0
    task = f"{prefix}:{partition}"
    n = len(opts.endpoints)
    clients: dict[int, BridgeClient] = {}
    try:
        for chunk in chunks(batches, opts, prefix):
            places: dict[int, list[int]] = {}
            for i, row_id in enumerate(chunk.ids or ()):
                # (an id ends with hex digits of a hash of its columns' values)
                places.setdefault(int(row_id[-8:], 16) % n, []).append(i)
            for bridge, rows in sorted(places.items()):
                client = clients.get(bridge)
                if client is None:
                    client = clients[bridge] = BridgeClient(
                        opts.endpoints[bridge], timeout_s=opts.timeout_s
                    )
                for res in client.publish(task, [chunk.only(rows)], opts.topic):
                    published += res.get("published", 0)
                    dups += res.get("duplicates", 0)
    finally:
        for client in clients.values():
            client.close()
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

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ArgumentError("the zmesh sink only appends: use mode('append')")
        check_columns(opts, schema)
        self.opts = opts
        self.write_id = opts.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        return publish_partition(self.opts, iterator, self.write_id, ctx.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.debug("zmesh write %s committed: %s", self.write_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "zmesh write %s aborted; rows already published stay published "
            "(rerun with writeId=%s to publish only the rest)",
            self.write_id,
            self.write_id,
        )


class ZMeshStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("zmesh")``: ids from (query id, batch id, partition, row)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_columns(opts, schema)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        query = ctx.getLocalProperty("sql.streaming.queryId")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            raise BridgeError(
                "no streaming query or batch id in this task; the zmesh "
                "stream sink cannot derive idempotent message ids"
            )
        return publish_partition(self.opts, iterator, f"{query}:{batch}", ctx.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.debug("zmesh stream batch %d committed: %s", batchId, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "zmesh stream batch %d aborted; when it runs again its rows are dropped as duplicates",
            batchId,
        )
