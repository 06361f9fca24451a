"""Per-peer state: identity, endpoints, liveness, subscriptions and outgoing sockets.

A peer's sockets are opened when first used: its DEALER for the first control message
sent to it (a hello, a probe, an ack), its PUSH for the first data batch. A node that
never sends a member data has no data connection to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

from .._protocol.frames import CopyRef, SubInfo

if TYPE_CHECKING:
    from ..subscription import Subscription


_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)  # (ints: pyzmq's flag enums cost a call per "|")


def announced_group(sub: Subscription) -> str:
    """The group a node's hello names for a subscription: its group, or, ephemeral, its
    own name (its lane)."""
    return sub.lane if sub.group is None else sub.group


def lane_name(sub: SubInfo, member: bytes) -> str:
    """The producer-side lane a subscription consumes: the group, or a member's own copy."""
    return sub.group if sub.mode == "shared" else f"{sub.group}/{member.hex()}"


@dataclass(slots=True)
class Peer:
    """Another node of the mesh as this node knows it."""

    node_id: bytes
    name: str
    incarnation: int
    ctrl_ep: str
    data_ep: str
    opener: Callable[[Peer, int], zmq.Socket[bytes]]  # opens its PUSH or DEALER
    last_seen: float
    alive: bool = True  # (alive or suspect: a member of lanes)
    state: str = "alive"  # "alive", "suspect" or "dead"
    is_self: bool = False
    subs: tuple[SubInfo, ...] = ()
    announced: tuple[SubInfo, ...] = ()  # its subscriptions before the ACL kept some
    lanes: dict[tuple[str, str], SubInfo] = field(default_factory=dict)
    # Its ephemeral subscriptions (no lane: sent what is published while it is here),
    # by (topic, the subscription's name).
    ephemeral: dict[tuple[str, str], SubInfo] = field(default_factory=dict)
    dead_since: float = 0.0
    public_key: bytes = b""  # Z85 CURVE key, on a secured mesh
    # It said hello (a node of this mesh): remembered in the store, and named in gossip.
    met: bool = False
    # Replicas (its hello's): whether it hosts them, whose copies it holds, whose lanes
    # it took over.
    replica_host: bool = False
    copies: tuple[CopyRef, ...] = ()
    serving: tuple[bytes, ...] = ()
    _push: zmq.Socket[bytes] | None = None
    _dealer: zmq.Socket[bytes] | None = None

    @property
    def push(self) -> zmq.Socket[bytes]:
        if self._push is None:
            self._push = self.opener(self, zmq.PUSH)
        return self._push

    @property
    def dealer(self) -> zmq.Socket[bytes]:
        if self._dealer is None:
            self._dealer = self.opener(self, zmq.DEALER)
        return self._dealer

    def send_batch(self, frames: list[bytes]) -> None:
        """Send a data batch's frames on its PUSH without blocking (zmq.Again when its
        queue is full: a multipart message is queued whole or not at all). Parts of a
        multipart batch are large payloads, sent without a copy past pyzmq's copy
        threshold, like ``send_multipart(copy=False)`` without its per-part checks."""
        push = self.push
        if len(frames) == 1:
            push.send(frames[0], _NOBLOCK)
            return
        send = push.send
        for frame in frames[:-1]:
            send(frame, _MORE, copy=False)
        send(frames[-1], _NOBLOCK, copy=False)

    def open_data(self) -> None:
        """Open its data socket now (it subscribes: what is published next goes to it)."""
        _ = self.push

    @property
    def connected(self) -> bool:
        """Whether its control socket is open (something was sent to it)."""
        return self._dealer is not None

    def close(self, linger_ms: int = 0) -> None:
        if self._push is not None:
            self._push.close(linger=0)
            self._push = None
        if self._dealer is not None:
            self._dealer.close(linger=linger_ms)
            self._dealer = None

    def info(self, now: float) -> dict[str, Any]:
        return {
            "id": self.node_id.hex(),
            "name": self.name,
            "incarnation": self.incarnation,
            "control": self.ctrl_ep,
            "data": self.data_ep,
            "alive": self.alive,
            "state": self.state,
            "last_seen_s": round(now - self.last_seen, 3),
            # (an ephemeral one once it applies: sent to from then on)
            "subscriptions": [
                [s.topic, s.group, s.mode]
                for s in self.subs
                if s.mode != "ephemeral" or (s.topic, s.group) in self.ephemeral
            ],
            "public_key": self.public_key.decode() or None,  # (to reach it on a secured mesh)
        }
