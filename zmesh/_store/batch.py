"""The write batch: everything one loop iteration of the IO thread commits at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .chunks import chunk_masks


@dataclass(slots=True)
class WriteBatch:
    """Everything one loop iteration of the IO thread writes, in one transaction."""

    msgs_put: list[tuple[bytes, bytes]] = field(default_factory=list)
    msgs_del: list[bytes] = field(default_factory=list)
    pend_put: list[tuple[bytes, bytes]] = field(default_factory=list)
    # New messages' pending entries, lane by lane: (lane key prefix, sequence keys, values).
    # Their (key, value) pairs are made only while LMDB takes them: a publish's pairs for
    # every lane would otherwise live until the commit, for the garbage collector to walk.
    pend_runs: list[tuple[bytes, list[bytes], list[bytes]]] = field(default_factory=list)
    pend_del: list[bytes] = field(default_factory=list)
    # Runs (see _engine/runs.py): new records and their lanes' entries; records deleted;
    # lanes' entries rewritten (a value) or deleted (None) by settling, the last one wins.
    runs_put: list[tuple[bytes, bytes]] = field(default_factory=list)
    prun_put: list[tuple[bytes, bytes]] = field(default_factory=list)
    runs_del: list[bytes] = field(default_factory=list)
    prun_set: dict[bytes, bytes | None] = field(default_factory=dict)
    # the consumer's acks: (producer, lane, seqs) and prunes: (producer, floor, lane)
    seen_put: list[tuple[bytes, bytes, Sequence[int]]] = field(default_factory=list)
    # acks' bits given per chunk: (producer, lane, {chunk: bits}) (acked.py), those of
    # acks sent while a full disk kept them out of the window (written when it has room)
    seen_masks: list[tuple[bytes, bytes, dict[int, int]]] = field(default_factory=list)
    seen_prune: list[tuple[bytes, int, bytes]] = field(default_factory=list)
    # producers' last-heard times (the clock's observed time), and producers whose part of
    # the window is forgotten whole (acked.py)
    seen_heard: dict[bytes, float] = field(default_factory=dict)
    seen_forget: list[bytes] = field(default_factory=list)
    lanes_put: list[tuple[bytes, bytes]] = field(default_factory=list)
    # Lanes retired (a group deleted or expired): (lanes key, lane id), with every
    # pending entry, run entry and dead letter of theirs.
    lanes_del: list[tuple[bytes, int]] = field(default_factory=list)
    dead_put: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead_del: list[bytes] = field(default_factory=list)
    meta_put: dict[bytes, bytes] = field(default_factory=dict)
    ids_put: list[tuple[bytes, int, float]] = field(default_factory=list)
    peers_put: dict[bytes, bytes] = field(default_factory=dict)
    peers_del: list[bytes] = field(default_factory=list)
    # message indexes (see _engine/retention.py): (rlog key, value, rtime key, value);
    # (rnext key, next index), applied in order; (rlog key, rtime key) to delete
    log_put: list[tuple[bytes, bytes, bytes, bytes]] = field(default_factory=list)
    log_next: list[tuple[bytes, int]] = field(default_factory=list)
    log_del: list[tuple[bytes, bytes]] = field(default_factory=list)
    # (db name, key, raw value): records that cannot be decoded, moved to the ``bad`` db
    quarantine: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    ids_prune_before: float = 0.0
    fsync: bool = False
    msgs_bytes: int = 0  # bytes of the records in msgs_put and runs_put (the room check)
    # Bytes of the large records deleted, as far as known: deleting a record maps its
    # pages into the process (``MappedPages``), as writing or reading it does.
    del_bytes: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.msgs_put
            or self.msgs_del
            or self.pend_put
            or self.pend_runs
            or self.pend_del
            or self.runs_put
            or self.prun_put
            or self.runs_del
            or self.prun_set
            or self.seen_put
            or self.seen_masks
            or self.seen_prune
            or self.seen_heard
            or self.seen_forget
            or self.lanes_put
            or self.lanes_del
            or self.dead_put
            or self.dead_del
            or self.meta_put
            or self.ids_put
            or self.ids_prune_before
            or self.peers_put
            or self.peers_del
            or self.quarantine
            or self.log_put
            or self.log_next
            or self.log_del
        )

    def pending_entries(self) -> int:
        """The pending entries this batch puts."""
        return (
            len(self.pend_put)
            + len(self.prun_put)
            + sum(len(seqs) for _, seqs, _ in self.pend_runs)
        )

    def frees_space(self) -> bool:
        """True when committing this batch deleted stored records."""
        return bool(
            self.msgs_del
            or self.pend_del
            or self.dead_del
            or self.seen_prune
            or self.seen_forget
            or self.log_del
            or self.runs_del
            or self.lanes_del
            or None in self.prun_set.values()
        )

    def mark(self) -> dict[str, int]:
        """The length of every list now; ``truncate`` drops what was added after."""
        return {name: len(getattr(self, name)) for name in _LISTS}

    def truncate(self, mark: dict[str, int]) -> None:
        for name, n in mark.items():
            del getattr(self, name)[n:]
        self.msgs_bytes = sum(len(v) for _k, v in self.msgs_put) + sum(
            len(v) for _k, v in self.runs_put
        )

    def without_growth(self) -> WriteBatch:
        """The part of the batch that frees space (the last resort when the map is full).

        Parked messages (``dead_put``) and new lanes stay with the deletes: dropping them
        while deleting the outbox records they came from would lose messages. So do the
        acks' dedupe bits (``seen_put``, ``seen_masks``; a commit that must do without
        them, after a failure other than a full store, clears them first): without them
        an ack is either sent unrecorded or rolled back and handled again
        (_engine/commit.py).
        """
        return WriteBatch(
            msgs_del=self.msgs_del,
            pend_del=self.pend_del,
            runs_del=self.runs_del,
            del_bytes=self.del_bytes,
            prun_set=self.prun_set,
            dead_del=self.dead_del,
            dead_put=self.dead_put,
            lanes_put=self.lanes_put,
            lanes_del=self.lanes_del,
            seen_put=self.seen_put,
            seen_masks=self.seen_masks,
            seen_prune=self.seen_prune,
            seen_forget=self.seen_forget,
            meta_put=self.meta_put,
            ids_prune_before=self.ids_prune_before,
            quarantine=self.quarantine,
            log_del=self.log_del,
        )

    def settlement_pieces(self, size: int) -> Iterator[WriteBatch]:
        """What ``without_growth`` keeps, as batches of at most ``size`` deletions each,
        the first with everything else; then the run entries, and last the acks' dedupe
        bits, ``size`` chunks a piece (as ``seen_masks``). On a full disk a commit copies
        every page it changes to a free one, and the pages it frees are reused two
        commits later: a small piece fits where the whole would not, and the pieces after
        it reuse what the ones before freed."""
        whole = self.without_growth()
        keys = [(name, key) for name in _DELETIONS for key in getattr(whole, name)]
        runs = list(whole.prun_set.items())
        empty: dict[str, Any] = {name: [] for name in _DELETIONS}
        piece = dataclasses.replace(whole, prun_set={}, seen_put=[], seen_masks=[], **empty)
        for start in range(0, max(len(keys), 1), size):
            for name, key in keys[start : start + size]:
                getattr(piece, name).append(key)
            yield piece
            piece = WriteBatch()
        for start in range(0, len(runs), size):
            yield WriteBatch(prun_set=dict(runs[start : start + size]))
        yield from self.seen_pieces(size)

    def seen_pieces(self, size: int) -> Iterator[WriteBatch]:
        """The acks' dedupe bits of this batch (``seen_put`` and ``seen_masks``) as
        batches of at most ``size`` chunks each."""
        chunks = [
            (producer, lane, chunk, bits)
            for producer, lane, masks in self.seen_masks
            + [(p, lane, chunk_masks(seqs)) for p, lane, seqs in self.seen_put if seqs]
            for chunk, bits in masks.items()
        ]
        for start in range(0, len(chunks), size):
            piece = WriteBatch()
            for producer, lane, chunk, bits in chunks[start : start + size]:
                last = piece.seen_masks[-1] if piece.seen_masks else None
                if last is None or last[:2] != (producer, lane):
                    last = (producer, lane, {})
                    piece.seen_masks.append(last)
                masks = last[2]
                masks[chunk] = masks.get(chunk, 0) | bits
            yield piece


_LISTS = tuple(f.name for f in fields(WriteBatch) if f.default_factory is list)
# What settling deletes (prun_set's deletions and rewrites go in pieces of their own).
_DELETIONS = ("msgs_del", "pend_del", "runs_del", "dead_del", "log_del")
