"""Handing a producer's ready messages to live members (IO thread, once per loop).

A message is sent from the fields it was staged with while ``Decoded`` keeps them, else
its record is read from LMDB and decoded (and kept, for a topic with several lanes); a
``memory`` message not spilled is kept as its fields and never packed. A record that
cannot be decoded is set aside and settled, never sent; one that is missing is settled as
lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ..._protocol.codec import PackedColumns
from ..._store.damage import decode_record
from ..._store.store import WriteBatch, u64
from ..lane.delivery import Taken
from ..lane.lane import Lane
from .outcomes import Outcome
from .staging import UNCLAIMED, oldest

if TYPE_CHECKING:
    from .producer import Producer

log = logging.getLogger(__name__)

_PAYLOAD: Callable[[Any], bytes] = itemgetter(8)  # a message's payload in its fields
_RUN_SIZE: Callable[[Any], int] = itemgetter(1)  # a kept run's bytes as counted


class Columns(NamedTuple):
    """The fields a data batch carries of a take's messages, a column each, in the order
    of the take's sequences. ``inline``: known to travel inside a batch's header whole
    (together within ``INLINE_PAYLOAD_BYTES``, none large), with no look at each."""

    keys: Sequence[str | None]
    headers: Sequence[dict | None]
    published_ats: Sequence[float]
    indexes: Sequence[int | None]
    payloads: Sequence[bytes]
    inline: bool = False


def columns_of(fields: Sequence[Sequence]) -> Columns:
    """The columns of messages given as their fields (a record's, decoded)."""
    (_t, _p, keys, headers, _prio, published_ats, _e, _d, payloads,
     indexes) = zip(*fields, strict=True)
    return Columns(keys, headers, published_ats, indexes, payloads)

DECODED_KEPT_BYTES = 8 << 20  # what the records kept decoded may take
_ENTRY_BYTES = 440  # a record's decoded fields and its map entry, besides the payload


class Decoded:
    """The fields of stored records, kept from staging (while a member is there to take
    them and the map is under its limit) or from their first read (for a topic with
    several lanes) until the message leaves the outbox, so sending them needs no read and
    no decoding. Past ``limit`` bytes the oldest go first, at the start of a dispatch call
    only: one that found a record here must find it again (a group far behind the others
    reads its records again)."""

    __slots__ = ("fields", "runs", "bytes", "limit")

    def __init__(self, limit: int = DECODED_KEPT_BYTES) -> None:
        self.fields: dict[int, Sequence] = {}  # in the order kept: the oldest first
        # Runs (runs.py) kept whole: first sequence -> (decoded record, bytes as counted)
        self.runs: dict[int, tuple[list, int]] = {}
        self.bytes = 0
        self.limit = limit

    def keep(self, seq: int, fields: Sequence) -> None:
        self.fields[seq] = fields
        self.bytes += len(fields[8]) + _ENTRY_BYTES

    def forget(self, seqs: Iterable[int]) -> None:
        """Drop what is kept of ``seqs`` (messages that left the outbox)."""
        gone = list(filter(None, map(self.fields.pop, seqs, repeat(None))))
        if gone:
            self.bytes -= sum(map(len, map(_PAYLOAD, gone))) + _ENTRY_BYTES * len(gone)

    def keep_run(self, first: int, record: list, size: int) -> None:
        """Keep a run's decoded record (``size``: the bytes it counts for)."""
        self.runs[first] = (record, size)
        self.bytes += size

    def forget_runs(self, firsts: Iterable[int]) -> None:
        for first in firsts:
            kept = self.runs.pop(first, None)
            if kept is not None:
                self.bytes -= kept[1]

    def trim(self) -> None:
        """Drop the oldest past the limit (runs first: a run is sent whole, soon after it
        is kept, while single messages wait for the other lanes)."""
        excess = self.bytes - self.limit
        if self.runs:
            firsts, freed = oldest(self.runs, excess, _RUN_SIZE)
            self.forget_runs(firsts)
            excess -= freed
        if excess > 0:
            seqs, _ = oldest(self.fields, excess, lambda fields: len(fields[8]) + _ENTRY_BYTES)
            self.forget(seqs)


PACKED_KEPT_BYTES = 4 << 20  # what the batch columns kept packed may take


def _packed_size(columns: PackedColumns) -> int:
    before, after, extra = columns
    return len(before) + sum(map(len, after)) + sum(map(len, extra))


class Packed:
    """Batch columns packed for one lane of a topic with several groups, by their
    sequences: the other lanes send the same messages, mostly in the same batches, in
    the same dispatch or a later one. The newest are kept, up to ``limit`` bytes."""

    __slots__ = ("columns", "bytes", "limit")

    def __init__(self, limit: int = PACKED_KEPT_BYTES) -> None:
        self.columns: dict[tuple[int, ...] | range, PackedColumns] = {}
        self.bytes = 0
        self.limit = limit

    def keep(self, seqs: tuple[int, ...] | range, columns: PackedColumns) -> None:
        self.columns[seqs] = columns
        self.bytes += _packed_size(columns)
        if self.bytes > self.limit:
            drop, freed = oldest(self.columns, self.bytes - self.limit // 2, _packed_size)
            for key in drop:
                del self.columns[key]
            self.bytes -= freed


def dispatch(producer: Producer, now: float,
             send: Callable[[bytes, Lane, Taken, Columns], int],
             batch: WriteBatch) -> int:
    """Hand ready messages (decoded records) to live members; ``send`` returns how many
    left. A record that cannot be decoded is set aside and settled, never sent."""
    sent_total = 0
    mem = producer._mem
    decoded = producer.decoded
    if decoded.bytes > decoded.limit:
        decoded.trim()
    known = decoded.fields
    ready = producer.ready
    # The lanes of a topic mostly take the same sequences: a run's columns are made once.
    made: dict[range, Columns] = {}
    for lane in list(ready):
        if not lane.ready_count or not lane.members or lane.name == UNCLAIMED:
            del ready[lane]  # (back when it gets ready messages, or a member)
            continue
        topic = lane.topic
        taken, expired = lane.take(now)
        if expired:
            producer._count(lane, "expired", len(expired))
            producer._settled(topic, lane, expired, batch, Outcome.EXPIRED)
        if not taken:
            continue
        if producer.runs:  # runs holding all of a take send their columns as they are
            for member, out in list(taken.items()):
                seqs, limit = out.seqs, lane.members[member].max_message_bytes
                columns = made.get(seqs) if type(seqs) is range and \
                    limit >= producer.payload_bound else None  # (else checked against it)
                if columns is None:
                    columns = producer.run_columns(seqs, limit)
                    if columns is not None and type(seqs) is range:
                        made[seqs] = columns
                if columns is not None:
                    del taken[member]
                    sent_total += _send(send, member, lane, out, columns, now)
        # The common case, every record kept decoded (or as a memory message's fields),
        # found with no Python call per message.
        kept = mem if producer.topic_config(topic).durability == "memory" else known
        looked = [(member, out, list(map(kept.get, out.seqs))) for member, out in taken.items()]
        need = [seq for _member, out, fields in looked if None in fields
                for seq, fields_of in zip(out.seqs, fields, strict=True)
                if fields_of is None and seq not in mem]
        in_runs = producer.run_messages(need, batch) if need and producer.runs else {}
        if in_runs:
            need = [seq for seq in need if seq not in in_runs]
        records = producer.store.get_messages(need) if need else {}
        shared = len(producer.by_topic.get(topic, ())) > 1  # other lanes will send them
        for member, out, fields in looked:
            missing = []
            for i in _gaps(fields):
                seq = out.seqs[i]
                # (memory: never packed; a run's: kept decoded whole, see Producer)
                fields_of = known.get(seq) or mem.get(seq) or in_runs.get(seq)
                if fields_of is None:
                    record = records.get(seq)
                    fields_of = None if record is None else decode_record(record)
                    if fields_of is not None:
                        if len(fields_of[8]) > producer.payload_bound:
                            producer.payload_bound = len(fields_of[8])
                        if shared:
                            decoded.keep(seq, fields_of)
                    else:
                        if record is not None:
                            producer.set_aside("msgs", u64(seq), record,
                                               "an outbox record: settled for every group",
                                               batch)
                        missing.append(seq)
                fields[i] = fields_of
            if missing:
                out, fields = _select(out, fields, [f is not None for f in fields])
                _drop(producer, topic, missing, batch)
            limit = lane.members[member].max_message_bytes
            if limit < producer.payload_bound and out.seqs and \
                    max(map(len, map(_PAYLOAD, fields))) > limit:
                out, fields = _refuse_oversized(producer, lane, member, limit, out, fields,
                                                batch)
            if out.seqs:
                sent_total += _send(send, member, lane, out,
                                    columns_of(cast("list[Sequence]", fields)), now)
    return sent_total


def _send(send: Callable[[bytes, Lane, Taken, Columns], int], member: bytes, lane: Lane,
          out: Taken, columns: Columns, now: float) -> int:
    """``send``; what did not leave is ready again."""
    sent = send(member, lane, out, columns)
    if sent < len(out):
        lane.unsend(out.seqs[sent:], now)
    return sent


def _gaps(fields: list) -> list[int]:
    """The places of None in ``fields`` (none, mostly: found at C speed)."""
    return [i for i, f in enumerate(fields) if f is None] if None in fields else []


def _drop(producer: Producer, topic: str, seqs: list[int], batch: WriteBatch) -> None:
    """Messages whose record is gone or damaged: settle them for every lane owing them."""
    bad = {k for db, k, _v in batch.quarantine if db == "msgs"}
    lost = [s for s in seqs if u64(s) not in bad]
    if lost:
        log.error("outbox records missing for %d messages of %s; settled as lost",
                  len(lost), topic)
        producer.counters.add("lost_records", len(lost))
    for seq in seqs:
        for owing in producer._owing(topic, seq):
            owing.ack([seq])
            producer._settled(topic, owing, [seq], batch, Outcome.LOST)


def _select(out: Taken, fields: list, keep: list[bool]) -> tuple[Taken, list]:
    """The messages of ``out`` (and their fields) where ``keep`` is true."""
    kept, kept_fields = Taken(), []
    seqs, partitions, attempts = [], [], []
    for seq, partition, attempt, f, k in zip(out.seqs, out.partitions, out.attempts, fields,
                                             keep, strict=True):
        if k:
            seqs.append(seq)
            partitions.append(partition)
            attempts.append(attempt)
            kept_fields.append(f)
    kept.seqs, kept.partitions, kept.attempts = seqs, partitions, attempts
    return kept, kept_fields


def _refuse_oversized(producer: Producer, lane: Lane, member: bytes, limit: int, out: Taken,
                      fields: list, batch: WriteBatch) -> tuple[Taken, list]:
    """Park the messages whose payload is larger than ``member`` accepts (``limit``, its
    node's ``max_message_bytes``, from its hello) as dead letters of the lane: sent, they
    would be dropped as undecodable and come back after every ack timeout. Returns the rest."""
    sizes = list(map(len, map(_PAYLOAD, fields)))
    for seq, size in zip(out.seqs, sizes, strict=True):
        if size > limit:
            producer.on_fail(lane.topic, lane.name, seq,
                             f"payload of {size} bytes is larger than the max_message_bytes "
                             f"({limit}) of consumer node {member.hex()[:12]}", batch)
    refused = sum(size > limit for size in sizes)
    producer.counters.add("refused_oversized", refused)
    log.warning("%d messages of %s parked as dead letters of lane %s: their payload is "
                "larger than the max_message_bytes (%d) of consumer node %s", refused,
                lane.topic, lane.name, limit, member.hex()[:12])
    return _select(out, fields, [size <= limit for size in sizes])
