"""Committing the IO thread's write batch, and what a failed commit means.

A full map is the failure that matters: it is grown when ``max_map_size_bytes`` allows;
otherwise the batch is committed again without its publishes (held, see held.py), and
transactions fail (their acks with them). A full disk released its reserve for that
commit (_store/disk.py); when even so the rest does not fit, only what settles messages
is committed, whole, then in pieces: the deletions first, the consumer's acks' dedupe
bits last. Acks whose bits still do not fit are sent all the same, their bits kept in
memory and written once there is room (inbox/consumer.py says why: the alternative,
rolling them back, redelivers every one of them to the handlers for as long as the disk
is full). A full store is logged at most every LOG_EVERY_S per kind of line and shown
in status (``full``). Any other store error fails the publishes and transactions, rolls
the acks back and keeps only what frees space. Runs on the IO thread only.
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
# a fraction of the disk's reserve (disk.py). Also the dedupe window's chunks per piece.
SETTLEMENT_PIECE = 200
LOG_EVERY_S = 60.0  # a full store's failures are logged at most this often, each kind


class Said:
    """When a kind of log line may be said again: at most every ``every_s`` (the
    counters tell how often it happened). Logging is not logic: the clock is its own."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._next: dict[str, float] = {}

    def due(self, kind: str) -> bool:
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            return False
        self._next[kind] = now + self.every_s
        return True


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
        self.full = False  # the last commit found the store full (status shows it)
        self.lost: StoreError | None = None  # the store's files are gone (check_store)
        self._full_commits = 0
        self._said = Said(LOG_EVERY_S)

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
        if self.lost is not None:
            return self._refuse(self.lost, wb, pubs + self.held.take_all(), calls, now), []
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
            self._rewrite_acks(now)
            return pubs
        try:
            self._commit_growing(wb)
            self.committed(wb)
            if not self.store.disk.reserve_held:
                self.store.make_reserve()
            if wb.frees_space():
                self.held.freed()
            if self.held.stored():
                log.warning(
                    "the store %s has room again; held publishes are stored", self.store.path
                )
            self._room_again()
            self._rewrite_acks(now)
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
        if full:
            # Transactions fail (above): their acks go with them. The other acks are
            # committed with the rest of the batch below, in pieces if need be, or sent
            # without their dedupe bits (inbox/consumer.py says why).
            self.consumer.rollback_transactions(wb)
        else:
            # Not a full store: nothing says a smaller commit of the acks would do better.
            self.consumer.rollback()
            wb.seen_put.clear()
            wb.seen_masks.clear()
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
        attempts = [wb, wb.without_growth()] if full else [wb.without_growth()]
        while attempts:
            attempt = attempts.pop(0)
            reserve = self.store.disk.reserve_held
            try:
                self.store.commit(attempt)
            except StoreError as exc:
                last = exc
                if reserve and not self.store.disk.reserve_held:
                    attempts.insert(0, attempt)  # (the reserve's room is there now)
                elif full and attempt is wb:
                    self._full(exc)  # (not only publishes: the settlements do not fit)
                continue
            self.committed(attempt)
            if attempt.frees_space():
                self.held.freed()
            if attempt is not wb:
                for call in calls or ():
                    if call.writes:
                        call.error = error  # what the call staged was not committed
            return []
        if full:
            committed, unwritten = self._commit_in_pieces(wb)
            self._acks_unwritten(unwritten, error)
            if committed:
                for call in calls or ():
                    if call.writes:
                        call.error = error
                return []
        # Nothing could be written: settlements are not on disk and come back at restart.
        if not full or self._said.due("nothing"):
            log.error("could not commit settlements either: %s", last)
        for call in calls or ():
            if call.writes:
                call.error = error
        return []

    def _commit_in_pieces(self, wb: WriteBatch) -> tuple[bool, list[WriteBatch]]:
        """Commit the settlements of ``wb`` in pieces (see ``WriteBatch.settlement_pieces``).

        Returns whether every settlement but the acks' dedupe bits was committed, and the
        pieces of those bits that were not."""
        pieces = wb.settlement_pieces(SETTLEMENT_PIECE)
        settled = False
        for piece in pieces:
            if piece.seen_masks and not settled:  # (the deletions are in: the bits last)
                settled = True
                self._settled_in_pieces()
            try:
                self.store.commit(piece)
            except StoreError as exc:
                if not settled and self._said.due("unsettled"):
                    log.error("could not commit settlements, even in pieces: %s", exc)
                return settled, [p for p in (piece, *pieces) if p.seen_masks]
            self.committed(piece)
        if not settled:
            self._settled_in_pieces()
        return True, []

    def _settled_in_pieces(self) -> None:
        self.held.freed()
        if self._said.due("pieces"):
            log.warning(
                "settlements committed in pieces of %d deletions: the store's disk is full",
                SETTLEMENT_PIECE,
            )

    def _full(self, error: StoreError) -> None:
        """A commit found the store full: said (at most every LOG_EVERY_S), and shown in
        status until a whole commit goes through again."""
        if not self.full:
            self.full = True
            self._full_commits = 0
        self._full_commits += 1
        if self._said.due("full"):
            log.error(
                "%s; acks and other settlements are committed with the room left "
                "(the disk's reserve, pieces)",
                error,
            )

    def _room_again(self) -> None:
        if self.full:
            self.full = False
            if self._said.due("room"):
                log.warning(
                    "the store %s commits whole batches again, after %d that found it full",
                    self.store.path,
                    self._full_commits,
                )

    def _acks_unwritten(self, pieces: list[WriteBatch], error: StoreError) -> None:
        """Dedupe bits of acks that even pieces could not commit: the acks are sent
        anyway, their bits kept until there is room (_store/unwritten.py says why)."""
        unwritten = self.consumer.unwritten
        new = unwritten.add(pieces)
        if not new:
            return
        self.counters.add("acks_unwritten", new)
        if self._said.due("unwritten"):
            log.error(
                "%s; %d acks are sent without their dedupe entries (kept in memory until "
                "the store has room): their producers delete the messages and send none "
                "of them again, but a restart of this node before they are written "
                "forgets them",
                error,
                unwritten.count,
            )

    def _rewrite_acks(self, now: float) -> None:
        """Write the dedupe bits of acks sent while the store was full, when a try is
        due (_store/unwritten.py)."""
        if not self.consumer.unwritten.count:
            return
        try:
            written = self.consumer.unwritten.write(self.store.commit, now)
        except StoreError as exc:
            log.debug("dedupe entries still not written: %s", exc)
            return
        if written is not None:
            self._room_again()
            log.warning(
                "the store %s has room again: the dedupe entries of the %d acks sent "
                "while it was full are written",
                self.store.path,
                written,
            )

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

    def check_store(self, depth: int) -> None:
        """(Each heartbeat.) Whether the store's files are still those the node opened
        (_store/place.py); once they are not, said at ERROR, counted (``store_lost``) and
        shown in status, and publishes are refused from then on; frees stale reader slots."""
        if self.lost is not None:
            return
        if cleared := self.store.clear_stale_readers():  # (said in the log there)
            self.counters.add("stale_readers_cleared", cleared)
        lost = self.store.lost()
        if lost is None:
            return
        self.lost = lost
        self.counters.add("store_lost", 1)
        log.error("%s (%d unacknowledged messages in it now)", lost, depth)

    def _refuse(
        self,
        error: StoreError,
        wb: WriteBatch,
        pubs: list[AnyPublish],
        calls: Sequence[Waiter],
        now: float,
    ) -> tuple[int, int]:
        """Fail ``pubs`` with ``error`` (the store is lost: check_store), with every
        transaction among ``calls`` (their acks rolled back), and commit the rest.
        Returns (publishes, payload bytes) failed."""
        for p in pubs:
            p.stage.error = error
        if self.tx_pubs:
            self.tx_pubs.clear()
            for call in calls:
                if call.tx:
                    call.error = error
            self.consumer.rollback_transactions(wb)
        count = message_count(pubs)
        self.counters.add("publishes_refused_store_lost", count)
        self.commit(wb, [], calls, None, now)
        return count, payload_bytes(pubs)

    def fail_held(self, node: str) -> tuple[int, int]:
        """Closing with publishes the full map never took: their receipts say so.

        Returns (publishes, payload bytes) failed.
        """
        if self.consumer.unwritten.count:  # (a restart no longer drops their copies)
            log.warning(
                "node %s closed with the dedupe entries of %d acks unwritten (its store is "
                "full): a message of theirs that comes again is handled again",
                node,
                self.consumer.unwritten.count,
            )
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
