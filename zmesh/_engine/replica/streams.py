"""A producer's side of its replicas (IO thread only): which nodes hold its replicated
topics, the stream of its commits to each, and what their acks allow.

The producer keeps ``replicas - 1`` replica hosts (the most any of its topics asks for),
chosen by rendezvous order among the live ones (ranking.py) and kept while they live. A
new one gets a stream that begins a new copy: the outbox as it stands, read a part at a
time (``SyncReader``), with the commits made meanwhile in between, then the end of the
sync; after it, every commit's writes to the replicated topics (writes.py). Each frame
carries an op number growing over the producer's incarnation; a replica acks the last
op it committed.

What the acks allow:
- a replicated topic's receipts are stored once enough whole replicas acked the op of
  the commit that stored their messages (``pending``, released in op order);
- a lane's floor, which consumers forget their dedupe window below, is told only once
  every replica knows it (``floor``): the floor a taker would start from is never above
  what consumers still remember.

This module is long because a producer's replica set and its streams are one state (the
set's version names every stream's ops).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

from ..._protocol.frames import (
    SYNC_BEGIN,
    SYNC_END,
    SYNC_NONE,
    SYNC_PART,
    ReplAck,
    ReplOps,
    Writes,
)
from ..._protocol.replication import encode_repl_ops, pack_writes
from ..._store.store import Store, WriteBatch
from ...config import TopicConfig
from ...errors import StoreError
from ..lane.lane import Lane
from ..outbox.outbox import Outbox
from ..stats import Counters
from .ranking import Candidate, replica_order
from .writes import Scope, SyncReader, cut, select

if TYPE_CHECKING:
    from ..._receipt import Stage
    from ..peers import Peer

log = logging.getLogger(__name__)

MAX_QUEUED_BYTES = 64 << 20  # frames waiting for one replica's socket; past it, a new copy
# Frames sent to one replica and not acked yet, at most: the rest wait in ``frames``, not
# in the socket's queue (a sync's parts would fill it with hundreds of MiB).
SEND_WINDOW_BYTES = 16 << 20
SYNC_BYTES_PER_LOOP = 2 << 20  # what a loop iteration reads of the outbox for new replicas
FLOOR_SNAPSHOTS = 64  # lane floors waiting for the replicas' acks, at most
_NOBLOCK = int(zmq.NOBLOCK)
_EMPTY = Writes()


@dataclass(eq=False)
class Stream:
    """This producer's stream to one replica."""

    node_id: bytes
    peer: Peer
    prev: int = 0  # the op of the last frame queued for it
    acked: int = 0
    sync_end: int = 0  # the op of its SYNC_END (0: its copy is not whole yet)
    begun: int = 0  # the op of its last SYNC_BEGIN
    reader: SyncReader | None = None
    frames: deque[tuple[int, bytes]] = field(default_factory=deque)  # (op, frame) to send
    queued: int = 0  # bytes in ``frames``
    sent: deque[tuple[int, int]] = field(default_factory=deque)  # (op, bytes) not acked
    unacked: int = 0  # bytes in ``sent``
    sync_failed: bool = False  # its copy could not be read from the store (damaged)

    @property
    def whole(self) -> bool:
        """Its copy is whole and acked as such."""
        return 0 < self.sync_end <= self.acked


class Replicator:
    """One producer's replicas: chosen, streamed to, and counted."""

    def __init__(
        self,
        node_id: bytes,
        incarnation: int,
        store: Store,
        outbox: Outbox,
        counters: Counters,
        own_hosts: tuple[str, ...],
    ) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.store = store
        self.outbox = outbox
        self.receipts = outbox.receipts
        self.counters = counters
        self.own_hosts = own_hosts
        self.scope = Scope()
        self._scope_seen: tuple[object, ...] = ()
        self.op = 0
        self.version = 0
        self.streams: list[Stream] = []  # best first
        # (op, [(replicas needed, stage, messages)]): stored here, waiting for replicas
        self.pending: deque[tuple[int, list[tuple[int, Stage, int]]]] = deque()
        self.lag = 0  # messages in ``pending``
        self.floors: deque[tuple[int, dict[int, int]]] = deque()
        self.confirmed: dict[int, int] = {}  # lane id -> floor every replica knows
        self._commits: list[WriteBatch] = []  # committed, copied after the loop's sends
        self._short: tuple[int, int] | None = None  # (replicas kept, wanted) said last

    # -- what to copy ---------------------------------------------------------------------

    @property
    def wanted(self) -> int:
        """Replicas this producer keeps: the most any of its topics asks for, less one."""
        return max(self.receipts.replicated.values(), default=1) - 1

    def _rescope(self, wb: WriteBatch | None) -> None:
        replicated = self.receipts.replicated
        seen = (tuple(replicated), len(self.outbox.lanes.all))
        if seen != self._scope_seen or (wb is not None and (wb.lanes_put or wb.lanes_del)):
            self._scope_seen = seen
            gone = self.scope.topics.difference(replicated)
            self.scope.update(replicated, self.outbox.lanes.all.values())
            if gone and self.scope.topics:  # (none of their commits is sent: copies anew)
                for stream in self.streams:
                    if stream.prev:
                        self._begin(stream)

    def committed(self, wb: WriteBatch) -> None:
        """A batch was committed: its replicated part goes to every replica, once the
        loop has sent its data (``copy``: a consumer waits for those, not for this)."""
        if not self.streams:
            self.op += 1  # (a replica added later gets it in its sync)
            return
        self._commits.append(wb)

    def copy(self) -> None:
        """The replicated part of the batches committed since the last call, to every
        replica in order (frames made once, queued to each)."""
        commits, self._commits = self._commits, []
        for wb in commits:
            self._rescope(wb)
            writes = select(wb, self.scope)
            if writes is None:
                self.op += 1
                continue
            for part in cut(writes):
                self.op += 1
                self._queue_all(part, wb.fsync)

    def _queue_all(self, part: Writes, fsync: bool) -> None:
        packed = pack_writes(part)
        for stream in self.streams:
            if stream.prev:  # (its sync began)
                self._queue(stream, SYNC_NONE, packed, fsync)

    def _queue(self, stream: Stream, sync: int, packed: bytes, fsync: bool = False) -> None:
        topics: tuple[tuple[str, dict[str, Any]], ...] = ()
        if sync == SYNC_BEGIN:
            topics = tuple(
                (t, _config_fields(self.outbox.lanes.config(t))) for t in self.scope.topics
            )
        frame = encode_repl_ops(
            ReplOps(
                self.node_id,
                self.incarnation,
                self.op,
                stream.prev,
                self.version,
                tuple(s.node_id for s in self.streams),
                sync,
                fsync,
                topics,
                _EMPTY,
            ),
            packed,
        )
        stream.prev = self.op
        stream.frames.append((self.op, frame))
        stream.queued += len(frame)
        if stream.queued > MAX_QUEUED_BYTES:
            self.counters.add("replica_queue_overflows", 1)
            log.warning(
                "replica %s is %d MiB behind; it gets a new copy",
                stream.peer.name,
                stream.queued >> 20,
            )
            self._begin(stream)

    def _begin(self, stream: Stream) -> None:
        """Start ``stream`` over: a new copy, read from the store as it stands."""
        stream.frames.clear()
        stream.queued = 0
        stream.sent.clear()
        stream.unacked = 0
        stream.sync_end = 0
        stream.sync_failed = False
        stream.prev = 0
        self._rescope(None)
        stream.reader = SyncReader(self.store, self.scope)
        self.op += 1
        stream.begun = self.op
        self._queue(stream, SYNC_BEGIN, pack_writes(_EMPTY))
        self.counters.add("replica_syncs_begun", 1)

    # -- receipts and floors ----------------------------------------------------------------

    def gate(self) -> None:
        """The stages stored by this iteration's commit wait for the replicas of its op
        (after ``copy``)."""
        gated = self.receipts.gated
        if gated:
            self.pending.append((self.op, [(k - 1, stage, n) for stage, k, n in gated]))
            self.lag += sum(n for _s, _k, n in gated)
            gated.clear()
            self.release()

    def release(self) -> None:
        """Stages whose op enough whole replicas acked are stored (in op order). A stage
        needs no more replicas than the producer keeps now: a topic's ``replicas`` lowered
        since applies to the stages waiting too (they would wait for good, and every one
        after them)."""
        pending = self.pending
        wanted = self.wanted
        while pending:
            op, stages = pending[0]
            have = sum(1 for s in self.streams if s.whole and s.acked >= op)
            if any(min(need, wanted) > have for need, _stage, _n in stages):
                return
            pending.popleft()
            self.receipts.stored.extend(stage for _need, stage, _n in stages)
            self.lag -= sum(n for _need, _stage, n in stages)

    def snapshot_floors(self) -> None:
        """Note the replicated lanes' floors as of the last op (told once acked)."""
        if not self.scope.topics:
            return
        floors = {
            lane.id: lane.floor()
            for lane in self.outbox.lanes.all.values()
            if lane.topic in self.scope.topics
        }
        self.floors.append((self.op, floors))
        if len(self.floors) > FLOOR_SNAPSHOTS:
            self.floors.popleft()
        self._confirm()

    def _confirm(self) -> None:
        streams = self.streams
        while (
            self.floors
            and streams
            and all(s.whole and s.acked >= self.floors[0][0] for s in streams)
        ):
            self.confirmed = self.floors.popleft()[1]

    def floor(self, lane: Lane) -> int:
        """The floor to tell consumers of ``lane`` (see the module's docstring)."""
        floor = lane.floor()
        if lane.topic in self.scope.topics:
            return min(floor, self.confirmed.get(lane.id, 0))
        return floor

    # -- acks -----------------------------------------------------------------------------

    def on_ack(self, msg: ReplAck) -> None:
        stream = next((s for s in self.streams if s.node_id == msg.node_id), None)
        if stream is None or msg.incarnation != self.incarnation:
            return
        if msg.resync:
            # (``op``: the frame it refused; one sent before the sync under way began asks
            # for what that sync gives it already)
            if msg.op >= stream.begun:
                log.info("replica %s asks for a new copy", stream.peer.name)
                self._begin(stream)
            return
        if msg.op > stream.acked:
            stream.acked = msg.op
            sent = stream.sent
            while sent and sent[0][0] <= msg.op:
                stream.unacked -= sent.popleft()[1]
            self.release()
            self._confirm()

    # -- the replica set ------------------------------------------------------------------

    def upkeep(self, peers: list[Peer], serving_me: set[bytes]) -> list[Peer]:
        """Keep the replica set: drop replicas gone, restarted or serving this producer;
        fill free places by rank. Returns the live peers holding a copy of this producer
        that it does not count on, to be told to drop it (none until every replica it
        counts on holds a whole copy: until then an older copy may be all there is)."""
        self._rescope(None)
        alive = {p.node_id: p for p in peers if p.alive}
        kept = [
            s
            for s in self.streams
            if alive.get(s.node_id) is s.peer and s.node_id not in serving_me
        ]
        changed = len(kept) != len(self.streams)
        for gone in set(self.streams) - set(kept):
            log.warning("replica %s is gone", gone.peer.name)
        wanted = self.wanted
        if len(kept) > wanted:
            kept, changed = kept[:wanted], True
        if len(kept) < wanted:
            have = {s.node_id for s in kept}
            order = replica_order(
                (
                    Candidate(p.node_id, _host(p.ctrl_ep))
                    for p in alive.values()
                    if p.replica_host and p.node_id not in have and p.node_id not in serving_me
                ),
                self.node_id,
                self.own_hosts,
            )
            for node_id in order[: wanted - len(kept)]:
                stream = Stream(node_id, alive[node_id])
                kept.append(stream)
                changed = True
                log.info("replica %s chosen", stream.peer.name)
        if changed:
            self.streams = kept
            self.version += 1
            self.counters.add("replica_set_changes", 1)
            for stream in kept:
                if not stream.prev:
                    self._begin(stream)
            if kept:  # (every replica learns the set; a copy of an older one is stale)
                self.op += 1
                self._queue_all(_EMPTY, False)
        self.release()  # (also after a topic's replicas were lowered: fewer are needed)
        if len(self.streams) < wanted or not all(s.whole for s in self.streams):
            return []  # (an older copy elsewhere may be all there is until then)
        counted = {s.node_id for s in self.streams}
        return [
            p
            for p in alive.values()
            if p.node_id not in counted
            and p.node_id not in serving_me
            and any(c.producer == self.node_id for c in p.copies)
        ]

    def say_short(self) -> None:
        """Said once each time it changes: fewer live replica hosts than the replicated
        topics ask for, so their receipts wait (a topic's replicas larger than the mesh's
        hosts, or a host lost); the status shows it too (``set``, ``lag``)."""
        have, wanted = len(self.streams), self.wanted
        short = (have, wanted) if have < wanted else None
        if short == self._short:
            return
        if short is not None:
            log.warning(
                "this producer finds %d of the %d replica hosts its replicated topics ask "
                "for (replicas = %d): their receipts wait until more replica hosts are "
                "live, or their replicas are lowered",
                have,
                wanted,
                wanted + 1,
            )
        else:
            log.info("this producer has the %d replica hosts it needs again", wanted)
        self._short = short

    # -- sending ----------------------------------------------------------------------------

    def flush(self) -> bool:
        """Read the next parts of the outbox for new replicas and send what waits; True
        when a socket was full (try again soon)."""
        budget = SYNC_BYTES_PER_LOOP
        blocked = False
        for stream in self.streams:
            if not stream.peer.alive:  # (its sockets may be closed: the next beat drops it)
                continue
            reader = stream.reader
            while reader is not None and budget > 0 and stream.queued < MAX_QUEUED_BYTES // 2:
                try:
                    part = reader.part()
                except StoreError as exc:
                    self._sync_failed(stream, exc)
                    break
                if part is not None:
                    self.op += 1
                    packed = pack_writes(part)
                    budget -= len(packed)
                    self._queue(stream, SYNC_PART, packed)
                if reader.done:
                    self.op += 1
                    self._queue(stream, SYNC_END, pack_writes(_EMPTY))
                    stream.sync_end = self.op
                    stream.reader = reader = None
            frames, sent = stream.frames, stream.sent
            dealer = stream.peer.dealer
            try:
                while frames and stream.unacked < SEND_WINDOW_BYTES:
                    op, frame = frames[0]
                    dealer.send(frame, _NOBLOCK)
                    frames.popleft()
                    stream.queued -= len(frame)
                    sent.append((op, len(frame)))
                    stream.unacked += len(frame)
            except zmq.Again:
                blocked = True
        return blocked

    def _sync_failed(self, stream: Stream, exc: StoreError) -> None:
        """The outbox could not be read for ``stream``'s new copy (a damaged store): the
        copy is left unfinished, never whole, so its replica never takes over from it;
        the commits go on to it, and it is read again if the replica asks anew."""
        stream.reader = None
        stream.sync_failed = True
        self.counters.add("replica_syncs_failed", 1)
        log.error(
            "replica %s cannot get a whole copy of this outbox, and receipts of replicated "
            "topics wait for it: %s",
            stream.peer.name,
            exc,
        )

    def status(self) -> dict[str, Any]:
        return {
            "wanted": self.wanted,
            "version": self.version,
            "op": self.op,
            "lag": self.lag,
            "set": [
                {
                    "id": s.node_id.hex(),
                    "name": s.peer.name,
                    "state": "whole" if s.whole else "failed" if s.sync_failed else "syncing",
                    "acked_op": s.acked,
                    "queued_bytes": s.queued,
                    "unacked_bytes": s.unacked,
                }
                for s in self.streams
            ],
        }


def _host(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://").rpartition(":")[0]


def _config_fields(cfg: TopicConfig) -> dict[str, Any]:
    """A topic's configuration as its fields (for a taker to deliver alike)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
