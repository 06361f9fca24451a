"""Options of the ``zmesh`` data source, parsed once on the driver into frozen objects.

Spark lower-cases option names (``maxRecordsPerBatch`` arrives as ``maxrecordsperbatch``);
errors quote them in their documented spelling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import check_name
from ..errors import ArgumentError
from ._ddl import payload_ddl
from ._errors import BridgeError
from ._offsets import parse_spec

SOURCE_OPTIONS = (
    "endpoint",
    "path",
    "topics",
    "reader",
    "startingOffsets",
    "endingOffsets",
    "maxRecordsPerTrigger",
    "maxRecordsPerBatch",
    "maxBytesPerTrigger",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "payloadFormat",
    "payloadSchema",
    "requestTimeoutMs",
    "fetchMaxRecords",
)
SINK_OPTIONS = (
    "endpoint",
    "topic",
    "payloadFormat",
    "idColumns",
    "writeId",
    "batchRows",
    "requestTimeoutMs",
)
DEFAULT_PARTITIONS = 2
# Largest values of the numeric options: counts of records or bytes as the JVM's long
# holds them; partitions a query's driver can schedule; records per fetch as a bridge
# serves them (it sends no more); a day's wait for a request.
MAX_COUNT = (1 << 63) - 1
MAX_PARTITIONS = 100_000
MAX_FETCH_RECORDS = 1_000_000
MAX_BATCH_ROWS = 1_000_000
MAX_TIMEOUT_MS = 86_400_000
MAX_WRITE_ID_BYTES = 200  # (a row's id adds a hash of 33 characters: a msg_id holds 256)
# The source's columns; payloadSchema adds decoded ones after them.
BASE_COLUMNS = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("key", "string"),
    ("payload", "binary"),
    ("headers", "map<string,string>"),
    ("producer", "string"),
    ("timestamp", "timestamp"),
)
BASE_DDL = ", ".join(f"`{n}` {t}" for n, t in BASE_COLUMNS)


def check_endpoint(endpoint: object) -> str:
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
        raise BridgeError(f"bridge endpoint must look like 'tcp://host:port', got {endpoint!r}")
    return endpoint


def source_ddl(payload_schema: str | None) -> str:
    """The source's schema: its columns, then payloadSchema's (checked on its own)."""
    return BASE_DDL if not payload_schema else f"{BASE_DDL}, {payload_ddl(payload_schema)}"


PAYLOAD_FORMATS = ("json", "msgpack")
SPARK_OPTIONS = frozenset({"checkpointlocation", "path", "queryname"})  # Spark passes these on


def _lower(options: Mapping[str, Any], known: tuple[str, ...], what: str) -> dict[str, str]:
    names = {k.lower() for k in known} | SPARK_OPTIONS
    opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
    bad = sorted(set(opts) - names)
    if bad:
        raise ArgumentError(f"unknown zmesh {what} option(s) {bad}; known: {list(known)}")
    return opts


def _int(
    opts: dict[str, str], name: str, default: int | None, maximum: int = MAX_COUNT
) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= maximum:
        raise ArgumentError(f"option {name} must be an integer from 1 to {maximum:,}, got {raw!r}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise ArgumentError(f"option {name} must be true or false, got {raw!r}")
    return raw.lower() == "true"


def _format(opts: dict[str, str]) -> str | None:
    fmt = opts.get("payloadformat")
    if fmt is not None and fmt.lower() not in PAYLOAD_FORMATS:
        raise ArgumentError(f"option payloadFormat must be one of {PAYLOAD_FORMATS}, got {fmt!r}")
    return None if fmt is None else fmt.lower()


def _timeout(opts: dict[str, str]) -> float:
    return (_int(opts, "requestTimeoutMs", 30_000, MAX_TIMEOUT_MS) or 30_000) / 1000.0


def _endpoints(opts: dict[str, str], what: str) -> tuple[str, ...]:
    """Option endpoint: one bridge's ``tcp://host:port``, or several, comma-separated."""
    found = tuple(e.strip() for e in opts.get("endpoint", "").split(",") if e.strip())
    if not found:
        raise ArgumentError(
            f"the zmesh {what} needs option endpoint: the bridge's "
            "'tcp://host:port' (Bridge.endpoint), or several, comma-separated"
        )
    if len(set(found)) < len(found):
        raise ArgumentError(f"option endpoint names a bridge twice: {opts['endpoint']!r}")
    return tuple(check_endpoint(e) for e in found)


def _max_rows(opts: dict[str, str]) -> int | None:
    """maxRecordsPerTrigger, or its older name maxRecordsPerBatch (not both, unless equal)."""
    rows = _int(opts, "maxRecordsPerTrigger", None)
    older = _int(opts, "maxRecordsPerBatch", None)
    if rows is not None and older is not None and rows != older:
        raise ArgumentError(
            f"options maxRecordsPerTrigger ({rows}) and maxRecordsPerBatch "
            f"({older}) are one limit: give one of them"
        )
    return rows if rows is not None else older


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """How a reader finds the bridge and what it reads."""

    endpoints: tuple[str, ...]
    paths: tuple[str, ...]
    topics: tuple[str, ...] | None
    reader: str | None
    starting: str | dict[str, int]
    ending: str | dict[str, int] | None  # None: not given (a batch read reads to the latest)
    max_records_per_batch: int | None
    max_bytes_per_batch: int | None
    min_partitions: int
    max_records_per_partition: int
    fail_on_data_loss: bool
    payload_format: str | None
    payload_schema: str | None
    timeout_s: float
    fetch_max_records: int

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], default_partitions: int = DEFAULT_PARTITIONS
    ) -> SourceOptions:
        """``default_partitions``: minPartitions when not given (the session's parallelism,
        as ``zmesh.spark.register`` found it)."""
        opts = _lower(options, SOURCE_OPTIONS, "source")
        endpoints = _endpoints(opts, "source")
        topics = None
        if opts.get("topics"):
            topics = tuple(check_name("topic", t.strip()) for t in opts["topics"].split(","))
        reader = opts.get("reader")
        if reader is not None:
            check_name("reader", reader)
        fmt, schema = _format(opts), opts.get("payloadschema") or None
        ending = opts.get("endingoffsets")
        if (fmt is None) != (schema is None):
            raise ArgumentError(
                "options payloadFormat and payloadSchema go together: "
                "payloadSchema is a DDL string like 'sensor string, value double'"
            )
        return cls(
            endpoints=endpoints,
            paths=tuple(p.strip() for p in (opts.get("path") or "").split(",") if p.strip()),
            topics=topics,
            reader=reader,
            starting=parse_spec(opts.get("startingoffsets", "earliest"), "startingOffsets"),
            ending=None if ending is None else parse_spec(ending, "endingOffsets"),
            max_records_per_batch=_max_rows(opts),
            max_bytes_per_batch=_int(opts, "maxBytesPerTrigger", None),
            min_partitions=_int(opts, "minPartitions", default_partitions, MAX_PARTITIONS)
            or default_partitions,
            max_records_per_partition=_int(opts, "maxRecordsPerPartition", 1_000_000) or 1_000_000,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            payload_format=fmt,
            payload_schema=payload_ddl(schema) if schema else schema,
            timeout_s=_timeout(opts),
            fetch_max_records=_int(opts, "fetchMaxRecords", 10_000, MAX_FETCH_RECORDS) or 10_000,
        )

    def require_reader(self) -> str:
        if self.reader is None:
            raise ArgumentError(
                "a streaming read needs option reader: a name unique to the "
                "query, under which the bridge keeps its watermark so "
                "retention never removes what the query may still replay"
            )
        return self.reader


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Where and how a writer publishes rows."""

    endpoints: tuple[str, ...]
    topic: str | None
    payload_format: str
    id_columns: tuple[str, ...]
    write_id: str | None
    batch_rows: int
    timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SinkOptions:
        opts = _lower(options, SINK_OPTIONS, "sink")
        endpoints = _endpoints(opts, "sink")
        topic = opts.get("topic")
        if topic is not None:
            check_name("topic", topic)
        ids = tuple(c.strip() for c in opts.get("idcolumns", "").split(",") if c.strip())
        write_id = opts.get("writeid") or None
        if write_id is not None and len(write_id.encode()) > MAX_WRITE_ID_BYTES:
            raise ArgumentError(
                f"option writeId must be at most {MAX_WRITE_ID_BYTES} bytes (UTF-8): it names "
                f"every row the bridge remembers; got {len(write_id.encode())}"
            )
        return cls(
            endpoints=endpoints,
            topic=topic,
            payload_format=_format(opts) or "json",
            id_columns=ids,
            write_id=write_id,
            batch_rows=_int(opts, "batchRows", 10_000, MAX_BATCH_ROWS) or 10_000,
            timeout_s=_timeout(opts),
        )
