"""What a peer's hellos do to its lanes at this node: only a hello that lists this node
says what the peer consumes here. A hello that lists nobody (sent to a seed or a contact
by a node that holds this one dead or does not know it yet) leaves its lanes as they are;
before, such a hello took a live consumer out of every lane it consumed, and nothing sent
it back until its next hello that listed this node, which can be a long time coming."""

from __future__ import annotations

from tests.unit.conftest import ME
from zmesh._engine.mesh import Mesh
from zmesh._protocol.frames import Hello, PeerRef, SubInfo
from zmesh._store.store import WriteBatch

C = b"\x07" * 16  # a consumer
SUB = SubInfo("orders", "billing", "shared", 100, 10, 1 << 20)


def _hello(listing: tuple[PeerRef, ...], subs: tuple[SubInfo, ...]) -> Hello:
    return Hello(C, "c", "default", 1, 9, 9, ("127.0.0.1",), subs, listing, False, (), ())


def members(mesh: Mesh) -> list[bytes]:
    lane = mesh.lanes.get("orders", "billing")
    return [] if lane is None else list(lane.members)


def test_only_a_hello_that_lists_this_node_changes_what_a_peer_consumes(mesh: Mesh) -> None:
    us = (PeerRef(ME, "tcp://127.0.0.1:1"),)
    mesh.on_hello(_hello((), (SUB,)), "127.0.0.1", b"", WriteBatch(), 0.0)
    assert members(mesh) == []  # (it does not know us yet: it would refuse our data)
    mesh.on_hello(_hello(us, (SUB,)), "127.0.0.1", b"", WriteBatch(), 1.0)
    assert members(mesh) == [C]
    mesh.on_hello(_hello((), (SUB,)), "127.0.0.1", b"", WriteBatch(), 2.0)
    mesh.on_hello(_hello((), ()), "127.0.0.1", b"", WriteBatch(), 3.0)
    assert members(mesh) == [C]
    mesh.on_hello(_hello(us, ()), "127.0.0.1", b"", WriteBatch(), 4.0)
    assert members(mesh) == []
