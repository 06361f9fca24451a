"""Operators' requests over the control socket: dead letters and groups of a running
node. Dead letters are this node's own, or (``producer``) those of a producer whose lanes
this node serves from its replica copy (replica/takeover.py)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .._protocol.frames import AdminReply, AdminRequest
from .._store.store import WriteBatch
from .._subjects import check_subject
from ..config import check_name
from .outbox.deadletters import DeadLetters

if TYPE_CHECKING:
    from .engine import Engine
    from .replica.replication import Replication
    from .replica.takeover import Taken

MIN_ID_PREFIX = 4  # hex digits that name a producer this node serves


def _seqs(args: dict[str, Any]) -> set[int] | None:
    seqs = args.get("seqs")
    if seqs is None:
        return None
    if not isinstance(seqs, list) or not all(type(s) is int for s in seqs):
        raise ValueError("seqs must be a list of ints")
    return set(seqs)


def _str_arg(args: dict[str, Any], name: str, patterns: bool = False) -> str:
    """The topic (``patterns``: or pattern) or group ``name`` of a request, checked as a
    publish or subscribe checks it (ValueError: said in the reply)."""
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} is required")
    if name == "topic":
        return check_subject(name, value, wildcards=patterns)
    return check_name(name, value)


def _dead_letters(
    engine: Engine, args: dict[str, Any], wb: WriteBatch
) -> tuple[DeadLetters, WriteBatch]:
    """The dead letters a request is about, and the batch that writes to their store."""
    producer = args.get("producer")
    if producer is None:
        return engine.outbox.dead, wb
    if not isinstance(producer, str):
        raise ValueError("producer must be a node id (hex)")
    taken = _served(engine.replication, producer)
    return (engine.outbox.dead, wb) if taken is None else (taken.outbox.dead, taken.wb)


def _served(replication: Replication, producer: str) -> Taken | None:
    """The taker of the producer whose node id is or starts with ``producer`` (hex); None
    when that is this node's own id; ValueError, saying why, when this node serves no such
    producer's lanes."""
    want = producer.lower()
    if len(want) < MIN_ID_PREFIX or any(c not in "0123456789abcdef" for c in want):
        raise ValueError(
            f"producer {producer!r} is not a node id (hex, {MIN_ID_PREFIX} digits or more)"
        )
    if replication.node_id.hex().startswith(want):
        return None
    taken = [t for p, t in replication.taken.items() if p.hex().startswith(want)]
    if len(taken) == 1:
        return taken[0]
    if taken:
        raise ValueError(f"producer {producer!r} names {len(taken)} producers served here")
    copies = replication.copies
    if any(p.hex().startswith(want) for p in (*copies.held, *copies.making)):
        raise ValueError(
            f"this node holds a copy of producer {producer}'s outbox but does not serve its "
            "lanes (the producer is alive, or not silent for takeover_after_s yet): its dead "
            "letters are at the producer"
        )
    served = ", ".join(p.hex()[:12] for p in replication.taken) or "none"
    raise ValueError(
        f"this node holds no copy of producer {producer} (producers it serves: {served})"
    )


def admin(engine: Engine, req: AdminRequest, wb: WriteBatch, now: float) -> AdminReply:
    """Run one request on the IO thread; errors come back in the reply."""
    args = req.args
    try:
        result: Any
        if req.op in ("dead_letters", "replay", "purge"):
            dead, wb = _dead_letters(engine, args, wb)
        if req.op == "dead_letters":
            limit = args.get("limit", 1000)
            letters = dead.list(
                _str_arg(args, "topic"),
                _str_arg(args, "group"),
                limit if type(limit) is int and limit > 0 else 1000,
            )
            result = [{**asdict(d), "id": str(d.id), "seq": d.id.seq} for d in letters]
        elif req.op == "replay":
            result = dead.replay(
                _str_arg(args, "topic"), _str_arg(args, "group"), _seqs(args), wb, now
            )
        elif req.op == "purge":
            result = dead.purge(_str_arg(args, "topic"), _str_arg(args, "group"), _seqs(args), wb)
        elif req.op == "groups":
            topic = args.get("topic")
            if topic is not None:
                topic = _str_arg(args, "topic", patterns=True)
            result = engine.outbox.groups.listing(topic, time.time())
        elif req.op == "group_rm":
            announce = args.get("announce", True)  # (False: the asker tells the peers)
            if type(announce) is not bool:
                raise ValueError("announce must be true or false")
            result = engine.delete_group(
                _str_arg(args, "topic", patterns=True),
                _str_arg(args, "group"),
                wb,
                now,
                announce=announce,
            )
        else:
            return AdminReply(req.token, False, None, f"unknown operation {req.op!r}")
    except ValueError as exc:
        return AdminReply(req.token, False, None, str(exc))
    return AdminReply(req.token, True, result, "")
