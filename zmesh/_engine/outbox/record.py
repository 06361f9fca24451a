"""What the outbox holds of one message, and what a data batch carries of several.

``Record`` is a message's stored fields, in the order of its ``msgs`` record (a
``memory`` message is kept as its ``Record``, packed only if it spills). ``Columns`` are
the fields a batch carries of a take's messages, a column each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..._store.store import pack


class Record(NamedTuple):
    """One message as the outbox stores it (the ``msgs`` db's value, in this order)."""

    topic: str
    partition: int
    key: str | None
    headers: dict[str, Any] | None
    priority: int
    published_at: float
    expires_at: float | None
    deliver_at: float | None
    payload: bytes
    part_index: int | None  # its index in its partition (``msg.index``)


def carried_bytes(record: Record) -> int:
    """About what a reply carrying ``record`` holds of it (a fetch's or a page of kept
    values, cut at a number of these): its payload, key and packed headers, which may be
    64 KiB where the payload is a few bytes."""
    size = len(record.payload) + len(record.key or "")
    return size + len(pack(record.headers)) if record.headers else size


def as_record(fields: Sequence[Any]) -> Record:
    """A decoded record's fields (a list, as msgpack gives them) as a ``Record``."""
    return Record._make(fields)


class Columns(NamedTuple):
    """The fields a data batch carries of a take's messages, a column each, in the order
    of the take's sequences. ``inline``: known to travel inside a batch's header whole
    (together within ``INLINE_PAYLOAD_BYTES``, none large), with no look at each."""

    keys: Sequence[str | None]
    headers: Sequence[dict[str, Any] | None]
    published_ats: Sequence[float]
    indexes: Sequence[int | None]
    payloads: Sequence[bytes]
    inline: bool = False


def columns_of(records: Sequence[Record]) -> Columns:
    """The columns of messages given as their records."""
    (_t, _p, keys, headers, _prio, published_ats, _e, _d, payloads, indexes) = zip(
        *records, strict=True
    )
    return Columns(keys, headers, published_ats, indexes, payloads)
