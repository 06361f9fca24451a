"""The ``zmesh`` PySpark data source: batch and streaming readers over a bridge's log.

Planning (offsets, partitions) runs on the driver and talks to the bridge over its ROUTER;
``read()`` runs on executors from a pickled reader, opening its own connection (or, when
the bridge's log directory is on the same host, reading LMDB directly).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..errors import ArgumentError
from ._arrow import BASE_COLUMNS, RecordConverter, source_ddl
from ._client import BridgeClient
from ._errors import BridgeError, DataLossError
from ._log import BridgeLog
from ._offsets import Range, advance, count, plan, resolve, select
from ._options import SinkOptions, SourceOptions

__all__ = ["ZMeshDataSource"]


class ZMeshDataSource(DataSource):
    """``spark.read``/``readStream``/``write``/``writeStream`` ``.format("zmesh")``.

    Register it with ``zmesh.spark.register(spark)``; options are in docs/spark.md.
    """

    @classmethod
    def name(cls) -> str:
        return "zmesh"

    def schema(self) -> str:
        lowered = {str(k).lower(): v for k, v in dict(self.options).items()}
        return source_ddl(lowered.get("payloadschema"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return ZMeshBatchReader(SourceOptions.parse(dict(self.options)), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ZMeshStreamReader(SourceOptions.parse(dict(self.options)), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ._sink import ZMeshBatchWriter

        return ZMeshBatchWriter(SinkOptions.parse(dict(self.options)), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ._sink import ZMeshStreamWriter

        return ZMeshStreamWriter(SinkOptions.parse(dict(self.options)))


class RangePartition(InputPartition):
    """One Spark task's share of a micro-batch: ranges (stream, start, end)."""

    def __init__(self, ranges: tuple[Range, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def read_ranges(opts: SourceOptions, schema: StructType,
                ranges: Sequence[Range]) -> Iterator[pa.RecordBatch]:
    """Record batches of the given log ranges, in order (executor side)."""
    conv = RecordConverter(to_arrow_schema(schema, timezone="UTC"), opts.payload_format)
    client: BridgeClient | None = None
    fetch: Callable[..., tuple[int, list[bytes]]]
    if opts.path and os.path.isfile(os.path.join(opts.path, "log", "data.mdb")):
        fetch = BridgeLog.open_reader(opts.path).read
    else:
        client = BridgeClient(opts.endpoint, timeout_s=opts.timeout_s)
        fetch = client.fetch
    try:
        for stream, start, end in ranges:
            pos = start
            while pos < end:
                first, records = fetch(stream, pos, end, opts.fetch_max_records)
                if first > pos:
                    if opts.fail_on_data_loss:
                        raise DataLossError(stream, pos, first)
                    pos = first
                if not records:
                    if pos >= end:
                        break
                    raise BridgeError(f"the bridge log of {stream} holds nothing at offsets "
                                      f"{pos}..{end - 1} that were planned; was it replaced?")
                yield conv.convert(stream, first, records)
                pos = first + len(records)
    finally:
        if client is not None:
            client.close()


class _Planner:
    """Driver-side state shared by both readers: a lazily opened bridge client."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        base = [name for name, _type in BASE_COLUMNS]
        if [f.name for f in schema.fields[:len(base)]] != base:
            raise ArgumentError(f"the zmesh source's schema starts with the columns {base}; "
                                "add decoded columns with payloadSchema, not .schema()")
        self.opts = opts
        self.schema = schema
        self._client: BridgeClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # executors open their own
        return state

    def _bridge(self) -> BridgeClient:
        if self._client is None:
            self._client = BridgeClient(self.opts.endpoint, timeout_s=self.opts.timeout_s)
        return self._client

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _plan(self, start: dict[str, int], end: dict[str, int]) -> list[RangePartition]:
        return [RangePartition(r) for r in plan(
            start, end, min_partitions=self.opts.min_partitions,
            max_per_partition=self.opts.max_records_per_partition)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # An empty plan still gets one task, with a partition that is not ours: read nothing.
        ranges = partition.ranges if isinstance(partition, RangePartition) else ()
        return read_ranges(self.opts, self.schema, ranges)


class ZMeshBatchReader(_Planner, DataSourceReader):
    """``spark.read.format("zmesh")``: the retained log between startingOffsets and
    endingOffsets (default: all of it), as of planning time."""

    def partitions(self) -> Sequence[InputPartition]:
        try:
            bounds = select(self._bridge().info(), self.opts.topics)
        finally:
            self._close()
        start = resolve(self.opts.starting, bounds)
        end = resolve(self.opts.ending, bounds, missing="latest")
        end = {s: min(e, bounds[s][1]) if s in bounds else start.get(s, 0)
               for s, e in end.items()}
        return self._plan(start, end)


class ZMeshStreamReader(_Planner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("zmesh")``: offsets are the bridge log's offsets.

    Each latestOffset call also tells the bridge the query's start: everything below it
    belongs to committed batches (Spark plans batch N+1 only after committing batch N), so
    retention may drop it. Spark's own commit() is not needed for that, and not used.
    """

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self.reader_name = opts.require_reader()
        self._target: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None

    def _bounds(self, watermark: dict[str, int] | None = None) -> dict[str, tuple[int, int]]:
        topics = None if self.opts.topics is None else list(self.opts.topics)
        bounds = self._bridge().info(reader=self.reader_name, topics=topics,
                                     watermark=watermark)
        return select(bounds, self.opts.topics)

    def initialOffset(self) -> dict:
        start = resolve(self.opts.starting, self._bounds())
        self._bounds(watermark=start)
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch is not None:
            return ReadMaxRows(self.opts.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {s: end for s, (_h, end) in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start = {str(s): int(o) for s, o in start.items()}
        ends = {s: end for s, (_h, end) in self._bounds(watermark=start).items()}
        self._latest = dict(ends)
        if self._target is not None:
            ends = {s: min(e, self._target.get(s, start.get(s, 0))) for s, e in ends.items()}
        if isinstance(limit, ReadMinRows) and count(start, ends) < limit.min_rows:
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return advance(start, ends, max_rows)

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._plan({str(s): int(o) for s, o in start.items()},
                          {str(s): int(o) for s, o in end.items()})

    def commit(self, end: dict) -> None:
        """Nothing to do: retention follows latestOffset, which always comes."""

    def stop(self) -> None:
        self._close()
