"""zmesh scenarios, the worker side: one producer node or one consumer node per process.

Every node binds 127.0.0.1 only, with mDNS off; a consumer takes the producer's control
address as its seed (a restarted producer takes the consumer's). Consumers use the
documented APIs: ``for msg in sub: msg.ack()`` per message, or ``sub.fetch`` then
``sub.ack_many`` per batch.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmesh

from ._wio import (
    PAYLOAD_BYTES,
    Commands,
    cpu_s,
    emit,
    latency_s,
    payload,
    percentiles,
    rss_mb,
    rss_now,
    stamped,
)

CHUNK = 1000  # publishes between deadline checks
STATUS_POLL_S = 0.005


def _node(p: dict[str, Any], name: str, **extra: Any) -> zmesh.Node:
    return zmesh.Node(
        name,
        mesh=p["mesh"],
        data_dir=p["data_dir"],
        interfaces=["127.0.0.1"],
        mdns=False,
        seeds=p.get("seeds", []),
        replica_host=p.get("replica_host", False),  # (the replica scenarios' replica alone)
        **extra,
    ).start()


def _lanes(node: zmesh.Node, topic: str) -> dict[str, dict[str, Any]]:
    return {ln["lane"]: ln for ln in node.status()["lanes"] if ln["topic"] == topic}


def _wait(pred: Any, timeout: float, what: str, cmds: Commands, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        cmds.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _wait_members(
    node: zmesh.Node,
    topic: str,
    groups: list[str],
    timeout: float,
    cmds: Commands,
    members: int = 1,
) -> None:
    def ready() -> bool:
        lanes = _lanes(node, topic)
        return all(g in lanes and len(lanes[g]["members"]) >= members for g in groups)

    _wait(ready, timeout, f"{members} member(s) in each of {groups}", cmds)


def _wait_acked(node: zmesh.Node, last: zmesh.Receipt, deadline: float, cmds: Commands) -> None:
    """Every message acked: the last receipt acked, then the outbox empty (acks of other
    partitions may come a little later)."""
    while True:  # (woken by the acks themselves; a stop is seen within a tenth of a second)
        cmds.check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the last message was not acked before the deadline")
        try:
            last.wait_acked(min(remaining, 0.1))
            break
        except zmesh.TimeoutError:
            continue
    _wait(
        lambda: node.status()["outbox"] == 0,
        deadline - time.monotonic(),
        "an empty outbox",
        cmds,
        STATUS_POLL_S,
    )


def _publish(
    node: zmesh.Node,
    p: dict[str, Any],
    count: int,
    deadline: float,
    cmds: Commands,
    rate: float = 0.0,
) -> zmesh.Receipt:
    """Publish ``count`` messages with the scenario's API; returns the last receipt (the
    others are dropped, as a fire-and-forget publisher would)."""
    topic, body = p["topic"], payload(0, p.get("payload_bytes", PAYLOAD_BYTES))
    last = None
    if rate:
        publish, interval, t_next = node.publish, 1.0 / rate, time.monotonic()
        for _ in range(count):
            now = time.monotonic()
            cmds.check()
            if now > deadline:
                raise TimeoutError("paced publishing ran past its deadline")
            if t_next > now:
                time.sleep(t_next - now)
            last = publish(topic, stamped())
            t_next += interval
    elif p["api"] == "batch":
        bodies, many = [body] * p["batch"], node.publish_many
        for i in range(count // p["batch"]):
            if not i % 64:
                cmds.check()
                if time.monotonic() > deadline:
                    raise TimeoutError("publishing ran past its deadline")
            last = many(topic, bodies)
    else:
        publish = node.publish
        for i in range(count):
            if not i % CHUNK:
                cmds.check()
                if time.monotonic() > deadline:
                    raise TimeoutError("publishing ran past its deadline")
            last = publish(topic, body)
    assert last is not None
    return last


def zmesh_producer(p: dict[str, Any], cmds: Commands) -> None:
    """Live throughput or paced latency: warm up, publish ``count``, wait for every ack."""
    deadline = time.monotonic() + p["deadline_s"]
    node = _node(p, "producer")
    try:
        topic, groups = p["topic"], p["groups"]
        replicas = p.get("replicas", 1)
        node.topic(topic, durability=p["durability"], groups=groups, replicas=replicas)
        emit("ready", control=node.control_address)
        _wait_members(
            node, topic, groups, p.get("members_timeout_s", 30.0), cmds, p.get("members", 1)
        )
        if replicas > 1:  # (the warm-up's receipts wait for them anyway)

            def whole() -> bool:
                chosen = node.status()["replicas"]["set"]
                return len(chosen) == replicas - 1 and all(r["state"] == "whole" for r in chosen)

            _wait(whole, 30.0, f"{replicas - 1} replica(s) holding a whole copy", cmds)
        _wait_acked(
            node, _publish(node, p, p["warmup"], deadline, cmds, p.get("rate", 0.0)), deadline, cmds
        )
        t0, cpu0 = time.monotonic(), cpu_s()
        last = _publish(node, p, p["count"], deadline, cmds, p.get("rate", 0.0))
        t_published = time.monotonic()
        lanes_done: dict[str, float] = {}
        if len(groups) > 1:
            last.wait_stored(max(0.001, deadline - time.monotonic()))

            def all_done() -> bool:
                now = time.monotonic()
                for name, ln in _lanes(node, topic).items():
                    if name in groups and name not in lanes_done and ln["pending"] == 0:
                        lanes_done[name] = now
                return len(lanes_done) == len(groups)

            _wait(all_done, deadline - time.monotonic(), "every group to ack", cmds, STATUS_POLL_S)
        _wait_acked(node, last, deadline, cmds)
        t1, cpu1 = time.monotonic(), cpu_s()
        emit(
            "result",
            t0=t0,
            t_published=t_published,
            t1=t1,
            lanes_done=lanes_done,
            rss_mb=rss_mb(),
            cpu_s=cpu1 - cpu0,
            stats=node.stats(),
        )
        cmds.wait_stop(p["deadline_s"])
    finally:
        node.close()


def zmesh_replica(p: dict[str, Any], cmds: Commands) -> None:
    """A replica host (the replica scenarios'): holds copies until told to stop; reports
    its RSS and CPU."""
    cpu0 = cpu_s()
    node = _node({**p, "replica_host": True}, p.get("name", "replica"))
    try:
        emit("ready", control=node.control_address)
        cmds.wait_stop(p["deadline_s"])
        emit("result", rss_mb=rss_mb(), cpu_s=cpu_s() - cpu0, stats=node.stats())
    finally:
        node.close()


def zmesh_consumer(p: dict[str, Any], cmds: Commands) -> None:
    """Consume until told to stop; report count, first/last times, latency and RSS."""
    t_start = time.monotonic()
    deadline = t_start + p["deadline_s"]
    node = _node(p, p.get("name", "consumer"))
    for i in range(p.get("idle", 0)):  # topics nobody publishes: idle lanes at the producer
        node.subscribe(f"idle-{i}", group=p["group"])  # (closed with the node)
    sub = node.subscribe(p["topic"], group=p["group"])  # (the defaults users get)
    t_sub = time.monotonic()
    # The CPU of the timed part: from the last warm-up message on (``warmup`` counted).
    state = {
        "count": 0,
        "t_first": 0.0,
        "t_last": 0.0,
        "window_count": 0,
        "cpu0": cpu_s(),
        "cpu_s": 0.0,
        "warmup": p.get("warmup", 0),
    }
    window_s = p.get("window_s", 0.0)

    def watch() -> None:
        # Closing the subscription ends the consumer's loop; it runs on its own thread so
        # the hot loop stays the documented `for msg in sub`.
        while not cmds.stopping and time.monotonic() < deadline:
            if (
                window_s
                and state["t_first"]
                and not state["window_count"]
                and time.monotonic() >= state["t_first"] + window_s
            ):
                state["window_count"] = state["count"]
            time.sleep(0.005)
        sub.close()

    watcher = threading.Thread(target=watch, daemon=True, name="bench-watch")
    watcher.start()
    emit("ready", control=node.control_address, t_subscribed=t_sub, start_s=t_sub - t_start)
    lat: list[float] = []
    expect = p.get("expect", 0)
    try:
        if p["api"] == "batch":
            _consume_batches(sub, p["fetch"], expect, state)
        else:
            _consume_messages(sub, p.get("latency", False), lat, expect, state)
    finally:
        sub.close()
        watcher.join(5.0)
        node.close()
    emit(
        "result",
        count=state["count"],
        t_first=state["t_first"],
        t_last=state["t_last"],
        window_count=state["window_count"],
        start_s=t_sub - t_start,
        rss_mb=rss_mb(),
        cpu_s=state["cpu_s"] or cpu_s() - state["cpu0"],
        **percentiles(lat),
    )


def _seen(state: dict[str, Any], n: int, expect: int) -> None:
    before = state["count"]
    state["count"] = count = before + n
    if not before:
        state["t_first"] = time.monotonic()
        emit("first", t=state["t_first"])
    if before < state["warmup"] <= count:
        state["cpu0"] = cpu_s()
    if expect and before < expect <= count:
        state["t_last"] = time.monotonic()
        state["cpu_s"] = cpu_s() - state["cpu0"]
        emit("done", t=state["t_last"])


def _consume_messages(
    sub: zmesh.Subscription, latency: bool, lat: list[float], expect: int, state: dict[str, Any]
) -> None:
    count, warmup = 0, state["warmup"]
    for msg in sub:
        if latency and count >= warmup:  # (the warm-up is acked before the timed part)
            lat.append(latency_s(msg.payload))
        msg.ack()
        count += 1
        if count in (1, warmup, expect) or not count % 1024:
            _seen(state, count - state["count"], expect)
    _seen(state, count - state["count"], expect)


def _consume_batches(
    sub: zmesh.Subscription, fetch: int, expect: int, state: dict[str, Any]
) -> None:
    while True:
        msgs = sub.fetch(fetch)
        if not msgs:
            return
        sub.ack_many(msgs)
        _seen(state, len(msgs), expect)


def zmesh_offline_producer(p: dict[str, Any], cmds: Commands) -> None:
    """Publish ``count`` with the group declared and offline, then wait for the drain
    (``durability``, ``memory_budget_bytes``: the topic's and the node's, if given)."""
    deadline = time.monotonic() + p["deadline_s"]
    count, batch = p["count"], p["batch"]
    budget = {"memory_budget_bytes": p["budget"]} if p.get("budget") else {}
    node = _node(
        p, "producer", max_outbox_messages=count + 10_000, map_size_bytes=8 << 30, **budget
    )
    try:
        node.topic(p["topic"], durability=p.get("durability", "process"), groups=[p["group"]])
        emit("ready", control=node.control_address, rss_base=rss_now())
        bodies = [payload()] * batch
        t0 = time.monotonic()
        last = None
        for _ in range(count // batch):
            cmds.check()
            if time.monotonic() > deadline:
                raise TimeoutError("publishing the backlog ran past its deadline")
            last = node.publish_many(p["topic"], bodies)  # receipts are not kept
        assert last is not None
        last.wait_stored(max(0.001, deadline - time.monotonic()))
        t_pub = time.monotonic()
        emit(
            "published",
            publish_rate=count / (t_pub - t0),
            rss_mb=rss_mb(),
            rss_now=rss_now(),
            outbox=node.status()["outbox"],
        )
        cmds.wait("drain", p["deadline_s"])
        cpu0 = cpu_s()
        _wait(
            lambda: node.status()["outbox"] == 0,
            deadline - time.monotonic(),
            "the backlog to drain",
            cmds,
            STATUS_POLL_S,
        )
        emit(
            "drained",
            t_empty=time.monotonic(),
            rss_mb=rss_mb(),
            cpu_s=cpu_s() - cpu0,
            stats=node.stats(),
        )
        cmds.wait_stop(p["deadline_s"])
    finally:
        node.close()


def zmesh_build_producer(p: dict[str, Any], cmds: Commands) -> None:
    """Leave ``count`` messages pending for a declared group with no consumer, then close."""
    deadline = time.monotonic() + p["deadline_s"]
    count, batch = p["count"], p["batch"]
    node = _node(p, "producer", max_outbox_messages=count + 10_000, map_size_bytes=8 << 30)
    try:
        node.topic(p["topic"], durability="process", groups=[p["group"]])
        bodies = [payload()] * batch
        t0 = time.monotonic()
        last = None
        for _ in range(count // batch):
            cmds.check()
            if time.monotonic() > deadline:
                raise TimeoutError("building the backlog ran past its deadline")
            last = node.publish_many(p["topic"], bodies)
        assert last is not None
        last.wait_stored(max(0.001, deadline - time.monotonic()))
        rate = count / (time.monotonic() - t0)
        outbox = node.status()["outbox"]
    finally:
        node.close()
    emit("built", publish_rate=rate, outbox=outbox, rss_mb=rss_mb())


def zmesh_restart_producer(p: dict[str, Any], cmds: Commands) -> None:
    """Reopen a data dir full of pending messages; the consumer times the first delivery."""
    t0 = time.monotonic()
    node = _node(p, "producer", max_outbox_messages=p["count"] + 10_000, map_size_bytes=8 << 30)
    try:
        t_started = time.monotonic()
        emit("started", t0=t0, t_started=t_started, rss_now=rss_now())
        cmds.wait_stop(p["deadline_s"])
    finally:
        node.close()
        emit("result", rss_mb=rss_mb())


ROLES = {
    "zmesh_producer": zmesh_producer,
    "zmesh_consumer": zmesh_consumer,
    "zmesh_replica": zmesh_replica,
    "zmesh_offline_producer": zmesh_offline_producer,
    "zmesh_build_producer": zmesh_build_producer,
    "zmesh_restart_producer": zmesh_restart_producer,
}
