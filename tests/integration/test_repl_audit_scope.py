"""A topic's replicas lowered to 1 at run time while another topic of the producer stays
replicated: what the replica hosts' copies hold of it after."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import zmesh
from tests.conftest import fetched, wait_members, wait_until

TAKEOVER = {"takeover_after_s": 2.0}  # (dead_after_s is 1.5 in these tests)


def _replicas(node: zmesh.Node) -> dict:
    return node.status()["replicas"]


def test_a_topic_no_longer_replicated_leaves_nothing_owed_in_the_copies(
    make_node: Callable[..., zmesh.Node],
) -> None:
    """Topic t's replicas lowered from 2 to 1 while topic u keeps 2: the replica host
    keeps its copy (for u), but no later commit of t reaches it. The messages of t it
    held stayed owed there after the group acked them at the producer (their records
    deleted, their entries kept): the copy's status said it owed them, and a taker
    counted each as a lost record though every one had been acked. The copies are made
    anew without t now."""
    r = make_node("r", **TAKEOVER)
    c = make_node("c", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p = make_node("p", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    p.topic("u", replicas=2, groups=["g"])
    sub_t = c.subscribe("t", group="g")
    sub_u = c.subscribe("u", group="g")
    wait_members(p, "t", "g", 1)
    wait_members(p, "u", "g", 1)
    p.publish_many("t", [b"t%d" % i for i in range(10)]).wait_stored(timeout=10)
    p.topic("t", replicas=1)
    seen: Counter[bytes] = Counter()
    for msg in fetched(sub_t, 10):
        seen[msg.payload] += 1
        msg.ack()
    wait_until(lambda: p.status()["outbox"] == 0, 10, what="t acked at the producer")
    p.publish("u", b"u0").wait_stored(timeout=10)  # (held by the consumer: owed)

    def copy_owes_u0_alone() -> bool:
        copies = _replicas(r)["copies"]
        return [(x["state"], x["records"], x["owed_entries"]) for x in copies] == [("whole", 1, 1)]

    wait_until(copy_owes_u0_alone, 10, what="the copy to owe u0 alone")
    p.close()
    wait_until(lambda: bool(_replicas(r)["serving"]), 15, what="the taker")
    for msg in fetched(sub_u, 1):
        seen[msg.payload] += 1
        msg.ack()
    wait_until(lambda: _replicas(r)["serving"][0]["owed"] == 0, 10, what="u0 acked")
    assert not r.stats().get("lost_records")
    assert not sub_t.fetch(10, timeout=0.3) and not sub_u.fetch(10, timeout=0.1)
    assert len(seen) == 11 and max(seen.values()) == 1, seen
