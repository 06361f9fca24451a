"""What a peer's hellos do to its lanes at this node: only a hello that lists this node
says what the peer consumes here. A hello that lists nobody (sent to a seed or a contact
by a node that holds this one dead or does not know it yet) leaves its lanes as they are;
before, such a hello took a live consumer out of every lane it consumed, and nothing sent
it back until its next hello that listed this node, which can be a long time coming."""

from __future__ import annotations

from tests.unit.conftest import ME
from zmesh._engine.mesh import Mesh
from zmesh._protocol.frames import Gossip, Hello, PeerRef, Rumor, SubInfo
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


def test_a_node_heard_of_by_rumor_is_told_once_it_says_hello(mesh: Mesh) -> None:
    """A node learned from another's rumor is on trial until it says hello: rumors do not
    name it, and the news of it taken for frames meanwhile goes on none. Those who heard
    of a node's joining by rumor are how it reaches the members its first teller did not
    pick: they tell it once it has said hello."""
    seed, new = b"\x05" * 16, b"\x06" * 16
    us = (PeerRef(ME, "tcp://127.0.0.1:1"),)
    hello = Hello(seed, "s", "default", 1, 9, 9, ("127.0.0.1",), (), us, False, (), ())
    mesh.on_hello(hello, "127.0.0.1", b"", WriteBatch(), 0.0)
    sender = Rumor(seed, "s", 1, 0, 0, b"", "tcp://127.0.0.1:9", 9)
    joined = Rumor(new, "n", 1, 0, 0, b"", "tcp://127.0.0.1:8", 8)
    mesh.liveness.on_frame(Gossip(sender, (joined,)), "127.0.0.1", b"", WriteBatch(), 0.1)
    assert not mesh.peers[new].met
    for _ in range(20):  # (frames sent while it is on trial: they cannot name it)
        assert new not in {r.node_id for r in mesh.liveness.rumors(seed)}
    hello = Hello(new, "n", "default", 1, 8, 8, ("127.0.0.1",), (), us, False, (), ())
    mesh.on_hello(hello, "127.0.0.1", b"", WriteBatch(), 0.2)
    assert mesh.peers[new].met
    assert new in {r.node_id for r in mesh.liveness.rumors(seed)}
