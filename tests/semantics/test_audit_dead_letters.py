"""Dead letters replayed and purged by operators at once (two shells, the CLI and the
HTTP API): calls the IO thread takes in one iteration share one write batch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from zmesh._engine.commands import Call
from zmesh._store.store import Store


def taken_together(node: zmesh.Node, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` on threads of their own, queued in this order while the node's IO
    thread is held, so that it takes all of them in one iteration; their results."""
    queue = node._queue
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=queue.call, args=(lambda _wb, _now: started.set() or release.wait(10),)
    )
    holder.start()
    results: list[Any] = [None] * len(calls)
    threads = []
    try:
        assert started.wait(10), "the IO thread did not take the holding call"
        for n, call in enumerate(calls):

            def run(n: int = n, call: Callable[[], Any] = call) -> None:
                results[n] = call()

            thread = threading.Thread(target=run)
            thread.start()
            threads.append(thread)
            wait_until(
                lambda n=n: sum(type(c) is Call for c in list(queue._cmds)) == n + 1,
                what=f"call {n} queued",
            )
    finally:
        release.set()
        holder.join(10)
        for thread in threads:
            thread.join(10)
    return results


def parked_one(make_node) -> tuple[zmesh.Node, zmesh.Subscription]:
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"poison")
    [msg] = fetched(sub, 1)
    msg.fail("bad")
    wait_until(lambda: prod.dead_letters("t", "g"), what="a dead letter")
    return prod, sub


def parked_count(prod: zmesh.Node) -> int:
    [group] = prod.groups("t")
    return group["dead_letters"]


def test_a_dead_letter_purged_and_replayed_at_once_is_purged_only(make_node):
    """The replay read the letter as still parked (the purge not yet committed): both
    said 1, the purged message was delivered, and the group listed -1 dead letters."""
    prod, sub = parked_one(make_node)
    purged, replayed = taken_together(
        prod,
        [
            lambda: prod.purge_dead_letters("t", "g"),
            lambda: prod.replay_dead_letters("t", "g"),
        ],
    )
    assert (purged, replayed) == (1, 0)
    assert prod.dead_letters("t", "g") == []
    assert parked_count(prod) == 0
    assert prod.stats()["dead_purged"] == 1
    assert prod.stats().get("dead_replayed", 0) == 0
    assert sub.get(timeout=0.5) is None, "a purged message was delivered"


def test_a_dead_letter_replayed_and_purged_at_once_is_replayed_only(make_node):
    prod, sub = parked_one(make_node)
    replayed, purged = taken_together(
        prod,
        [
            lambda: prod.replay_dead_letters("t", "g"),
            lambda: prod.purge_dead_letters("t", "g"),
        ],
    )
    assert (replayed, purged) == (1, 0)
    assert parked_count(prod) == 0
    assert prod.stats().get("dead_purged", 0) == 0
    [again] = fetched(sub, 1)
    assert again.payload == b"poison"
    # Its history was kept for it: failed again, it is parked with both reasons.
    again.fail("still bad")
    wait_until(lambda: prod.dead_letters("t", "g"), what="parked again")
    [dead] = prod.dead_letters("t", "g")
    assert [h[2] for h in dead.history] == ["bad", "still bad"]


def test_a_dead_letter_replayed_twice_at_once_is_replayed_once(make_node):
    prod, sub = parked_one(make_node)
    first, second = taken_together(
        prod,
        [
            lambda: prod.replay_dead_letters("t", "g"),
            lambda: prod.replay_dead_letters("t", "g"),
        ],
    )
    assert (first, second) == (1, 0)
    assert prod.stats()["dead_replayed"] == 1
    [again] = fetched(sub, 1)
    again.ack()
    wait_until(lambda: prod.status()["outbox"] == 0, what="the replayed message acked")
    assert parked_count(prod) == 0
    assert sub.get(timeout=0.3) is None


@pytest.mark.parametrize("limit", [10**9, 2**63])
def test_dead_letters_listed_with_a_huge_limit(make_node, limit):
    prod, _sub = parked_one(make_node)
    assert [d.payload for d in prod.dead_letters("t", "g", limit=limit)] == [b"poison"]


def stored_records(data_dir: Path) -> int:
    """How many message records a closed node's store holds."""
    store = Store(str(data_dir), 1 << 26)
    try:
        with store.env.begin(db=store.msgs) as txn:
            return txn.stat(store.msgs)["entries"]
    finally:
        store.close()


@pytest.mark.parametrize("then", ["acked", "failed and purged"])
def test_a_dead_letter_replayed_after_its_retention_is_reclaimed_again(
    make_node, tmp_path: Path, then: str
):
    """Parked longer than the topic's retention_s, its index entry and record were
    reclaimed; the replay stored the record again without an index entry, so no
    retention pass ever reclaimed it: it stayed in the store for good."""
    topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=0.5, groups=("g",))}
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    prod.publish("t", b"poison")
    [msg] = fetched(sub, 1)
    msg.fail("bad")
    wait_until(
        lambda: prod.stats().get("retention_reclaimed", 0) == 1,
        what="the parked message's record reclaimed after its retention",
    )
    assert prod.replay_dead_letters("t", "g") == 1
    [again] = fetched(sub, 1)
    assert (again.payload, again.index) == (b"poison", 0)
    if then == "acked":
        again.ack()
    else:
        again.fail("still bad")
        wait_until(lambda: prod.dead_letters("t", "g"), what="parked again")
        assert prod.purge_dead_letters("t", "g") == 1
    wait_until(lambda: prod.status()["outbox"] == 0, what="the replayed message settled")
    wait_until(
        lambda: prod.stats().get("retention_reclaimed", 0) == 2,
        what="the replayed message's record reclaimed again",
    )
    prod.close()
    assert stored_records(tmp_path / "prod") == 0
