"""Encoding and decoding of the membership frames (PING, PING_REQ, PONG, GOSSIP), for
``codec``. Pure; decoding raises only DecodeError.

On the wire, after ``[version, kind``: the sender's rumor of itself, then (PING, PING_REQ)
seq and target id, or (PONG) seq and the id found alive, then the rumors. A rumor is
``[id, name, incarnation, refuted, state, by, control endpoint, data port, public key]``.
"""

from __future__ import annotations

from typing import Any

from .checks import check, endpoint, integer, node_id, text
from .frames import GOSSIP, PING, PING_REQ, PONG, Gossip, Ping, PingReq, Pong, Rumor

MAX_RUMORS = 64  # per frame (a node sends RUMORS_PER_FRAME at most)
STATES = (0, 1, 2)

Membership = Ping | PingReq | Pong | Gossip


def _rumor(r: Rumor) -> list[object]:
    return [
        r.node_id,
        r.name,
        r.incarnation,
        r.refuted,
        r.state,
        r.by,
        r.ctrl_endpoint,
        r.data_port,
        r.public_key,
    ]


def encode(msg: Membership, version: int) -> list[object]:
    """The frame's list (packed by the codec)."""
    rumors = [_rumor(r) for r in msg.rumors]
    if isinstance(msg, Ping):
        return [version, PING, _rumor(msg.sender), msg.seq, msg.target, rumors]
    if isinstance(msg, PingReq):
        return [version, PING_REQ, _rumor(msg.sender), msg.seq, msg.target, rumors]
    if isinstance(msg, Pong):
        return [version, PONG, _rumor(msg.sender), msg.seq, msg.about, rumors]
    return [version, GOSSIP, _rumor(msg.sender), rumors]


def _decode_rumor(value: Any) -> Rumor:
    check(isinstance(value, list) and len(value) == 9, "bad rumor")
    by = value[5]
    check(isinstance(by, bytes) and (by == b"" or len(by) == 16), "bad rumor author")
    check(type(value[4]) is int and value[4] in STATES, "bad rumor state")
    return Rumor(
        node_id(value[0]),
        text(value[1], "name"),
        integer(value[2], "incarnation"),
        integer(value[3], "refuted"),
        value[4],
        by,
        endpoint(value[6]),
        integer(value[7], "data port", 1, 65535),
        text(value[8], "public key", 40),
    )


def _decode_rumors(value: Any) -> tuple[Rumor, ...]:
    check(isinstance(value, list) and len(value) <= MAX_RUMORS, "bad rumors")
    return tuple(_decode_rumor(r) for r in value)


def decode(obj: list[Any]) -> Membership:
    """The frame a codec-checked list holds (``obj[1]`` is one of this module's kinds)."""
    kind = obj[1]
    if kind == GOSSIP:
        check(len(obj) == 4, "bad gossip length")
        return Gossip(_decode_rumor(obj[2]), _decode_rumors(obj[3]))
    check(len(obj) == 6, "bad probe length")
    sender, seq, other = _decode_rumor(obj[2]), integer(obj[3], "seq"), node_id(obj[4])
    rumors = _decode_rumors(obj[5])
    if kind == PING:
        return Ping(sender, seq, other, rumors)
    if kind == PING_REQ:
        return PingReq(sender, seq, other, rumors)
    return Pong(sender, seq, other, rumors)


KINDS = frozenset({PING, PING_REQ, PONG, GOSSIP})
