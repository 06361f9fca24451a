"""Frames that decode but say absurd things, fuzzed where they are decoded and where
they are used: an endpoint a peer is dialed at, a rumor of this node, confirmations of a
suspicion, a hello's subscriptions. Each once stopped, wedged or corrupted a node (the
end-to-end cases are in tests/faults/test_wire_edges.py)."""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from zmesh._engine.membership import Membership, Timing
from zmesh._engine.mesh import Mesh
from zmesh._engine.news import ALIVE, DEAD, SUSPECT, Fact
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.outcomes import Outcomes
from zmesh._engine.stats import Counters
from zmesh._protocol.addresses import endpoint, split_endpoint
from zmesh._protocol.checks import U63
from zmesh._protocol.codec import decode_control, encode_control
from zmesh._protocol.frames import Gossip, Hello, PeerRef, Rumor, SubInfo
from zmesh._store.store import Store, WriteBatch
from zmesh.config import NodeConfig
from zmesh.errors import DecodeError

ME = b"\x0c" * 16
OTHER = b"\x0d" * 16

# Text near what an endpoint is made of, so that many examples are close calls.
_hosts = st.text(alphabet="-._%*aZ09fF:", min_size=1, max_size=10)
near_endpoints = st.builds(
    lambda host, port: f"tcp://{host}:{port}",
    st.one_of(_hosts, _hosts.map(lambda h: f"[{h}]")),
    st.one_of(st.integers(1, 65535).map(str), st.text(alphabet="09٣", min_size=1, max_size=5)),
)


def _decodes_as_endpoint(ep: str) -> bool:
    rumor = Rumor(OTHER, "n", 1, 0, ALIVE, b"", ep, 9)
    sender = Rumor(ME, "me", 1, 0, ALIVE, b"", "tcp://127.0.0.1:1", 2)
    try:
        decode_control(encode_control(Gossip(sender, (rumor,))))
    except DecodeError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(near_endpoints)
def test_every_endpoint_the_codec_takes_is_one_zeromq_dials(ep: str) -> None:
    # A rumor's endpoint becomes a peer's (its host and port, made again: liveness._admit)
    # and a hello's peer reference is dialed as it is (contacts.py). "tcp://-:5" and
    # "tcp://[.]:5" were taken, then refused by connect(), which raised on the IO thread:
    # the node stopped.
    assume(_decodes_as_endpoint(ep))
    host, port = split_endpoint(ep)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        for dialed in (ep, endpoint(host, port)):
            sock = ctx.socket(zmq.DEALER)
            try:
                sock.connect(dialed)
            finally:
                sock.close(linger=0)
    finally:
        ctx.term()


@pytest.mark.parametrize("ep", ["tcp://-:5", "tcp://[.]:5", "tcp://...:5", "tcp://-a-:5"])
def test_endpoints_zeromq_refuses_do_not_decode(ep: str) -> None:
    assert not _decodes_as_endpoint(ep)


class _Wire:
    def ping(self, to: bytes, seq: int, target: bytes) -> None: ...
    def ping_req(self, to: bytes, seq: int, target: bytes) -> None: ...
    def pong(self, to: bytes, seq: int, about: bytes) -> None: ...
    def gossip(self, to: bytes) -> None: ...


def _membership() -> Membership:
    m = Membership(ME, 3, Timing(1.0, 5.0), _Wire(), random.Random(1))
    m.start(0.0)
    return m


def _my_rumor(m: Membership) -> Rumor:
    me = m.me()
    return Rumor(me.node_id, "me", me.incarnation, me.refuted, ALIVE, b"", "tcp://h:1", 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, U63), st.sampled_from([SUSPECT, DEAD])), max_size=6))
def test_whatever_is_said_of_this_node_its_own_rumor_still_decodes(
    said: list[tuple[int, int]],
) -> None:
    # A suspicion of this node at the largest refuted count the codec takes was refuted
    # one higher: past what the codec takes, so every membership frame this node sent
    # after was undecodable at its peers, which dropped its connections and declared it
    # dead for good.
    m = _membership()
    for refuted, state in said:
        m.learn(Fact(ME, 3, refuted, state, OTHER), 1.0)
        frame = encode_control(Gossip(_my_rumor(m), ()))
        assert decode_control(frame) == Gossip(_my_rumor(m), ())


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 2000))
def test_confirmations_of_a_suspicion_are_kept_up_to_those_expected(n: int) -> None:
    # Each rumor of a suspicion with a new "by" was kept: forged by the thousand, they
    # grew a set without bound while the suspicion lasted.
    m = _membership()
    others = [bytes([1]) + i.to_bytes(15, "big") for i in range(5)]
    for o in others:
        m.learn(Fact(o, 1, 0, ALIVE), 0.0)
    m.learn(Fact(others[0], 1, 0, SUSPECT, others[1]), 0.5)
    for i in range(n):
        m.learn(Fact(others[0], 1, 0, SUSPECT, b"\xee" + i.to_bytes(15, "big")), 0.6)
    member = m.members[others[0]]
    assert member.state == SUSPECT
    assert len(member.suspectors) <= member.expected + 1


# -- a hello's subscriptions, applied to lanes in the store --------------------------------


@pytest.fixture
def stored_mesh(tmp_path: Path) -> Iterator[tuple[Mesh, Store, Counters]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    store = Store(str(tmp_path / "me"), 1 << 24)
    config = NodeConfig(name="me", data_dir=str(tmp_path / "me"))
    counters = Counters()
    outbox = Outbox(store, ME, 1, 1, {}, 1 << 20, 1 << 20, counters, Outcomes())
    mesh = Mesh(ctx, config, ME, 1, outbox, counters, list, None)
    mesh.ctrl_port = mesh.data_port = 1
    try:
        yield mesh, store, counters
    finally:
        mesh.close()
        store.close()
        ctx.term()


names = st.one_of(
    st.text(max_size=256),
    st.text(alphabet="é~.*>-_aZ9", min_size=1, max_size=256),
    st.sampled_from(["orders", "g", "~1", "a.*", "a.>", "x" * 128]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(topic=names, group=names, mode=st.sampled_from(["shared", "broadcast", "ephemeral"]))
@example(topic="é" * 256, group="é" * 256, mode="shared")
@example(topic="t", group="x" * 128, mode="broadcast")
def test_any_subscription_a_hello_carries_leaves_the_store_writable(
    stored_mesh: tuple[Mesh, Store, Counters], topic: str, group: str, mode: str
) -> None:
    # Names of 256 characters of two bytes each made lane keys longer than LMDB takes:
    # the loop's whole transaction failed (honest publishes and acks of that iteration
    # with it). A subscription subscribe() would not make is refused, counted.
    mesh, store, counters = stored_mesh
    sub = SubInfo(topic, group, mode, 10, 10, 1 << 20)
    hello = Hello(
        OTHER, "c", "default", 1, 9, 9, ("127.0.0.1",), (sub,), (PeerRef(ME, "tcp://h:1"),)
    )
    decoded = decode_control(encode_control(hello))
    assert isinstance(decoded, Hello)
    refused = counters.get("subscriptions_refused")
    wb = WriteBatch()
    mesh.on_hello(decoded, "127.0.0.1", b"", wb, 0.0)
    store.commit(wb)
    assert (sub in mesh.peers[OTHER].subs) == (counters.get("subscriptions_refused") == refused)


def test_a_peer_socket_that_cannot_connect_is_not_left_open(
    stored_mesh: tuple[Mesh, Store, Counters],
) -> None:
    # A socket whose connect() raised was left open: once the IO thread stopped on that
    # error, its context's term() waited for it for good, and so did Node.close().
    mesh, _store, _counters = stored_mesh
    peer = mesh.make_peer(OTHER, "bad", 1, "tcp://-:5", "tcp://-:6", 0.0)
    with pytest.raises(zmq.ZMQError):
        _ = peer.dealer
    ctx: zmq.Context[zmq.Socket[bytes]] = mesh.ctx
    ended = threading.Event()
    closer = threading.Thread(target=lambda: (ctx.term(), ended.set()), daemon=True)
    closer.start()
    closer.join(10)
    if not ended.is_set():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            ctx.destroy(linger=0)  # (closes it: the term above ends, nothing is left)
        closer.join(10)
        pytest.fail("the context still held the socket that failed to connect")
