"""Handing a producer's ready messages to live members (IO thread, once per loop).

A message is sent from the record it was staged with while ``Decoded`` keeps it, else
its record is read from LMDB and decoded (and kept, for a topic with several lanes); a
``memory`` message not spilled is kept as its record and never packed. A record that
cannot be decoded is set aside and settled, never sent; one that is missing, or that LMDB
cannot read (a damaged store), is settled as lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from operator import attrgetter
from typing import cast

from ..._store.store import WriteBatch, u64
from ..lane.delivery import Taken
from ..lane.lane import Lane
from ..stats import Counters
from .lanes import UNCLAIMED, Lanes
from .outcomes import Outcome
from .record import Columns, Record, columns_of
from .records import Records
from .settle import Settler

log = logging.getLogger(__name__)

_payload: Callable[[Record], bytes] = attrgetter("payload")

Send = Callable[[bytes, Lane, Taken, Columns], int]


class Dispatcher:
    """Hands one producer's ready messages to live members."""

    def __init__(
        self, lanes: Lanes, records: Records, settler: Settler, counters: Counters
    ) -> None:
        self.lanes = lanes
        self.records = records
        self.settler = settler
        self.counters = counters

    def dispatch(self, now: float, send: Send, batch: WriteBatch) -> int:
        """Hand ready messages to live members; ``send`` returns how many left. A record
        that cannot be decoded is set aside and settled, never sent."""
        sent_total = 0
        records = self.records
        mem = records.mem
        decoded = records.decoded
        if decoded.bytes > decoded.limit:
            decoded.trim()
        known = decoded.fields
        ready = self.lanes.ready
        # The lanes of a topic mostly take the same sequences: a run's columns are made once.
        made: dict[range, Columns] = {}
        for lane in list(ready):
            if not lane.ready_count or not lane.members or lane.name == UNCLAIMED:
                del ready[lane]  # (back when it gets ready messages, or a member)
                continue
            topic = lane.topic
            taken, expired = lane.take(now)
            self.lanes.note_assigned(lane, batch)
            if expired:
                self.lanes.count(lane, "expired", len(expired))
                self.settler.settled(lane, expired, batch, Outcome.EXPIRED)
            if not taken:
                continue
            if records.runs:  # runs holding all of a take send their columns as they are
                for member, out in list(taken.items()):
                    seqs, limit = out.seqs, lane.members[member].max_message_bytes
                    columns = (
                        made.get(seqs)
                        if type(seqs) is range and limit >= records.payload_bound
                        else None
                    )  # (else checked against it)
                    if columns is None:
                        columns = records.run_columns(seqs, limit)
                        if columns is not None and type(seqs) is range:
                            made[seqs] = columns
                    if columns is not None:
                        del taken[member]
                        sent_total += _send(send, member, lane, out, columns, now)
            # The common case, every record kept decoded (or as a memory message's),
            # found with no Python call per message.
            kept = mem if self.lanes.config(topic).durability == "memory" else known
            looked = [(member, out, list(map(kept.get, out.seqs))) for member, out in taken.items()]
            need = [
                seq
                for _member, out, found in looked
                if None in found
                for seq, record in zip(out.seqs, found, strict=True)
                if record is None and seq not in mem
            ]
            in_runs = records.run_messages(need, batch) if need and records.runs else {}
            if in_runs:
                need = [seq for seq in need if seq not in in_runs]
            stored = records.read(need, batch) if need else {}
            shared = len(self.lanes.of_topic(topic)) > 1  # other lanes will send them
            for member, out, found in looked:
                missing = []
                for i in _gaps(found):
                    seq = out.seqs[i]
                    # (memory: never packed; a run's: kept decoded whole, see Records)
                    record = known.get(seq) or mem.get(seq) or in_runs.get(seq)
                    if record is None:
                        record = stored.get(seq)
                        if record is None:
                            missing.append(seq)
                        elif shared:
                            decoded.keep(seq, record)
                    found[i] = record
                if missing:
                    out, found = _select(out, found, [f is not None for f in found])
                    self._drop(topic, missing, batch)
                limit = lane.members[member].max_message_bytes
                if (
                    limit < records.payload_bound
                    and out.seqs
                    and max(map(len, map(_payload, cast("list[Record]", found)))) > limit
                ):
                    out, found = self._refuse_oversized(lane, member, limit, out, found, batch)
                if out.seqs:
                    sent_total += _send(
                        send, member, lane, out, columns_of(cast("list[Record]", found)), now
                    )
        return sent_total

    def _drop(self, topic: str, seqs: list[int], batch: WriteBatch) -> None:
        """Messages whose record is gone, damaged or unreadable: settle them for every lane
        owing them."""
        bad = {k for db, k, _v in batch.quarantine if db == "msgs"}
        lost = [s for s in seqs if u64(s) not in bad]
        if lost:
            log.error(
                "outbox records of %d messages of %s are missing or cannot be read; settled "
                "as lost",
                len(lost),
                topic,
            )
            self.counters.add("lost_records", len(lost))
        for seq in seqs:
            for owing in self.lanes.owing(topic, seq):
                owing.ack([seq])
                self.settler.settled(owing, [seq], batch, Outcome.LOST)

    def _refuse_oversized(
        self,
        lane: Lane,
        member: bytes,
        limit: int,
        out: Taken,
        found: list[Record | None],
        batch: WriteBatch,
    ) -> tuple[Taken, list[Record | None]]:
        """Park the messages whose payload is larger than ``member`` accepts (``limit``, its
        node's ``max_message_bytes``, from its hello) as dead letters of the lane: sent, they
        would be dropped as undecodable and come back after every ack timeout. Returns the
        rest."""
        sizes = list(map(len, map(_payload, cast("list[Record]", found))))  # (none missing)
        for seq, size in zip(out.seqs, sizes, strict=True):
            if size > limit:
                self.settler.on_fail(
                    lane.topic,
                    lane.name,
                    seq,
                    f"payload of {size} bytes is larger than the "
                    f"max_message_bytes ({limit}) of consumer node "
                    f"{member.hex()[:12]}",
                    batch,
                )
        refused = sum(size > limit for size in sizes)
        self.counters.add("refused_oversized", refused)
        log.warning(
            "%d messages of %s parked as dead letters of lane %s: their payload is "
            "larger than the max_message_bytes (%d) of consumer node %s",
            refused,
            lane.topic,
            lane.name,
            limit,
            member.hex()[:12],
        )
        return _select(out, found, [size <= limit for size in sizes])


def _send(send: Send, member: bytes, lane: Lane, out: Taken, columns: Columns, now: float) -> int:
    """``send``; what did not leave is ready again."""
    sent = send(member, lane, out, columns)
    if sent < len(out):
        lane.unsend(out.seqs[sent:], now)
    return sent


def _gaps(found: list[Record | None]) -> list[int]:
    """The places of None in ``found`` (none, mostly: found at C speed)."""
    return [i for i, f in enumerate(found) if f is None] if None in found else []


def _select(
    out: Taken, found: list[Record | None], keep: list[bool]
) -> tuple[Taken, list[Record | None]]:
    """The messages of ``out`` (and their records) where ``keep`` is true."""
    kept, kept_found = Taken(), []
    seqs, partitions, attempts = [], [], []
    for seq, partition, attempt, f, k in zip(
        out.seqs, out.partitions, out.attempts, found, keep, strict=True
    ):
        if k:
            seqs.append(seq)
            partitions.append(partition)
            attempts.append(attempt)
            kept_found.append(f)
    kept.seqs, kept.partitions, kept.attempts = seqs, partitions, attempts
    return kept, kept_found
