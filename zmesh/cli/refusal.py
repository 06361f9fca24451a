"""Why a node did not answer a command: what the failed handshake says, and the refusal a
node sends a banned address or a key it does not permit.

The CLI's DEALER gets a monitor for failed handshakes; when no reply comes, the last
failure names the cause (keys missing or not needed, a key the node does not trust, a
server key that is not the node's). A failure with no detail (the node closed the
connection before its greeting reached the client) is told apart by the node's ZMTP
greeting, which names its mechanism. A reply that refuses (a status reply holding
``refused``, an admin reply with an error) is said as it is.
"""

from __future__ import annotations

import itertools
import socket

import zmq

from .._protocol.monitor import monitor_event

_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_names = itertools.count()
GREETING_TIMEOUT_S = 1.0  # how long a node's greeting is waited for
# ZMTP 3.0's greeting: a signature, the version, the mechanism (20 bytes, NUL-padded)...
_SIGNATURE = b"\xff" + bytes(8) + b"\x7f\x03\x00"
_MECHANISM = slice(12, 32)
_GREETING_BYTES = 64
_KEYS = (
    "pass --server-key (its NAME.pub, or the 'pk' of its mDNS record) and "
    "--secret-key-file (a key pair whose .pub is in its trusted_keys_dir)"
)


class HandshakeWatch:
    """The failed handshakes of one socket, for the message when no reply comes."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.mon = sock.get_monitor_socket(_FAILED, addr=f"inproc://zmesh-cli-{next(_names)}")
        self.events: set[tuple[int, int]] = set()  # (event, value) of each failure seen

    def _drain(self) -> None:
        while self.mon.poll(0):
            event = monitor_event(self.mon.recv_multipart(zmq.NOBLOCK))
            self.events.add((event.event, event.value))

    def why(self, keyed: bool, ep: str) -> str | None:
        """What the failed handshakes with ``ep`` say (``keyed``: the command had CURVE
        keys); the most telling one, since a connection retried may fail more vaguely."""
        self._drain()
        if not self.events:
            return None
        auth = [value for event, value in self.events if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH]
        mismatch = (
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
        ) in self.events
        if not mismatch and not auth:  # (vague: the node's greeting says which it is)
            mechanism = greeting_mechanism(ep)
            mismatch = mechanism is not None and (mechanism == "CURVE") != keyed
        if mismatch:
            if keyed:
                return (
                    "the node runs without CurveZMQ keys: leave out --server-key and "
                    "--secret-key-file"
                )
            return "the node is secured and requires CurveZMQ keys: " + _KEYS
        if auth:
            if keyed:
                return (
                    "the node refused the key of --secret-key-file: its .pub is not in "
                    "the node's trusted_keys_dir (or was taken out of it)"
                )
            return f"the node refused this connection (ZAP status {auth[0]})"
        if keyed:
            return (
                "the CurveZMQ handshake failed: --server-key is probably not this node's public key"
            )
        return (
            "the handshake with the node failed: it may be a secured node (then "
            + _KEYS
            + "), or not a zmesh node"
        )

    def close(self) -> None:
        self.mon.close(linger=0)


def greeting_mechanism(ep: str) -> str | None:
    """The security mechanism (``NULL``, ``CURVE``) the ZMTP node at ``ep`` (tcp://host:port)
    names in its greeting; None when no greeting comes. It is sent before any handshake,
    so a node says it whatever keys the asker has."""
    host, _, port = ep.removeprefix("tcp://").rpartition(":")
    got = b""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), GREETING_TIMEOUT_S) as conn:
            conn.sendall(_SIGNATURE)
            while len(got) < _GREETING_BYTES:
                part = conn.recv(_GREETING_BYTES - len(got))
                if not part:
                    break
                got += part
    except (OSError, ValueError):
        pass
    if len(got) < _MECHANISM.stop or got[0] != 0xFF or got[9] != 0x7F:
        return None  # (none, or not ZMTP 3)
    return got[_MECHANISM].rstrip(b"\0").decode("ascii", "replace")
