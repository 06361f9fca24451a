"""Dead letters of a group across the mesh, and the admin actions on them (replay,
purge), shared by the node's HTTP API and ``zmesh web``. Whether an action is allowed
at all is the caller's decision; these only do it."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import zmq

from .._protocol.checks import U63
from .._protocol.frames import AdminReply
from .._subjects import check_subject
from ..config import check_name, int_in
from ..errors import ConfigError
from .collect import MESH_TIMEOUT_S, all_targets, run_admin

if TYPE_CHECKING:
    from .._engine.engine import Engine

ADMIN_OPS = {"replay": "replayed", "purge": "purged"}  # op -> the count's name in answers
GROUP_RM = "/api/groups/rm"
DEAD_LETTER_ACTIONS = "/api/dead-letters/"  # + an ADMIN_OPS name
MAX_LIMIT = 100_000  # dead letters listed in one answer, at most
MAX_SEQ = 2**64 - 1


class HttpError(Exception):
    """An answer other than 200, with its JSON error message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def count(raw: str) -> int | None:
    """``raw`` as an int when it is decimal digits alone (ASCII: ``"²"`` is a digit to
    ``str.isdigit``, not to ``int``) of at most 2**63-1, what the wire carries (a digit
    string past 4,300 digits int() refuses); None otherwise."""
    if raw.isascii() and raw.isdigit() and len(raw) < 20 and (value := int(raw)) <= U63:
        return value
    return None


def arg(source: Mapping[str, Any], name: str) -> str:
    """A required, non-empty string argument."""
    value = source.get(name)
    if not isinstance(value, str) or not value:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"{name} is required")
    return value


def name_arg(source: Mapping[str, Any], kind: str, *, wildcards: bool = False) -> str:
    """A required topic or group name (``kind``), valid as a node takes it (a topic,
    ``wildcards``: or a pattern)."""
    value = arg(source, kind)
    try:
        if kind == "topic":
            return check_subject("topic", value, wildcards=wildcards)
        return check_name(kind, value)
    except ConfigError as exc:
        raise HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from None


def payload_json(payload: bytes) -> dict[str, str | None]:
    """A payload in JSON: ``payload_b64``, and ``payload_text`` when it is UTF-8."""
    try:
        text: str | None = payload.decode()
    except UnicodeDecodeError:
        text = None
    return {"payload_b64": base64.b64encode(payload).decode(), "payload_text": text}


def dead_letter_json(d: dict[str, Any], node: str, serving: str | None) -> dict[str, Any]:
    """A dead letter as an admin reply holds it, in JSON, the name of the node that holds
    it beside its id (``serving``: the producer, gone, whose lanes that node serves)."""
    out = {k: v for k, v in d.items() if k != "payload"}
    held = {"node": node, **({"serving": serving} if serving else {})}
    return {**out, "id": str(d["id"]), **held, **payload_json(bytes(d["payload"]))}


def dead_letters(
    engine: Engine,
    ctx: zmq.Context[zmq.Socket[bytes]],
    query: dict[str, str],
    timeout_s: float = MESH_TIMEOUT_S,
) -> dict[str, Any]:
    """The parked messages of ``query``'s topic and group at every node this one knows (or
    at ``node``, an id or a name), with the nodes that could not say. A node that serves
    the lanes of a producer gone is asked for that producer's too (its copy holds them):
    ``node`` names the one or the other."""
    args: dict[str, Any] = {"topic": name_arg(query, "topic"), "group": name_arg(query, "group")}
    given = str(query.get("limit", "1000"))
    limit = count(given)
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        raise HttpError(
            HTTPStatus.BAD_REQUEST, f"limit must be an int in 1..{MAX_LIMIT}, got {given!r}"
        )
    args["limit"] = limit
    targets = all_targets(engine)
    asked = targets
    node = query.get("node")
    if node:
        asked = [t for t in targets if node in (t.node_id, t.name)]
    producers = {t.node_id for t in asked} | ({node} if node and not asked else set())
    requests = [(t, args) for t in asked]
    requests += [
        (t, {**args, "producer": p})
        for t in targets
        for p in t.serving
        if not node or t in asked or p in producers
    ]
    if not requests:
        raise HttpError(HTTPStatus.NOT_FOUND, f"node {node!r} is not known to this node")
    letters: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for a, (_t, sent) in zip(
        run_admin(engine, ctx, requests, "dead_letters", timeout_s), requests, strict=True
    ):
        reply = a.reply
        if not isinstance(reply, AdminReply) or not reply.ok:
            error = reply.error if isinstance(reply, AdminReply) else a.error
            errors.append({"node": a.target.name, "node_id": a.target.node_id, "error": error})
            continue
        result = reply.result
        assert isinstance(result, list)
        serving = sent.get("producer")
        letters += [dead_letter_json(d, a.target.name, serving) for d in result]
    return {**args, "letters": letters, "errors": errors}


def remove_group(
    engine: Engine, ctx: zmq.Context[zmq.Socket[bytes]], body: dict[str, Any]
) -> dict[str, Any]:
    """Delete ``body``'s group of its topic (or pattern) at every node this one knows,
    then here (admin op ``group_rm``), whence every live peer is told as ``zmesh group
    rm`` does (a live peer that did not answer drops it so): what each node dropped of
    what it owed the group (``dropped_at``) and their sum, how many peers were told, and
    the nodes that did not answer (``errors``)."""
    args = {"topic": name_arg(body, "topic", wildcards=True), "group": name_arg(body, "group")}
    me, *peers = all_targets(engine)
    # (each peer drops its own lanes and counts them; told first, it has nothing left to
    # drop when this node's word comes)
    answers = run_admin(engine, ctx, [(p, {**args, "announce": False}) for p in peers], "group_rm")
    [here] = run_admin(engine, ctx, [(me, args)], "group_rm")
    reply = here.reply
    assert isinstance(reply, AdminReply)  # (this node's own: always answered)
    if not reply.ok:
        raise HttpError(HTTPStatus.BAD_REQUEST, reply.error)
    told = reply.result
    assert isinstance(told, dict)
    dropped_at: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for a in [here, *answers]:
        result = a.reply.result if isinstance(a.reply, AdminReply) and a.reply.ok else None
        if isinstance(result, dict):
            dropped_at.append(
                {"node": a.target.node_id, "name": a.target.name, "dropped": result["dropped"]}
            )
        else:
            error = a.reply.error if isinstance(a.reply, AdminReply) else a.error
            errors.append({"node": a.target.name, "node_id": a.target.node_id, "error": error})
    return {
        "node": me.node_id,
        "name": me.name,
        **args,
        "dropped": sum(d["dropped"] for d in dropped_at),
        "peers_told": told["peers_told"],
        "dropped_at": dropped_at,
        "errors": errors,
    }


def act(
    engine: Engine, ctx: zmq.Context[zmq.Socket[bytes]], op: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Replay or purge (``op``) dead letters of ``body``'s topic and group at its node
    (an id or a name): every one, or those whose sequences ``seqs`` lists. A producer
    that is not alive, whose lanes another node serves, is acted on at that node."""
    if op not in ADMIN_OPS:
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such action: {op}")
    node = arg(body, "node")
    args: dict[str, Any] = {"topic": name_arg(body, "topic"), "group": name_arg(body, "group")}
    seqs = body.get("seqs")
    if seqs is not None:
        if not isinstance(seqs, list) or not all(int_in(s, 0, MAX_SEQ) for s in seqs):
            raise HttpError(HTTPStatus.BAD_REQUEST, "seqs must be a list of ints in 0..2**64-1")
        args["seqs"] = seqs
    targets = all_targets(engine)
    named = [t for t in targets if node in (t.node_id, t.name)]
    if not named or named[0].alive is False:
        producer = named[0].node_id if named else node
        servers = [t for t in targets if t.alive and producer in t.serving]
        if servers:
            named, args["producer"] = servers, producer
    if not named:
        raise HttpError(HTTPStatus.NOT_FOUND, f"node {node!r} is not known to this node")
    [answer] = run_admin(engine, ctx, [(named[0], args)], op)
    reply = answer.reply
    if not isinstance(reply, AdminReply):
        raise HttpError(HTTPStatus.GATEWAY_TIMEOUT, f"{answer.target.name}: {answer.error}")
    if not reply.ok:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"{answer.target.name}: {reply.error}")
    return {
        "node": answer.target.node_id,
        "name": answer.target.name,
        **args,
        ADMIN_OPS[op]: reply.result,
    }
