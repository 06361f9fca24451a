"""A bridge log record: a run of messages of one producer in one stream, kept as columns.

The bridge appends what one loop took as one record per (stream, producer), so the log
costs one LMDB put per run, not per message, and a reader turns a run into Arrow arrays
from its buffers, with no Python object per message: the payloads are one byte string
with their int32 end offsets (Arrow's binary layout), the publish times an array of
doubles. Keys and headers, which most messages lack, are msgpack lists only when some
message of the run has one.

A record is ``PREFIX`` (when it was appended, how many messages) and a msgpack array::

    [version, producer(16), first seq, seqs (int64 array, or None when consecutive),
     published_ats (float64 array), payload offsets (int32 array, n + 1 of them),
     payload bytes, keys (list, or None when none has one), headers (likewise)]

Arrays are in the machine's byte order, as ``array`` writes them (little-endian on every
platform Spark runs on; Arrow's buffers are little-endian too).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Any

import msgpack

from .._seqs import consecutive
from ._errors import BridgeError

VERSION = 2
PREFIX = struct.Struct("<dI")  # appended_at, count
_pack = msgpack.Packer(use_bin_type=True).pack


@dataclass(slots=True, frozen=True)
class Run:
    """Messages of one producer bound for one stream, in order, as columns."""

    producer: bytes
    seqs: Sequence[int]
    published_ats: Sequence[float]
    payloads: Sequence[bytes]
    keys: Sequence[str | None] | None = None  # None: no message has a key
    headers: Sequence[dict[str, Any] | None] | None = None  # None: no message has headers

    def __len__(self) -> int:
        return len(self.payloads)

    def nbytes(self) -> int:
        return sum(map(len, self.payloads))

    def without(self, places: set[int]) -> Run:
        """The run less the messages at ``places``."""
        keep = [i for i in range(len(self.payloads)) if i not in places]

        def pick(col: Sequence[Any] | None) -> list[Any] | None:
            return None if col is None else [col[i] for i in keep]

        return Run(
            self.producer,
            [self.seqs[i] for i in keep],
            [self.published_ats[i] for i in keep],
            [self.payloads[i] for i in keep],
            pick(self.keys),
            pick(self.headers),
        )


def encode(run: Run, appended_at: float) -> bytes:
    """The record of ``run``, appended at ``appended_at``."""
    seqs, payloads = run.seqs, run.payloads
    n = len(payloads)
    keys = run.keys if run.keys is not None and run.keys.count(None) < n else None
    headers = run.headers if run.headers is not None and any(run.headers) else None
    body = _pack(
        [
            VERSION,
            run.producer,
            seqs[0],
            None if consecutive(seqs) else array("q", seqs).tobytes(),
            (
                run.published_ats
                if isinstance(run.published_ats, array) and run.published_ats.typecode == "d"
                else array("d", run.published_ats)
            ).tobytes(),
            array("i", accumulate(map(len, payloads), initial=0)).tobytes(),
            b"".join(payloads),
            None if keys is None else list(keys),
            None if headers is None else list(headers),
        ]
    )
    return PREFIX.pack(appended_at, n) + body


def head(record: bytes) -> tuple[float, int]:
    """(appended_at, count) of a record, read without decoding the rest."""
    return PREFIX.unpack_from(record)


@dataclass(slots=True, frozen=True)
class Columns:
    """A record's columns as stored: the arrays still as bytes, for Arrow to wrap."""

    appended_at: float
    count: int
    producer: bytes
    first_seq: int
    seqs: bytes | None
    published_ats: bytes
    offsets: bytes
    data: bytes
    keys: list[str | None] | None
    headers: list[dict[str, Any] | None] | None

    def seq_list(self) -> list[int]:
        if self.seqs is None:
            return list(range(self.first_seq, self.first_seq + self.count))
        return array("q", self.seqs).tolist()

    def payload_list(self) -> list[bytes]:
        ends = array("i", self.offsets)
        data = self.data
        return [data[a:b] for a, b in zip(ends, islice(ends, 1, None), strict=False)]

    def time_list(self) -> list[float]:
        return array("d", self.published_ats).tolist()


def columns(record: bytes) -> Columns:
    """Decode a record into its columns (``BridgeError`` when it is not one)."""
    try:
        appended_at, n = PREFIX.unpack_from(record)
        fields = msgpack.unpackb(memoryview(record)[PREFIX.size :], raw=False)
        version, producer, first, seqs, stamps, offsets, data, keys, headers = fields
    except (
        ValueError,
        TypeError,
        struct.error,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
    ) as exc:
        raise BridgeError(f"not a bridge log record: {exc}") from exc
    if version != VERSION:
        raise BridgeError(f"bridge log record of version {version}, expected {VERSION}")
    return Columns(appended_at, n, producer, first, seqs, stamps, offsets, data, keys, headers)


@dataclass(slots=True, frozen=True)
class Message:
    """One logged message, as tests and tools read it back."""

    offset: int
    producer: bytes
    seq: int
    key: str | None
    headers: dict[str, Any] | None
    published_at: float
    appended_at: float
    payload: bytes


def messages(first_offset: int, record: bytes) -> list[Message]:
    """The messages of a record whose first offset is ``first_offset`` (a Python object
    each: for tests and tools, not for the read path)."""
    c = columns(record)
    keys = c.keys or [None] * c.count
    headers = c.headers or [None] * c.count
    return [
        Message(first_offset + i, c.producer, seq, key, hdrs, at, c.appended_at, payload)
        for i, (seq, key, hdrs, at, payload) in enumerate(
            zip(c.seq_list(), keys, headers, c.time_list(), c.payload_list(), strict=True)
        )
    ]
