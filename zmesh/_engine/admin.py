"""Operators' requests over the control socket: dead letters and groups of a running
node."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .._protocol.frames import AdminReply, AdminRequest
from .._store.store import WriteBatch
from .._subjects import check_subject
from ..config import check_name

if TYPE_CHECKING:
    from .engine import Engine


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


def admin(engine: Engine, req: AdminRequest, wb: WriteBatch, now: float) -> AdminReply:
    """Run one request on the IO thread; errors come back in the reply."""
    dead = engine.outbox.dead
    args = req.args
    try:
        result: Any
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
