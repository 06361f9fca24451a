"""Why a node did not answer a command: what the failed handshake says, and the refusal a
node sends a banned address or a key it does not permit.

The CLI's DEALER gets a monitor for failed handshakes; when no reply comes, the last
failure names the cause (keys missing or not needed, a key the node does not trust, a
server key that is not the node's). A reply that refuses (a status reply holding
``refused``, an admin reply with an error) is said as it is.
"""

from __future__ import annotations

import itertools

import zmq
from zmq.utils.monitor import recv_monitor_message

_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_names = itertools.count()
NO_KEYS_NEEDED = "the node runs without CurveZMQ keys: leave out --server-key and --secret-key-file"
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
            event = recv_monitor_message(self.mon, zmq.NOBLOCK)
            self.events.add((int(event["event"]), int(event["value"])))

    @property
    def conclusive(self) -> bool:
        """Whether a failure names its cause: a mechanism mismatch or a refused key (a
        node without keys that closes the connection first leaves only a vague one)."""
        self._drain()
        return any(
            event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
            or (event, value)
            == (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            for event, value in self.events
        )

    def why(self, keyed: bool) -> str | None:
        """What the failed handshakes say (``keyed``: the command had CURVE keys); the
        most telling one, since a connection retried may fail more vaguely."""
        self._drain()
        if not self.events:
            return None
        if (
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
        ) in self.events:
            if keyed:
                return NO_KEYS_NEEDED
            return "the node is secured and requires CurveZMQ keys: " + _KEYS
        auth = [value for event, value in self.events if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH]
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
