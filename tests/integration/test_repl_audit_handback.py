"""A taker's hand-back after the taker itself was restarted: what it settled before its
restart goes back to the producer with its outcome, its dead letters with their
records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import zmesh
from tests.conftest import fetched, wait_until

TAKEOVER = {"takeover_after_s": 2.0}  # (dead_after_s is 1.5 in these tests)


def _serving(node: zmesh.Node) -> list[dict]:
    return node.status()["replicas"]["serving"]


def test_dead_letters_parked_by_a_taker_restarted_since_are_handed_back(
    make_node: Callable[..., zmesh.Node], tmp_path: Path
) -> None:
    """A consumer fails a message that a taker delivered; the taker restarts (its copy,
    and what each lane owed when it took over, kept on disk) and takes over again; the
    producer returns. The hand-back told the failed message as acked: its outcome was
    known only in the first taker's memory. The producer settled it as acked, so its
    dead letter was lost (the copy that held it is replaced by the producer's next
    sync) and no operator could replay it."""
    r = make_node("r", **TAKEOVER)
    c = make_node("c", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p = make_node("p", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"], ack_timeout_s=30.0)
    payloads = [b"good-%d" % i for i in range(5)] + [b"bad"]
    p.publish_many("t", payloads).wait_stored(timeout=10)
    p_id = p.id
    wait_until(lambda: {x["name"] for x in c.peers()} == {"p", "r"}, what="c meets p and r")
    p.close()  # (before anything was delivered: the taker delivers it all)
    sub = c.subscribe("t", group="g")
    seen: Counter[bytes] = Counter()
    for msg in fetched(sub, len(payloads)):
        seen[msg.payload] += 1
        assert msg.id.producer == p_id
        if msg.payload == b"bad":
            msg.fail("unreadable")
        else:
            msg.ack()
    wait_until(lambda: _serving(r) and _serving(r)[0]["owed"] == 0, 10, what="all settled")
    r.close()
    r = make_node("r", data_dir=str(tmp_path / "r"), **TAKEOVER)
    wait_until(lambda: bool(_serving(r)), 15, what="the taker to take over again")
    back = make_node("p", data_dir=str(tmp_path / "p"), replica_host=False, **TAKEOVER)
    assert back.id == p_id
    wait_until(lambda: back.status()["outbox"] == 0, 15, what="the hand-back applied")
    wait_until(lambda: not _serving(r), 10, what="the taker to let go")
    dead = back.dead_letters("t", "g")
    assert [(d.payload, d.reason) for d in dead] == [(b"bad", "unreadable")]
    # Nothing was delivered twice, nothing lost.
    assert not sub.fetch(10, timeout=0.5)
    assert sorted(seen) == sorted(payloads) and max(seen.values()) == 1


def test_a_producer_back_and_gone_again_leaves_what_it_stored_meanwhile_delivered(
    make_node: Callable[..., zmesh.Node], tmp_path: Path
) -> None:
    """A producer back on its data dir while a taker serves it keeps its receipts
    waiting for a replica host other than the taker: it syncs that host and its new
    messages are stored there. Gone again before the hand-back (a crash loop), the taker
    served on from its older copy, and the host with the fresher one never took over
    (a node served the producer already): messages whose receipts said stored were never
    delivered, and were deleted for good when the taker, owing nothing, told the other
    holders to drop their copies. The taker gives way to the fresher copy now."""
    r1 = make_node("r1", **TAKEOVER)
    r2 = make_node("r2", seeds=[r1.control_address], **TAKEOVER)
    c = make_node("c", seeds=[r1.control_address], replica_host=False, **TAKEOVER)
    p = make_node("p", seeds=[r1.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"], ack_timeout_s=30.0)
    wait_until(lambda: {x["name"] for x in c.peers()} == {"p", "r1", "r2"}, what="c meets all")
    before = [b"a%d" % i for i in range(100)]
    p.publish_many("t", before).wait_stored(timeout=10)
    (chosen,) = p.status()["replicas"]["set"]
    taker, other = (r1, r2) if chosen["name"] == "r1" else (r2, r1)
    p.close()
    sub = c.subscribe("t", group="g", max_in_flight=20, batch_size=10)
    held = fetched(sub, 5)  # (from the taker, held unacked: the hand-back must wait)
    assert _serving(taker) and not _serving(other)
    back = make_node("p", data_dir=str(tmp_path / "p"), replica_host=False, **TAKEOVER)
    back.topic("t", replicas=2, groups=["g"], ack_timeout_s=30.0)
    wait_until(lambda: _serving(taker)[0]["handing_back"], 10, what="the taker stopped")
    meanwhile = [b"b%d" % i for i in range(50)]
    back.publish_many("t", meanwhile).wait_stored(timeout=15)  # (at the other host)
    back.close()  # (gone again before the hand-back)
    seen: Counter[bytes] = Counter()
    for msg in held:
        seen[msg.payload] += 1
        msg.ack()
    _drain(sub, seen, before + meanwhile, 30)
    assert max(seen.values()) == 1
    assert sorted(seen) == sorted(before + meanwhile)


def _drain(
    sub: zmesh.Subscription, seen: Counter[bytes], want: list[bytes], timeout: float
) -> None:
    """Handle and ack until every payload of ``want`` was seen."""

    def more() -> bool:
        for msg in sub.fetch(500, timeout=0.05):
            seen[msg.payload] += 1
            msg.ack()
        return all(payload in seen for payload in want)

    wait_until(more, timeout, what=f"{len(want)} distinct messages")
