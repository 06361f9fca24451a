"""Asking the nodes of a mesh for their status (or an admin operation) over their control
sockets, from a thread that is not the node's IO thread.

The asking thread uses sockets of its own, in a context of its own (the way a replay
reader does): the IO thread only answers which peers it knows. Every node is asked at
once and given the same deadline, so a mesh with dead nodes answers within one timeout,
and a node that does not answer is reported as unreachable, never left out. Peers that
the reached nodes know and the asking node does not (gossip not yet arrived) are asked
in a second round.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from .._engine.admin import admin
from .._protocol.addresses import endpoint
from .._protocol.codec import decode_control, encode_control
from .._protocol.frames import (
    AdminReply,
    AdminRequest,
    LastReply,
    LastRequest,
    StatusReply,
    StatusRequest,
    random_token,
)
from .._security import Keys, client_options
from .._waits import poll_ms
from ..errors import DecodeError

if TYPE_CHECKING:
    from .._engine.engine import Engine

MESH_TIMEOUT_S = 2.0  # how long a node of the mesh is waited for, all of them at once
MAX_REPLY_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Target:
    """A node to ask: its control endpoint, and its CURVE key on a secured mesh."""

    node_id: str  # hex
    name: str
    control: str  # tcp://host:port
    public_key: bytes = b""
    alive: bool | None = None  # as the asking node sees it (None: not its peer)
    # Producers (hex ids) whose lanes it serves from its replica copies: it holds their
    # dead letters (admin ops with ``producer``).
    serving: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """What one target answered, or why not."""

    target: Target
    reply: StatusReply | AdminReply | LastReply | None
    rtt_ms: float | None
    error: str | None


def _self_target(engine: Engine) -> Target:
    """This node as a target (IO thread: the producers it serves)."""
    host = next((i for i in engine.config.interfaces if i not in ("*", "0.0.0.0")), "127.0.0.1")
    return Target(
        engine.node_id.hex(),
        engine.config.name,
        endpoint(host, engine.ctrl_port),
        engine.keys.public if engine.keys is not None else b"",
        True,
        tuple(p.hex() for p in engine.replication.taken),
    )


def _peers(engine: Engine) -> list[Target]:
    """The peers this node knows, alive or not (IO thread)."""
    mesh = engine.mesh
    return (
        []
        if mesh is None
        else [
            Target(
                p.node_id.hex(),
                p.name,
                p.ctrl_ep,
                p.public_key,
                p.alive,
                tuple(s.hex() for s in p.serving),
            )
            for p in mesh.peers.values()
            if not p.is_self
        ]
    )


def known(engine: Engine) -> tuple[dict[str, Any], list[Target]]:
    """This node's status and the peers it knows (one IO-thread call)."""
    return engine.queue.call(lambda _wb, _now: (engine.status(), _peers(engine)))


def all_targets(engine: Engine) -> list[Target]:
    """This node and every peer it knows, alive or not."""
    return engine.queue.call(lambda _wb, _now: [_self_target(engine), *_peers(engine)])


def ask(
    ctx: zmq.Context[zmq.Socket[bytes]],
    requests: Sequence[tuple[Target, StatusRequest | AdminRequest | LastRequest]],
    keys: Keys | None,
    timeout_s: float,
) -> list[Answer]:
    """Send each request to its target at once; the answers (in order) once every target
    has answered or ``timeout_s`` has passed."""
    socks: list[zmq.Socket[bytes]] = []
    replies: list[tuple[Any, float] | None] = [None] * len(requests)
    index: dict[zmq.Socket[bytes], int] = {}
    poller = zmq.Poller()
    start = time.monotonic()
    try:
        for i, (target, msg) in enumerate(requests):
            sock = ctx.socket(zmq.DEALER)
            socks.append(sock)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
            client_options(sock, keys, target.public_key)
            sock.connect(target.control)
            sock.send(encode_control(msg), zmq.NOBLOCK)
            poller.register(sock, zmq.POLLIN)
            index[sock] = i
        deadline = start + timeout_s
        while index:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for sock, _ in poller.poll(poll_ms(left)):
                i = index[sock]
                try:
                    reply = decode_control(sock.recv(zmq.NOBLOCK), MAX_REPLY_BYTES)
                except (DecodeError, zmq.Again):
                    continue
                if (
                    isinstance(reply, StatusReply | AdminReply | LastReply)
                    and reply.token == requests[i][1].token
                ):
                    replies[i] = (reply, time.monotonic())
                    poller.unregister(sock)
                    del index[sock]
    finally:
        for sock in socks:
            sock.close(linger=0)
    out = []
    for (target, msg), got in zip(requests, replies, strict=True):
        if got is None:
            what = (
                "status"
                if isinstance(msg, StatusRequest)
                else msg.op
                if isinstance(msg, AdminRequest)
                else "last values"
            )
            out.append(Answer(target, None, None, f"no {what} reply within {timeout_s:g}s"))
        else:
            out.append(Answer(target, got[0], round((got[1] - start) * 1000, 2), None))
    return out


def _control_address(ep: str) -> str:
    return ep.removeprefix("tcp://")


def _entry(
    target: Target,
    *,
    is_self: bool,
    status: dict[str, Any] | None,
    read_at: float | None,
    rtt_ms: float | None,
    error: str | None,
) -> dict[str, Any]:
    return {
        "id": target.node_id,
        "name": target.name,
        "control": _control_address(target.control),
        "self": is_self,
        "alive": target.alive,
        "reachable": status is not None,
        "read_at": read_at,
        "rtt_ms": rtt_ms,
        "error": error,
        "status": status,
    }


def collect_mesh(
    engine: Engine, ctx: zmq.Context[zmq.Socket[bytes]], timeout_s: float = MESH_TIMEOUT_S
) -> dict[str, Any]:
    """Every node this node knows (itself first), each with its status or marked
    unreachable, and the links between them as each reached node sees its peers."""
    own, peers = known(engine)
    me = _self_target(engine)
    nodes = [_entry(me, is_self=True, status=own, read_at=time.time(), rtt_ms=0.0, error=None)]
    seen = {me.node_id}
    targets = [t for t in peers if t.node_id not in seen]
    for _round in range(2):
        if not targets:
            break
        asked_at = time.time()
        answers = ask(
            ctx, [(t, StatusRequest(random_token())) for t in targets], engine.keys, timeout_s
        )
        seen.update(t.node_id for t in targets)
        found: dict[str, Target] = {}
        for a in answers:
            status = a.reply.status if isinstance(a.reply, StatusReply) else None
            error = a.error
            if status is not None and "refused" in status:  # (a key it does not admit)
                error = f"refused the status request: {status['refused']}"
                status = None
            read_at = None if status is None or a.rtt_ms is None else asked_at + a.rtt_ms / 1000
            nodes.append(
                _entry(
                    a.target,
                    is_self=False,
                    status=status,
                    read_at=read_at,
                    rtt_ms=a.rtt_ms,
                    error=error,
                )
            )
            for p in (status or {}).get("peers", []):
                if p["id"] not in seen and p["id"] not in found and p.get("control"):
                    key = (p.get("public_key") or "").encode()
                    found[p["id"]] = Target(p["id"], p["name"], p["control"], key)
        targets = list(found.values())
    links = []
    for node in nodes:
        status = node["status"]
        if status is None:
            continue
        for p in status.get("peers", []):
            links.append({"from": node["id"], "to": p["id"], "alive": bool(p["alive"])})
    return {
        "mesh": engine.config.mesh,
        "observer": me.node_id,
        "collected_at": time.time(),
        "timeout_s": timeout_s,
        "nodes": nodes,
        "links": links,
    }


def run_admin(
    engine: Engine,
    ctx: zmq.Context[zmq.Socket[bytes]],
    requests: Sequence[tuple[Target, dict[str, Any]]],
    op: str,
    timeout_s: float = MESH_TIMEOUT_S,
) -> list[Answer]:
    """Run the admin operation ``op`` (dead_letters, replay, purge, group_rm) at each
    target with its arguments: this node's own on its IO thread, the others over their
    control sockets (answers in the order asked)."""
    me = engine.node_id.hex()
    remote = [(i, t, args) for i, (t, args) in enumerate(requests) if t.node_id != me]
    answers: list[Answer | None] = [None] * len(requests)
    if remote:
        asked = [(t, AdminRequest(random_token(), op, args)) for _i, t, args in remote]
        got = ask(ctx, asked, engine.keys, timeout_s)
        for (i, _t, _args), answer in zip(remote, got, strict=True):
            answers[i] = answer
    for i, (t, args) in enumerate(requests):
        if t.node_id == me:
            answers[i] = Answer(t, _admin_here(engine, AdminRequest(0, op, args)), 0.0, None)
    return [a for a in answers if a is not None]


def _admin_here(engine: Engine, req: AdminRequest) -> AdminReply:
    return engine.queue.call(lambda wb, now: admin(engine, req, wb, now))
