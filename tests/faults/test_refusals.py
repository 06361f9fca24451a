"""What the CLI says when a node refuses it, and bans of CURVE keys on a secured mesh."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import zmq

from tests.conftest import run_module, wait_until
from zmesh._protocol.addresses import endpoint
from zmesh._security import generate_keypair
from zmesh.cli.refusal import greeting_mechanism

CLI = ["-m", "zmesh.cli"]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    for name in ("node", "ops"):
        generate_keypair(d / "trusted", name)
    generate_keypair(d / "stranger", "x")
    return d


def secured(keys: Path, **kw: object) -> dict:
    return dict(
        secret_key_file=str(keys / "trusted" / "node.key"),
        trusted_keys_dir=str(keys / "trusted"),
        **kw,
    )


def status(address: str, cwd: Path, *args: str) -> tuple[int, str]:
    return run_module([*CLI, "status", address, "--timeout", "2", *args], 30, str(cwd))


def test_a_node_says_its_mechanism_in_its_greeting_whatever_keys_the_asker_has(make_node, keys):
    # (a handshake that fails with no detail, the node closing the connection first, is
    # told apart by the greeting: a node with keys or without, and no node at all)
    open_node = make_node("open")
    secured_node = make_node("secured", **secured(keys))
    for node, mechanism in ((open_node, "NULL"), (secured_node, "CURVE")):
        host, port = node.control_address.rsplit(":", 1)
        assert greeting_mechanism(endpoint(host, int(port))) == mechanism
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # (a port nobody listens on)
        port = closed.getsockname()[1]
        assert greeting_mechanism(endpoint("127.0.0.1", port)) is None


def test_the_cli_says_why_a_node_does_not_answer(make_node, keys, tmp_path):
    node = make_node("node", **secured(keys))
    server = ["--server-key", str(keys / "trusted" / "node.pub")]
    code, out = status(node.control_address, tmp_path)
    assert code == 1 and "the node is secured and requires CurveZMQ keys" in out, out
    code, out = status(
        node.control_address,
        tmp_path,
        *server,
        "--secret-key-file",
        str(keys / "stranger" / "x.key"),
    )
    assert code == 1 and "the node refused the key of --secret-key-file" in out, out
    code, out = status(
        node.control_address,
        tmp_path,
        "--server-key",
        str(keys / "stranger" / "x.pub"),
        "--secret-key-file",
        str(keys / "trusted" / "ops.key"),
    )
    assert code == 1 and "--server-key is probably not this node's public key" in out, out
    code, out = status(
        node.control_address,
        tmp_path,
        *server,
        "--secret-key-file",
        str(keys / "trusted" / "ops.key"),
    )
    assert code == 0 and "node" in out, out
    open_node = make_node("open")
    code, out = status(
        open_node.control_address,
        tmp_path,
        *server,
        "--secret-key-file",
        str(keys / "trusted" / "ops.key"),
    )
    assert code == 1 and "the node runs without CurveZMQ keys" in out, out


def _garbage_with_key(
    ctx: zmq.Context, ep: str, server: bytes, pair: tuple[bytes, bytes], count: int
) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = server
    sock.curve_publickey, sock.curve_secretkey = pair
    sock.connect(ep)
    for _ in range(count):
        sock.send(b"\xc1garbage")
    return sock


def test_a_misbehaving_key_is_banned_wherever_it_connects_from(make_node, keys, tmp_path):
    bad = zmq.curve_keypair()  # a key the node trusts, of a misbehaving process
    (keys / "trusted" / "bad.pub").write_text(bad[0].decode() + "\n")
    node = make_node(
        "node", **secured(keys, drop_after_bad_frames=3, ban_after_dropped_connections=2)
    )
    server = (keys / "trusted" / "node.pub").read_text().strip().encode()
    ep = f"tcp://127.0.0.1:{node._engine.ctrl_port}"
    ctx = zmq.Context()
    try:
        socks = [_garbage_with_key(ctx, ep, server, bad, 3)]
        wait_until(lambda: node.stats().get("connections_dropped", 0) == 1, what="a drop")
        socks.append(_garbage_with_key(ctx, ep, server, bad, 3))
        wait_until(lambda: node.stats().get("keys_banned", 0) == 1, what="the key banned")
        assert "addresses_banned" not in node.stats()  # (loopback: and it is the key)
        [ban] = node.status()["bans"]
        assert ban["who"] == f"key {bad[0].decode()}"
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.destroy(linger=0)
    # The operator's key, from the same address, is served.
    code, out = status(
        node.control_address,
        tmp_path,
        "--server-key",
        str(keys / "trusted" / "node.pub"),
        "--secret-key-file",
        str(keys / "trusted" / "ops.key"),
    )
    assert code == 0, out
