"""Frames that decode but say absurd things, sent to a real node from a raw socket on
127.0.0.1: the node goes on, and delivers what an honest peer sends it afterwards. Each
case once stopped, cut off or corrupted the node (their decoders are fuzzed in
tests/unit/test_wire_edges.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import zmq

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from zmesh._protocol.checks import U63
from zmesh._protocol.codec import encode_control
from zmesh._protocol.frames import Gossip, Hello, PeerRef, Rumor, SubInfo

FAKE = b"\xfa" * 16  # the node the raw socket says it is
OTHER = b"\xfb" * 16


@pytest.fixture
def raw() -> Iterator[Callable[[zmesh.Node], zmq.Socket[bytes]]]:
    """Raw DEALERs to a node's control socket, closed at the end."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks: list[zmq.Socket[bytes]] = []

    def dealer_to(node: zmesh.Node) -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        socks.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{node._engine.ctrl_port}")
        return sock

    yield dealer_to
    for sock in socks:
        sock.close(linger=0)
    ctx.term()


def fake_rumor() -> Rumor:
    return Rumor(FAKE, "fake", 1, 0, 0, b"", "tcp://127.0.0.1:1", 2)


def delivered_after(prod: zmesh.Node, sub: zmesh.Subscription, payload: bytes) -> None:
    """``payload`` published by ``prod`` now reaches ``sub`` and is acked."""
    receipt = prod.publish("t", payload)
    got = fetched(sub, 1)
    assert [bytes(m.payload) for m in got] == [payload]
    got[0].ack()
    receipt.wait_acked(10)


def pair(make_node) -> tuple[zmesh.Node, zmesh.Node, zmesh.Subscription]:
    prod = make_node("prod")
    victim = make_node("victim", seeds=[prod.control_address])
    sub = victim.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    delivered_after(prod, sub, b"before")
    return prod, victim, sub


def test_a_gossiped_endpoint_zeromq_refuses_does_not_stop_the_node(make_node, raw):
    # "tcp://-:5" passed the codec's check; the peer made of it was dialed on the IO
    # thread, connect() raised, and the node stopped (NodeClosedError ever after).
    prod, victim, sub = pair(make_node)
    sock = raw(victim)
    for ep in ("tcp://-:5", "tcp://[.]:5", "tcp://-:5"):
        bad = Rumor(OTHER, "bad", 1, 0, 0, b"", ep, 6)
        sock.send(encode_control(Gossip(fake_rumor(), (bad,))))
    wait_until(lambda: victim.stats().get("decode_errors", 0) >= 3, what="the frames refused")
    assert "internal_errors" not in victim.stats()
    assert OTHER.hex() not in {p["id"] for p in victim.status()["peers"]}
    delivered_after(prod, sub, b"after")


def test_a_suspicion_at_the_largest_count_leaves_the_node_heard_by_its_peers(make_node, raw):
    # Refuted one past the largest count the codec takes, every membership frame of the
    # node was undecodable at its peers: they counted bad frames, dropped its
    # connections, declared it dead and sent it nothing more.
    prod, victim, sub = pair(make_node)
    me = victim.status()["node"]
    suspicion = Rumor(
        bytes.fromhex(me["id"]), "victim", me["incarnation"], U63, 1, FAKE, "tcp://h:1", 2
    )
    raw(victim).send(encode_control(Gossip(fake_rumor(), (suspicion,))))
    wait_until(lambda: victim.stats().get("refuted", 0) >= 1, what="the refutation")
    # Probes of the victim, answered with its own rumor, for longer than a death takes.
    probes = prod.stats().get("probes", 0)
    wait_until(lambda: prod.stats().get("probes", 0) >= probes + 15, what="probes answered")
    assert "decode_errors" not in prod.stats()
    states = {p["name"]: p["state"] for p in prod.status()["peers"]}
    assert states["victim"] == "alive"
    delivered_after(prod, sub, b"after")


def test_a_hello_subscribing_what_no_node_can_leaves_the_store_writable(make_node, raw, mesh_name):
    # Names of 256 two-byte characters made lane keys longer than LMDB takes: the loop's
    # transaction failed whole (the honest publishes and acks of that iteration too).
    prod, victim, sub = pair(make_node)
    long = "é" * 256
    hello = Hello(
        FAKE,
        "fake",
        mesh_name,
        1,
        1,
        2,
        ("127.0.0.1",),
        (SubInfo(long, long, "shared", 10, 10, 1 << 20),),
        (PeerRef(bytes.fromhex(prod.status()["node"]["id"]), "tcp://127.0.0.1:1"),),
    )
    raw(prod).send(encode_control(hello))
    wait_until(
        lambda: prod.stats().get("subscriptions_refused", 0) >= 1, what="the subscription refused"
    )
    assert "store_errors" not in prod.stats()
    assert not [ln for ln in prod.status()["lanes"] if ln["topic"] == long]
    delivered_after(prod, sub, b"after")


def test_undecodable_control_frames_are_counted_and_said_once_a_minute(make_node, raw, caplog):
    # A bad control frame was counted but said at debug level only: a node refusing a
    # peer's every frame said nothing.
    victim = make_node("victim", drop_after_bad_frames=0)
    sock = raw(victim)
    for i in range(20):
        sock.send(b"\xc1not msgpack %d" % i)
    wait_until(lambda: victim.stats().get("decode_errors", 0) == 20, what="the frames counted")
    said = [r for r in caplog.records if "control frame that cannot be decoded" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"


def test_an_internal_error_is_said_once_a_minute_not_per_frame(make_node, raw, caplog, monkeypatch):
    # A control message that met a bug in its handling logged a whole traceback each
    # time: a peer sending it again and again flooded the log.
    from zmesh._engine import listener as listener_module

    def broken(*_args: object) -> None:
        raise RuntimeError("a bug")

    victim = make_node("victim")
    monkeypatch.setattr(listener_module.Listener, "_on_control", broken)
    sock = raw(victim)
    for _ in range(20):
        sock.send(encode_control(Gossip(fake_rumor(), ())))
    wait_until(lambda: victim.stats().get("internal_errors", 0) == 20, what="the errors counted")
    said = [r for r in caplog.records if "error while handling a Gossip" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "ERROR" and said[0].exc_info is not None
