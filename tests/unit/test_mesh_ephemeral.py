"""An ephemeral subscription applies once the producer's data connection to its node is
up: what is sent to it is sent at most once, and a send before the connection is up
fails (the data socket sets IMMEDIATE), so a message published in between would be lost.
The mesh of one node on a real store and real sockets, peers' hellos handed to it."""

from __future__ import annotations

import socket

import zmq

from tests.unit.conftest import ME
from tests.waiting import until
from zmesh._engine.mesh import Mesh
from zmesh._protocol.frames import Hello, PeerRef, SubInfo
from zmesh._store.store import WriteBatch

SLOW = b"\x05" * 16  # a subscriber whose data port accepts TCP but never speaks ZMTP
UP = b"\x06" * 16  # a subscriber whose data port is a PULL socket


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _hello(node_id: bytes, ctrl_port: int, data_port: int, sub: SubInfo) -> Hello:
    return Hello(
        node_id,
        node_id.hex()[:4],
        "default",
        1,
        ctrl_port,
        data_port,
        ("127.0.0.1",),
        (sub,),
        (PeerRef(ME, "tcp://127.0.0.1:1"),),  # (it knows us: its subscriptions apply)
        True,
        (),
        (),
    )


def test_an_ephemeral_subscription_applies_once_the_data_connection_is_up(
    mesh: Mesh, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    ctrl = ctx.socket(zmq.ROUTER)
    data = ctx.socket(zmq.PULL)
    silent = socket.socket()  # (the kernel completes its TCP handshakes; nobody answers)
    try:
        ctrl.bind("tcp://127.0.0.1:*")
        data.bind("tcp://127.0.0.1:*")
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        ctrl_port = _port(ctrl.getsockopt_string(zmq.LAST_ENDPOINT))
        slow = SubInfo("sensors.*", "~1", "ephemeral", 100, 10, 1 << 20)
        up = SubInfo("sensors.>", "~1", "ephemeral", 100, 10, 1 << 20)
        hellos = [
            _hello(SLOW, ctrl_port, silent.getsockname()[1], slow),
            _hello(UP, ctrl_port, _port(data.getsockopt_string(zmq.LAST_ENDPOINT)), up),
        ]
        for hello in hellos:
            mesh.on_hello(hello, "127.0.0.1", b"", WriteBatch(), 0.0)

        # The one whose connection comes up is sent to from then on, and listed.
        assert until(lambda: mesh.ready_data() and mesh.unready == {SLOW}, 10.0, 0.01)
        [(peer, applied)] = mesh.ephemeral.match("sensors.t1")
        assert peer.node_id == UP and applied == up
        assert mesh.peers[UP].info(0.0)["subscriptions"] == [["sensors.>", "~1", "ephemeral"]]
        # The other waits: nothing sent to it could reach it.
        assert mesh.ready_data() is True
        assert mesh.peers[SLOW].info(0.0)["subscriptions"] == []
    finally:
        ctrl.close(linger=0)
        data.close(linger=0)
        silent.close()
