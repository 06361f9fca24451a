"""A consumer's side of a take-over, with no IO thread: the mesh of one node on a real
store and real sockets, peers' hellos handed to it, what it sends read where they
listen. While a node serves a producer's lanes, the producer's own batches are refused
and every settlement for it goes to the taker, naming the producer (and to the producer
too while it is alive)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from tests.unit.conftest import ME
from zmesh._engine.mesh import Mesh
from zmesh._engine.replica.takeover import TAKEN_INCARNATION
from zmesh._protocol.codec import decode_control
from zmesh._protocol.frames import Ack, Hello, Nack, PeerRef
from zmesh._store.store import WriteBatch

X = b"\x01" * 16  # the producer
T = b"\x02" * 16  # the node that took its lanes over


class Listening:
    """A ROUTER where a peer would listen for control frames."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind("tcp://127.0.0.1:*")
        self.port = int(self.sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])

    def received(self, timeout_ms: int = 2000) -> list:
        out = []
        while self.sock.poll(timeout_ms if not out else 200):
            out.append(decode_control(self.sock.recv_multipart()[1]))
        return out


@pytest.fixture
def listening(ctx: zmq.Context) -> Iterator[tuple[Listening, Listening]]:
    """Where the producer and the taker listen."""
    x, t = Listening(ctx), Listening(ctx)
    yield x, t
    x.sock.close(linger=0)
    t.sock.close(linger=0)


def _hello(
    node_id: bytes, port: int, serving: tuple[bytes, ...] = (), incarnation: int = 1
) -> Hello:
    return Hello(
        node_id,
        node_id.hex()[:4],
        "default",
        incarnation,
        port,
        port,
        ("127.0.0.1",),
        (),
        (PeerRef(ME, "tcp://127.0.0.1:1"),),
        True,
        (),
        serving,
    )


def test_while_a_node_serves_a_producer_only_its_batches_are_taken(
    mesh: Mesh, listening: tuple[Listening, Listening]
) -> None:
    x, t = listening
    assert mesh.admits(X, 7) is None  # (a stranger's batch: given back until it says hello)
    mesh.on_hello(_hello(X, x.port), "127.0.0.1", b"", WriteBatch(), 0.0)
    assert mesh.admits(X, 7) is True
    mesh.on_hello(_hello(T, t.port, serving=(X,)), "127.0.0.1", b"", WriteBatch(), 0.0)
    assert mesh.served == {X: {T}}
    assert mesh.admits(X, 7) is False  # the producer's own, from beyond a partition
    assert mesh.admits(X, TAKEN_INCARNATION) is True
    x.received(300), t.received(300)  # (the hellos this node answered with)

    # A settlement goes to the taker, naming the producer, and to the producer, alive.
    mesh.send_ctrl(X, Ack(ME, "topic", "g", range(10, 20)))
    [relayed] = [m for m in t.received() if isinstance(m, Ack)]
    assert relayed.producer == X and list(relayed.seqs) == list(range(10, 20))
    [direct] = [m for m in x.received() if isinstance(m, Ack)]
    assert direct.producer == b""
    # A refused batch goes back to the producer alone (the taker never sent it).
    mesh.send_ctrl(X, Nack(ME, "topic", "g", (5,), -1.0), relay=False)
    assert [m for m in x.received() if isinstance(m, Nack)]
    assert not [m for m in t.received(300) if isinstance(m, Nack)]

    # The producer silent: settlements go to the taker alone.
    mesh.mark_dead(mesh.peers[X], 10.0, "silent")
    mesh.send_ctrl(X, Ack(ME, "topic", "g", (30,)))
    assert [m.producer for m in t.received() if isinstance(m, Ack)] == [X]
    assert not [m for m in x.received(300) if isinstance(m, Ack)]
    # The taker gone: nobody serves the producer; its batches are taken again.
    mesh.mark_dead(mesh.peers[T], 11.0, "silent")
    assert mesh.served == {}
    assert mesh.admits(X, 7) is True
    # It comes back (a dead node returns in a new life) and hands the lanes back: the
    # producer's own batches are taken at once.
    hello = _hello(T, t.port, serving=(X,), incarnation=2)
    mesh.on_hello(hello, "127.0.0.1", b"", WriteBatch(), 12.0)
    assert mesh.admits(X, 7) is False
    mesh.unserve(X, T)
    assert mesh.admits(X, 7) is True


def test_a_node_that_takes_lanes_over_tells_each_peer_in_a_hello_that_lists_it(
    mesh: Mesh, listening: tuple[Listening, Listening]
) -> None:
    # (a hello that does not list its receiver applies none of the sender's subscriptions
    # there: one sent to all alike would take this node out of every lane it consumes)
    x, t = listening
    mesh.on_hello(_hello(X, x.port), "127.0.0.1", b"", WriteBatch(), 0.0)
    mesh.on_hello(_hello(T, t.port), "127.0.0.1", b"", WriteBatch(), 0.0)
    x.received(300), t.received(300)
    mesh.serving_changed()
    for node_id, peer in ((X, x), (T, t)):
        [hello] = [m for m in peer.received() if isinstance(m, Hello)]
        assert [r.node_id for r in hello.peers] == [node_id]
