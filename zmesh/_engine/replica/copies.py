"""A replica host's copies of other producers' outboxes (IO thread only).

Each copy is a store of its own, ``DATA_DIR/replicas/<producer>-<n>``, in the format of a
producer's outbox (writes.py), so that a copy taken over opens as an outbox (takeover.py).
A producer's stream to this node starts a new copy (SYNC_BEGIN) and makes it whole
(SYNC_END); until then the copy it had before, if any, stays the one this node holds and
announces (``refs``), so a replica that is being brought up to date again never holds
less than before. Each frame of the stream names the one before it: a frame that does
not follow the last one applied (a lost frame, a reconnection) is not applied, and the
producer is asked for a new copy. What a loop iteration applied is committed at its end,
frame by frame in order (frames are joined only where the order of puts and deletions
cannot matter), then acked to the producer with the last op applied.

This module is long because where a copy's stream stands, what it committed and when its
producer may be asked for a new one (a gap, a full disk, a frame refused again) are one
state that every frame reads or changes.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from ..._protocol.frames import (
    SYNC_BEGIN,
    SYNC_END,
    SYNC_NONE,
    CopyRef,
    ReplAck,
    ReplOps,
)
from ..._store.health import at_start
from ..._store.store import Store, WriteBatch
from ...errors import DataDirLockedError, StoreError
from ..stats import Counters
from .writes import deletes_only, into_batch

log = logging.getLogger(__name__)

COPIES_DIR = "replicas"  # under the data dir
# A producer asked for a new copy is not asked again this long after (frames sent before
# its sync still arrive meanwhile; the ask may be lost; the copy it begins may lose a
# frame again), until a copy of it is whole.
RESYNC_ASK_AGAIN_S = 30.0
# Frames that only delete (settlements) are acked at most this often: their acks tell the
# producer's floors, told consumers once a heartbeat; what a frame stores is acked at once
# (receipts wait for it).
LAZY_ACK_S = 0.2
_COPY_META = b"copy"  # [incarnation, version, replicas, synced, topics, last op]

_packb = msgpack.Packer(use_bin_type=True).pack


@dataclass(eq=False)
class Copy:
    """One copy of a producer's replicated outbox, and where its stream stands."""

    producer: bytes
    path: Path
    store: Store
    incarnation: int = 0  # the producer's, of the stream that made it
    version: int = 0  # the producer's replica-set version last heard of
    replicas: tuple[bytes, ...] = ()
    synced: bool = False  # whole (its stream's SYNC_END was committed)
    # The replicated topics' configurations (TopicConfig's fields by name).
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_op: int = 0  # the last frame applied (-1: a commit failed; ask for a new copy)
    batches: list[WriteBatch] = field(default_factory=list)  # applied, not committed yet
    acked: int = 0  # the last op committed
    told: int = 0  # the last op acked to the producer
    told_at: float = 0.0
    puts: bool = False  # a frame in ``batches`` stores something (its ack is awaited)
    ends_sync: bool = False  # a SYNC_END waits in ``batches``

    @property
    def ref(self) -> CopyRef:
        return CopyRef(self.producer, self.incarnation, self.version)

    def meta(self) -> bytes:
        return _packb(
            [
                self.incarnation,
                self.version,
                list(self.replicas),
                self.synced,
                self.topics,
                self.last_op,
            ]
        )

    def take(self, msg: ReplOps) -> None:
        """Apply one frame (it follows the last): into the pending batches, joined to the
        last one where the order of their puts and deletions cannot matter."""
        last = self.batches[-1] if self.batches else None
        if last is None or not (_no_deletions(last) or deletes_only(msg.writes)):
            last = WriteBatch()
            self.batches.append(last)
        into_batch(msg.writes, last)
        self.puts = self.puts or msg.sync != SYNC_NONE or not deletes_only(msg.writes)
        if msg.fsync:
            last.fsync = True
        self.last_op = msg.op
        self.version, self.replicas = msg.version, msg.replicas
        if msg.sync == SYNC_END:
            self.synced = self.ends_sync = True
        last.meta_put[_COPY_META] = self.meta()


def _no_deletions(wb: WriteBatch) -> bool:
    return not (
        wb.pend_del or wb.msgs_del or wb.runs_del or wb.prun_set or wb.lanes_del or wb.dead_del
    )


class Copies:
    """The copies this node holds, and those it is being sent."""

    def __init__(self, data_dir: str, map_size_bytes: int, me: bytes, counters: Counters) -> None:
        self.root = Path(data_dir) / COPIES_DIR
        self.map_size_bytes = map_size_bytes
        self.me = me
        self.counters = counters
        self.held: dict[bytes, Copy] = {}  # whole copies, announced
        self.making: dict[bytes, Copy] = {}  # copies a stream is making (from SYNC_BEGIN)
        self.serving: set[bytes] = set()  # producers whose copy is taken over (takeover.py)
        self._asked: dict[bytes, float] = {}  # when each producer was last asked to resync
        self._answered: set[bytes] = set()  # producers making a copy this node asked for

    # -- start and close ------------------------------------------------------------------

    def load(self) -> None:
        """Open the whole copies the data dir holds (the newest of each producer); delete
        the others (a copy whose sync never ended, or one a newer copy replaced)."""
        if not self.root.is_dir():
            if self.root.exists() or self.root.is_symlink():
                log.warning(
                    "%s is not a directory: this node holds no copies until it is one",
                    self.root,
                )
            return
        found: dict[bytes, list[tuple[int, Path]]] = {}
        for path in self.root.iterdir():
            name, _, n = path.name.partition("-")
            try:
                producer, number = bytes.fromhex(name), int(n)
            except ValueError:
                continue
            if len(producer) == 16:
                found.setdefault(producer, []).append((number, path))
        for producer, paths in found.items():
            for _n, path in sorted(paths, reverse=True):
                if producer not in self.held:
                    try:
                        copy = self._open(producer, path)
                    except DataDirLockedError as exc:  # (another process has it)
                        log.error("the copy %s is left alone: %s", path, exc)
                        continue
                    if copy is not None and copy.synced:
                        self.held[producer] = copy
                        continue
                    if copy is not None:
                        copy.store.close()
                _remove(path)
        if self.held:
            log.info(
                "holding copies of %d producers' outboxes: %s",
                len(self.held),
                ", ".join(p.hex()[:12] for p in self.held),
            )

    def _open(self, producer: bytes, path: Path) -> Copy | None:
        try:
            store = Store(str(path), self.map_size_bytes)
        except StoreError as exc:
            log.error("the copy %s cannot be opened (%s); it is deleted", path, exc)
            return None
        try:
            with (
                at_start("reading the copy's meta", str(path)),
                store.env.begin(db=store.meta) as txn,
            ):
                raw = txn.get(_COPY_META)
        except StoreError as exc:
            log.error("the copy %s cannot be read (%s); it is deleted", path, exc)
            store.close()
            return None
        try:
            inc, version, replicas, synced, topics, last_op = msgpack.unpackb(raw, raw=False)
            copy = Copy(
                producer,
                path,
                store,
                int(inc),
                int(version),
                tuple(bytes(r) for r in replicas),
                bool(synced),
                dict(topics),
                int(last_op),
            )
        except Exception:  # (no meta yet, or damaged: not a whole copy)
            return Copy(producer, path, store)
        copy.acked = copy.last_op
        return copy

    def close(self) -> None:
        for copy in [*self.held.values(), *self.making.values()]:
            with contextlib.suppress(Exception):
                self.commit_one(copy)
            copy.store.close()
        self.held.clear()
        self.making.clear()

    # -- the stream -----------------------------------------------------------------------

    def refs(self) -> tuple[CopyRef, ...]:
        """The whole copies this node announces."""
        return tuple(copy.ref for copy in self.held.values())

    def on_ops(self, msg: ReplOps, now: float) -> ReplAck | None:
        """Apply a frame of ``msg.producer``'s stream; returns an answer to send at once
        (asking for a new copy) when it cannot be applied."""
        producer = msg.producer
        if producer in self.serving:
            return None  # (a producer that returned hands back first; see takeover.py)
        if msg.sync == SYNC_BEGIN:
            held = self.held.get(producer)
            if held is None or held.incarnation <= msg.incarnation:  # (not an earlier life's)
                try:
                    self._begin(msg)
                except StoreError as exc:
                    # (the frames that follow ask for a new copy, once RESYNC_ASK_AGAIN_S
                    # has passed: not at once, each time leaving a directory behind)
                    self._asked[producer] = now
                    self.counters.add("replica_commit_errors", 1)
                    log.error(
                        "a copy of producer %s's outbox cannot begin: %s", producer.hex()[:12], exc
                    )
                else:
                    # (the ask is kept until the copy is whole: one that loses a frame
                    # again is asked for RESYNC_ASK_AGAIN_S after it, not at once)
                    if producer in self._asked:
                        self._answered.add(producer)
            return None
        copy = self.making.get(producer) or self.held.get(producer)
        if copy is None or copy.incarnation != msg.incarnation or copy.last_op != msg.prev:
            self.counters.add("replica_stream_gaps", 1)
            asked = self._asked.get(producer, -1e9)
            if producer in self._answered and copy is self.making.get(producer):
                self._answered.discard(producer)
                log.warning(
                    "the new copy of producer %s's outbox lost a frame again (one cause: a "
                    "record larger than this node's max_message_bytes and a MiB, which its "
                    "socket refuses: give it the producer's); another is asked for in %.0fs",
                    producer.hex()[:12],
                    max(0.0, asked + RESYNC_ASK_AGAIN_S - now),
                )
            if now - asked < RESYNC_ASK_AGAIN_S:
                return None
            self._asked[producer] = now
            return ReplAck(self.me, producer, msg.incarnation, msg.op, True)  # (the op refused)
        copy.take(msg)
        self.counters.add("replica_frames", 1)
        return None

    def _begin(self, msg: ReplOps) -> None:
        producer = msg.producer
        old = self.making.pop(producer, None)
        if old is not None:
            old.store.close()
            _remove(old.path)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # (a file where the directory goes, a full disk)
            raise StoreError(
                f"cannot make the replicas' directory {self.root}: {exc.strerror or exc}",
                str(self.root),
            ) from exc
        numbers = [
            int(p.name.partition("-")[2])
            for p in self.root.glob(f"{producer.hex()}-*")
            if p.name.partition("-")[2].isdigit()
        ]
        path = self.root / f"{producer.hex()}-{max(numbers, default=0) + 1}"
        try:
            store = Store(str(path), self.map_size_bytes)
        except StoreError:
            _remove(path)
            raise
        copy = Copy(producer, path, store, msg.incarnation)
        copy.topics = dict(msg.topics)
        copy.batches.append(WriteBatch(meta_put={b"node_id": producer}))
        self.making[producer] = copy
        copy.take(msg)
        self.counters.add("replica_syncs", 1)
        log.info("a copy of producer %s's outbox begins at %s", producer.hex()[:12], path)

    def commit(self, now: float) -> list[ReplAck]:
        """Commit what this iteration applied, copy by copy; the acks to send (see
        LAZY_ACK_S)."""
        acks = []
        for copy in [*self.making.values(), *self.held.values()]:
            if copy.batches:
                puts, copy.puts = copy.puts, False
                if not self.commit_one(copy):
                    self._refused(copy, now)
                    continue
                if not (puts or now - copy.told_at >= LAZY_ACK_S):
                    continue
            elif copy.told == copy.acked or now - copy.told_at < LAZY_ACK_S:
                continue
            copy.told, copy.told_at = copy.acked, now
            acks.append(ReplAck(self.me, copy.producer, copy.incarnation, copy.acked, False))
        return acks

    def commit_one(self, copy: Copy) -> bool:
        batches, copy.batches = copy.batches, []
        try:
            for wb in batches:
                copy.store.commit(wb)
        except StoreError as exc:
            self.counters.add("replica_commit_errors", 1)
            log.error("a copy of %s's outbox could not commit: %s", copy.producer.hex()[:12], exc)
            copy.last_op = -1  # (the next frame asks for a new copy)
            copy.ends_sync = False
            return False
        copy.acked = copy.last_op
        if copy.ends_sync:
            copy.ends_sync = False
            self._whole(copy)
        return True

    def _refused(self, copy: Copy, now: float) -> None:
        """``copy`` could not commit (a full disk or map): its producer is asked for a new
        copy RESYNC_ASK_AGAIN_S later, not at its next frame (each ask is a new sync of
        its whole outbox, which a full disk refuses again: hundreds a second while a
        publisher went on); a copy being made is deleted, giving back the room it took."""
        producer = copy.producer
        if self.making.get(producer) is copy:
            self.forget(producer, (self.making,))
            log.warning(
                "the copy of producer %s's outbox being made is deleted; a new one is asked "
                "for in %.0fs",
                producer.hex()[:12],
                RESYNC_ASK_AGAIN_S,
            )
        self._asked[producer] = now

    def _whole(self, copy: Copy) -> None:
        """A new copy is whole: it replaces the one held before."""
        producer = copy.producer
        if self.making.get(producer) is copy:
            del self.making[producer]
        self._asked.pop(producer, None)
        self._answered.discard(producer)
        old = self.held.get(producer)
        self.held[producer] = copy
        if old is not None and old is not copy:
            old.store.close()
            _remove(old.path)
        log.info("the copy of producer %s's outbox is whole", producer.hex()[:12])

    def drop(self, producer: bytes) -> None:
        """The producer no longer counts on this node's copies of it."""
        if producer in self.serving:
            return
        for _copy in self.forget(producer, (self.making, self.held)):
            self.counters.add("replica_copies_dropped", 1)
            log.info("copy of producer %s's outbox dropped", producer.hex()[:12])

    def forget(self, producer: bytes, tables: tuple[dict[bytes, Copy], ...]) -> list[Copy]:
        """Delete the producer's copies in ``tables`` (``making``, ``held``): their stores
        closed, their directories removed. Returns them."""
        self._asked.pop(producer, None)
        self._answered.discard(producer)
        gone = [copy for table in tables if (copy := table.pop(producer, None)) is not None]
        for copy in gone:
            copy.store.close()
            _remove(copy.path)
        return gone

    def status(self) -> list[dict[str, Any]]:
        out = []
        for table, state in ((self.held, "whole"), (self.making, "syncing")):
            for producer, copy in table.items():
                store = copy.store
                records: int | None = None  # (None: its store cannot be read)
                owed: int | None = None
                dead: int | None = None
                with contextlib.suppress(lmdb.Error), store.env.begin() as txn:
                    records = sum(txn.stat(db)["entries"] for db in (store.msgs, store.runs))
                    owed = sum(txn.stat(db)["entries"] for db in (store.pend, store.pruns))
                    dead = txn.stat(store.dead)["entries"]
                out.append(
                    {
                        "producer": producer.hex(),
                        "state": "serving" if producer in self.serving else state,
                        "incarnation": copy.incarnation,
                        "version": copy.version,
                        "op": copy.acked,
                        "topics": sorted(copy.topics),
                        "records": records,  # (a run's messages are one record)
                        "owed_entries": owed,
                        # (parked, or replayed by a taker and not settled again yet)
                        "dead_letters": dead,
                    }
                )
        return out


def _remove(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as exc:
        log.error("cannot remove the copy %s: %s", path, exc)
