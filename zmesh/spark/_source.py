"""The ``zmesh`` PySpark data source: batch and streaming readers over bridges' logs.

A source reads one bridge or several (the members of one group, each with a share of
the partitions) as one stream: its streams are named by their bridge log's id. Planning
(offsets, partitions) runs on the driver and talks to the bridges over their ROUTERs;
``read()`` runs on executors from a pickled reader, opening its own connections (or,
when a bridge's log directory is on the same host, reading LMDB directly).

This module is long because the batch and the stream readers are one planner (offsets
resolved, checked and cut into partitions) under PySpark's two reader interfaces, and
what they hand to executors (``read_ranges``) reads what that planner cut.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..errors import ArgumentError
from ._client import BridgeClient, LogInfo
from ._errors import BridgeError, DataLossError
from ._log import BridgeLog
from ._offsets import (
    Range,
    advance,
    check_order,
    check_spec,
    count,
    plan,
    qualify,
    qualify_all,
    resolve,
    rows_for_bytes,
    select,
    split,
    topic_of,
)
from ._options import BASE_COLUMNS, DEFAULT_PARTITIONS, SinkOptions, SourceOptions, source_ddl
from ._runs import columns

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ZMeshDataSource"]

BATCH_ROWS = 1 << 16  # rows per Arrow record batch handed to Spark, about
# Payload bytes per record batch, about: a binary column's int32 offsets end at 2 GiB.
BATCH_BYTES = 64 << 20
Sizes = dict[str, tuple[int, int, int]]


class ZMeshDataSource(DataSource):
    """``spark.read``/``readStream``/``write``/``writeStream`` ``.format("zmesh")``.

    Register it with ``zmesh.spark.register(spark)``; options are in docs/spark.md.
    """

    # The session's default parallelism, when register() found it: minPartitions' default.
    parallelism: ClassVar[int | None] = None

    @classmethod
    def name(cls) -> str:
        return "zmesh"

    def schema(self) -> str:
        lowered = {str(k).lower(): v for k, v in dict(self.options).items()}
        return source_ddl(lowered.get("payloadschema"))

    def _source_options(self) -> SourceOptions:
        return SourceOptions.parse(dict(self.options), self.parallelism or DEFAULT_PARTITIONS)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ZMeshBatchReader(self._source_options(), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ZMeshStreamReader(self._source_options(), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ._sink import ZMeshBatchWriter

        return ZMeshBatchWriter(SinkOptions.parse(dict(self.options)), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ._sink import ZMeshStreamWriter

        return ZMeshStreamWriter(SinkOptions.parse(dict(self.options)), schema)


class RangePartition(InputPartition):
    """One Spark task's share of a micro-batch: ranges (stream, start, end), and where
    the bridge of each log id answers."""

    def __init__(self, ranges: tuple[Range, ...], endpoints: dict[str, str]) -> None:
        super().__init__(ranges)
        self.ranges = ranges
        self.endpoints = endpoints


class _Fetchers:
    """How an executor reads each bridge log: from its directory when it is on this host
    (one of the ``path`` option's), else from the bridge over the network."""

    def __init__(self, opts: SourceOptions, endpoints: dict[str, str]) -> None:
        self.opts = opts
        self.endpoints = endpoints
        self.local: dict[str, BridgeLog] = {}
        for path in opts.paths:
            if os.path.isfile(os.path.join(path, "log", "data.mdb")):
                found = BridgeLog.open_reader(path)
                self.local[found.log_id] = found
        self.clients: dict[str, BridgeClient] = {}

    def fetch(self, log_id: str) -> Callable[..., tuple[int, list[tuple[int, bytes]]]]:
        if log_id in self.local:
            return self.local[log_id].read
        client = self.clients.get(log_id)
        if client is None:
            endpoint = self.endpoints.get(log_id)
            if endpoint is None:
                raise BridgeError(
                    f"no bridge of log {log_id} among the source's endpoints "
                    f"{list(self.opts.endpoints)}"
                )
            client = self.clients[log_id] = BridgeClient(endpoint, timeout_s=self.opts.timeout_s)
        return client.fetch

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def read_ranges(
    opts: SourceOptions,
    schema: StructType,
    ranges: Sequence[Range],
    endpoints: dict[str, str],
    reader: str | None,
) -> Iterator[pa.RecordBatch]:
    """Record batches of the given log ranges, in order (executor side); ``reader``: the
    streaming query's name at the bridges (None: a batch read)."""
    # (imported here: the planner's processes never build a record batch)
    from pyspark.sql.pandas.types import to_arrow_schema

    from ._arrow import RecordConverter

    conv = RecordConverter(to_arrow_schema(schema, timezone="UTC"), opts.payload_format)
    fetchers = _Fetchers(opts, endpoints)
    size = 0  # payload bytes added since the last batch
    try:
        for stream, start, end in ranges:
            log_id, name = split(stream)
            fetch = fetchers.fetch(log_id)
            pos = start
            while pos < end:
                first, runs = fetch(name, pos, end, opts.fetch_max_records)
                if first > pos:
                    if opts.fail_on_data_loss:
                        raise DataLossError(stream, pos, first, reader)
                    pos = first
                if not runs:
                    if pos >= end:
                        break
                    raise BridgeError(
                        f"the bridge log of {stream} holds nothing at offsets "
                        f"{pos}..{end - 1} that were planned; was it replaced?"
                    )
                for run_first, record in runs:
                    c = columns(record)
                    lo, hi = pos - run_first, min(end, run_first + c.count) - run_first
                    if lo < 0 or hi <= lo:
                        raise BridgeError(
                            f"the bridge log of {stream} sent a run of offsets "
                            f"{run_first}..{run_first + c.count - 1} for "
                            f"offset {pos}"
                        )
                    ends = memoryview(c.offsets).cast("i")
                    while lo < hi:
                        # the messages from lo whose payloads fit in the batch's room
                        cut = bisect_right(ends, ends[lo] + BATCH_BYTES - size, lo, hi + 1) - 1
                        if cut == lo and conv.rows:
                            yield conv.batch()  # (the next message fills a batch of its own)
                            size = 0
                            continue
                        cut = max(cut, lo + 1)
                        conv.add(name, run_first + lo, c, lo, cut)
                        size += ends[cut] - ends[lo]
                        lo = cut
                        if conv.rows >= BATCH_ROWS or size >= BATCH_BYTES:
                            yield conv.batch()
                            size = 0
                    pos = run_first + hi
        if conv.rows:
            yield conv.batch()
    finally:
        fetchers.close()


class _Planner:
    """Driver-side state shared by both readers: a client per bridge, opened lazily, and
    each bridge's log id."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        base = [name for name, _type in BASE_COLUMNS]
        if [f.name for f in schema.fields[: len(base)]] != base:
            raise ArgumentError(
                f"the zmesh source's schema starts with the columns {base}; "
                "add decoded columns with payloadSchema, not .schema()"
            )
        names = [f.name.lower() for f in schema.fields]
        clash = sorted({n for n in names[len(base) :] if names.count(n) > 1})
        if clash:
            raise ArgumentError(
                f"payloadSchema repeats the column(s) {clash}: the source has the columns "
                f"{base}, and each decoded field needs a name of its own (decode such a "
                "field from the payload column with from_json instead)"
            )
        self.opts = opts
        self.schema = schema
        self.reader_name: str | None = None  # a streaming query's, at the bridges
        self._clients: dict[str, BridgeClient] = {}
        self._log_ids: dict[str, str] = {}  # endpoint -> its bridge log's id

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_clients"] = {}  # executors open their own
        return state

    def _client(self, endpoint: str) -> BridgeClient:
        client = self._clients.get(endpoint)
        if client is None:
            client = self._clients[endpoint] = BridgeClient(endpoint, timeout_s=self.opts.timeout_s)
        return client

    def _close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _sizes(self, reader: str | None = None, watermark: dict[str, int] | None = None) -> Sizes:
        """Every bridge's streams of the source's topics -> (head, end, bytes appended),
        named by log id; with ``reader``, registers it at each bridge and moves its
        watermarks there up to ``watermark``'s."""
        if len(self._log_ids) < len(self.opts.endpoints):
            self._learn_all()
        topics = None if self.opts.topics is None else list(self.opts.topics)
        out: Sizes = {}
        for endpoint in self.opts.endpoints:
            log_id = self._log_ids[endpoint]
            marks = None
            if reader is not None and watermark:
                marks = {split(s)[1]: o for s, o in watermark.items() if split(s)[0] == log_id}
            found = self._client(endpoint).bounds(reader=reader, topics=topics, watermark=marks)
            log_id = self._learn(endpoint, found.log_id)
            out.update({qualify(log_id, s): b for s, b in found.streams.items()})
        return select(out, self.opts.topics)

    def _learn_all(self) -> None:
        """Each bridge's log id, with calls that register nothing, and the source's topics
        checked against what the bridges consume or have logged: a source refused leaves
        no reader at the bridges."""
        found = [self._client(endpoint).bounds() for endpoint in self.opts.endpoints]
        for endpoint, info in zip(self.opts.endpoints, found, strict=True):
            self._learn(endpoint, info.log_id)
        self._check_topics(found)

    def _check_topics(self, found: list[LogInfo]) -> None:
        if self.opts.topics is None or any(info.topics is None for info in found):
            return  # (all of them, or a bridge of an older zmesh does not say its topics)
        consumed = {t for info in found for t in info.topics or ()}
        known = consumed | {topic_of(s) for info in found for s in info.streams}
        unknown = [t for t in self.opts.topics if t not in known]
        if unknown:
            raise ArgumentError(
                f"option topics names {unknown}, which no bridge of the source consumes "
                f"or has logged; they consume {sorted(consumed)}"
            )

    def _learn(self, endpoint: str, log_id: str) -> str:
        if not log_id:
            raise BridgeError(
                f"the bridge at {endpoint} does not name its log: is it a bridge of an older zmesh?"
            )
        for other, known in self._log_ids.items():
            if known == log_id and other != endpoint:
                raise ArgumentError(
                    f"endpoints {other} and {endpoint} are the same bridge "
                    f"(log {log_id}): name each bridge once"
                )
        self._log_ids[endpoint] = log_id
        return log_id

    def _endpoints(self) -> dict[str, str]:
        """Each bridge log's id -> its endpoint."""
        if len(self._log_ids) < len(self.opts.endpoints):
            self._learn_all()
        return {log_id: endpoint for endpoint, log_id in self._log_ids.items()}

    def _qualified(self, offsets: dict[str, int]) -> dict[str, int]:
        return qualify_all(offsets, self._endpoints())

    def _resolve(
        self,
        spec: str | dict[str, int],
        sizes: Sizes,
        what: str,
        missing: str = "earliest",
        past_end: bool = False,
    ) -> dict[str, int]:
        """Offsets of every stream by ``spec`` (startingOffsets or endingOffsets); a JSON
        one may name only the source's streams, at most at their ends unless ``past_end``."""
        bounds = {s: (h, e) for s, (h, e, _b) in sizes.items()}
        if not isinstance(spec, str):
            spec = self._qualified(spec)
            check_spec(spec, bounds, self._log_ids.values(), what, past_end=past_end)
        return resolve(spec, bounds, missing)

    def _plan(
        self, start: dict[str, int], end: dict[str, int], cut_into: int | None = None
    ) -> list[tuple[Range, ...]]:
        return plan(
            start,
            end,
            min_partitions=self.opts.min_partitions,
            max_per_partition=self.opts.max_records_per_partition,
            cut_into=cut_into,
        )

    def _partitions(self, ranges: list[tuple[Range, ...]]) -> list[RangePartition]:
        endpoints = self._endpoints()
        return [RangePartition(r, endpoints) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # An empty plan still gets one task, with a partition that is not ours: read nothing.
        if not isinstance(partition, RangePartition):
            return iter(())
        return read_ranges(
            self.opts, self.schema, partition.ranges, partition.endpoints, self.reader_name
        )


# A micro-batch's end offset also holds the number of Spark partitions it was cut into
# when it was first planned: the sink names rows by their partition and place, so a batch
# replayed after a restart with other parallelism must be cut the same way.
PARTS = "partitions"


def _ints(offsets: dict[str, Any]) -> dict[str, int]:
    """Offsets as Spark hands them back (read from its offset log's JSON), as ints,
    without the batch's partition count."""
    return {str(s): int(o) for s, o in offsets.items() if s != PARTS}


class ZMeshBatchReader(_Planner, DataSourceReader):
    """``spark.read.format("zmesh")``: the retained logs between startingOffsets and
    endingOffsets (default: all of them), as of planning time."""

    def partitions(self) -> Sequence[InputPartition]:
        try:
            sizes = self._sizes()
            start = self._resolve(self.opts.starting, sizes, "startingOffsets")
            end = self._resolve(
                self.opts.ending or "latest", sizes, "endingOffsets", "latest", past_end=True
            )
            check_order(start, end)
            return self._partitions(
                self._plan(start, {s: min(e, sizes[s][1]) for s, e in end.items()})
            )
        finally:
            self._close()


class ZMeshStreamReader(_Planner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("zmesh")``: offsets are the bridge logs' offsets.

    Each latestOffset call also tells each bridge the query's start: everything below it
    belongs to committed batches (Spark plans batch N+1 only after committing batch N), so
    retention may drop it. Spark's own commit() is not needed for that, and not used.
    """

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self.reader_name = opts.require_reader()
        if opts.ending is not None:
            raise ArgumentError(
                "option endingOffsets is for batch reads (spark.read): a stream reads on "
                "as the logs grow (Trigger.AvailableNow stops at their ends as of its start)"
            )
        self._target: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        # startingOffsets checked before the reader is registered (a refused query leaves
        # nothing at the bridges), then resolved once it is (it holds every record since).
        self._resolve(self.opts.starting, self._sizes(), "startingOffsets")
        start = self._resolve(self.opts.starting, self._sizes(self.reader_name), "startingOffsets")
        self._sizes(self.reader_name, watermark=start)
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch is not None:
            return ReadMaxRows(self.opts.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {s: end for s, (_h, end, _b) in self._sizes().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        given, start = start, self._qualified(_ints(start))
        sizes = self._sizes(self.reader_name, watermark=start)
        self._latest = {s: end for s, (_h, end, _b) in sizes.items()}
        # A stream new to the query (a partition that appeared, a topic or a bridge added
        # to it) enters at its first retained offset, in this end offset: where it starts
        # is then in Spark's offset log, and it is read from the next batch on.
        fresh = {s: head for s, (head, _e, _b) in sizes.items() if s not in start}
        sizes = {s: b for s, b in sizes.items() if s in start}
        ends = {s: end for s, (_h, end, _b) in sizes.items()}
        if self._target is not None:
            ends = {s: min(e, self._target.get(s, start.get(s, 0))) for s, e in ends.items()}
        if isinstance(limit, ReadMinRows) and count(start, ends) < limit.min_rows:
            return given
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self.opts.max_bytes_per_batch is not None:
            by_bytes = rows_for_bytes(self.opts.max_bytes_per_batch, start, sizes)
            max_rows = by_bytes if max_rows is None else min(max_rows, by_bytes)
        end = {**advance(start, ends, max_rows), **fresh}
        if end == start:
            return given  # (no new batch: the offset Spark has, as it has it)
        return {**end, PARTS: len(self._plan({**end, **start}, end))}

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        parts = end.get(PARTS)  # (none in a batch planned by an older zmesh)
        end = self._qualified(_ints(end))
        # (a stream new in this batch's end offset is read from the next batch on)
        start = {**end, **self._qualified(_ints(start))}
        return self._partitions(self._plan(start, end, None if parts is None else int(parts)))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: retention follows latestOffset, which always comes."""

    def stop(self) -> None:
        self._close()
