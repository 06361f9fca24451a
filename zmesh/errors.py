"""Every exception zmesh raises.

The tree::

    ZMeshError
    ├── ConfigError                 bad configuration value (also ValueError)
    ├── ArgumentError               bad argument to a call (also ValueError)
    ├── NodeStateError              node not started, already closed, or failed
    │   └── NodeClosedError         the node closed before (or while) the call waited
    ├── DataDirLockedError          another open node holds the node's data dir
    ├── StoreError                  the LMDB store cannot be opened, read or written
    │   └── StoreFullError          the LMDB map, or the disk under it, is full
    ├── OutboxFullError             publish() waited for room in the outbox and gave up
    ├── MessageStateError           ack/nack/fail on a message already settled
    ├── NotDeliveredError           wait_delivered(): a group did not ack the message
    ├── NoRespondersError           request(): no group of the topic has a live member
    ├── ReplyError                  request(): the responder's function raised
    ├── TimeoutError                a wait_* call ran out of time (also builtins.TimeoutError)
    └── DecodeError                 a frame that is not valid zmesh wire data (internal)

No ``zmq.ZMQError`` or ``lmdb.Error`` leaves the public API: they are wrapped with
``raise ... from exc``.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping

__all__ = [
    "ArgumentError",
    "ConfigError",
    "DataDirLockedError",
    "DecodeError",
    "MessageStateError",
    "NoRespondersError",
    "NodeClosedError",
    "NodeStateError",
    "NotDeliveredError",
    "OutboxFullError",
    "ReplyError",
    "StoreError",
    "StoreFullError",
    "TimeoutError",
    "ZMeshError",
]


class ZMeshError(Exception):
    """Base class of every zmesh error."""


class ConfigError(ZMeshError, ValueError):
    """A configuration value or call argument is invalid."""


class ArgumentError(ZMeshError, ValueError):
    """A call got an argument it cannot use; the message says which and why."""


class NodeStateError(ZMeshError):
    """The node is not in a state that allows the call."""


class NodeClosedError(NodeStateError):
    """The node closed (or its IO thread stopped) before the call, or while it waited: a
    receipt that can no longer be stored or acked, a subscription or a transaction of a
    closed node. ``node``: the node's name; ``detail``: what was left waiting."""

    def __init__(self, node: str, detail: str = "") -> None:
        super().__init__(f"node {node!r} is closed" + (f": {detail}" if detail else ""))
        self.node = node
        self.detail = detail


class DataDirLockedError(ZMeshError):
    """Another open node holds this data dir: one of another live process, or one of this
    process not closed yet (``holder_pid``: the holder's pid, when its lock file says)."""

    def __init__(self, path: str, holder_pid: int | None = None) -> None:
        if holder_pid is not None and holder_pid == os.getpid():
            message = (
                f"data dir {path!r} is in use by another zmesh node of this process "
                f"(pid {holder_pid}) that was not closed: close() it (or use it in a "
                "with block) before opening its data dir again"
            )
        else:
            holder = (
                "of another process, or of this one and not closed yet"
                if holder_pid is None
                else f"pid {holder_pid}"
            )
            message = (
                f"data dir {path!r} is in use by another zmesh node ({holder}); "
                "give each node its own data_dir"
            )
        super().__init__(message)
        self.path = path
        self.holder_pid = holder_pid


class StoreError(ZMeshError):
    """The node's LMDB store failed."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message if path is None else f"{message} (store: {path})")
        self.path = path


class StoreFullError(StoreError):
    """The store has no room for new messages: publish() waited ``waited_s`` for room and
    gave up (or, with ``waited_s`` None, a commit found none). Either the LMDB map is full
    (``disk`` None), or the disk holding the store is (``disk`` names it, ``free_bytes``
    says what it had left: the store keeps some of it for acks and other settlements)."""

    def __init__(
        self,
        path: str,
        map_size_bytes: int,
        waited_s: float | None = None,
        *,
        disk: str | None = None,
        free_bytes: int | None = None,
    ) -> None:
        waited = "" if waited_s is None else f" and no room came within {waited_s:g}s"
        if disk is None:
            message = (
                f"LMDB map of {map_size_bytes} bytes is full{waited}; raise "
                "NodeConfig.map_size_bytes, set NodeConfig.max_map_size_bytes so the "
                "map grows, or let consumers drain the outbox"
            )
        else:
            left = "an unknown number of" if free_bytes is None else f"{free_bytes:,}"
            message = (
                f"the disk {disk} is full: {left} bytes free, which the store keeps "
                f"for acks and other settlements{waited}; free space on that disk, "
                "move the data dir to a larger one, or let consumers drain the outbox "
                "(publishes go on once acks make room in the store)"
            )
        super().__init__(message, path)
        self.map_size_bytes = map_size_bytes
        self.waited_s = waited_s
        self.disk = disk
        self.free_bytes = free_bytes


class OutboxFullError(ZMeshError):
    """publish() found the outbox full for longer than its timeout."""

    def __init__(self, depth: int, limit: int, timeout_s: float) -> None:
        super().__init__(
            f"outbox holds {depth} unacknowledged messages (limit {limit}) and no room "
            f"came within {timeout_s:g}s; raise NodeConfig.max_outbox_messages, pass a "
            "longer publish timeout, or start consumers for the backlog"
        )
        self.depth = depth
        self.limit = limit
        self.timeout_s = timeout_s


class MessageStateError(ZMeshError):
    """A message was acked, nacked or failed twice."""


class NotDeliveredError(ZMeshError):
    """``Receipt.wait_delivered()``: some group did not ack the message. ``outcomes``
    maps each group (lane) owed it to its outcome (``acked``, ``dead_lettered``,
    ``expired``, ``superseded``, ``group_deleted``, ...)."""

    def __init__(self, message_id: object, outcomes: Mapping[str, str]) -> None:
        others = {g: str(o) for g, o in outcomes.items() if o != "acked"}
        said = ", ".join(f"{g}: {o}" for g, o in sorted(others.items())) or "no group"
        super().__init__(f"message {message_id} was not delivered to every group ({said})")
        self.message_id = message_id
        self.outcomes = dict(outcomes)


class NoRespondersError(ZMeshError):
    """``request()``: no group of ``topic`` has a live member, so nobody would answer
    (raised at once; the request is not published)."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"no responders for {topic!r}: no group of the topic has a live member "
            "(is a server running, and has this node met it yet?)"
        )
        self.topic = topic


class ReplyError(ZMeshError):
    """``request()``: the responder's function raised; ``reason`` says what, ``reply``
    is the reply itself (``zmesh.Reply``, ``ok`` False)."""

    def __init__(self, topic: str, responder: str, reason: str, reply: object) -> None:
        super().__init__(f"the request on {topic!r} failed at responder {responder[:12]}: {reason}")
        self.topic = topic
        self.responder = responder
        self.reason = reason
        self.reply = reply


class TimeoutError(ZMeshError, builtins.TimeoutError):  # noqa: A001 - deliberate shadow
    """A wait ran out of time."""


class DecodeError(ZMeshError):
    """Bytes that are not a valid zmesh frame; the engine counts and drops them."""
