"""Membership in the mesh: its frames in and out, and what its changes do to peers.

``Membership`` (membership.py) decides who is alive; this is its ``Wire`` and the mesh's
side of it. Every membership frame carries the sender's rumor of itself (so a frame from a
node is news of it, and the first frame of a node learned by gossip introduces it) and
up to ``RUMORS_PER_FRAME`` rumors. A rumor of a node not known here, or of a later life of
one, makes its peer (mesh.join, which says hello to it: the hello carries what this node
subscribes). A peer found dead leaves its lanes and keeps its sockets; alive again in the
same life, it is back in them (mesh.mark_dead, mesh.revive).

A ROUTER connection that carried a node's membership frames and closes (a process that
ends closes all of its connections, a killed one too) is a reason to suspect that node
at once (``disconnected``): every node it probed or answered notices within a
round trip, so a killed node is found dead in the shortest suspicion, not in a probe
round of the whole mesh.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from .._protocol.addresses import endpoint, split_endpoint
from .._protocol.codec import encode_control
from .._protocol.frames import Gossip, Ping, PingReq, Pong, Rumor
from .._store.store import WriteBatch
from ..config import NodeConfig
from .limits import RUMORS_PER_FRAME
from .membership import Change, Membership, Timing
from .news import ALIVE, DEAD, STATES, Fact
from .peers import Peer
from .stats import Counters

if TYPE_CHECKING:
    from .mesh import Mesh

log = logging.getLogger(__name__)

Frame = Ping | PingReq | Pong | Gossip
_ANY_HOST = ("*", "0.0.0.0", "")


def fact(r: Rumor) -> Fact:
    return Fact(r.node_id, r.incarnation, r.refuted, r.state, r.by)


class Liveness:
    """The mesh's membership: SWIM over the peers' control sockets."""

    def __init__(self, mesh: Mesh, config: NodeConfig, counters: Counters) -> None:
        self.mesh = mesh
        self.counters = counters
        timing = Timing(config.heartbeat_interval_s, config.dead_after_s)
        self.membership = Membership(
            mesh.node_id, mesh.incarnation, timing, self, random.Random(), counters.add
        )
        self.behind = False  # control frames wait unread (the listener's last burst was full)

    def start(self, now: float) -> None:
        self.membership.start(now)

    def next_wakeup(self) -> float:
        return self.membership.next_wakeup()

    def tick(self, now: float, wb: WriteBatch) -> None:
        self._apply(self.membership.tick(now, self.behind), wb, now, "unresponsive")

    # -- what arrives ---------------------------------------------------------------------

    def hello(self, peer: Peer, wb: WriteBatch, now: float) -> None:
        """``peer`` said hello (mesh.on_hello made or kept its peer)."""
        self._apply(self.membership.add(peer.node_id, peer.incarnation, now), wb, now, "")

    def met(self, peer: Peer) -> None:
        """``peer``, known until now from membership frames alone, said hello. Rumors name
        only nodes that said hello (``rumors``), so the news of it taken for frames while
        it was on trial went on none: it is told again now. A node's joining reaches the
        mesh through those who heard of it by rumor; untold, it would reach only the
        members its first teller picks, and one that missed it would never say hello to
        it."""
        self.membership.retell(peer.node_id)

    def on_frame(
        self, msg: Frame, addr: str | None, key: bytes, wb: WriteBatch, now: float
    ) -> bytes | None:
        """A membership frame arrived (``addr``: the connection's source address, ``key``:
        its authenticated CURVE key). Returns the sender's id when it is a peer."""
        sender = msg.sender
        membership = self.membership
        if sender.node_id == self.mesh.node_id or sender.state != ALIVE:
            return None
        peer = self._admit(sender, addr, key, wb, now)
        if peer is None:
            return None
        peer.last_seen = now
        refuted = membership.refuted
        self._apply(membership.heard(fact(sender), now), wb, now, "")
        for rumor in msg.rumors:
            self._rumor(rumor, wb, now)
        if isinstance(msg, Ping):
            membership.on_ping(sender.node_id, msg.seq, msg.target)  # (with our refutation)
        elif isinstance(msg, PingReq):
            membership.on_ping_req(sender.node_id, msg.seq, msg.target, now)
        elif isinstance(msg, Pong):
            membership.on_pong(sender.node_id, msg.seq, msg.about)
        if membership.refuted != refuted and not isinstance(msg, Ping):
            self.gossip(sender.node_id)  # it suspects us: it hears us refute at once
        return sender.node_id

    def disconnected(self, node_id: bytes, wb: WriteBatch, now: float) -> None:
        """Our connection from ``node_id`` closed."""
        self.counters.add("peer_disconnects", 1)
        self._apply(self.membership.disconnected(node_id, now), wb, now, "")

    def left(self, node_id: bytes, incarnation: int, wb: WriteBatch, now: float) -> None:
        """``node_id`` said goodbye: dead at once (news that others learn fast), and its
        peer forgotten (membership keeps its death, so no late rumor brings it back),
        its address in the store once it has been gone as long as a dead peer is kept."""
        peer = self.mesh.peers.get(node_id)
        self._apply(self.membership.left(node_id, incarnation, now), wb, now, "said bye")
        if peer is not None and peer.incarnation == incarnation:
            self.mesh.drop(peer, now, "said bye")
            self.mesh.left(node_id, now)

    def forget(self, node_id: bytes) -> None:
        self.membership.forget(node_id)

    def _rumor(self, rumor: Rumor, wb: WriteBatch, now: float) -> None:
        if rumor.node_id != self.mesh.node_id:
            peer = self.mesh.peers.get(rumor.node_id)
            if peer is None or rumor.incarnation > peer.incarnation:
                if rumor.state == DEAD:
                    if peer is None:
                        return  # (a stranger's death)
                elif self._admit(rumor, None, rumor.public_key.encode(), wb, now) is None:
                    return
        self._apply(self.membership.learn(fact(rumor), now), wb, now, "declared dead")

    def _admit(
        self, rumor: Rumor, addr: str | None, key: bytes, wb: WriteBatch, now: float
    ) -> Peer | None:
        """The peer ``rumor`` is of: the one known, or a new one for a node (or a life of
        it) not known yet; None when it cannot be one (an earlier life, an untrusted
        key, no address)."""
        mesh = self.mesh
        peer = mesh.peers.get(rumor.node_id)
        if peer is not None and rumor.incarnation <= peer.incarnation:
            return peer if rumor.incarnation == peer.incarnation else None
        gone = self.membership.members.get(rumor.node_id)
        if peer is None and gone is not None and gone.incarnation >= rumor.incarnation:
            return None  # (a life that said goodbye)
        if not mesh.admissible(key):
            self.counters.add("untrusted_rumors", 1)
            return None
        host, port = split_endpoint(rumor.ctrl_endpoint)
        host = addr or host
        if host in _ANY_HOST or not mesh.room_for(rumor.node_id, False, now, wb):
            return None
        new = mesh.make_peer(
            rumor.node_id,
            rumor.name,
            rumor.incarnation,
            endpoint(host, port),
            endpoint(host, rumor.data_port),
            now,
            key,
        )
        return mesh.join(new, wb, now)

    def _apply(self, changes: list[Change], wb: WriteBatch, now: float, why: str) -> None:
        mesh = self.mesh
        for change in changes:
            peer = mesh.peers.get(change.node_id)
            if peer is None:
                continue
            peer.state = STATES[change.new]
            if change.new == DEAD:
                if peer.alive:
                    mesh.mark_dead(peer, now, why or "dead")
                if not peer.met:  # (never a member of this mesh here: nothing to keep)
                    mesh.forget(peer, now, "dead before it said hello", wb)
            elif not peer.alive:
                mesh.revive(peer, wb, now)

    # -- what goes out (membership's Wire) ---------------------------------------------------

    def me(self) -> Rumor:
        mesh = self.mesh
        me = self.membership.me()
        host = next((h for h in mesh.hosts if h not in _ANY_HOST), "0.0.0.0")
        return Rumor(
            me.node_id,
            mesh.config.name,
            me.incarnation,
            me.refuted,
            ALIVE,
            b"",
            endpoint(host, mesh.ctrl_port),
            mesh.data_port,
            mesh.keys.public.decode() if mesh.keys is not None else "",
        )

    def rumors(self, about: bytes) -> tuple[Rumor, ...]:
        """News for a frame to ``about``, as rumors (of peers this node can describe)."""
        out = []
        peers = self.mesh.peers
        for f in self.membership.rumors(RUMORS_PER_FRAME, about):
            if f.node_id == self.mesh.node_id:
                out.append(self.me())
                continue
            peer = peers.get(f.node_id)
            if peer is not None and peer.met and peer.incarnation == f.incarnation:
                out.append(
                    Rumor(
                        f.node_id,
                        peer.name,
                        f.incarnation,
                        f.refuted,
                        f.state,
                        f.by,
                        peer.ctrl_ep,
                        split_endpoint(peer.data_ep)[1],
                        peer.public_key.decode(),
                    )
                )
        return tuple(out)

    def _send(self, to: bytes, msg: Frame) -> None:
        peer = self.mesh.peers.get(to)
        if peer is not None:
            self.mesh.send_raw(peer.dealer, encode_control(msg))

    def ping(self, to: bytes, seq: int, target: bytes) -> None:
        self._send(to, Ping(self.me(), seq, target, self.rumors(target)))

    def ping_req(self, to: bytes, seq: int, target: bytes) -> None:
        self._send(to, PingReq(self.me(), seq, target, self.rumors(to)))

    def pong(self, to: bytes, seq: int, about: bytes) -> None:
        self._send(to, Pong(self.me(), seq, about, self.rumors(to)))

    def gossip(self, to: bytes) -> None:
        self._send(to, Gossip(self.me(), self.rumors(to)))
