"""Pure encode/decode of the replication frames (REPL_OPS, REPL_ACK, REPL_DROP, HANDBACK,
HANDBACK_ACK); decoding raises only DecodeError. codec.py dispatches to them.

A ``ReplOps`` frame carries store keys and values as they are: its writes are packed once
and shared by every replica's frame (``pack_writes``), each replica's header packed apart
(``encode_repl_ops``), as a data batch's columns are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from .checks import U63
from .checks import check as _check
from .checks import integer as _int
from .checks import ints as _ints
from .checks import node_id as _node_id
from .checks import text as _str
from .frames import (
    HANDBACK,
    HANDBACK_ACK,
    PROTOCOL_VERSION,
    REPL_ACK,
    REPL_DROP,
    REPL_OPS,
    SYNC_END,
    Handback,
    HandbackAck,
    HandbackLane,
    ReplAck,
    ReplDrop,
    ReplOps,
    Writes,
)

MAX_REPLICA_SET = 16  # node ids in a ReplOps' replica set
MAX_KEY_BYTES = 1024  # a ``lanes`` key: a topic's and a lane's names, packed
SEQ_KEY_BYTES = 8  # msgs, runs
LANE_KEY_BYTES = 12  # pend, pruns, dead: lane id (4) + seq (8)
MAX_HANDBACK_INTS = 60_000  # range bounds of one hand-back lane part

_packb = msgpack.Packer(use_bin_type=True).pack
_array_header = msgpack.Packer(use_bin_type=True).pack_array_header

# -- encoding -------------------------------------------------------------------------------


def pack_writes(w: Writes) -> bytes:
    """A ``Writes`` as the last field of a REPL_OPS frame (tuples pack as arrays)."""
    return _packb(
        (
            w.msgs_put,
            w.pend_put,
            w.pend_runs,
            w.runs_put,
            w.prun_put,
            w.prun_set,
            w.lanes_put,
            w.lanes_del,
            w.dead_put,
            w.pend_del,
            w.msgs_del,
            w.runs_del,
            w.dead_del,
        )
    )


def encode_repl_ops(msg: ReplOps, packed_writes: bytes) -> bytes:
    """A REPL_OPS frame from its header fields and its writes packed (``pack_writes``)."""
    head = (
        PROTOCOL_VERSION,
        REPL_OPS,
        msg.producer,
        msg.incarnation,
        msg.op,
        msg.prev,
        msg.version,
        msg.replicas,
        msg.sync,
        msg.fsync,
        [[name, cfg] for name, cfg in msg.topics],
    )
    return _array_header(len(head) + 1) + _packb(head)[1:] + packed_writes


def encode_replication(msg: ReplAck | ReplDrop | Handback | HandbackAck) -> bytes:
    v = PROTOCOL_VERSION
    if isinstance(msg, ReplAck):
        return _packb([v, REPL_ACK, msg.node_id, msg.producer, msg.incarnation, msg.op, msg.resync])
    if isinstance(msg, ReplDrop):
        return _packb([v, REPL_DROP, msg.producer, msg.incarnation])
    if isinstance(msg, Handback):
        lanes = [[h.topic, h.lane, h.outcome, h.ranges, h.dead] for h in msg.lanes]
        return _packb([v, HANDBACK, msg.node_id, msg.producer, msg.token, lanes, msg.last])
    return _packb([v, HANDBACK_ACK, msg.node_id, msg.token])


# -- decoding -------------------------------------------------------------------------------


def _bin(value: Any, what: str, size: int = 0) -> bytes:
    """Bytes (of exactly ``size``, when given)."""
    _check(type(value) is bytes and (not size or len(value) == size), f"bad {what}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    _check(type(value) is list, f"bad {what}")
    return value


def _keys(value: Any, what: str, size: int) -> tuple[bytes, ...]:
    keys = _list(value, what)
    _check(all(type(k) is bytes and len(k) == size for k in keys), f"bad {what}")
    return tuple(keys)


def _pairs(value: Any, what: str, size: int, nil: bool = False) -> tuple[tuple[bytes, Any], ...]:
    """(key, value) pairs: keys of ``size`` bytes (0: up to MAX_KEY_BYTES), values bytes
    (or nil, with ``nil``)."""
    out = []
    for pair in _list(value, what):
        _check(type(pair) is list and len(pair) == 2, f"bad {what}")
        key, val = pair
        _check(
            type(key) is bytes and (len(key) == size if size else len(key) <= MAX_KEY_BYTES),
            f"bad {what} key",
        )
        _check(type(val) is bytes or (nil and val is None), f"bad {what} value")
        out.append((key, val))
    return tuple(out)


def _pend_runs(value: Any) -> tuple[tuple[bytes, tuple[bytes, ...], tuple[bytes, ...]], ...]:
    out = []
    for run in _list(value, "pending run"):
        _check(type(run) is list and len(run) == 3, "bad pending run")
        prefix = _bin(run[0], "pending run lane", 4)
        seqs = _keys(run[1], "pending run seqs", SEQ_KEY_BYTES)
        values = _list(run[2], "pending run values")
        _check(len(values) == len(seqs), "bad pending run values")
        _check(all(type(v) is bytes for v in values), "bad pending run values")
        out.append((prefix, seqs, tuple(values)))
    return tuple(out)


def _lanes_del(value: Any) -> tuple[tuple[bytes, int], ...]:
    out = []
    for pair in _list(value, "lanes deleted"):
        _check(type(pair) is list and len(pair) == 2, "bad lanes deleted")
        key = _bin(pair[0], "lanes deleted key")
        _check(len(key) <= MAX_KEY_BYTES, "bad lanes deleted key")
        out.append((key, _int(pair[1], "lane id", 0, (1 << 32) - 1)))
    return tuple(out)


def _writes(value: Any) -> Writes:
    _check(type(value) is list and len(value) == 13, "bad writes")
    (msgs_put, pend_put, pend_runs, runs_put, prun_put, prun_set, lanes_put) = value[:7]
    (lanes_del, dead_put, pend_del, msgs_del, runs_del, dead_del) = value[7:]
    return Writes(
        _pairs(msgs_put, "msgs put", SEQ_KEY_BYTES),
        _pairs(pend_put, "pend put", LANE_KEY_BYTES),
        _pend_runs(pend_runs),
        _pairs(runs_put, "runs put", SEQ_KEY_BYTES),
        _pairs(prun_put, "pruns put", LANE_KEY_BYTES),
        _pairs(prun_set, "pruns set", LANE_KEY_BYTES, nil=True),
        _pairs(lanes_put, "lanes put", 0),
        _lanes_del(lanes_del),
        _pairs(dead_put, "dead put", LANE_KEY_BYTES),
        _keys(pend_del, "pend deleted", LANE_KEY_BYTES),
        _keys(msgs_del, "msgs deleted", SEQ_KEY_BYTES),
        _keys(runs_del, "runs deleted", SEQ_KEY_BYTES),
        _keys(dead_del, "dead deleted", LANE_KEY_BYTES),
    )


def _topics(value: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    out = []
    for item in _list(value, "topics"):
        _check(type(item) is list and len(item) == 2 and type(item[1]) is dict, "bad topic")
        out.append((_str(item[0], "topic"), item[1]))
    return tuple(out)


def _repl_ops(obj: list[Any]) -> ReplOps:
    _check(len(obj) == 12, "bad replication frame length")
    replicas = _list(obj[7], "replica set")
    _check(len(replicas) <= MAX_REPLICA_SET, "bad replica set")
    return ReplOps(
        _node_id(obj[2]),
        _int(obj[3], "incarnation"),
        _int(obj[4], "op"),
        _int(obj[5], "previous op"),
        _int(obj[6], "version"),
        tuple(_node_id(r) for r in replicas),
        _int(obj[8], "sync", 0, SYNC_END),
        _flag(obj[9], "fsync"),
        _topics(obj[10]),
        _writes(obj[11]),
    )


def _flag(value: Any, what: str) -> bool:
    _check(type(value) is bool, f"bad {what}")
    return value


def _repl_ack(obj: list[Any]) -> ReplAck:
    _check(len(obj) == 7, "bad replica ack length")
    return ReplAck(
        _node_id(obj[2]),
        _node_id(obj[3]),
        _int(obj[4], "incarnation"),
        _int(obj[5], "op"),
        _flag(obj[6], "resync"),
    )


def _repl_drop(obj: list[Any]) -> ReplDrop:
    _check(len(obj) == 4, "bad replica drop length")
    return ReplDrop(_node_id(obj[2]), _int(obj[3], "incarnation"))


def _handback_lane(value: Any) -> HandbackLane:
    _check(type(value) is list and len(value) == 5, "bad hand-back lane")
    topic, lane, outcome, ranges, dead = value
    bounds = _list(ranges, "hand-back ranges")
    _check(len(bounds) % 2 == 0 and len(bounds) <= MAX_HANDBACK_INTS, "bad hand-back ranges")
    parked = []
    for item in _list(dead, "hand-back dead letters"):
        _check(type(item) is list and len(item) == 2, "bad hand-back dead letter")
        parked.append((_int(item[0], "seq"), _bin(item[1], "dead letter")))
    return HandbackLane(
        _str(topic, "topic"),
        _str(lane, "lane"),
        _str(outcome, "outcome", 32),
        _ints(bounds, len(bounds), "hand-back range", U63),
        tuple(parked),
    )


def _handback(obj: list[Any]) -> Handback:
    _check(len(obj) == 7, "bad hand-back length")
    return Handback(
        _node_id(obj[2]),
        _node_id(obj[3]),
        _int(obj[4], "token"),
        tuple(_handback_lane(h) for h in _list(obj[5], "hand-back lanes")),
        _flag(obj[6], "last"),
    )


def _handback_ack(obj: list[Any]) -> HandbackAck:
    _check(len(obj) == 4, "bad hand-back ack length")
    return HandbackAck(_node_id(obj[2]), _int(obj[3], "token"))


DECODERS: dict[int, Callable[[list[Any]], Any]] = {
    REPL_OPS: _repl_ops,
    REPL_ACK: _repl_ack,
    REPL_DROP: _repl_drop,
    HANDBACK: _handback,
    HANDBACK_ACK: _handback_ack,
}
