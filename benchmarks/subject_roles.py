"""Subjects and request/reply, the worker side (``benchmarks.bench_subjects`` runs them).

- ``rr_raw_server`` / ``rr_raw_client``: the yardstick, a ROUTER that sends each request
  back and a DEALER that sends requests of 100 bytes, ``inflight`` at a time (1: one
  round trip after the other), timing each.
- ``rr_zmesh_server`` / ``rr_zmesh_client``: ``Node.serve`` answering each request with
  its payload, and ``Node.request`` from ``inflight`` threads of one node; the request
  topic's durability is ``process`` or ``memory``.
- ``subj_publisher``: one node publishing ``count`` messages round-robin over ``topics``
  topics, each a group's: by name (``flat``, the group declared on each topic) or by
  pattern (``patterns``: the group declared on each of ``patterns`` patterns, each topic
  matched by one of them, so both keep one lane per topic). Timed apart: every topic's
  first message (a pattern's lane of the topic is made then), then ``count`` messages.
  The rates are publish to stored.

Every node binds 127.0.0.1 only, with mDNS off (``zmesh_roles._node``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

import zmesh

from ._wio import Commands, cpu_s, emit, payload, percentiles
from .zmesh_roles import _node

TOPIC = "rpc.echo"
GROUP = "svc"


# -- request/reply -------------------------------------------------------------------------


def rr_raw_server(p: dict[str, Any], cmds: Commands) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    emit("ready", endpoint=sock.getsockopt_string(zmq.LAST_ENDPOINT))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        while not cmds.stopping:
            if poller.poll(100):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    sock.send_multipart(frames)
    finally:
        sock.close(0)
        ctx.term()


def _timed(p: dict[str, Any], one: Any, cmds: Commands) -> None:
    """Round trips by ``one()`` from ``inflight`` threads: ``warmup`` each, then for
    ``seconds``; emits the rate and the latencies."""
    inflight, seconds, warmup = p["inflight"], p["seconds"], p["warmup"]
    start = threading.Barrier(inflight + 1)
    samples: list[list[float]] = [[] for _ in range(inflight)]
    stop_at = [0.0]

    def run(i: int) -> None:
        for _ in range(warmup):
            one(i)
        start.wait()
        mine = samples[i]
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at[0]:
                return
            one(i)
            mine.append(time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(inflight)]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + 3600.0
    start.wait()
    c0, t0 = cpu_s(), time.monotonic()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    t1 = time.monotonic()
    every = [s for mine in samples for s in mine]
    emit(
        "result",
        rate=len(every) / (t1 - t0),
        cpu_us_per_rt=(cpu_s() - c0) * 1e6 / max(1, len(every)),
        **percentiles(every),
    )
    cmds.wait_stop(30)


def rr_raw_client(p: dict[str, Any], cmds: Commands) -> None:
    ctx = zmq.Context()
    socks = []
    for _ in range(p["inflight"]):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(p["endpoint"])
        socks.append(sock)
    body = payload()

    def one(i: int) -> None:
        sock = socks[i]
        sock.send(body)
        sock.recv()

    emit("ready")
    try:
        _timed(p, one, cmds)
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()


def rr_zmesh_server(p: dict[str, Any], cmds: Commands) -> None:
    topics = {TOPIC: zmesh.TopicConfig(durability=p["durability"])}
    node = _node(p, "server", topics=topics)
    try:
        node.serve(TOPIC, GROUP, lambda msg: msg.payload, concurrency=p.get("concurrency", 1))
        emit("ready", control=node.control_address)
        cmds.wait_stop(p["deadline_s"])
    finally:
        node.close()


def rr_zmesh_client(p: dict[str, Any], cmds: Commands) -> None:
    topics = {TOPIC: zmesh.TopicConfig(durability=p["durability"])}
    node = _node(p, "client", topics=topics)
    try:
        body = payload()
        deadline = time.monotonic() + 30
        while True:  # (until the server is met)
            try:
                node.request(TOPIC, body, timeout=5)
                break
            except zmesh.NoRespondersError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        emit("ready")
        _timed(p, lambda _i: node.request(TOPIC, body, timeout=10), cmds)
    finally:
        node.close()


# -- publishing to many topics ---------------------------------------------------------------


def subject_names(topics: int, patterns: int) -> tuple[list[str], list[str]]:
    """``topics`` topics of three tokens, and ``patterns`` patterns ``site.devN.*`` that
    match each topic once (``topics`` a multiple of ``patterns``)."""
    per = topics // patterns
    names = [f"site.dev{d}.m{m}" for d in range(patterns) for m in range(per)]
    return names, [f"site.dev{d}.*" for d in range(patterns)]


def subj_publisher(p: dict[str, Any], cmds: Commands) -> None:
    names, patterns = subject_names(p["topics"], p["patterns"])
    declared = zmesh.TopicConfig(groups=("g",))
    on = names if p["mode"] == "flat" else patterns
    node = _node(p, "publisher", topics=dict.fromkeys(on, declared))
    try:
        body = payload()
        emit("ready")
        # Each topic's first message: a pattern's lane of it is made then.
        c0, t0 = cpu_s(), time.monotonic()
        for name in names:
            receipt = node.publish(name, body)
        receipt.wait_stored(p["deadline_s"])
        first = (time.monotonic() - t0, cpu_s() - c0)
        count, n = p["count"], len(names)
        c0, t0 = cpu_s(), time.monotonic()
        for i in range(count):
            receipt = node.publish(names[i % n], body)
            if i % 1000 == 0:
                cmds.check()
        receipt.wait_stored(p["deadline_s"])
        t1 = time.monotonic()
        emit(
            "result",
            rate=count / (t1 - t0),
            cpu_us_per_msg=(cpu_s() - c0) * 1e6 / count,
            first_rate=n / first[0],
            first_cpu_us_per_msg=first[1] * 1e6 / n,
            lanes=len(node.groups()),
            pattern_groups=len(node.status()["pattern_groups"]),
        )
        cmds.wait_stop(30)
    finally:
        node.close()


ROLES = {
    "rr_raw_server": rr_raw_server,
    "rr_raw_client": rr_raw_client,
    "rr_zmesh_server": rr_zmesh_server,
    "rr_zmesh_client": rr_zmesh_client,
    "subj_publisher": subj_publisher,
}
