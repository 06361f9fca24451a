"""Replicas, as the engine sees them (IO thread only): one object for its hooks.

- as a producer: its replica set and streams (streams.py), its receipts gated and floors
  held back by them, hand-backs applied from a node that served its lanes;
- as a replica host: the copies it holds (copies.py), the lanes it takes over from a
  producer silent for ``takeover_after_s`` (ranking.py, takeover.py), handing them
  back when the producer returns, and forgetting the copy of one that does not: once
  the taken lanes owed nothing for FORGET_DEAD_AFTER_S (a producer per run, each with
  a new node id, would otherwise leave a copy, its open store and a taker for good).

The engine calls ``committed`` for every commit, ``after_store`` once a loop iteration
has committed, ``beat`` every heartbeat, ``dispatch`` after its own dispatch, and
``on_control`` for the frames of replication; the mesh asks it what a hello announces.

This module is long because the take-over decisions (who takes over, who gives way, when
a silent producer's copy is forgotten) read both roles' state at every heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._protocol.frames import (
    CopyRef,
    Handback,
    HandbackAck,
    ReplAck,
    ReplDrop,
    ReplOps,
)
from ..._store.store import Store, WriteBatch
from ...config import NodeConfig
from ...errors import StoreError
from ..lane.lane import Lane
from ..limits import FORGET_DEAD_AFTER_S
from ..outbox.dispatch import Send
from ..outbox.outbox import Outbox
from ..stats import Counters
from .copies import Copies, Copy
from .ranking import Holder, outranks, takes_over
from .streams import Replicator
from .takeover import TAKEN_INCARNATION, Settlement, Taken, apply_handback

if TYPE_CHECKING:
    from ..mesh import Mesh

log = logging.getLogger(__name__)

HANDBACK_RESEND_S = 2.0  # a hand-back not acked is sent again this often

# Sends a taken producer's data: (producer, incarnation, floor, outbox) -> a dispatch's send
SendAs = Callable[[bytes, int, int, Outbox], Send]
REPLICATION_FRAMES = (ReplOps, ReplAck, ReplDrop, Handback, HandbackAck)


class Replication:
    """One node's replicas: those it keeps as a producer, those it holds for others."""

    def __init__(
        self,
        config: NodeConfig,
        node_id: bytes,
        incarnation: int,
        store: Store,
        outbox: Outbox,
        counters: Counters,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.counters = counters
        self.outbox = outbox
        own = tuple(h for h in config.interfaces if h not in ("*", "0.0.0.0"))
        self.producer = Replicator(
            node_id, incarnation, store, outbox, counters, (*own, "127.0.0.1")
        )
        self.copies = Copies(config.data_dir, config.map_size_bytes, node_id, counters)
        self.taken: dict[bytes, Taken] = {}
        self._absent: dict[bytes, float] = {}  # producers with a copy here and no peer
        self._next_floors = 0.0
        self.started = 0.0
        self.mesh: Mesh | None = None
        self._announced: tuple[CopyRef, ...] = ()  # the copies our peers were last told of

    def start(self, mesh: Mesh, now: float) -> None:
        self.mesh = mesh
        mesh.replication = self
        mesh.taken = self.taken
        self.started = now
        if self.config.replica_host:
            self.copies.load()
        elif any(self.copies.root.glob("*")):  # (a host's before: what only they hold waits)
            log.warning("%s: copies kept, not served (replica_host is false)", self.copies.root)
        self._announced = self.copies.refs()  # (the first hellos name them)
        for producer in self.copies.held:
            self._absent[producer] = now

    # -- what hellos say ------------------------------------------------------------------

    def announce(self) -> tuple[bool, tuple[CopyRef, ...], tuple[bytes, ...]]:
        """(replica host, whole copies held, producers served) for this node's hello."""
        return self.config.replica_host, self.copies.refs(), tuple(self.taken)

    @property
    def holding(self) -> bool:
        """A node serves this producer's lanes: nothing is sent until it hands them back."""
        mesh = self.mesh
        return mesh is not None and self.node_id in mesh.served

    # -- the engine's hooks ---------------------------------------------------------------

    def committed(self, wb: WriteBatch) -> None:
        self.producer.committed(wb)

    def floor(self, lane: Lane) -> int:
        return self.producer.floor(lane)

    def after_store(self, now: float) -> bool:
        """After the loop's commit: receipts gated, frames sent, copies committed and
        acked, served lanes' timers and commits. True when a socket was full."""
        producer = self.producer
        producer.copy()
        producer.gate()
        if now >= self._next_floors:
            self._next_floors = now + self.config.heartbeat_interval_s
            producer.snapshot_floors()
        blocked = producer.flush()
        mesh = self.mesh
        assert mesh is not None
        for ack in self.copies.commit(now):
            mesh.send_ctrl(ack.producer, ack)
        for taken in list(self.taken.values()):
            taken.tick(now)
            self._hand_back(taken, now)
            taken.commit()
        return blocked

    def dispatch(self, now: float, send_as: SendAs) -> None:
        for producer, taken in self.taken.items():
            taken.commit()  # (first: a dead letter replayed puts its record in that batch)
            taken.dispatch(now, send_as(producer, TAKEN_INCARNATION, 0, taken.outbox))
            taken.commit()

    def next_wakeup(self) -> float | None:
        times = [t for t in (taken.next_wakeup() for taken in self.taken.values()) if t]
        return min(times, default=None)

    def beat(self, now: float) -> None:
        """Every heartbeat: the replica set kept, copies no longer counted on dropped,
        take-overs decided."""
        mesh = self.mesh
        assert mesh is not None
        refs = self.copies.refs()
        if refs != self._announced:  # peers rank holders by them to agree on a taker
            self._announced = refs
            mesh.hello_all()
        peers = list(mesh.peers.values())
        serving_me = mesh.served.get(self.node_id, set())
        stale = self.producer.upkeep(peers, serving_me)
        if now - self.started >= self.config.dead_after_s:  # (peers said hello by then)
            self.producer.say_short()
        # A node that replicates nothing (yet) tells others to drop their copies of it
        # only after a while: a restarted producer configures its topics when it can.
        if stale and (self.producer.wanted or now - self.started >= self.config.takeover_delay_s):
            for peer in stale:
                mesh.send_ctrl(peer.node_id, ReplDrop(self.node_id, self.producer.incarnation))
        if self.copies.held:
            self._take_overs(now, mesh)
        if self.copies.making:
            self._abandoned(now, mesh)

    def _take_overs(self, now: float, mesh: Mesh) -> None:
        me = self.node_id
        for producer, copy in list(self.copies.held.items()):
            silent_since = self._silent_since(producer, mesh, now)
            taken = self.taken.get(producer)
            if silent_since is None:
                if taken is not None:
                    taken.fresher_since = 0.0
                continue
            holders = [Holder(me, copy.incarnation, copy.version)]
            for p in peers_alive(mesh):
                holders += [
                    Holder(p.node_id, c.incarnation, c.version)
                    for c in p.copies
                    if c.producer == producer
                ]
            servers = mesh.served.get(producer, set()) - {me}
            if taken is not None:
                mine = holders[0]
                if any(outranks(h, mine, producer) for h in holders if h.node_id in servers):
                    log.warning(
                        "another node serves producer %s's lanes too, before this one: "
                        "this one gives way",
                        producer.hex()[:12],
                    )
                    self._let_go(producer)
                elif self._fresher_held(taken, mine, holders, now):
                    log.warning(
                        "a copy of a later life of producer %s is held by another node, and "
                        "the producer is still silent: this one gives way to it",
                        producer.hex()[:12],
                    )
                    self._let_go(producer)
                elif self._done_with(taken, now):
                    self._forget(producer)
                continue
            if takes_over(
                now,
                silent_since,
                self.config.takeover_delay_s,
                me,
                holders,
                producer,
                bool(servers),
            ):
                self._take_over(producer, now, mesh)

    def _fresher_held(self, taken: Taken, mine: Holder, holders: list[Holder], now: float) -> bool:
        """A live holder's copy is of a later life of the producer than the one ``taken``
        serves from, and the producer stayed silent ``takeover_delay_s`` since this node
        saw it: the producer, back meanwhile, synced that holder and stored there what
        this copy lacks (it takes over, or that is never sent). The delay lets a producer
        that is back, and that this node has not heard yet, get its hand-back."""
        if not any(h.incarnation > mine.incarnation for h in holders):
            taken.fresher_since = 0.0
            return False
        if not taken.fresher_since:
            taken.fresher_since = now
        return now - taken.fresher_since >= self.config.takeover_delay_s

    def _silent_since(self, producer: bytes, mesh: Mesh, now: float) -> float | None:
        """Since when ``producer`` has been silent: when last heard from, or first found
        absent (not a peer); None while it is alive."""
        peer = mesh.peers.get(producer)
        if peer is not None and peer.alive:
            self._absent.pop(producer, None)
            return None
        return peer.last_seen if peer is not None else self._absent.setdefault(producer, now)

    def _abandoned(self, now: float, mesh: Mesh) -> None:
        """Copies being made of a producer silent for FORGET_DEAD_AFTER_S are deleted: a
        copy is whole only once its stream ends, and a producer that speaks again begins
        a new one (a copy held before, if any, stays)."""
        for producer in list(self.copies.making):
            since = self._silent_since(producer, mesh, now)
            if since is not None and now - since >= FORGET_DEAD_AFTER_S:
                self._forget_copies(producer, (self.copies.making,), "the copy being made")

    def _take_over(self, producer: bytes, now: float, mesh: Mesh) -> None:
        copy = self.copies.held[producer]
        try:
            taken = Taken(copy, self.config, now)
        except StoreError as exc:  # (another holder of a copy takes over instead)
            self.counters.add("takeovers_failed", 1)
            log.error(
                "producer %s has been silent for %.1fs, but this node's copy of it cannot "
                "be read (%s): the copy is dropped",
                producer.hex()[:12],
                self.config.takeover_delay_s,
                exc,
            )
            self.copies.drop(producer)
            return
        self.taken[producer] = taken
        self.copies.serving.add(producer)
        mesh.take_members(taken, now)
        mesh.serving_changed()
        self.counters.add("takeovers", 1)
        log.warning(
            "producer %s has been silent for %.1fs: this node takes over its lanes "
            "(%d messages owed)",
            producer.hex()[:12],
            self.config.takeover_delay_s,
            taken.depth,
        )

    def _hand_back(self, taken: Taken, now: float) -> None:
        mesh = self.mesh
        assert mesh is not None
        peer = mesh.peers.get(taken.producer)
        if peer is None or not peer.alive:
            if taken.back_since:  # (gone again before the hand-back: serve its lanes on)
                taken.back_since = taken.sent_at = 0.0
                taken.token = 0
                log.warning(
                    "producer %s is gone again before its lanes were handed back: this "
                    "node serves them on",
                    taken.producer.hex()[:12],
                )
            return
        if not taken.back_since:
            taken.back_since = now
            log.info(
                "producer %s is back: its lanes go back to it once nothing sent is in flight",
                taken.producer.hex()[:12],
            )
        if not taken.ready_to_hand_back(now) or now - taken.sent_at < HANDBACK_RESEND_S:
            return
        taken.sent_at = now
        for part in taken.handback(self.node_id):
            mesh.send_ctrl(taken.producer, part)

    def _done_with(self, taken: Taken, now: float) -> bool:
        """``taken``'s producer, silent, is owed nothing more: its lanes have owed nothing
        for FORGET_DEAD_AFTER_S (nothing pending, nothing in flight) and its copy holds no
        dead letter (the producer's, handed back if it returns)."""
        if taken.depth or taken.back_since:
            taken.idle_since = 0.0
            return False
        if not taken.idle_since:
            taken.idle_since = now
        return now - taken.idle_since >= FORGET_DEAD_AFTER_S and not taken.holds_dead_letters()

    def _forget(self, producer: bytes) -> None:
        """Let go of a producer gone for good and delete its copy; the other holders drop
        theirs first (told before the hello saying nobody serves it): theirs still owe
        what this node settled, and one would take over to send it all again. Back after
        all (its data dir kept), the producer sends again what this node settled, with
        the same ids: its consumers drop it by their dedupe window (floor 0 kept it)."""
        mesh = self.mesh
        assert mesh is not None
        drop = ReplDrop(producer, self.copies.held[producer].incarnation)
        for peer in peers_alive(mesh):
            if any(c.producer == producer for c in peer.copies):
                mesh.send_ctrl(peer.node_id, drop)
        self._let_go(producer)
        copies = self.copies
        self._forget_copies(producer, (copies.making, copies.held), "its copy (owing nothing)")

    def _forget_copies(
        self, producer: bytes, tables: tuple[dict[bytes, Copy], ...], what: str
    ) -> None:
        """Delete a silent producer's copies in ``tables`` (counted, logged)."""
        self.copies.forget(producer, tables)
        if producer not in self.copies.held:
            self._absent.pop(producer, None)
        self.counters.add("replica_copies_forgotten", 1)
        log.info(
            "producer %s has been silent for %.0fs: %s is deleted",
            producer.hex()[:12],
            FORGET_DEAD_AFTER_S,
            what,
        )

    def _let_go(self, producer: bytes) -> None:
        taken = self.taken.pop(producer)
        taken.close()
        self.copies.serving.discard(producer)
        mesh = self.mesh
        assert mesh is not None
        mesh.serving_changed()

    # -- frames ---------------------------------------------------------------------------

    def on_control(self, msg: object, wb: WriteBatch, now: float) -> None:
        mesh = self.mesh
        assert mesh is not None
        if isinstance(msg, ReplOps):
            if self.config.replica_host:
                answer = self.copies.on_ops(msg, now)
                if answer is not None:
                    mesh.send_ctrl(msg.producer, answer)
        elif isinstance(msg, ReplAck):
            self.producer.on_ack(msg)
        elif isinstance(msg, ReplDrop):
            self.copies.drop(msg.producer)
        elif isinstance(msg, Handback):
            if msg.producer != self.node_id:
                return
            apply_handback(self.outbox, msg, wb)  # (counted per lane: handed_back)
            if msg.last:
                mesh.unserve(self.node_id, msg.node_id)
                mesh.send_ctrl(msg.node_id, HandbackAck(self.node_id, msg.token))
                self.counters.add("handbacks_received", 1)
                log.info("node %s handed this producer's lanes back", msg.node_id.hex()[:12])
        elif isinstance(msg, HandbackAck):
            taken = self.taken.get(msg.node_id)
            if taken is not None and taken.token == msg.token:
                self._let_go(msg.node_id)
                self.counters.add("handbacks", 1)
                log.info("lanes of producer %s handed back", msg.node_id.hex()[:12])

    def settle(self, msg: Settlement, now: float) -> None:
        """A settlement relayed for a producer this node serves."""
        taken = self.taken.get(msg.producer)
        if taken is None:
            self.counters.add("relayed_settlements_dropped", 1)
            return
        taken.settle(msg, now)

    # -- status and close -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        producer = self.producer
        topics = dict(self.outbox.receipts.replicated)
        now = time.monotonic()
        return {
            "host": self.config.replica_host,
            "topics": topics,
            **producer.status(),
            "copies": self.copies.status(),
            "serving": [
                {
                    "producer": p.hex(),
                    "owed": t.depth,
                    "since_s": round(now - t.since, 3),
                    "handing_back": bool(t.back_since),
                    "counters": t.counters.snapshot(),
                }
                for p, t in self.taken.items()
            ],
        }

    def close(self) -> None:
        for taken in self.taken.values():
            taken.commit()
        self.copies.close()


def peers_alive(mesh: Mesh) -> list[Any]:
    return [p for p in mesh.peers.values() if p.alive]
