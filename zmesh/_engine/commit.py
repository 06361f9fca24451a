"""Committing the IO thread's write batch, and what a failed commit means.

A full map is the failure that matters: it is grown when ``max_map_size_bytes`` allows;
otherwise the batch is committed again without its publishes (held, see held.py) and
without the consumer's acks (rolled back, not sent, so their messages come again), and
transactions fail. Any other store error fails the publishes and transactions and keeps
only what frees space. Runs on the IO thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .._store.store import Store, WriteBatch, u64
from ..errors import StoreError, StoreFullError
from .held import Held
from .outbox.publishes import message_count, payload_bytes

if TYPE_CHECKING:
    from .inbox.consumer import Consumer
    from .outbox.publishes import AnyPublish
    from .outbox.staging import Staging
    from .stats import Counters

log = logging.getLogger(__name__)

# Deletions per commit when a full disk refuses the whole of them: a page each at most,
# a fraction of the disk's reserve (disk.py).
SETTLEMENT_PIECE = 200


class Waiter(Protocol):
    """A call or transaction waiting for the commit of its loop iteration."""

    tx: bool
    writes: bool  # False: it staged nothing, and a failed commit leaves it alone
    error: BaseException | None


class Committer:
    """Commits write batches for one engine; owns the publishes a full map holds."""

    def __init__(
        self,
        store: Store,
        staging: Staging,
        consumer: Consumer,
        counters: Counters,
        max_map_size_bytes: int,
        held: Held,
    ) -> None:
        self.store = store
        self.staging = staging
        self.consumer = consumer
        self.counters = counters
        self.max_map_size_bytes = max_map_size_bytes
        self.held = held
        self.tx_pubs: set[int] = set()  # ids of this iteration's transaction publishes
        # Told every batch committed (what of it the replicas copy: replica/streams.py).
        self.committed: Callable[[WriteBatch], None] = _nothing

    def store_pubs(
        self,
        wb: WriteBatch,
        pubs: list[AnyPublish],
        calls: Sequence[Waiter],
        now: float,
        next_wb: WriteBatch,
    ) -> tuple[tuple[int, int], list[AnyPublish]]:
        """Stage the loop's publishes (and held ones due for a retry) and commit.

        Returns (publishes, payload bytes) no longer waiting: stored or failed (held
        publishes are neither, so they still count against the outbox); and the
        publishes now stored.
        """
        held_before = self.held.count
        if not pubs and not held_before:  # (most iterations of a consumer): nothing staged
            self.commit(wb, [], calls, None, now)
            return (0, 0), []
        held_bytes = self.held.bytes if held_before else 0
        pubs_in, bytes_in = message_count(pubs), payload_bytes(pubs)
        pubs = self.held.admit(pubs, self.tx_pubs, now)
        self.staging.prepare_lanes(pubs, wb, now)
        mark = wb.mark() if pubs else None  # what follows is the publishes' part
        fresh = self.staging.stage(pubs, wb)
        stored = self.commit(wb, fresh, calls, mark, now)
        self.staging.added(stored, now, next_wb)
        self.tx_pubs.clear()
        return (
            held_before + pubs_in - self.held.count,
            held_bytes + bytes_in - self.held.bytes,
        ), stored

    def commit(
        self,
        wb: WriteBatch,
        pubs: list[AnyPublish],
        calls: Sequence[Waiter] | None = None,
        mark: dict[str, int] | None = None,
        now: float = 0.0,
    ) -> list[AnyPublish]:
        """Commit the loop's batch; returns the publishes that are now stored.

        ``mark`` (from ``WriteBatch.mark``) says where the publishes' part of ``wb`` starts;
        None when nothing was staged for this commit (nothing to give back if it fails).
        """
        if not wb:
            return pubs
        try:
            self._commit_growing(wb)
            self.committed(wb)
            if not self.store.disk.reserve_held:
                self.store.disk.make_reserve()
            if wb.frees_space():
                self.held.freed()
            if self.held.stored():
                log.warning(
                    "the store %s has room again; held publishes are stored", self.store.path
                )
            return pubs
        except StoreFullError as exc:
            error: StoreError = exc
            full = True
        except StoreError as exc:
            error = exc
            full = False
        self.counters.add("store_full" if full else "store_errors", 1)
        if mark is not None:
            pubs = pubs + self.staging.unstage(pubs)
        keep = [p for p in pubs if id(p) not in self.tx_pubs]
        for p in pubs:
            if not (full and id(p) not in self.tx_pubs):
                p.stage.error = error
        if not full:
            log.error("%s", error)
        elif keep and self.held.hold(keep, now):
            log.error("%s; publishes wait for room (acks that delete messages)", error)
        for call in calls or ():
            if call.tx or (call.writes and not full):
                call.error = error
        self.consumer.rollback()
        wb.seen_put.clear()
        if mark is not None:
            wb.truncate(mark)
        if full:
            # Never leave the failure without a commit: LMDB reuses the pages a commit
            # freed only from the second commit after it, so an idle node whose last
            # commit deleted the backlog would otherwise stay full for good.
            wb.meta_put[b"store_full_at"] = u64(int(time.time()))
        # A full map: the rest of the batch (settlements, lanes, dead letters, calls) may
        # still fit. Any other error: keep only what frees space, as a last resort.
        last: StoreError = error
        for attempt in (wb, wb.without_growth()) if full else (wb.without_growth(),):
            try:
                self.store.commit(attempt)
            except StoreError as exc:
                last = exc
                continue
            self.committed(attempt)
            if attempt.frees_space():
                self.held.freed()
            if attempt is not wb:
                for call in calls or ():
                    if call.writes:
                        call.error = error  # what the call staged was not committed
            return []
        if full and self._commit_in_pieces(wb):
            for call in calls or ():
                if call.writes:
                    call.error = error
            return []
        # Nothing could be written: settlements are not on disk and come back at restart.
        log.error("could not commit settlements either: %s", last)
        for call in calls or ():
            if call.writes:
                call.error = error
        return []

    def _commit_in_pieces(self, wb: WriteBatch) -> bool:
        """Commit the settlements of ``wb`` in pieces (see ``WriteBatch.settlement_pieces``);
        True when every piece was committed."""
        for piece in wb.settlement_pieces(SETTLEMENT_PIECE):
            try:
                self.store.commit(piece)
            except StoreError as exc:
                log.error("could not commit settlements, even in pieces: %s", exc)
                return False
            self.committed(piece)
        self.held.freed()
        log.warning(
            "settlements committed in pieces of %d deletions: the store's disk is full",
            SETTLEMENT_PIECE,
        )
        return True

    def _commit_growing(self, wb: WriteBatch) -> None:
        limit = self.max_map_size_bytes
        while True:
            try:
                self.store.commit(wb)
                return
            except StoreFullError:
                # (a larger map is no help on a full disk)
                if not limit or self.store.disk.full or not self.store.grow(limit):
                    raise
                self.counters.add("map_grown", 1)

    def fail_held(self, node: str) -> tuple[int, int]:
        """Closing with publishes the full map never took: their receipts say so.

        Returns (publishes, payload bytes) failed.
        """
        held = self.held.take_all()
        if not held:
            return 0, 0
        error = self.store.full_error()
        for p in held:
            p.stage.error = error
        count = message_count(held)
        self.counters.add("publishes_failed_store_full", count)
        log.error("node %s closed with %d publishes never stored: %s", node, count, error)
        return count, payload_bytes(held)


def _nothing(_wb: WriteBatch) -> None:
    pass
