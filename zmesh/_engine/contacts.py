"""Contacts: control endpoints whose node is not known yet (a seed, an mDNS record, an
address a hello named). Each gets a DEALER of its own that says this node's hello every
heartbeat until the node there answers with its own (then it is a peer, and the contact
is closed) or, unless it is a seed, for ``CONTACT_EXPIRY_BEATS`` heartbeats.

A seed's DEALER is opened anew after each ``CONTACT_EXPIRY_BEATS`` heartbeats without an
answer: ZeroMQ connects again by itself after a connection fails, but not after the node
there refused its CURVE key, and that node may trust the key later (a .pub copied into
its trusted_keys_dir is read at run time). It is let go instead when the seed was not
named again meanwhile (an address its host name no longer resolves to)."""

from __future__ import annotations

import logging

import zmq

from .._security import Keys, client_options
from .limits import MAX_CONTACTS
from .stats import Counters

log = logging.getLogger(__name__)

CONTACT_EXPIRY_BEATS = 10


class Contacts:
    """The contacts of one node (IO thread)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], counters: Counters) -> None:
        self.ctx = ctx
        self.counters = counters
        self._keys: Keys | None = None  # this node's, as the last ``add`` was given them
        # (endpoint, server key) -> (socket, heartbeats without answer, is a seed)
        self._open: dict[tuple[str, bytes], tuple[zmq.Socket[bytes], int, bool]] = {}
        self._named: set[tuple[str, bytes]] = set()  # seeds named again since renewed

    def __bool__(self) -> bool:
        return bool(self._open)

    def add(self, ep: str, seed: bool, key: bytes, keys: Keys | None, hello: bytes) -> None:
        """Say ``hello`` to ``ep``. On a secured mesh the server key must be known; when it
        is not (a seed), every trusted key is tried: only the right one completes the CURVE
        handshake."""
        self._keys = keys
        candidates = [key] if key or keys is None else sorted(keys.trusted)
        for k in candidates:
            if (ep, k) in self._open:
                if seed:
                    self._named.add((ep, k))
                continue
            if not seed and len(self._open) >= MAX_CONTACTS:
                self.counters.add("contacts_refused", 1)  # (named again later, or never)
                return
            dealer = self._connect(ep, k)
            if dealer is None:
                return
            self._open[(ep, k)] = (dealer, 0, seed)
            _send(dealer, hello, self.counters)

    def _connect(self, ep: str, key: bytes) -> zmq.Socket[bytes] | None:
        """A DEALER connecting to ``ep`` (CURVE server ``key``); None when it cannot be
        made (counted, said)."""
        try:
            dealer = self.ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:  # (out of sockets or descriptors: not this one)
            self.counters.add("contacts_refused", 1)
            log.warning("cannot contact %r: %s", ep, exc)
            return None
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, 4)
        client_options(dealer, self._keys, key)
        try:
            dealer.connect(ep)
        except zmq.ZMQError as exc:
            dealer.close(linger=0)
            self.counters.add("bad_endpoints", 1)
            log.warning("cannot contact %r: %s", ep, exc)
            return None
        return dealer

    def met(self, ep: str) -> None:
        """The node at ``ep`` is a peer now: its contacts go (their tiny queues were for
        hellos only)."""
        for ck in [ck for ck in self._open if ck[0] == ep]:
            self._open.pop(ck)[0].close(linger=0)
            self._named.discard(ck)

    def beat(self, hello: bytes) -> None:
        for ck, (sock, beats, seed) in list(self._open.items()):
            if beats >= CONTACT_EXPIRY_BEATS:
                if not seed or ck not in self._named:
                    sock.close(linger=0)
                    del self._open[ck]
                    continue
                self._named.discard(ck)
                # A seed's socket anew (see above); the old one stays when it cannot be made.
                again = self._connect(*ck)
                if again is not None:
                    sock.close(linger=0)
                    sock = again
                beats = 0
            self._open[ck] = (sock, beats + 1, seed)
            _send(sock, hello, self.counters)

    def close(self) -> None:
        for sock, _beats, _seed in self._open.values():
            sock.close(linger=0)
        self._open.clear()
        self._named.clear()


def _send(sock: zmq.Socket[bytes], frame: bytes, counters: Counters) -> None:
    try:
        sock.send(frame, zmq.NOBLOCK)
    except zmq.Again:
        counters.add("control_send_full", 1)
