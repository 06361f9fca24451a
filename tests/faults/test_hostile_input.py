"""Hostile input: 100,000 random and mutated frames at a node's PULL and ROUTER sockets
while it keeps serving a normal publisher without loss."""

from __future__ import annotations

import random
import resource
import threading
import time

import msgpack
import pytest
import zmq

from tests.conftest import wait_members, wait_until
from zmesh._protocol.codec import encode_batch, encode_control
from zmesh._protocol.frames import PROTOCOL_VERSION, Ack, Batch, Hello, Nack, PeerRef, SubInfo

BAD_FRAMES = 100_000
MESSAGES = 20_000


def samples(mesh: str) -> list[list[bytes]]:
    """Valid multipart messages to mutate."""
    nid = bytes(range(16))
    # Another mesh: a forged hello of this mesh would make its sender a peer (an open
    # mesh admits anyone), and its batches legitimate.
    hello = encode_control(Hello(nid, "evil", mesh + "-x", 1, 1, 2, ("127.0.0.1",),
                                 (SubInfo("t", "g", "shared", 10, 10, 1 << 20),),
                                 (PeerRef(nid, "tcp://127.0.0.1:1", ""),)))
    batch = Batch(nid, 1, "t", "g", 0, (1, 2), (0, 3), ("k", None), ({"h": 1}, None), (1, 0),
                  (1.0, 2.0), (0, None), (b"payload", b"other"))
    inline = encode_batch(batch)
    # The same batch with its second payload in a frame of its own, as a large one travels.
    header = msgpack.unpackb(inline[0])
    header[14][1] = None
    apart = [msgpack.packb(header), b"other"]
    return [[hello], [encode_control(Ack(nid, "t", "g", (1, 2, 3)))],
            [encode_control(Nack(nid, "t", "g", (1,), 0.0))], inline, apart]


def mutate(rng: random.Random, msg: list[bytes]) -> list[bytes]:
    choice = rng.randrange(6)
    if choice == 0:
        return [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 4))]
    frames = [bytearray(f) for f in msg]
    f = frames[rng.randrange(len(frames))]
    if choice == 1 and f:
        for _ in range(rng.randrange(1, 4)):
            f[rng.randrange(len(f))] = rng.randrange(256)
    elif choice == 2 and f:
        del f[rng.randrange(len(f)):]
    elif choice == 3:
        f.extend(rng.randbytes(rng.randrange(1, 20)))
    elif choice == 4:
        frames.append(bytearray(rng.randbytes(10)))
    else:
        frames[0] = bytearray(msgpack.packb([PROTOCOL_VERSION, rng.randrange(30),
                                             *[rng.random()] * 3]))
    return [bytes(x) for x in frames]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fuzzed_node_keeps_serving_without_loss(make_node, mesh_name):
    prod = make_node("prod")
    victim = make_node("victim", seeds=[prod.control_address], ban_after_bad_frames=50_000)
    sub = victim.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    data_ep = f"tcp://127.0.0.2:0;127.0.0.1:{victim._engine.data_port}"
    ctrl_ep = f"tcp://127.0.0.2:0;127.0.0.1:{victim._engine.ctrl_port}"
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sent = [0]
    stop = threading.Event()

    def fuzz() -> None:
        rng = random.Random(1121)
        base = samples(mesh_name)
        ctx = zmq.Context()
        try:
            push = ctx.socket(zmq.PUSH)
            dealer = ctx.socket(zmq.DEALER)
            for sock, ep in ((push, data_ep), (dealer, ctrl_ep)):
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 100_000)
                sock.connect(ep)
            deadline = time.monotonic() + 120
            while sent[0] < BAD_FRAMES and time.monotonic() < deadline and not stop.is_set():
                msg = mutate(rng, base[rng.randrange(len(base))])
                (push if rng.random() < 0.5 else dealer).send_multipart(msg)
                sent[0] += 1
        finally:
            ctx.destroy(linger=0)

    fuzzer = threading.Thread(target=fuzz, name="fuzzer")
    fuzzer.start()
    ours = {str(i).encode(): i for i in range(MESSAGES)}
    got: set[int] = set()
    foreign: list[bytes] = []  # delivered payloads this test never published
    try:
        receipts = []
        for i in range(MESSAGES):
            receipts.append(prod.publish("t", str(i).encode(), key=str(i % 50)))

        def drained() -> bool:
            for m in sub.fetch(1000, timeout=0.05):
                i = ours.get(bytes(m.payload))
                if i is None:
                    foreign.append(bytes(m.payload[:40]))
                else:
                    got.add(i)
                m.ack()
            return len(got) >= MESSAGES and not fuzzer.is_alive()

        wait_until(drained, 200, what="every message while being fuzzed")
        for r in receipts[-100:]:
            r.wait_acked(30)
    finally:
        stop.set()
        fuzzer.join()
    stats = victim.stats()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\nfuzz: bad frames sent={sent[0]} decode_errors={stats.get('decode_errors', 0)} "
          f"unknown-producer batches={stats.get('batches_from_unknown_peers', 0)} "
          f"messages={len(got)}/{MESSAGES} rss growth={(rss_after - rss_before) / 1024:.0f} MB")
    assert sent[0] >= BAD_FRAMES
    assert got == set(range(MESSAGES)), "lost messages while fuzzed"
    assert stats.get("decode_errors", 0) > BAD_FRAMES // 4
    assert stats.get("received", 0) >= MESSAGES
    # Forged but decodable batches were handed back, never delivered.
    assert not foreign, f"{len(foreign)} forged messages delivered, e.g. {foreign[:3]}"
    assert (rss_after - rss_before) < 300 * 1024, "memory grew without bound"
    assert victim.status()["node"]["name"] == "victim"  # the IO thread still answers


def test_an_abusive_address_is_banned(make_node):
    victim = make_node("victim", ban_after_bad_frames=200)
    ep = f"tcp://127.0.0.3:0;127.0.0.1:{victim._engine.ctrl_port}"
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(ep)
        for _ in range(300):
            dealer.send(b"\xc1garbage")
        wait_until(lambda: victim.stats().get("addresses_banned", 0) == 1, what="a ban")
        again = ctx.socket(zmq.DEALER)
        again.setsockopt(zmq.LINGER, 0)
        again.connect(ep)
        again.send(b"\xc1more")
        wait_until(lambda: victim.stats().get("auth_denied", 0) >= 1,
                   what="the banned address refused on a new connection")
    finally:
        ctx.destroy(linger=0)
    # The node is still up: its IO thread runs and answers.
    assert victim._engine._thread is not None and victim._engine._thread.is_alive()
    assert victim.status()["node"]["name"] == "victim"
