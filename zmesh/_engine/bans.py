"""Abuse of a node's sockets: counted per connection, answered by dropping the connection,
and by banning an address (or a CURVE key) only when several of its connections misbehave.

One misbehaving process must not lock out everyone behind its address: a host's other
nodes, a NAT's other hosts, the same host's operators. So undecodable frames are counted
per connection (the ZAP handler gives every connection an id, ``X-Conn``, which ZeroMQ
attaches to each frame), and a connection that sends ``drop_after_bad_frames`` of them is
shut down at once (its socket, found by the frame's source descriptor); what it had
queued is dropped unread. An address whose connections were dropped
``ban_after_dropped_connections`` times within BAN_WINDOW_S is banned for
``ban_duration_s``, except a loopback address (unless ``ban_loopback``); on a secured
mesh the CURVE key of such connections is banned instead, wherever it connects from.

Frames of another protocol version are not abuse: a node of another version (a rolling
upgrade) is told once per address, in the log, and its frames are dropped. A banned
address still reaches the control socket, where its first status or admin request gets a
reply saying since when it is banned, and anything more shuts the connection down; its
data connections are refused by ZAP.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import zmq

from ..config import NodeConfig
from .stats import Counters

log = logging.getLogger(__name__)

BAN_WINDOW_S = 600.0  # dropped connections counted towards a ban within this long
DROPPED_KEPT = 4096  # connections remembered as dropped (their queued frames skipped)
CONNS_KEPT = 10_000  # connections whose identity, or count of bad frames, is remembered
RECENT_DROP_S = 2.0  # after a drop, data frames are looked at for their connection
_VERSION_ERROR = "unsupported protocol version"


@dataclass(frozen=True, slots=True)
class Ban:
    """An address or key refused until ``until`` (monotonic; inf: until restart)."""

    who: str
    since: float  # wall clock, for people
    until: float
    why: str

    def text(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        end = (
            "until the node restarts"
            if self.until == float("inf")
            else f"for {max(0.0, self.until - time.monotonic()):.0f}s more"
        )
        return f"{self.who} is banned by the node since {since}, {end}: {self.why}"


@dataclass(slots=True)
class Conn:
    """What a connection's first frame said about it."""

    conn: str  # the id the ZAP handler gave it
    address: str
    key: str  # its CURVE key, or ""
    ban: str  # why it is banned, or ""
    rid: bytes = b""  # its routing id at the control socket
    told: bool = False  # a banned one: its request was answered with why


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def meta(frame: zmq.Frame, name: str) -> str:
    """A property ZeroMQ attached to ``frame`` (metadata of its connection), or ""."""
    try:
        value = frame.get(name)
    except zmq.ZMQError:  # (inproc frames have none)
        return ""
    return value if isinstance(value, str) else ""


def shut_down(frame: zmq.Frame) -> None:
    """Shut down the TCP connection ``frame`` came on. ZeroMQ owns the descriptor: a
    shutdown through a duplicate of it makes ZeroMQ see the connection end and close it."""
    try:
        fd = frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return
    if not isinstance(fd, int) or fd < 0:
        return
    try:
        dup = os.dup(fd)
    except OSError:
        return
    try:
        with socket.socket(fileno=dup) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # (closed meanwhile)


class Bans:
    """Bad frames per connection, connections dropped per address and key, and bans."""

    def __init__(self, config: NodeConfig, counters: Counters) -> None:
        self.config = config
        self.counters = counters
        self.bans: dict[str, Ban] = {}  # address or key -> its ban
        self._bad: dict[str, int] = {}  # connection -> bad frames
        self._dropped: OrderedDict[str, None] = OrderedDict()
        self._drops: dict[str, deque[float]] = {}  # address or key -> when
        self._last_drop = -RECENT_DROP_S
        self._versions_told: set[tuple[str, str]] = set()
        self._next_id = 0
        self.conns: OrderedDict[bytes, Conn] = OrderedDict()  # control routing id -> Conn

    # -- the ZAP handler's side ---------------------------------------------------------

    def new_conn(self) -> str:
        self._next_id += 1
        return str(self._next_id)

    def find(self, address: str, key: str, now: float) -> Ban | None:
        """The ban on ``address`` or ``key``, if one is in force."""
        for who in (address, key):
            ban = self.bans.get(who) if who else None
            if ban is not None:
                if now < ban.until:
                    return ban
                del self.bans[who]
                log.warning("the ban of %s ended", who)
        return None

    # -- the listener's side ------------------------------------------------------------

    def control_conn(self, rid: bytes, frame: zmq.Frame) -> Conn:
        """The connection a control frame came on (its properties read once)."""
        conn = self.conns.get(rid)
        if conn is None:
            cid = meta(frame, "X-Conn")
            if cid and cid in self._dropped:
                # (not kept: a later connection may come with the same routing id, which a
                # client may choose)
                return Conn(cid, "", "", "", rid)
            conn = self.conns[rid] = Conn(
                cid, meta(frame, "Peer-Address"), meta(frame, "User-Id"), meta(frame, "X-Ban"), rid
            )
            if len(self.conns) > CONNS_KEPT:
                self.conns.popitem(last=False)
        return conn

    def dropped(self, conn: str) -> bool:
        """Whether ``conn`` was dropped (what it had queued arrives after the drop: it is
        skipped unread, and counted)."""
        if conn and conn in self._dropped:
            self.counters.add("dropped_connection_frames", 1)
            return True
        return False

    def data_dropped(self, frame: zmq.Frame, now: float) -> bool:
        """Whether a data frame came on a connection dropped a moment ago."""
        if now - self._last_drop > RECENT_DROP_S:
            return False
        return self.dropped(meta(frame, "X-Conn"))

    def bad_frame(
        self, frame: zmq.Frame, error: Exception, now: float, conn: Conn | None = None
    ) -> None:
        """A frame that is not valid zmesh wire data arrived (``conn``: a control
        connection's, else read from the frame)."""
        if conn is None:
            conn = Conn(
                meta(frame, "X-Conn"), meta(frame, "Peer-Address"), meta(frame, "User-Id"), ""
            )
        if str(error).startswith(_VERSION_ERROR):
            self.counters.add("wrong_version_frames", 1)
            told = (conn.address, str(error))
            if told not in self._versions_told and len(self._versions_told) < 1000:
                self._versions_told.add(told)
                log.warning(
                    "a node at %s speaks another zmesh protocol (%s; this node "
                    "speaks the version of this release): nodes of two versions do "
                    "not talk, upgrade the older one; its frames are dropped",
                    conn.address or "?",
                    error,
                )
            return
        limit = self.config.drop_after_bad_frames
        if not limit or not conn.conn or conn.conn in self._dropped:
            return
        n = self._bad[conn.conn] = self._bad.get(conn.conn, 0) + 1
        if len(self._bad) > CONNS_KEPT:  # (connections that sent a few and went away)
            del self._bad[next(iter(self._bad))]
        if n >= limit:
            self._drop(frame, conn, n, error, now)

    def _drop(self, frame: zmq.Frame, conn: Conn, n: int, error: Exception, now: float) -> None:
        shut_down(frame)
        del self._bad[conn.conn]
        self.conns.pop(conn.rid, None)
        self._dropped[conn.conn] = None
        if len(self._dropped) > DROPPED_KEPT:
            self._dropped.popitem(last=False)
        self._last_drop = now
        self.counters.add("connections_dropped", 1)
        who = conn.key or conn.address
        since = now - BAN_WINDOW_S
        for other in [w for w, t in self._drops.items() if t[-1] < since]:
            del self._drops[other]  # (addresses that stopped: nothing left to count)
        times = self._drops.setdefault(who, deque())
        times.append(now)
        while times and times[0] < since:
            times.popleft()
        log.warning(
            "dropped a connection from %s%s: %d frames that are not zmesh wire "
            "data (the last: %s); %d of its connections dropped in %.0f s",
            conn.address or "?",
            f" (key {conn.key})" if conn.key else "",
            n,
            error,
            len(times),
            BAN_WINDOW_S,
        )
        if len(times) >= (self.config.ban_after_dropped_connections or float("inf")):
            self._ban(who, conn, len(times), now)

    def _ban(self, who: str, conn: Conn, drops: int, now: float) -> None:
        if not conn.key and is_loopback(who) and not self.config.ban_loopback:
            return  # (its connections are still dropped, one by one)
        duration = self.config.ban_duration_s or float("inf")
        ban = self.bans[who] = Ban(
            f"{'key' if conn.key else 'address'} {who}",
            time.time(),
            now + duration,
            f"{drops} of its connections sent frames that are not zmesh wire data",
        )
        self._drops.pop(who, None)
        self.counters.add("keys_banned" if conn.key else "addresses_banned", 1)
        log.warning(
            "banning %s for %s: %d of its connections were dropped for frames that "
            "are not zmesh wire data within %.0f s (zmesh status shows bans)",
            ban.who,
            "good" if duration == float("inf") else f"{duration:g}s",
            drops,
            BAN_WINDOW_S,
        )

    def refuse(self, frame: zmq.Frame, conn: Conn) -> None:
        """A banned connection said something: it is shut down."""
        shut_down(frame)
        self.conns.pop(conn.rid, None)

    def state(self, now: float) -> list[dict[str, Any]]:
        """The bans in force, for status."""
        return [
            {
                "who": ban.who,
                "since": ban.since,
                "until_s": None if ban.until == float("inf") else round(ban.until - now, 1),
                "why": ban.why,
            }
            for who, ban in list(self.bans.items())
            if self.find(who, "", now)
        ]
