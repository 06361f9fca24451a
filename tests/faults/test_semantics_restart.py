"""Message semantics across a producer's kill -9, at edge values.

A child process publishes, says ``stored`` once every publish is in its outbox, and is
SIGKILLed; the test reopens its data dir in a node of its own, with a consumer, and checks
what the messages' options promised: a TTL that ran out while the producer was down, a
schedule that came due meanwhile, latest-wins with one key before and after the kill,
and a ``msg_id`` repeated after it, within its window and just past it. (Priorities,
retained replay and transactions killed mid-commit have tests of their own:
tests/semantics/test_priority.py, test_retention_replay.py, test_transaction_kills.py.)
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import zmesh
from tests.conftest import kill_9_when, spawn, wait_until

# The child: argv mesh, data dir, topic config (JSON), node options (JSON), publishes
# (JSON: [payload, options] each; a ``ttl_at``/``deliver_in`` is made relative to now).
CHILD = """
import json, sys, time, zmesh
mesh, data_dir, topic, node_kw, pubs = sys.argv[1:6]
cfg = json.loads(topic)
node = zmesh.Node("prod", mesh=mesh, data_dir=data_dir, mdns=False,
                  interfaces=["127.0.0.1"], **json.loads(node_kw),
                  topics={cfg.pop("name"): zmesh.TopicConfig(**cfg)}).start()
receipt = None
for payload, opts in json.loads(pubs):
    if "deliver_in" in opts:
        opts["deliver_at"] = time.time() + opts.pop("deliver_in")
    receipt = node.publish("t", payload.encode(), **opts)
receipt.wait_stored(10)
print("stored", flush=True)
sys.stdin.read()
"""
TOPIC = "t"
GROUP = "g"
DRAINED_S = 20.0


def publish_then_kill_9(
    tmp_path: Path, mesh: str, topic: dict, pubs: list, node_kw: dict | None = None
) -> float:
    """Publish ``pubs`` from a child producer, SIGKILL it once they are stored; returns
    the wall time the child was killed at."""
    proc = spawn(
        [
            "-c",
            CHILD,
            mesh,
            str(tmp_path / "prod"),
            json.dumps({"name": TOPIC, **topic}),
            json.dumps(node_kw or {}),
            json.dumps(pubs),
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    kill_9_when(proc, "stored")
    return time.time()


def receive_until_drained(prod: zmesh.Node, sub: zmesh.Subscription) -> list[bytes]:
    """Every payload ``sub`` gets (acked) until the producer's outbox is empty."""
    got: list[bytes] = []

    def drained() -> bool:
        for m in sub.fetch(100, timeout=0.05):
            got.append(bytes(m.payload))
            m.ack()
        return prod.status()["outbox"] == 0

    wait_until(drained, DRAINED_S, what="the producer's outbox drained")
    got.extend(bytes(m.payload) for m in sub.fetch(100, timeout=0.2))  # (none should come)
    return got


def lane_count(prod: zmesh.Node, event: str) -> int:
    return sum(ln[event] for ln in prod.status()["lanes"] if ln["lane"] == GROUP)


def test_a_ttl_run_out_and_a_schedule_come_due_while_the_producer_was_down(
    tmp_path, mesh_name, make_node
):
    # Edge values: a TTL that ends while the producer is down, one that ends long after,
    # a schedule due while it is down, one due after its restart, and plain messages.
    killed = publish_then_kill_9(
        tmp_path,
        mesh_name,
        {"groups": [GROUP]},
        [
            ["short", {"ttl": 1.0}],
            ["prio-short", {"ttl": 1.0, "priority": 5}],
            ["long", {"ttl": 600.0}],
            ["due-while-down", {"deliver_in": 0.5}],
            ["due-later", {"deliver_in": 4.0}],
            ["plain", {}],
        ],
    )
    # The TTLs end (and the first schedule comes due) while nothing runs.
    wait_until(lambda: time.time() > killed + 1.2, 5, what="the TTLs to run out")
    prod = make_node("prod")
    try:
        cons = make_node("cons", seeds=[prod.control_address])
        try:
            sub = cons.subscribe(TOPIC, group=GROUP)
            got = receive_until_drained(prod, sub)
            assert sorted(got) == sorted([b"long", b"due-while-down", b"due-later", b"plain"])
            assert lane_count(prod, "expired") == 2
            assert prod.stats()["expired"] == 2
        finally:
            cons.close()
    finally:
        prod.close()


def test_latest_wins_supersedes_a_value_published_before_the_kill(tmp_path, mesh_name, make_node):
    topic = {"groups": [GROUP], "latest_wins": True}
    publish_then_kill_9(
        tmp_path,
        mesh_name,
        topic,
        [["k1-old", {"key": "k1"}], ["k2-only", {"key": "k2"}], ["k1-mid", {"key": "k1"}]],
        # (no heartbeat to commit, before the kill, the deletion of what k1-mid superseded:
        # it is written in the commit after k1-mid's)
        {"heartbeat_interval_s": 30.0, "dead_after_s": 90.0},
    )
    prod = make_node("prod", topics={TOPIC: zmesh.TopicConfig(groups=(GROUP,), latest_wins=True)})
    try:
        assert prod.status()["outbox"] == 2  # (k1-old superseded, before the kill or at the start)
        prod.publish(TOPIC, b"k1-new", key="k1").wait_stored(5)
        assert prod.status()["outbox"] == 2
        cons = make_node("cons", seeds=[prod.control_address])
        try:
            sub = cons.subscribe(TOPIC, group=GROUP)
            assert sorted(receive_until_drained(prod, sub)) == [b"k1-new", b"k2-only"]
            assert lane_count(prod, "superseded") >= 1  # (k1-mid, and k1-old if at the start)
        finally:
            cons.close()
    finally:
        prod.close()


def test_a_msg_id_repeated_after_the_kill_within_its_window_is_a_duplicate(
    tmp_path, mesh_name, make_node
):
    # (a window far longer than a restart: whatever the machine's load, still in it)
    node_kw = {"dedupe_window_s": 600.0, "heartbeat_interval_s": 30.0, "dead_after_s": 90.0}
    publish_then_kill_9(
        tmp_path, mesh_name, {"groups": [GROUP]}, [["first", {"msg_id": "order-1"}]], node_kw
    )
    prod = make_node("prod", **node_kw)
    try:
        prod.publish(TOPIC, b"again", msg_id="order-1").wait_stored(5)
        assert prod.stats()["duplicates_suppressed"] == 1
        assert prod.status()["outbox"] == 1  # (its receipt names the first's message)
    finally:
        prod.close()


def test_a_msg_id_repeated_after_the_kill_past_its_window_is_a_new_message(
    tmp_path, mesh_name, make_node
):
    window_s = 10.0
    # A long heartbeat: the window's pruning (each heartbeat) must not be what decides
    # whether an id is still in its window.
    node_kw = {"dedupe_window_s": window_s, "heartbeat_interval_s": 30.0, "dead_after_s": 90.0}
    killed = publish_then_kill_9(
        tmp_path, mesh_name, {"groups": [GROUP]}, [["first", {"msg_id": "order-1"}]], node_kw
    )
    prod = make_node("prod", **node_kw)
    try:
        # Past the window (it was stored before the child's kill): a new message.
        wait_until(lambda: time.time() > killed + window_s + 0.1, 30, what="the window's end")
        late = prod.publish(TOPIC, b"late", msg_id="order-1")
        late.wait_stored(5)
        assert prod.stats().get("duplicates_suppressed", 0) == 0, (
            "an id past its window was dropped"
        )
        assert prod.status()["outbox"] == 2
        # ... and the id's window starts again from that publish.
        prod.publish(TOPIC, b"late-again", msg_id="order-1").wait_stored(5)
        assert prod.stats()["duplicates_suppressed"] == 1
        assert prod.status()["outbox"] == 2
    finally:
        prod.close()
