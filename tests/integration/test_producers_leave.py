"""A long-lived consumer whose producers come and go (each run a node of its own): what
it keeps of a producer that said goodbye."""

from __future__ import annotations

from tests.conftest import fetched, wait_members, wait_until


def known_peers(node) -> set[str]:
    """The node ids (hex) a node's store remembers, to contact at its next start."""
    return {k.hex() for k in node._engine.store.known_peers()}


def test_a_producer_that_said_bye_is_forgotten_by_the_store_too(make_node, monkeypatch):
    """A node remembers the peers that said hello, to contact them when it starts again;
    a peer dead for FORGET_DEAD_AFTER_S (600 s; 1 s here) is deleted. One that said bye
    was dropped from the peers at once but stayed in the store for good: a consumer
    whose producers each run with a new data dir (a new node id) kept every one of them,
    and at its next start contacted dead addresses (64 at most: live peers among the
    rest were not contacted). It is deleted as a dead peer is now."""
    from zmesh._engine import mesh as mesh_module

    monkeypatch.setattr(mesh_module, "FORGET_DEAD_AFTER_S", 1.0)
    hub = make_node("hub")
    hub.subscribe("t", group="g")
    prod = make_node("p", seeds=[hub.control_address])
    wait_members(prod, "t", "g", 1)
    wait_until(lambda: prod.id in known_peers(hub), what="the producer remembered")
    prod.close()
    wait_until(lambda: "p" not in {p["name"] for p in hub.peers()}, what="the bye heard")
    wait_until(lambda: prod.id not in known_peers(hub), what="the producer forgotten")


def test_acks_for_a_producer_that_said_bye_are_not_held_for_good(make_node):
    """A consumer that acks messages of a producer that said bye meanwhile has no peer to
    send the acks to: they wait for the producer (a node not known yet, whose data
    overtook its hello, becomes a peer within a moment), and used to wait for good, a
    backlog per producer gone that nothing emptied (256 of them and every other node's
    settlements that had to wait were dropped). They wait dead_after_s now, then are
    dropped and counted."""
    hub = make_node("hub")
    sub = hub.subscribe("t", group="g")
    prod = make_node("p", seeds=[hub.control_address])
    wait_members(prod, "t", "g", 1)
    prod.publish_many("t", [b"a", b"b"]).wait_stored(5)
    msgs = fetched(sub, 2)
    prod.close()  # (while the consumer holds its messages)
    wait_until(lambda: "p" not in {p["name"] for p in hub.peers()}, what="the bye heard")
    sub.ack_many(msgs)
    wait_until(lambda: hub.stats().get("acked_local", 0) >= 2, what="the acks made")

    def backlog() -> int:
        mesh = hub._engine.mesh
        return hub._engine.queue.call(lambda _wb, _now: len(mesh.ctrl_backlog), writes=False)

    wait_until(lambda: not backlog(), what="the acks for the producer gone dropped")
    assert hub.stats()["control_dropped"] >= 1
