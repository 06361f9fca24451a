"""The sockets a node listens on, and what arrives on them (IO thread only).

PULL takes data batches; ROUTER takes control frames, and answers status, admin and fetch
requests on the same socket. The ZAP handler vets whoever connects to either; a
connection that keeps sending frames that are not zmesh wire data is dropped, and an
address whose connections keep being dropped is banned (bans.py).

This module is long because every kind of frame that arrives is routed here, in one
place, to the part that handles it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import zmq

from .._acl import ADMIN_OPS
from .._protocol.codec import decode_batch, decode_control, encode_control
from .._protocol.frames import (
    Ack,
    AdminReply,
    AdminRequest,
    Bye,
    Fail,
    FetchHead,
    FetchItem,
    FetchReply,
    FetchRequest,
    Gossip,
    GroupDel,
    Hello,
    LastItem,
    LastReply,
    LastRequest,
    Nack,
    Ping,
    PingReq,
    Pong,
    Reply,
    StatusReply,
    StatusRequest,
    Touch,
)
from .._protocol.monitor import monitor_event
from .._security import CONTROL_DOMAIN, DATA_DOMAIN, ZapHandler, server_options
from .._subjects import subject_error
from ..errors import DecodeError, ZMeshError
from .admin import admin
from .bans import Bans, Conn, meta, shut_down
from .guard import Guard
from .replica.replication import REPLICATION_FRAMES
from .replica.takeover import is_settlement

if TYPE_CHECKING:
    from .._store.store import WriteBatch
    from .engine import Engine
    from .mesh import Mesh

log = logging.getLogger(__name__)

RECV_BURST = 512  # control frames handled per loop iteration
# Messages received per loop iteration: a few batches, so their acks (committed at the end
# of the iteration) flow back while the producer still has credit to send more.
RECV_DATA_MSGS = 200
# A data frame a consumer cannot decode is dropped, never acked: its producer sends it again
# after the ack timeout. Said at warning level at most this often (control frames too).
DATA_WARNING_INTERVAL_S = 60.0
# A fetch reply, and a reply of kept values, end past this many bytes of payloads, keys
# and headers (record.carried_bytes), at least one message each.
FETCH_REPLY_BYTES = 1 << 20
LAST_REPLY_BYTES = 1 << 20

# Plain ints: pyzmq's Flag enums cost an enum operation per use on the data path.
_NOBLOCK = int(zmq.NOBLOCK)


class Listener:
    """The PULL and ROUTER sockets of one node, with their ZAP handler and monitors."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.config = engine.config
        self.counters = engine.counters
        self.settler = engine.outbox.settler
        self.retained = engine.outbox.retained
        self.consumer = engine.consumer
        self.bans = Bans(self.config, self.counters)
        self.guard = Guard(engine)
        # When a warning may be said again, per kind: a socket's frames that cannot be
        # decoded ("data", "control"), a message's class that met an internal error.
        self._next_warning: dict[str, float] = {}
        # ROUTER connections that carried a peer's membership frames: descriptor -> peer
        # (its closing is news: membership suspects the peer at once)
        self._members_at: dict[int, bytes] = {}
        # What a control frame may hold: a reply carries its payload in it.
        self._max_control = self.config.max_message_bytes + (1 << 20)
        self._max_repl_bytes = self.config.max_message_bytes + (1 << 20)  # (copies' records)

    def open(self, ctx: zmq.Context[zmq.Socket[bytes]], inproc: str) -> tuple[int, int]:
        """Bind PULL and ROUTER on the configured interfaces and under ``inproc``; returns
        their TCP ports (data, control)."""
        cfg = self.config
        keys = self.engine.keys
        self.guard.load()  # (the ACL file: a bad one fails the start, the store closed)
        max_frame = self._max_control
        # The ZAP handler must be bound before any server socket, or CURVE admits everyone.
        self.zap = ZapHandler(ctx, keys, self.counters, self.bans)
        self.pull = ctx.socket(zmq.PULL)
        self.router = ctx.socket(zmq.ROUTER)
        for sock, domain in ((self.pull, DATA_DOMAIN), (self.router, CONTROL_DOMAIN)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
            server_options(sock, keys, domain)
        try:
            ports = self._bind(self.pull), self._bind(self.router)
        except zmq.ZMQError as exc:
            raise ZMeshError(
                f"cannot bind on interfaces {list(cfg.interfaces) or ['*']}: {exc}"
            ) from exc
        self.pull.bind(inproc + "-data")
        self.router.bind(inproc + "-ctrl")
        return ports

    def _bind(self, sock: zmq.Socket[bytes]) -> int:
        ifaces = list(self.config.interfaces) or ["*"]
        sock.bind(f"tcp://{_host(ifaces[0])}:*")
        port = int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        for iface in ifaces[1:]:
            sock.bind(f"tcp://{_host(iface)}:{port}")
        return port

    def register(self, poller: zmq.Poller) -> None:
        """Have ``poller`` watch these sockets and the monitors of their handshakes."""
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.zap.sock, zmq.POLLIN)
        # Failed handshakes (a keyless node at a secured one, garbage instead of ZMTP) never
        # reach ZAP; the sockets' monitors report them, and the ROUTER's its connections
        # that close.
        failed = (
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        self._monitors = [
            self.pull.get_monitor_socket(failed),
            self.router.get_monitor_socket(failed | zmq.EVENT_DISCONNECTED),
        ]
        for mon in self._monitors:
            poller.register(mon, zmq.POLLIN)

    def receive(self, events: dict[zmq.Socket[bytes], int], wb: WriteBatch, now: float) -> None:
        """Handle what the poller's ``events`` say is waiting on these sockets."""
        self.guard.tick(wb, now)
        if self.zap.sock in events:
            self.zap.handle(now)
        for mon in self._monitors:
            if mon in events:
                self._on_monitor(mon, wb, now)
        if self.pull in events:
            self._recv_data(wb, now)
        if self.router in events:
            self._recv_control(wb, now)

    def _recv_data(self, wb: WriteBatch, now: float) -> None:
        pull = self.pull
        mesh = self.engine.mesh
        guard = self.guard
        limit = self.config.max_message_bytes
        received = 0
        for _ in range(RECV_BURST):
            if received >= RECV_DATA_MSGS:
                return
            try:
                # Usually one frame; large payloads follow as more parts of the message.
                parts = _recv_parts(pull)
            except zmq.Again:
                return
            if self.bans.data_dropped(parts[0], now):
                continue
            key = meta(parts[0], "User-Id").encode() if guard.active else b""
            if key and key in guard.revoked:
                shut_down(parts[0])
                continue
            try:
                # (the header read where it was received: its inline payloads are copied
                # out as they are unpacked, once)
                batch = decode_batch([parts[0].buffer, *[f.bytes for f in parts[1:]]], limit)
            except DecodeError as exc:
                self.bans.bad_frame(parts[0], exc, now)
                self._undecodable("data", exc, now)
                continue
            admitted = True if mesh is None else mesh.admits(batch.node_id, batch.incarnation)
            if admitted is None:
                # Data can overtake its producer's hello; hand it back until we know the
                # producer (the nack waits for it), and never deliver a stranger's batch.
                self.counters.add("batches_from_unknown_peers", 1)
                self.consumer.release(batch)
                continue
            if not admitted:
                # The producer's own, while a node serves its lanes (it was cut off from
                # them): back to it alone, with its backoff (replica/takeover.py).
                assert mesh is not None
                self.counters.add("batches_fenced", 1)
                nack = Nack(self.engine.node_id, batch.topic, batch.lane, batch.seqs, -1.0)
                mesh.send_ctrl(batch.node_id, nack, relay=False)
                continue
            if key and not guard.allowed(key, "publish", batch.topic):
                # Handed back with the topic's backoff (a negative delay), not at once: it
                # comes again later, when the permission may have been granted.
                assert mesh is not None
                mesh.send_ctrl(
                    batch.node_id,
                    Nack(self.engine.node_id, batch.topic, batch.lane, batch.seqs, -1.0),
                )
                continue
            received += len(batch.seqs)
            self.consumer.on_batch(batch, wb, now)

    def _warn_now(self, kind: str, now: float) -> bool:
        """Whether a warning of ``kind`` may be said now: at most once a minute each."""
        if now < self._next_warning.get(kind, 0.0):
            return False
        self._next_warning[kind] = now + DATA_WARNING_INTERVAL_S
        return True

    def _undecodable(self, kind: str, exc: DecodeError, now: float) -> None:
        """A frame that cannot be decoded was dropped: counted, and said at warning level
        at most once a minute for each socket (a flood of them is one line a minute)."""
        self.counters.add("decode_errors", 1)
        if self._warn_now(kind, now):
            log.warning(
                "dropped a %s frame that cannot be decoded (%s); %d so far, "
                "see the decode_errors counter",
                kind,
                exc,
                self.counters.get("decode_errors"),
            )
        else:
            log.debug("dropped a bad %s frame: %s", kind, exc)

    def _on_monitor(self, mon: zmq.Socket[bytes], wb: WriteBatch, now: float) -> None:
        while True:
            try:
                event = monitor_event(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event.event == zmq.EVENT_DISCONNECTED:
                peer = self._members_at.pop(event.value, None)
                mesh = self.engine.mesh
                if peer is not None and mesh is not None:
                    mesh.liveness.disconnected(peer, wb, now)
                continue
            if event.event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # The connection ended during its handshake: a client that closed its
                # socket or ended at once (a node's contact of a peer it has just met, a
                # killed node), which says nothing of who it was.
                self.counters.add("handshakes_cut", 1)
                log.debug("a connection ended during its handshake on %s", event.endpoint)
                continue
            n = self.counters.get("handshakes_failed") + 1
            self.counters.add("handshakes_failed", 1)
            if n in (1, 10, 100, 1000) or n % 10_000 == 0:
                log.warning(
                    "%d failed handshakes so far (last: %s on %s); a node without "
                    "the mesh's keys, or not speaking zmesh, tries to connect",
                    n,
                    zmq.Event(event.event).name,
                    event.endpoint,
                )

    def _recv_control(self, wb: WriteBatch, now: float) -> None:
        router = self.router
        mesh = self.engine.mesh
        assert mesh is not None
        mesh.liveness.behind = True  # (until the ROUTER is found empty)
        for _ in range(RECV_BURST):
            try:
                frames = _recv_parts(router)
            except zmq.Again:
                mesh.liveness.behind = False
                return
            conn = self.bans.control_conn(frames[0].bytes, frames[-1])
            if self.bans.dropped(conn.conn):
                continue  # (what a dropped connection had queued)
            try:
                if len(frames) != 2:
                    raise DecodeError(f"{len(frames)} frames")
                msg = decode_control(
                    frames[1].bytes, self._max_control, max_repl_bytes=self._max_repl_bytes
                )
            except DecodeError as exc:
                self._undecodable("control", exc, now)
                self.bans.bad_frame(frames[-1], exc, now, conn)
                continue
            if conn.ban:
                self._refuse(msg, frames, conn)
                continue
            if self.guard.active and conn.key and not self._permitted(msg, frames, conn):
                continue
            try:
                self._on_control(msg, frames, conn, mesh, wb, now)
            except Exception:
                # Input must never stop the IO thread; this is a bug to report, not a crash.
                # Its traceback at most once a minute per kind of message: a peer sending
                # what meets it again and again does not flood the log.
                self.counters.add("internal_errors", 1)
                kind = type(msg).__name__
                if self._warn_now(kind, now):
                    log.exception(
                        "error while handling a %s; the node goes on (said at most once a "
                        "minute: see the internal_errors counter)",
                        kind,
                    )
                else:
                    log.debug("error while handling a %s", kind, exc_info=True)

    def _on_control(
        self,
        msg: object,
        frames: list[zmq.Frame],
        conn: Conn,
        mesh: Mesh,
        wb: WriteBatch,
        now: float,
    ) -> None:
        if is_settlement(msg, self.engine.node_id):  # (relayed: a producer taken over)
            self.engine.replication.settle(msg, now)  # type: ignore[arg-type]
        elif isinstance(msg, Ack):
            self.settler.on_ack(msg.topic, msg.lane, msg.seqs, wb)
        elif isinstance(msg, Ping | PingReq | Pong | Gossip):
            peer = mesh.liveness.on_frame(msg, conn.address or None, conn.key.encode(), wb, now)
            if peer is not None:
                fd = _source_fd(frames[1])
                if fd is not None:
                    self._members_at[fd] = peer
        elif isinstance(msg, REPLICATION_FRAMES):
            self.engine.replication.on_control(msg, wb, now)
        elif isinstance(msg, Hello):
            key = conn.key.encode()
            announced = msg.subs
            if key and self.guard.acl is not None:
                msg = self.guard.hello(msg, key)
            mesh.on_hello(msg, conn.address or None, key, wb, now, announced)
            self.engine.heard(msg.node_id)
        elif isinstance(msg, Nack):
            self.settler.on_nack(
                msg.topic, msg.lane, msg.seqs, None if msg.delay_s < 0 else msg.delay_s, wb, now
            )
        elif isinstance(msg, Fail):
            self.settler.on_fail(msg.topic, msg.lane, msg.seq, msg.reason, wb)
        elif isinstance(msg, Touch):
            self.settler.on_touch(msg.topic, msg.lane, msg.seqs, msg.node_id, now)
        elif isinstance(msg, GroupDel):
            if mesh.peers.get(msg.node_id) is not None:  # (a peer's operator, not a stranger)
                self.engine.delete_group(msg.topic, msg.group, wb, now, announce=False)
        elif isinstance(msg, Bye):
            mesh.liveness.left(msg.node_id, msg.incarnation, wb, now)
        elif isinstance(msg, StatusRequest):
            self._reply(frames[0], StatusReply(msg.token, self.engine.status()))
        elif isinstance(msg, AdminRequest):
            self._reply(frames[0], admin(self.engine, msg, wb, now))
        elif isinstance(msg, FetchRequest):
            items, heads = self.retained.fetch(
                msg.topic,
                dict(msg.cursors),
                msg.start,
                msg.max_items,
                FETCH_REPLY_BYTES,
                msg.max_payload_bytes,
            )
            self.counters.add("fetched", len(items))
            self._reply(
                frames[0],
                FetchReply(
                    msg.token,
                    msg.topic,
                    tuple(FetchItem(*i) for i in items),
                    tuple(FetchHead(*h) for h in heads),
                ),
            )
        elif isinstance(msg, Reply):
            if mesh.peer(msg.node_id) is not None:  # (a peer's answer, not a stranger's)
                self.engine.requests.deliver(msg, self.engine.node_id.hex())
        elif isinstance(msg, LastRequest):
            self._reply(frames[0], self._last_values(msg))

    def _last_values(self, msg: LastRequest) -> LastReply:
        """The values kept of the topics a pattern matches (``Node.last``)."""
        if subject_error("topic", msg.pattern, wildcards=True) is not None:
            self.counters.add("bad_requests", 1)
            return LastReply(msg.token, (), False)
        kept, more = self.engine.outbox.kept.read(
            msg.pattern, msg.after, msg.max_items, LAST_REPLY_BYTES, msg.max_payload_bytes
        )
        return LastReply(
            msg.token,
            tuple(
                LastItem(topic, partition, index, seq, r.key, r.headers, r.published_at, r.payload)
                for topic, partition, index, seq, r in kept
            ),
            more,
        )

    def _permitted(self, msg: object, frames: list[zmq.Frame], conn: Conn) -> bool:
        """Whether the key of ``conn`` may send ``msg`` (guard.py); a request it may not
        make is answered with why, a revoked key's connection is shut down."""
        key = conn.key.encode()
        guard = self.guard
        if key in guard.revoked:
            self.bans.refuse(frames[-1], conn)
            return False
        if isinstance(msg, Ack | Nack):
            return guard.allowed(key, "subscribe", msg.topic)
        if isinstance(msg, GroupDel):  # (a peer's group deletion: what it owes is dropped)
            return guard.allowed(key, "admin", "group")
        if isinstance(msg, Fail):
            return guard.allowed(key, "subscribe", msg.topic)
        if isinstance(msg, FetchRequest) and not guard.allowed(key, "subscribe", msg.topic):
            self._reply(frames[0], FetchReply(msg.token, msg.topic, (), ()))
            return False
        if isinstance(msg, LastRequest) and not guard.allowed(key, "subscribe", msg.pattern):
            self._reply(frames[0], LastReply(msg.token, (), False))
            return False
        if isinstance(msg, Reply):  # (a responder consumes the topic of the request)
            return guard.allowed(key, "subscribe", msg.topic)
        if isinstance(msg, StatusRequest) and not guard.allowed(key, "admin", "status"):
            self._reply(
                frames[0], StatusReply(msg.token, {"refused": guard.refusal(key, "status")})
            )
            return False
        if isinstance(msg, AdminRequest):
            right = ADMIN_OPS.get(msg.op, msg.op)
            if not guard.allowed(key, "admin", right):
                self._reply(
                    frames[0], AdminReply(msg.token, False, None, guard.refusal(key, right))
                )
                return False
        return True

    def _refuse(self, msg: object, frames: list[zmq.Frame], conn: Conn) -> None:
        """A banned connection's first request is answered with why (shutting it down at
        once could cut the reply off); anything more shuts it down."""
        if conn.told or not isinstance(msg, StatusRequest | AdminRequest):
            self.bans.refuse(frames[-1], conn)
        elif isinstance(msg, StatusRequest):
            self._reply(frames[0], StatusReply(msg.token, {"refused": conn.ban}))
        else:
            self._reply(frames[0], AdminReply(msg.token, False, None, conn.ban))
        conn.told = True

    def _reply(
        self, identity: zmq.Frame, msg: StatusReply | AdminReply | FetchReply | LastReply
    ) -> None:
        try:
            self.router.send_multipart([identity.bytes, encode_control(msg)], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.counters.add("replies_dropped", 1)

    def close(self) -> None:
        """Close whatever of these sockets was opened (also after a failed ``open``)."""
        monitors = getattr(self, "_monitors", ())
        for name in ("pull", "router"):
            sock = getattr(self, name, None)
            if sock is not None and not sock.closed and monitors:
                sock.disable_monitor()
        for mon in monitors:
            mon.close(linger=0)
        zap = getattr(self, "zap", None)
        if zap is not None:
            zap.close()
        for name in ("pull", "router"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(linger=0)


def _recv_parts(sock: zmq.Socket[bytes]) -> list[zmq.Frame]:
    """The parts of the next message, uncopied; zmq.Again when none waits.

    ZeroMQ delivers a message's parts whole, and a Frame knows whether more follow, where
    ``recv_multipart`` asks the socket (a getsockopt per part).
    """
    frames = [sock.recv(_NOBLOCK, copy=False)]
    while frames[-1].more:
        frames.append(sock.recv(_NOBLOCK, copy=False))
    return frames


def _source_fd(frame: zmq.Frame) -> int | None:
    """The descriptor of the TCP connection ``frame`` came on (None: inproc, or gone)."""
    try:
        fd = frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _host(iface: str) -> str:
    if iface in ("*", "0.0.0.0", ""):
        return "*"
    return f"[{iface}]" if ":" in iface else iface
