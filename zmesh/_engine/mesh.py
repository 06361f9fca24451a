"""This node's view of the mesh: peers, contacts, hellos, and the control messages it sends.
Runs only on the IO thread.

Who is alive is membership's (membership.py, SWIM, fed by liveness.py); this module keeps
a ``Peer`` per member, with its sockets (opened when first needed) and what it subscribes.
A hello carries what a node subscribes and is sent once per meeting: to a contact, to a
member when it is first known (or known again after it was dead), and to every live
member when this node's subscriptions change. It is not a heartbeat.

This module is long because it is the one owner of the peers: their hellos, their
subscriptions applied to lanes (by pattern too, and to lanes taken over) and the control
messages sent to them; membership, contacts and sockets are modules of their own.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import TYPE_CHECKING

import zmq

from .._protocol.addresses import endpoint
from .._protocol.codec import encode_control
from .._protocol.frames import Ack, Control, Fail, GroupDel, Hello, Nack, PeerRef, SubInfo, Touch
from .._security import Keys, client_options
from .._store.store import WriteBatch
from .._subjects import SubjectMap, subject_error
from ..config import NodeConfig, check_name
from ..errors import ConfigError
from .contacts import Contacts
from .limits import (
    FORGET_DEAD_AFTER_S,
    MAX_PEERS,
    MAX_UNMET_PEERS,
    REFUSAL_LOG_INTERVAL_S,
    SYNC_BEATS,
)
from .liveness import Liveness
from .outbox.ephemeral import send_kept
from .outbox.outbox import Outbox
from .peers import Peer, announced_group
from .replica.takeover import TAKEN_INCARNATION
from .stats import Counters

if TYPE_CHECKING:
    from ..subscription import Subscription
    from .outbox.groups import Groups
    from .outbox.lanes import Lanes
    from .replica.replication import Replication
    from .replica.takeover import Taken

log = logging.getLogger(__name__)

DEALER_LINGER_MS = 200
CTRL_BACKLOG_MAX = 10_000
CTRL_BACKLOG_PEERS_MAX = 256  # distinct nodes with waiting settlements
CTRL_BACKLOG_UNKNOWN_MAX = 1000  # frames waiting for a node not (yet) known
_SETTLEMENTS = (Ack, Nack, Fail, Touch)
_EPHEMERAL_NAME = re.compile(r"^~[0-9]{1,19}\Z")  # an ephemeral subscription's (submit.py)
_dead_since = attrgetter("dead_since")


class Mesh:
    """Peers of one node and the sockets to them."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        config: NodeConfig,
        node_id: bytes,
        incarnation: int,
        outbox: Outbox,
        counters: Counters,
        local_subs: Callable[[], list[Subscription]],
        keys: Keys | None,
    ) -> None:
        self.ctx = ctx
        self.keys = keys
        # A connection whose data stays unacknowledged this long is reset and redialed,
        # rather than left in TCP's exponential retransmission backoff.
        self._maxrt_ms = max(1000, int(config.dead_after_s * 1000))
        # Redials of a peer that is gone back off to about a heartbeat apart.
        self._redial_max_ms = max(100, int(config.heartbeat_interval_s * 1000))
        self.config = config
        self.node_id = node_id
        self.incarnation = incarnation
        self.lanes = outbox.lanes
        self.groups = outbox.groups
        self.kept = outbox.kept
        outbox.groups.patterns.peers = self._live_peers
        self.counters = counters
        self._local_subs = local_subs
        self.peers: dict[bytes, Peer] = {}
        self.self_peer: Peer | None = None
        self._contacts = Contacts(ctx, counters)
        self._at: dict[str, bytes] = {}  # control endpoint -> the peer there
        self.ctrl_backlog: dict[bytes, list[bytes]] = {}
        # Nodes with a backlog that are not peers (not met yet, or gone), since when.
        self._unknown_since: dict[bytes, float] = {}
        # Nodes that said bye, when (the oldest first), their addresses still in the store.
        self._left: dict[bytes, float] = {}
        # Live peers' ephemeral subscriptions by topic or pattern (rebuilt when one
        # changes), found by the topics they match.
        self.ephemeral: SubjectMap[tuple[Peer, SubInfo]] = SubjectMap()
        # Peers whose ephemeral subscriptions wait for our data connection to them: what
        # is sent at most once is sent only on a connection that is up (ready_data).
        self.unready: set[bytes] = set()
        self._foreign_logged: set[bytes] = set()
        self._refusal_logged_at = -REFUSAL_LOG_INTERVAL_S
        self._bad_subs_logged_at = -REFUSAL_LOG_INTERVAL_S
        self._beats = 0
        self.ctrl_port = 0
        self.data_port = 0
        self.hosts: tuple[str, ...] = ()
        self.liveness = Liveness(self, config, counters)
        # Replicas: what this node's hello says of them, the lanes of other producers it
        # serves (both the replication's, set at start), and who serves whose lanes (from
        # hellos: live peers, and this node).
        self.replication: Replication | None = None
        self.taken: dict[bytes, Taken] = {}
        self.served: dict[bytes, set[bytes]] = {}

    def peer(self, node_id: bytes) -> Peer | None:
        """The peer (or this node itself) with that id."""
        return self.self_peer if node_id == self.node_id else self.peers.get(node_id)

    def make_peer(
        self,
        node_id: bytes,
        name: str,
        incarnation: int,
        ctrl_ep: str,
        data_ep: str,
        now: float,
        key: bytes = b"",
    ) -> Peer:
        return Peer(node_id, name, incarnation, ctrl_ep, data_ep, self._open, now, public_key=key)

    def _open(self, peer: Peer, kind: int) -> zmq.Socket[bytes]:
        """Open ``peer``'s PUSH (data) or DEALER (control) socket, at its first use."""
        sock = self.ctx.socket(kind)
        if kind == zmq.PUSH:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
        else:
            sock.setsockopt(zmq.LINGER, DEALER_LINGER_MS)
        sock.setsockopt(zmq.TCP_MAXRT, self._maxrt_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, self._redial_max_ms)
        try:
            client_options(sock, self.keys, peer.public_key)
            sock.connect(peer.data_ep if kind == zmq.PUSH else peer.ctrl_ep)
        except zmq.ZMQError:
            sock.close(linger=0)  # (left open, it would hang the context's term at close)
            raise
        return sock

    def join(self, peer: Peer, wb: WriteBatch, now: float) -> Peer:
        """A node met for the first time, or in a new life: its peer (replacing the old
        one's sockets), remembered in the store, and told our hello."""
        node_id, ctrl_ep = peer.node_id, peer.ctrl_ep
        old = self.peers.get(node_id)
        if old is not None:
            log.info(
                "peer %s restarted (incarnation %d -> %d)",
                peer.name,
                old.incarnation,
                peer.incarnation,
            )
            self.drop(old, now, "restarted")
        self._contacts.met(ctrl_ep)
        self.peers[node_id] = peer
        self._left.pop(node_id, None)
        self._at[ctrl_ep] = node_id
        if peer.met:
            _remember(peer, wb)
        log.info("peer %s (%s) joined at %s", peer.name, node_id.hex()[:12], ctrl_ep)
        self.say_hello(peer)
        return peer

    def room_for(self, node_id: bytes, met: bool, now: float, wb: WriteBatch) -> bool:
        """Whether a new peer (``met``: it said hello) fits within ``MAX_PEERS`` and,
        unmet, ``MAX_UNMET_PEERS``, the peer dead the longest forgotten to make room (a
        dead peer is kept only in case it comes back: nodes that come and go, each run
        of a worker or of the command line a node of its own, would otherwise fill the
        table with the dead and lock out the living); a refusal is counted and logged
        now and then."""
        peers = self.peers
        if node_id in peers:  # (a new life of a known node takes its place)
            return True
        if len(peers) >= MAX_PEERS:
            dead = [p for p in peers.values() if not p.alive]
            if dead:
                oldest = min(dead, key=_dead_since)
                self.forget(oldest, now, "dead the longest, to make room for a new peer", wb)
                self.counters.add("dead_peers_forgotten_for_room", 1)
        if len(peers) < MAX_PEERS and (
            met or sum(not p.met for p in peers.values()) < MAX_UNMET_PEERS
        ):
            return True
        self.counters.add("peers_refused", 1)
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged_at = now
            log.warning(
                "refusing a new peer: this node knows %d (at most %d, of them %d that have "
                "not said hello); see the peers_refused counter",
                len(peers),
                MAX_PEERS,
                MAX_UNMET_PEERS,
            )
        return False

    def admissible(self, key: bytes) -> bool:
        """Whether a node with this CURVE key may be a peer (on a secured mesh: trusted)."""
        return self.keys is None or key in self.keys.trusted

    def hello(self, to: Iterable[Peer] = ()) -> Hello:
        """Our hello: what we subscribe, and the peers ``to`` it lists. A peer applies our
        subscriptions only from a hello that lists it (it shows we know it); a contact's
        lists none; one to a random member every ``SYNC_BEATS`` heartbeats lists every live
        peer (anti-entropy: a peer that gossip missed is met by contacting it)."""
        limit = self.config.max_message_bytes
        # Several subscriptions of one topic and group on this node are one member of its
        # lane: named once (the newest one's flow control).
        subs = tuple(
            {
                (s.topic, announced_group(s), s.mode): SubInfo(
                    s.topic,
                    announced_group(s),
                    s.mode,
                    s.config.max_in_flight,
                    s.config.batch_size,
                    limit,
                    s.config.deliver,
                )
                for s in self._local_subs()
            }.values()
        )
        host, copies, serving = (
            self.replication.announce() if self.replication is not None else (False, (), ())
        )
        return Hello(
            self.node_id,
            self.config.name,
            self.config.mesh,
            self.incarnation,
            self.ctrl_port,
            self.data_port,
            self.hosts,
            subs,
            tuple(PeerRef(p.node_id, p.ctrl_ep, p.public_key.decode()) for p in to),
            host,
            copies,
            serving,
        )

    def say_hello(self, peer: Peer) -> None:
        """Our hello to ``peer``, listing it alone (it shows we know it)."""
        self.send_raw(peer.dealer, encode_control(self.hello((peer,))))

    def contact(self, ep: str, seed: bool = False, key: bytes = b"") -> None:
        """Say hello to a control endpoint whose node we do not know yet (contacts.py),
        unless a live peer is there."""
        there = self.peers.get(self._at.get(ep, b""))
        if there is None or not there.alive:
            self._contacts.add(ep, seed, key, self.keys, encode_control(self.hello()))

    def send_raw(self, sock: zmq.Socket[bytes], frame: bytes) -> bool:
        try:
            sock.send(frame, zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.counters.add("control_send_full", 1)
            return False

    def on_hello(
        self,
        hello: Hello,
        addr: str | None,
        key: bytes,
        wb: WriteBatch,
        now: float,
        announced: tuple[SubInfo, ...] | None = None,
    ) -> None:
        """A hello arrived; ``key`` is the sender's authenticated CURVE key; ``announced``:
        its subscriptions before the ACL kept those its key may have (``hello.subs``)."""
        if hello.mesh != self.config.mesh:
            self.counters.add("foreign_mesh_hellos", 1)
            if hello.node_id not in self._foreign_logged:
                self._foreign_logged.add(hello.node_id)
                log.warning(  # (once a node: a seed, or a stale address, names this one)
                    "ignoring node %s of mesh %r (from %s, control port %d): this is mesh %r",
                    hello.name,
                    hello.mesh,
                    addr or ", ".join(hello.hosts),
                    hello.ctrl_port,
                    self.config.mesh,
                )
            return
        if hello.node_id == self.node_id:
            return
        if not all(map(_valid_sub, hello.subs)):
            hello, announced = self._refuse_subs(hello, announced, now)
        host = addr or next((h for h in hello.hosts if h not in ("*", "0.0.0.0")), None)
        if host is None:
            self.counters.add("hello_without_address", 1)
            return
        peer = self.peers.get(hello.node_id)
        if peer is not None and hello.incarnation < peer.incarnation:
            return  # a late hello of an earlier life
        if peer is None or hello.incarnation > peer.incarnation:
            if not self.room_for(hello.node_id, True, now, wb):
                return
            ctrl_ep, data_ep = endpoint(host, hello.ctrl_port), endpoint(host, hello.data_port)
            new = self.make_peer(
                hello.node_id, hello.name, hello.incarnation, ctrl_ep, data_ep, now, key
            )
            new.met = True
            peer = self.join(new, wb, now)
        elif not peer.met:  # (known from membership frames until now)
            peer.met = True
            _remember(peer, wb)
            self.liveness.met(peer)
        elif not peer.alive:
            # A hello of a peer we hold dead: our sockets to it may have been refused for
            # good (its node revoked our key, then trusted it again: ZeroMQ does not
            # connect again after a refusal), so they are opened anew at their next use
            # (what the old control socket holds still goes, if it can).
            peer.close(DEALER_LINGER_MS)
        peer.last_seen = now
        self.liveness.hello(peer, wb, now)
        peer.replica_host, peer.copies = hello.replica_host, hello.copies
        if hello.serving != peer.serving:
            peer.serving = hello.serving
            self._index_served()
        # A peer that does not list us yet would refuse our data (it cannot ack a stranger),
        # so it becomes a member of our lanes only once its hello shows it knows us.
        if hello.subs:
            # A subscriber is sent data: its connection opens now, to be up by the time
            # its subscriptions apply (this hello's, or the next one's that lists us).
            peer.open_data()
        # Only a hello that lists us says what the node consumes here: one that does not
        # (a contact's, or one from a node that holds us dead) leaves its lanes as they are.
        if any(r.node_id == self.node_id for r in hello.peers):
            subs = hello.subs
            peer.announced = hello.subs if announced is None else announced
            if not peer.alive:
                peer.subs = subs  # (applied when it is alive again)
            elif subs != peer.subs:
                self.apply_subs(peer, subs, wb, now)
        for ref in hello.peers:
            if ref.node_id != self.node_id and ref.node_id not in self.peers:
                self.contact(ref.ctrl_endpoint, key=ref.public_key.encode())

    def _refuse_subs(
        self, hello: Hello, announced: tuple[SubInfo, ...] | None, now: float
    ) -> tuple[Hello, tuple[SubInfo, ...] | None]:
        """``hello`` without its subscriptions that no node's ``subscribe()`` makes (a
        topic that is not a subject, a group that is not a name: as lanes, keys longer
        than the store takes, which failed the loop's whole transaction), counted, said
        now and then."""
        kept = tuple(filter(_valid_sub, hello.subs))
        self.counters.add("subscriptions_refused", len(hello.subs) - len(kept))
        if now - self._bad_subs_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._bad_subs_logged_at = now
            bad = next(s for s in hello.subs if not _valid_sub(s))
            log.warning(
                "ignoring subscriptions of node %s that are not valid (topic %.64r, group "
                "%.64r); see the subscriptions_refused counter",
                hello.name,
                bad.topic,
                bad.group,
            )
        if announced is not None:
            announced = tuple(filter(_valid_sub, announced))
        return dataclasses.replace(hello, subs=kept), announced

    def apply_subs(self, peer: Peer, subs: tuple[SubInfo, ...], wb: WriteBatch, now: float) -> None:
        # (a pattern's lanes: one per known topic it matches; patterns.py)
        new = self.groups.patterns.wanted(peer.node_id, subs, wb, now)
        _members(self.lanes, self.groups, peer.node_id, peer.lanes, new, wb, now, False)
        for taken in self.taken.values():
            lanes, groups = taken.outbox.lanes, taken.outbox.groups
            _members(lanes, groups, peer.node_id, peer.lanes, new, taken.wb, now, True)
        peer.subs = subs
        peer.lanes = new
        self._apply_ephemeral(peer)

    def _apply_ephemeral(self, peer: Peer) -> None:
        """``peer``'s ephemeral subscriptions (``peer.subs``) join the index once our data
        connection to it is up (with IMMEDIATE, a send before then fails: what is sent at
        most once would be lost); till then it waits in ``unready``."""
        ephemeral = {(s.topic, s.group): s for s in peer.subs if s.mode == "ephemeral"}
        if ephemeral == peer.ephemeral:
            self.unready.discard(peer.node_id)
            return
        if ephemeral and not peer.push.poll(0, zmq.POLLOUT):
            self.unready.add(peer.node_id)
            return
        self.unready.discard(peer.node_id)
        fresh = [s for key, s in ephemeral.items() if key not in peer.ephemeral]
        peer.ephemeral = ephemeral
        self._index_ephemeral()
        for s in fresh:  # (before anything stored from now on: sent after the commit)
            if s.deliver == "last_per_key":
                send_kept(peer, s, self.kept, self.node_id, self.incarnation, self.counters)

    def ready_data(self) -> bool:
        """Apply the ephemeral subscriptions of peers whose data connection is up now;
        whether some still wait."""
        for node_id in list(self.unready):
            peer = self.peers.get(node_id)
            if peer is None or not peer.alive:
                self.unready.discard(node_id)
            else:
                self._apply_ephemeral(peer)
        return bool(self.unready)

    def _live_peers(self) -> list[Peer]:
        return [p for p in (self.self_peer, *self.peers.values()) if p is not None and p.alive]

    def _index_ephemeral(self) -> None:
        self.ephemeral = SubjectMap(
            (topic, (peer, s))
            for peer in self._live_peers()
            for (topic, _name), s in peer.ephemeral.items()
        )

    def take_members(self, taken: Taken, now: float) -> None:
        """``taken``'s lanes get the live members they have (this node's too)."""
        lanes, groups = taken.outbox.lanes, taken.outbox.groups
        for peer in (self.self_peer, *self.peers.values()):
            if peer is not None and peer.alive:
                _members(lanes, groups, peer.node_id, {}, peer.lanes, taken.wb, now, True)

    def serving_changed(self) -> None:
        """This node took a producer's lanes over or let them go: every peer hears it."""
        self._index_served()
        self.hello_all()

    def hello_all(self) -> None:
        """What our hello says changed: each live peer is told, in a hello listing it (a
        hello that lists nobody applies none of our subscriptions there)."""
        for peer in self.peers.values():
            if peer.alive:
                self.say_hello(peer)

    def unserve(self, producer: bytes, server: bytes) -> None:
        """``server`` handed ``producer``'s lanes back (its next hello will say so)."""
        servers = self.served.get(producer)
        if servers is not None:
            servers.discard(server)
            if not servers:
                del self.served[producer]
        peer = self.peers.get(server)
        if peer is not None:
            peer.serving = tuple(p for p in peer.serving if p != producer)

    def _index_served(self) -> None:
        served: dict[bytes, set[bytes]] = {}
        for peer in self.peers.values():
            if peer.alive:
                for producer in peer.serving:
                    served.setdefault(producer, set()).add(peer.node_id)
        for producer in self.taken:
            served.setdefault(producer, set()).add(self.node_id)
        self.served = served

    def admits(self, producer: bytes, incarnation: int) -> bool | None:
        """Whether a data batch of ``producer`` is delivered: while a node serves the
        producer's lanes, only that node's (the producer's own, sent from the other side
        of a partition, go back); None when the producer is not known at all."""
        if producer in self.served:
            return incarnation >= TAKEN_INCARNATION
        if self.peer(producer) is None:
            return None
        return True

    def renew_lanes(self, topic: str, group: str, wb: WriteBatch, now: float) -> None:
        """``group`` of ``topic`` was deleted here: live members that still subscribe to
        it are members of a new lane of it at once (it owes what is published from now)."""
        for peer in (self.self_peer, *self.peers.values()):
            if peer is None or not peer.alive:
                continue
            gone = [
                key
                for key, s in peer.lanes.items()
                if topic in (key[0], s.topic) and s.group == group
            ]
            if gone:
                for key in gone:
                    del peer.lanes[key]
                self.apply_subs(peer, peer.subs, wb, now)

    def send_to_peers(self, msg: GroupDel) -> int:
        """Send a control message to every live peer; returns how many were sent it."""
        frame = encode_control(msg)
        return sum(self.send_raw(peer.dealer, frame) for peer in self.peers.values() if peer.alive)

    def subs_changed(self, wb: WriteBatch, now: float) -> None:
        assert self.self_peer is not None
        self.apply_subs(self.self_peer, self.hello().subs, wb, now)
        self.hello_all()

    def mark_dead(self, peer: Peer, now: float, why: str) -> None:
        """``peer`` is dead: it leaves every lane, what it held in flight is ready again.
        Its sockets and its subscriptions are kept, for when it is alive again."""
        peer.alive = False
        peer.state = "dead"
        peer.dead_since = now
        peer.lanes = {}
        self.groups.patterns.changed()
        if peer.ephemeral:
            peer.ephemeral = {}
            self._index_ephemeral()
        moved = self.lanes.members_gone(peer.node_id, now)
        for taken in self.taken.values():
            taken.outbox.lanes.members_gone(peer.node_id, now)
        if peer.serving:
            self._index_served()
        log.log(
            # (one that never said hello was never a member here: news for debugging)
            logging.DEBUG
            if not peer.met
            else logging.WARNING
            if why == "unresponsive"
            else logging.INFO,
            "peer %s (%s) is gone (%s, last heard %.1fs ago); %d in-flight messages pending again",
            peer.name,
            peer.node_id.hex()[:12],
            why,
            now - peer.last_seen,
            moved,
        )

    def revive(self, peer: Peer, wb: WriteBatch, now: float) -> None:
        """``peer`` was dead and is alive again in the same life: back in its lanes, with
        the sockets it had, and told our hello (our subscriptions may have changed)."""
        log.info("peer %s is back after %.1fs", peer.name, now - peer.dead_since)
        peer.alive = True
        self.counters.add("peers_back", 1)
        subs, peer.subs = peer.subs, ()
        self.apply_subs(peer, subs, wb, now)
        if peer.serving:
            self._index_served()
        self.say_hello(peer)

    def drop(self, peer: Peer, now: float, why: str) -> None:
        """Forget ``peer``'s life: out of the lanes, its sockets closed."""
        if peer.alive:
            self.mark_dead(peer, now, why)
        self.peers.pop(peer.node_id, None)
        if self._at.get(peer.ctrl_ep) == peer.node_id:
            del self._at[peer.ctrl_ep]
        peer.close()

    def left(self, node_id: bytes, now: float) -> None:
        """``node_id`` said bye and its peer is dropped: its address is deleted from the
        store once it has been gone FORGET_DEAD_AFTER_S, as a dead peer's is (unless it
        says hello again), not kept for good: producers that come and go, each run a
        node of its own, would fill the store, and the contacts of the next start."""
        self._left.pop(node_id, None)
        self._left[node_id] = now

    def forget(self, peer: Peer, now: float, why: str, wb: WriteBatch) -> None:
        """Forget ``peer`` altogether (its key revoked, dead too long), in the store too."""
        self.liveness.forget(peer.node_id)
        self.drop(peer, now, why)
        self._left.pop(peer.node_id, None)
        wb.peers_del.append(peer.node_id)

    def beat(self, now: float, wb: WriteBatch) -> None:
        """Heartbeat: hellos to contacts, now and then every live peer named to one of
        them; peers dead too long are forgotten."""
        for peer in list(self.peers.values()):
            if not peer.alive and now - peer.dead_since > FORGET_DEAD_AFTER_S:
                self.forget(peer, now, "dead too long", wb)
        left = self._left
        while left:
            node_id, at = next(iter(left.items()))
            if now - at <= FORGET_DEAD_AFTER_S:
                break
            del left[node_id]
            wb.peers_del.append(node_id)
        if self.ctrl_backlog or self._unknown_since:
            self._expire_backlogs(now)
        if self._contacts:
            self._contacts.beat(encode_control(self.hello()))
        self._beats += 1
        live = [p for p in self.peers.values() if p.alive]
        if live and self._beats % SYNC_BEATS == 0:
            to = random.choice(live)
            self.send_raw(to.dealer, encode_control(self.hello(live)))

    def _expire_backlogs(self, now: float) -> None:
        """Frames held for a node that is not a peer wait ``dead_after_s`` for it to be
        one (a producer whose data overtook its hello says it within a moment), then are
        dropped, counted: a producer that said bye, or was forgotten, before the acks of
        what this node held of it were sent never takes them, and a backlog per producer
        gone would be kept for good (and, CTRL_BACKLOG_PEERS_MAX of them, leave no room
        for a live peer's)."""
        since = self._unknown_since
        for node_id, backlog in list(self.ctrl_backlog.items()):
            if node_id == self.node_id or node_id in self.peers:
                since.pop(node_id, None)
            elif now - since.setdefault(node_id, now) >= self.config.dead_after_s:
                del self.ctrl_backlog[node_id], since[node_id]
                self.counters.add("control_dropped", len(backlog))
        for node_id in [n for n in since if n not in self.ctrl_backlog]:
            del since[node_id]

    # -- sending -------------------------------------------------------------------------

    def send_ctrl(self, node_id: bytes, msg: Control, relay: bool = True) -> None:
        """Send a settlement to a producer (or another control message to a node); hold
        it while the node is unknown or its socket is full, so acks are delayed rather
        than lost. A settlement for a producer whose lanes a node serves goes to that
        node, naming the producer (``relay``), and to the producer too if it is alive."""
        if relay and self.served and isinstance(msg, _SETTLEMENTS):
            servers = self.served.get(node_id)
            if servers:
                relayed = encode_control(dataclasses.replace(msg, producer=node_id))
                for server in servers:
                    self._send_frame(server, relayed)
                producer = self.peers.get(node_id)
                if node_id != self.node_id and (producer is None or not producer.alive):
                    return
        self._send_frame(node_id, encode_control(msg))

    def _send_frame(self, node_id: bytes, frame: bytes) -> None:
        peer = self.self_peer if node_id == self.node_id else self.peers.get(node_id)
        backlog = self.ctrl_backlog.get(node_id)
        if peer is not None and not backlog:
            try:
                peer.dealer.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
        backlog = self.ctrl_backlog.get(node_id)
        if backlog is None:
            if len(self.ctrl_backlog) >= CTRL_BACKLOG_PEERS_MAX:
                self.counters.add("control_dropped", 1)  # too many unknown nodes
                return
            backlog = self.ctrl_backlog[node_id] = []
        if len(backlog) < (CTRL_BACKLOG_MAX if peer is not None else CTRL_BACKLOG_UNKNOWN_MAX):
            backlog.append(frame)
        else:
            self.counters.add("control_dropped", 1)

    def flush_ctrl_backlog(self) -> bool:
        """Send what waits; True when a socket was still full."""
        blocked = False
        for node_id, backlog in list(self.ctrl_backlog.items()):
            peer = self.self_peer if node_id == self.node_id else self.peers.get(node_id)
            if peer is None:
                continue
            sent = 0
            try:
                for frame in backlog:
                    peer.dealer.send(frame, zmq.NOBLOCK)
                    sent += 1
            except zmq.Again:
                blocked = True
            del backlog[:sent]
            if not backlog:
                del self.ctrl_backlog[node_id]
        return blocked

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close(DEALER_LINGER_MS)
        self.peers.clear()
        if self.self_peer is not None:
            self.self_peer.close()
        self._contacts.close()


def _members(
    lanes: Lanes,
    groups: Groups,
    member: bytes,
    old: dict[tuple[str, str], SubInfo],
    new: dict[tuple[str, str], SubInfo],
    wb: WriteBatch,
    now: float,
    known_only: bool,
) -> None:
    """A node's subscriptions changed from ``old`` to ``new``: it leaves the lanes it no
    longer consumes and joins (or makes) those it does; ``known_only``: only lanes of the
    topics that have some here (the lanes of a producer taken over)."""
    for key in old.keys() - new.keys():
        lane = lanes.get(*key)
        if lane is not None:
            lane.remove_member(member, now)
    for (topic, name), s in new.items():
        if known_only and not lanes.of_topic(topic, unclaimed=True):
            continue
        lane = groups.ensure(topic, name, s.group, s.mode, wb, now, s.deliver)
        lane.set_member(member, s.max_in_flight, s.batch_size, s.max_message_bytes)


def _valid_sub(s: SubInfo) -> bool:
    """Whether a hello's subscription is one ``subscribe()`` makes: a topic or pattern by
    the subject rules, a group by the name rules (an ephemeral one's own name, ``~N``)."""
    if subject_error("topic", s.topic, True) is not None:
        return False
    if s.mode == "ephemeral":
        return _EPHEMERAL_NAME.match(s.group) is not None
    try:
        check_name("group", s.group)
    except ConfigError:
        return False
    return True


def _remember(peer: Peer, wb: WriteBatch) -> None:
    """Keep ``peer``'s address in the store: contacted again at the next start (a
    deletion of it earlier in the iteration, its last life's, is undone)."""
    if peer.node_id in wb.peers_del:
        wb.peers_del[:] = [n for n in wb.peers_del if n != peer.node_id]
    wb.peers_put[peer.node_id] = f"{peer.ctrl_ep} {peer.public_key.decode()}".strip().encode()
