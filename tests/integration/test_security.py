"""CurveZMQ: trusted nodes talk; strangers, keyless nodes and other meshes are refused;
a secured mesh's traffic is not readable on the wire."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest
import zmq

from tests.conftest import wait_members, wait_until
from tests.integration.test_delivery import drain
from zmesh._protocol.codec import decode_control, encode_control
from zmesh._protocol.frames import StatusReply, StatusRequest
from zmesh._security import generate_keypair


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    for name in ("a", "b"):
        generate_keypair(d / "trusted", name)
    generate_keypair(d / "stranger", "x")
    return d


def secured(keys, name):
    return dict(
        secret_key_file=str(keys / "trusted" / f"{name}.key"),
        trusted_keys_dir=str(keys / "trusted"),
    )


def status_over_wire(
    address: str, server_key: bytes | None = None, client: tuple[bytes, bytes] | None = None
) -> dict | None:
    """A status request as `zmesh status` sends it; None when no answer comes."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if server_key is not None and client is not None:
            sock.curve_serverkey = server_key
            sock.curve_publickey, sock.curve_secretkey = client
        sock.connect(f"tcp://{address}")
        sock.send(encode_control(StatusRequest(7)))
        if not sock.poll(1500):
            return None
        reply = decode_control(sock.recv())
        assert isinstance(reply, StatusReply)
        return reply.status
    finally:
        ctx.destroy(linger=0)


def test_trusted_nodes_work_over_curve(make_node, keys):
    a = make_node("a", **secured(keys, "a"))
    b = make_node("b", seeds=[a.control_address], **secured(keys, "b"))
    sub = b.subscribe("t", group="g")
    wait_members(a, "t", "g", 1)
    rs = [a.publish("t", str(i).encode()) for i in range(100)]
    assert len(drain(sub, 100)) == 100
    for r in rs:
        r.wait_acked(10)


def test_a_key_trusted_at_run_time_lets_in_the_node_it_refused(make_node, keys, tmp_path):
    # b starts before a trusts its key: refused. Its .pub copied into a's trusted_keys_dir
    # then lets it in, neither node restarted (a reads the directory at run time, b's
    # contact of its seed tries again).
    only_a = tmp_path / "only-a"
    only_a.mkdir()
    shutil.copy(keys / "trusted" / "a.pub", only_a)
    a = make_node(
        "a", secret_key_file=str(keys / "trusted" / "a.key"), trusted_keys_dir=str(only_a)
    )
    b = make_node("b", seeds=[a.control_address], **secured(keys, "b"))
    wait_until(lambda: a.stats().get("auth_denied", 0) >= 1, what="b refused")
    sub = b.subscribe("t", group="g")
    shutil.copy(keys / "trusted" / "b.pub", only_a)
    wait_members(a, "t", "g", 1)
    a.publish("t", b"trusted now")
    assert [m.payload for m in drain(sub, 1)] == [b"trusted now"]


def test_untrusted_keyless_and_foreign_nodes_are_refused(make_node, keys, mesh_name):
    a = make_node("a", **secured(keys, "a"))
    a_sub = a.subscribe("t", group="g")
    a.topic("t", groups=["g"])
    stranger = make_node(
        "x",
        seeds=[a.control_address],
        secret_key_file=str(keys / "stranger" / "x.key"),
        trusted_keys_dir=str(keys / "trusted"),
    )
    keyless = make_node("k", seeds=[a.control_address])
    other_mesh = make_node(
        "o", mesh=mesh_name + "-other", seeds=[a.control_address], **secured(keys, "b")
    )
    wait_until(lambda: a.stats().get("auth_denied", 0) >= 1, what="the stranger refused")
    wait_until(lambda: a.stats().get("handshakes_failed", 0) >= 1, what="the keyless refused")
    wait_until(lambda: a.stats().get("foreign_mesh_hellos", 0) >= 1, what="other mesh ignored")
    for intruder in (stranger, keyless, other_mesh):
        # Publish: nothing reaches a's group; subscribe: a never sends them anything.
        intruder.topic("t", groups=["g"])
        intruder.publish("t", b"intrusion").wait_stored(5)
        intruder.subscribe("t", group="g2")
    a.publish("t", b"secret").wait_stored(5)
    assert [m.payload for m in drain(a_sub, 1)] == [b"secret"]
    # What the intruders try now carries their message's lane and their subscription:
    # wait until it was answered before checking that it came to nothing. The other
    # mesh's hellos reach a and are ignored (counted); the stranger (refused once, for
    # good) and the keyless node never connect, so their hellos are held back unsent
    # (counted at each), while a goes on failing the keyless node's handshakes.
    foreign, failed = (a.stats().get(n, 0) for n in ("foreign_mesh_hellos", "handshakes_failed"))
    held = {n.name: n.stats().get("control_send_full", 0) for n in (stranger, keyless)}
    wait_until(
        lambda: a.stats().get("foreign_mesh_hellos", 0) > foreign,
        what="a hello of the other mesh, with its subscription, ignored",
    )
    wait_until(
        lambda: a.stats().get("handshakes_failed", 0) > failed, what="another failed handshake"
    )
    for n in (stranger, keyless):
        wait_until(
            lambda n=n: n.stats().get("control_send_full", 0) > held[n.name],
            what=f"{n.name}'s hellos held back",
        )
    assert not any(ln["lane"] == "g2" for ln in a.status()["lanes"])
    assert [p["name"] for p in a.peers()] == []
    assert a_sub.fetch(10, timeout=0) == [], "a's group got a message it did not publish"
    for intruder in (stranger, keyless, other_mesh):
        assert intruder.peers() == []
        assert intruder.stats().get("received", 0) == 0
        assert intruder.stats().get("sent", 0) == 0 and intruder.status()["outbox"] == 1
    # Status: refused without the right key pair, answered with one.
    assert status_over_wire(a.control_address) is None
    a_pub = (keys / "trusted" / "a.pub").read_text().strip().encode()
    x_sec = (keys / "stranger" / "x.key").read_text().strip().encode()
    assert status_over_wire(a.control_address, a_pub, (zmq.curve_public(x_sec), x_sec)) is None
    b_sec = (keys / "trusted" / "b.key").read_text().strip().encode()
    st = status_over_wire(a.control_address, a_pub, (zmq.curve_public(b_sec), b_sec))
    assert st is not None and st["node"]["name"] == "a"
    assert st["counters"]["auth_denied"] >= 2  # the stranger and the status attempt


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing loopback packets needs root")
def test_secured_traffic_is_not_readable_on_the_wire(make_node, keys):
    marker = b"PLAINTEXT-MARKER-" + os.urandom(4).hex().encode()
    captured = bytearray()
    stop = threading.Event()
    # A raw packet socket on loopback sees every byte both nodes exchange.
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    raw.bind(("lo", 0))
    raw.settimeout(0.05)

    def sniff() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                captured.extend(raw.recv(65535))
            except TimeoutError:
                continue

    t = threading.Thread(target=sniff, name="sniffer")
    t.start()
    try:
        for secure in (False, True):
            opts_a = secured(keys, "a") if secure else {}
            opts_b = secured(keys, "b") if secure else {}
            a = make_node(f"a{secure}", **opts_a)
            b = make_node(f"b{secure}", seeds=[a.control_address], **opts_b)
            sub = b.subscribe("t", group="g")
            wait_members(a, "t", "g", 1)
            payload = marker + (b"-secure" if secure else b"-open")
            r = a.publish("t", payload)
            assert [m.payload for m in drain(sub, 1)] == [payload]
            r.wait_acked(10)
    finally:
        stop.set()
        t.join()
        raw.close()
    assert marker + b"-open" in captured, "the capture did not see the open mesh"
    assert marker + b"-secure" not in captured, "secured payload readable on the wire"
