"""Bridge requests and replies: pure encode/decode, no I/O.

A request is ``[header, *parts]`` from a DEALER to the bridge's ROUTER; the header is msgpack
``{"v": 1, "k": kind, "t": token, "a": args}`` and the parts are raw bytes (log records of a
fetch reply, payloads of a publish). A reply echoes the token so a client drops stale ones.

Kinds: ``info`` (stream bounds; with ``reader`` also registers it and moves its
watermarks), ``fetch`` (records of one stream between offsets), ``publish`` (sink rows with
their row ids), ``drop`` (forget a reader).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import DecodeError

VERSION = 1
KINDS = frozenset({"info", "fetch", "publish", "drop"})

_pack = msgpack.Packer(use_bin_type=True).pack


@dataclass(slots=True, frozen=True)
class Request:
    kind: str
    token: int
    args: dict[str, Any]
    parts: tuple[bytes, ...] = ()


@dataclass(slots=True, frozen=True)
class Reply:
    token: int
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    parts: tuple[bytes, ...] = ()


def _header(frame: bytes) -> dict[str, Any]:
    try:
        head = msgpack.unpackb(frame, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"bad bridge header: {exc}") from exc
    if not isinstance(head, dict) or head.get("v") != VERSION:
        raise DecodeError(f"not a bridge frame of version {VERSION}")
    if not isinstance(head.get("t"), int):
        raise DecodeError("bridge frame without a token")
    return head


def encode_request(req: Request) -> list[bytes]:
    return [_pack({"v": VERSION, "k": req.kind, "t": req.token, "a": req.args}), *req.parts]


def decode_request(frames: list[bytes]) -> Request:
    if not frames:
        raise DecodeError("empty bridge request")
    head = _header(frames[0])
    kind, args = head.get("k"), head.get("a")
    if kind not in KINDS or not isinstance(args, dict):
        raise DecodeError(f"unknown bridge request {kind!r}")
    return Request(kind, head["t"], args, tuple(frames[1:]))


def encode_reply(rep: Reply) -> list[bytes]:
    head = {"v": VERSION, "t": rep.token, "ok": rep.ok, "r": rep.result, "e": rep.error}
    return [_pack(head), *rep.parts]


def decode_reply(frames: list[bytes]) -> Reply:
    if not frames:
        raise DecodeError("empty bridge reply")
    head = _header(frames[0])
    result = head.get("r")
    if not isinstance(result, dict):
        raise DecodeError("bridge reply without a result")
    return Reply(
        head["t"], bool(head.get("ok")), result, str(head.get("e") or ""), tuple(frames[1:])
    )
