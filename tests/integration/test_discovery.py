"""Discovery on loopback: mDNS bound to 127.0.0.1, seeds, gossip, liveness, restarts."""

from __future__ import annotations

from tests.conftest import wait_members, wait_until


def peer_names(node) -> set[str]:
    return {p["name"] for p in node.peers() if p["alive"]}


def test_mdns_on_loopback_finds_peers_of_the_same_mesh(make_node, mesh_name):
    a = make_node("a", mdns=True)
    b = make_node("b", mdns=True)
    other = make_node("x", mdns=True, mesh=mesh_name + "-other")
    wait_until(lambda: peer_names(a) == {"b"} and peer_names(b) == {"a"}, 20,
               what="mDNS discovery of a and b")
    sub = b.subscribe("t", group="g")
    wait_members(a, "t", "g", 1)
    a.publish("t", b"over mdns").wait_stored(5)
    msg = sub.get(timeout=10)
    assert msg is not None and msg.payload == b"over mdns"
    msg.ack()
    assert peer_names(other) == set()


def test_gossip_introduces_peers_learned_from_a_seed(make_node):
    hub = make_node("hub")
    a = make_node("a", seeds=[hub.control_address])
    b = make_node("b", seeds=[hub.control_address])
    wait_until(lambda: peer_names(a) == {"hub", "b"} and peer_names(b) == {"hub", "a"},
               what="a and b to meet through the hub")


def test_silent_peer_is_declared_dead_and_returns(make_node, tmp_path):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    cons_id = cons.id
    cons.close()
    # A clean close says bye, so the producer drops it at once.
    wait_until(lambda: "cons" not in peer_names(prod), what="cons to leave")
    wait_members(prod, "t", "g", 0)
    back = make_node("cons", data_dir=str(tmp_path / "cons"), seeds=[prod.control_address])
    assert back.id == cons_id, "node id is stable across restarts"
    back.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    incarnations = [p["incarnation"] for p in prod.peers() if p["name"] == "cons"]
    assert incarnations == [2]
