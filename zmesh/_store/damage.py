"""Recognising a damaged store: files LMDB must not open, records msgpack cannot decode.

A damaged store is reported, never recreated: LMDB initialises an empty ``data.mdb`` as a
new environment, which would silently throw away every message the old one held. A
single record that cannot be decoded is set aside in the ``bad`` database (see
``WriteBatch.quarantine``) and counted, so a restart never loops on it.
"""

from __future__ import annotations

from array import array
from itertools import islice
from operator import lt
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from .._numbers import fitting_array, le_column
from ..errors import StoreError

# LMDB writes two meta pages when it creates an environment; anything shorter is not one.
MIN_DATA_BYTES = 2 * 4096
RECORD_FIELDS = 10  # msgs values: [topic, partition, key, headers, priority, published_at,
#                                   expires_at, deliver_at, payload, index]

FIX = (
    "restore the data dir from a snapshot (zmesh snapshot, Node.snapshot), or copy what "
    "can be read into a new data dir (zmesh store salvage DATA_DIR NEW_DIR) and run the "
    "node there, or move it aside to start this node afresh (its unacknowledged "
    "messages would then be lost)"
)


def remedy(store_path: str | Path) -> str:
    """What to do about the damaged store at ``store_path`` (``DATA_DIR/store``)."""
    return FIX.replace("DATA_DIR", str(Path(store_path).parent))


def advice(store_path: str | Path) -> str:
    """How to find out what is damaged in the store at ``store_path``, and the remedies."""
    return (
        f"zmesh store check {Path(store_path).parent} lists what is damaged; {remedy(store_path)}"
    )


def read_failed(exc: Exception, path: str, what: str) -> StoreError:
    """The StoreError of a read LMDB refused (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, and the
    MDB_BAD_TXN that follows them): the store is damaged."""
    return StoreError(f"reading {what} failed ({exc}): the store is damaged; {remedy(path)}", path)


class Corrupt(NamedTuple):
    """A record that could not be decoded."""

    db: str
    key: bytes
    value: bytes
    reason: str


def check_store_files(path: Path, used_bytes: int = MIN_DATA_BYTES) -> None:
    """Refuse a store directory that has lost or truncated its data file: one shorter than
    ``used_bytes``, the least an LMDB store has (or what its meta says it uses)."""
    if path.exists() and not path.is_dir():
        raise StoreError(f"{path} is not a directory, where the store's files go", str(path))
    data = path / "data.mdb"
    if data.exists():
        size = data.stat().st_size
        if size < used_bytes:
            raise StoreError(
                f"{data} is {size} bytes, where its store needs {used_bytes} (it was "
                f"truncated?); {remedy(path)}",
                str(path),
            )
    elif path.is_dir() and any(path.iterdir()):
        raise StoreError(
            f"{data} is missing but the store directory is not empty; {remedy(path)}", str(path)
        )


def decode_or_none(data: bytes | memoryview) -> Any:
    """msgpack-decoded ``data``, or None when it is not valid msgpack."""
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        return None


def decode_record(data: bytes | memoryview) -> list[Any] | None:
    """An outbox record's fields (each of its own type, in the order ``RECORD_FIELDS``
    names), or None when the record is damaged.

    A record stored before messages had indexes (nine fields) gets index None.
    """
    fields = decode_or_none(data)
    if (
        not isinstance(fields, list)
        or len(fields) not in (RECORD_FIELDS - 1, RECORD_FIELDS)
        or not isinstance(fields[8], bytes)
    ):
        return None
    if len(fields) < RECORD_FIELDS:
        fields.append(None)
    return fields


RUN_FIELDS = 7  # runs values: [topic, partitions, keys, headers, published_at, payloads,
#                               indexes]; published_at one time, or little-endian doubles
#                               (a list of numbers in records written before), one per
#                               message; partitions and indexes little-endian bytes ("B" or
#                               "H" each, "I" or "q" each), or lists of ints in records
#                               written before


def decode_run(data: bytes | memoryview) -> list[Any] | None:
    """A run record's fields (see _engine/runs.py), its partitions an array of "B" or "H",
    its indexes of "I" or "q", its publish time a float or an array of "d"; or None when
    the record is damaged: every column as long as the payloads, payloads bytes,
    partitions and indexes non-negative numbers, publish times numbers."""
    fields = decode_or_none(data)
    if not isinstance(fields, list) or len(fields) != RUN_FIELDS:
        return None
    topic, partitions, keys, headers, published_at, payloads, indexes = fields
    n = len(payloads) if isinstance(payloads, list) else 0
    if not (
        n
        and isinstance(topic, str)
        and (keys is None or isinstance(keys, list) and len(keys) == n)
        and (headers is None or isinstance(headers, dict))
        and set(map(type, payloads)) == {bytes}
    ):
        return None
    fields[1] = partitions = number_column(partitions, n, "BH")
    fields[4] = published_at = _times(published_at, n)
    fields[6] = indexes = number_column(indexes, n, "Iq")
    if partitions is None or published_at is None or indexes is None:
        return None
    return fields


def _times(value: Any, n: int) -> float | array[float] | None:
    """A run's publish times: one for the whole run (a float), or ``n`` as an array of
    doubles, from their little-endian bytes or from a list of numbers (older records);
    None when ``value`` is none of these."""
    if type(value) in (int, float):
        return float(value)
    if type(value) is bytes:
        return le_column(value, n, "d")
    if type(value) is list and len(value) == n and set(map(type, value)) <= {int, float}:
        return array("d", value)
    return None


def run_offsets(value: Any, n: int) -> range | list[int] | None:
    """A run entry's offsets (of a run of ``n`` messages): None (all owed), an int (those
    from it to the end) as a range, or an ascending list; ValueError when they are none
    of these within the run."""
    if value is None:
        return None
    if type(value) is int and 0 <= value < n:
        return range(value, n)
    if (
        type(value) is list
        and value
        and set(map(type, value)) <= {int}
        and value[0] >= 0
        and value[-1] < n
        and all(map(lt, value, islice(value, 1, None)))
    ):
        return value
    raise ValueError("bad offsets in a run entry")


def number_column(value: Any, n: int, codes: str) -> array[int] | None:
    """``n`` non-negative numbers as an array of the first type of ``codes`` they fit:
    from their little-endian bytes, or from a list of ints (older records); None when
    ``value`` is neither."""
    if type(value) is bytes:
        column = le_column(value, n, codes)
        if column is not None and column.typecode == "q" and min(column) < 0:
            return None
        return column
    if (
        type(value) is not list
        or len(value) != n
        or set(map(type, value)) != {int}
        or min(value) < 0
    ):
        return None
    try:
        return fitting_array(codes, value)
    except OverflowError:
        return None
