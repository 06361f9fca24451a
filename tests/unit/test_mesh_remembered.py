"""The peers a node remembers in its store (``peers``: contacted again at its next
start): each that said hello, until it is forgotten, dead or gone with a goodbye for
FORGET_DEAD_AFTER_S. A new life's hello in the batch that forgets the last keeps it."""

from __future__ import annotations

from tests.unit.conftest import ME
from zmesh._engine.limits import FORGET_DEAD_AFTER_S
from zmesh._engine.mesh import Mesh
from zmesh._protocol.frames import Hello, PeerRef
from zmesh._store.store import WriteBatch

C = b"\x07" * 16  # a consumer


def _hello(incarnation: int) -> Hello:
    us = (PeerRef(ME, "tcp://127.0.0.1:1"),)
    return Hello(C, "c", "default", incarnation, 9, 9, ("127.0.0.1",), (), us, False, (), ())


def test_a_peer_that_said_bye_is_forgotten_by_the_store_as_a_dead_one_is(mesh: Mesh) -> None:
    wb = WriteBatch()
    mesh.on_hello(_hello(1), "127.0.0.1", b"", wb, 0.0)
    assert C in wb.peers_put
    wb = WriteBatch()
    mesh.liveness.left(C, 1, wb, 1.0)
    assert C not in mesh.peers and wb.peers_del == []  # (back within 600 s: still known)
    mesh.beat(1.0 + FORGET_DEAD_AFTER_S / 2, wb)
    assert wb.peers_del == []
    mesh.beat(2.0 + FORGET_DEAD_AFTER_S, wb)
    assert wb.peers_del == [C]


def test_a_new_life_heard_in_the_batch_that_forgets_the_last_is_remembered(
    mesh: Mesh,
) -> None:
    """A batch's deletions are applied after its writes: the new life's entry must not
    be deleted with the last one's."""
    mesh.on_hello(_hello(1), "127.0.0.1", b"", WriteBatch(), 0.0)
    mesh.liveness.left(C, 1, WriteBatch(), 1.0)
    wb = WriteBatch()
    mesh.beat(2.0 + FORGET_DEAD_AFTER_S, wb)
    assert wb.peers_del == [C]
    mesh.on_hello(_hello(2), "127.0.0.1", b"", wb, 3.0 + FORGET_DEAD_AFTER_S)
    assert mesh.peers[C].incarnation == 2
    assert C in wb.peers_put and C not in wb.peers_del
