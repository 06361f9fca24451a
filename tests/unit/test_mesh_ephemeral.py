"""An ephemeral subscription applies once the producer's data connection to its node is
up: what is sent to it is sent at most once, and a send before the connection is up
fails (the data socket sets IMMEDIATE), so a message published in between would be lost.
The mesh of one node on a real store and real sockets, a peer's hello handed to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.waiting import until
from zmesh._engine.mesh import Mesh
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.outcomes import Outcomes
from zmesh._engine.stats import Counters
from zmesh._protocol.frames import Hello, PeerRef, SubInfo
from zmesh._store.store import Store, WriteBatch
from zmesh.config import NodeConfig

ME = b"\x0c" * 16
SUB = b"\x05" * 16  # the node that subscribes


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.fixture
def mesh(tmp_path: Path, ctx: zmq.Context) -> Iterator[Mesh]:
    store = Store(str(tmp_path / "me"), 1 << 24)
    config = NodeConfig(name="me", data_dir=str(tmp_path / "me"))
    outbox = Outbox(store, ME, 1, 1, {}, 1 << 20, 1 << 20, Counters(), Outcomes())
    mesh = Mesh(ctx, config, ME, 1, outbox, Counters(), list, None)
    mesh.ctrl_port = mesh.data_port = 1  # (what its hellos say: nobody dials it here)
    yield mesh
    mesh.close()
    store.close()


def test_an_ephemeral_subscription_applies_once_the_data_connection_is_up(
    mesh: Mesh, ctx: zmq.Context
) -> None:
    ctrl = ctx.socket(zmq.ROUTER)
    data = ctx.socket(zmq.PULL)
    try:
        ctrl.bind("tcp://127.0.0.1:*")
        data.bind("tcp://127.0.0.1:*")
        ctrl_port = int(ctrl.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        data_ep = data.getsockopt_string(zmq.LAST_ENDPOINT)
        data.unbind(data_ep)  # (nobody listens there until the end)
        data_port = int(data_ep.rsplit(":", 1)[1])
        sub = SubInfo("sensors.*", "~1", "ephemeral", 100, 10, 1 << 20)
        hello = Hello(
            SUB,
            "sub",
            "default",
            1,
            ctrl_port,
            data_port,
            ("127.0.0.1",),
            (sub,),
            (PeerRef(ME, "tcp://127.0.0.1:1"),),
            True,
            (),
            (),
        )
        mesh.on_hello(hello, "127.0.0.1", b"", WriteBatch(), 0.0)
        # Not yet: nothing sent could reach it.
        assert mesh.peers[SUB].info(0.0)["subscriptions"] == []
        assert mesh.ready_data() is True
        assert mesh.ephemeral.match("sensors.t1") == ()

        data.bind(data_ep)
        assert until(lambda: not mesh.ready_data(), 10.0, 0.01) is not None
        [(peer, applied)] = mesh.ephemeral.match("sensors.t1")
        assert peer.node_id == SUB and applied == sub
        assert mesh.peers[SUB].info(0.0)["subscriptions"] == [["sensors.*", "~1", "ephemeral"]]
    finally:
        ctrl.close(linger=0)
        data.close(linger=0)
