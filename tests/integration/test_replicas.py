"""Replicated topics between nodes on loopback: receipts stored once a replica holds the
messages, a replica replaced when it leaves, a producer's lanes taken over when it is
gone and handed back when it returns (tests/faults/netns has the same with kill -9 on
hosts of their own)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import zmesh
from tests.conftest import wait_members, wait_until
from tests.integration.test_cli import LOOP, Proc, run_cli

TAKEOVER = {"takeover_after_s": 2.0}  # (dead_after_s is 1.5 in these tests)


def _drain(sub: zmesh.Subscription, seen: Counter[bytes], want: int, timeout: float) -> None:
    """Handle and ack until ``want`` distinct payloads were seen."""

    def more() -> bool:
        for msg in sub.fetch(500, timeout=0.05):
            seen[msg.payload] += 1
            msg.ack()
        return len(seen) >= want

    wait_until(more, timeout, what=f"{want} distinct messages")


def _replicas(node: zmesh.Node) -> dict:
    return node.status()["replicas"]


def test_a_receipt_is_stored_once_a_replica_holds_its_message(
    make_node: Callable[..., zmesh.Node],
) -> None:
    p = make_node("p", replica_host=False)
    c = make_node("c", seeds=[p.control_address], replica_host=False)
    p.topic("t", replicas=2, groups=["g"])
    sub = c.subscribe("t", group="g")
    wait_members(p, "t", "g", 1)
    receipt = p.publish("t", b"first")
    # Delivery does not wait for the replicas; the receipt does.
    msg = sub.get(timeout=10)
    assert msg.payload == b"first"
    msg.ack()
    with pytest.raises(zmesh.TimeoutError):
        receipt.wait_stored(timeout=0.5)
    assert not receipt.stored and not receipt.acked
    assert _replicas(p)["lag"] == 1
    once = p.publish("t", b"idempotent", msg_id="m-1")
    again = p.publish("t", b"idempotent", msg_id="m-1")  # (a duplicate: it follows the first)
    with pytest.raises(zmesh.TimeoutError):
        again.wait_stored(timeout=0.5)
    r = make_node("r", seeds=[p.control_address])
    receipt.wait_stored(timeout=10)
    once.wait_stored(timeout=10)
    again.wait_stored(timeout=10)
    assert again.id == once.id
    receipt.wait_acked(timeout=10)
    later = p.publish_many("t", [b"%d" % i for i in range(500)])
    later.wait_stored(timeout=10)
    status = _replicas(p)
    assert status["lag"] == 0
    assert [(m["name"], m["state"]) for m in status["set"]] == [("r", "whole")]
    # Settlements follow: the copy ends empty once the group acked everything.
    _drain(sub, Counter(), 501, 10)
    later.wait_acked(timeout=10)

    def copy_empty() -> bool:
        copies = _replicas(r)["copies"]
        return bool(copies) and copies[0]["records"] == 0 and copies[0]["owed_entries"] == 0

    wait_until(copy_empty, 10, what="the replica's copy to empty as the group acks")


def test_a_replica_that_leaves_is_replaced(make_node: Callable[..., zmesh.Node]) -> None:
    p = make_node("p", replica_host=False)
    r1 = make_node("r1", seeds=[p.control_address])
    r2 = make_node("r2", seeds=[p.control_address])
    p.topic("t", replicas=2, groups=["g"])
    first = p.publish_many("t", [b"a"] * 100)
    first.wait_stored(timeout=10)
    (chosen,) = _replicas(p)["set"]
    gone, other = (r1, r2) if chosen["name"] == "r1" else (r2, r1)
    gone.close()
    receipt = p.publish_many("t", [b"b"] * 100)
    receipt.wait_stored(timeout=15)
    (now,) = _replicas(p)["set"]
    assert now["name"] == other.name and now["state"] == "whole"
    # The new replica got the whole backlog, the messages of before too.
    (copy,) = _replicas(other)["copies"]
    assert copy["producer"] == p.id and copy["records"] >= 1
    assert p.status()["counters"]["replica_set_changes"] == 2


def test_lanes_taken_over_then_handed_back(make_node: Callable[..., zmesh.Node], tmp_path) -> None:
    p = make_node("p", replica_host=False, **TAKEOVER)
    r = make_node("r", seeds=[p.control_address], **TAKEOVER)
    c = make_node("c", seeds=[p.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    sub = c.subscribe("t", group="g", max_in_flight=100, batch_size=50)
    wait_members(p, "t", "g", 1)
    n = 2000
    receipts = [p.publish("t", b"%d" % i) for i in range(n)]
    receipts[-1].wait_stored(timeout=10)
    seen: Counter[bytes] = Counter()
    _drain(sub, seen, n // 2, 10)
    p_id = p.id
    p.close()
    # The replica takes over and delivers the rest with the producer's ids: the
    # consumer's dedupe window drops what it acked before.
    _drain(sub, seen, n, 20)
    assert max(seen.values()) == 1
    served = _replicas(r)["serving"]
    assert [s["producer"] for s in served] == [p_id]
    assert r.status()["counters"]["takeovers"] == 1
    taken_ids = {m.id.producer for m in sub.fetch(10, timeout=0.2)}
    assert taken_ids <= {p_id}

    def all_acked_at_the_taker() -> bool:
        serving = _replicas(r)["serving"]
        return bool(serving) and serving[0]["owed"] == 0

    wait_until(all_acked_at_the_taker, 10, what="the taker to owe nothing")
    # The producer comes back on its data dir: it learns what was settled while it was
    # away before it sends anything, and delivers none of it again. (Its outbox owes them
    # until the hand-back comes, which may be before anyone looks: the count of what the
    # hand-back settled says it owed them.)
    p2 = make_node("p", replica_host=False, data_dir=str(tmp_path / "p"), **TAKEOVER)
    assert p2.id == p_id
    wait_until(lambda: p2.status()["outbox"] == 0, 15, what="the hand-back to settle the outbox")
    assert p2.status()["counters"].get("handed_back", 0) > 0
    # (the taker lets go once the producer's HANDBACK_ACK reaches it)
    wait_until(lambda: not _replicas(r)["serving"], 10, what="the taker to let go")
    assert r.status()["counters"]["handbacks"] == 1
    assert p2.status()["counters"]["handbacks_received"] == 1
    assert not sub.fetch(100, timeout=0.5)
    assert c.status()["counters"].get("received", 0) == n


def test_status_shows_replicas_and_cli_nodes_host_none(
    make_node: Callable[..., zmesh.Node], mesh_name: str, tmp_path: Path
) -> None:
    p = make_node("p", replica_host=False)
    p.topic("t", replicas=2, groups=["g"])
    # A command line node is a peer like any other, but hosts no replica: the producer
    # finds no replica host while it is the only other node.
    sub = Proc(
        tmp_path,
        "sub",
        ["sub", "t", "--group", "g", *LOOP, "--mesh", mesh_name, "--seed", p.control_address],
    )
    try:
        wait_members(p, "t", "g", 1, timeout=30)
        receipt = p.publish("t", b"one")
        wait_until(lambda: "one" in sub.stdout(), 30, what="the command line's subscriber")
        assert not receipt.stored and _replicas(p)["set"] == []
        text = run_cli(["status", p.control_address])
        assert text.returncode == 0, text.stderr
        assert "replicated topics" in text.stdout and "t (2)" in text.stdout
        assert "no replica host" in text.stdout and "1 not on replicas yet" in text.stdout
        r = make_node("r", seeds=[p.control_address])
        receipt.wait_stored(timeout=15)
        text = run_cli(["status", r.control_address])
        assert text.returncode == 0, text.stderr
        assert "copy held" in text.stdout and p.id[:12] in text.stdout
    finally:
        sub.popen.terminate()
        sub.popen.wait(30)
