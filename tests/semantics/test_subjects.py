"""Subjects between real nodes on loopback: patterns in every kind of subscription, topic
settings by pattern, pattern groups remembered across a restart, deleted and expired."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import zmesh
from tests.conftest import LOOPBACK, fetched, wait_until
from tests.integration.test_delivery import drain


def subscribers(node: zmesh.Node, topic: str) -> int:
    """How many live peers ``node`` sees subscribing ``topic``."""
    return sum(p["alive"] and any(s[0] == topic for s in p["subscriptions"]) for p in node.peers())


def subscribed(node: zmesh.Node, topic: str, count: int = 1) -> None:
    """Wait until ``node`` sees ``count`` live peers subscribing ``topic``."""
    wait_until(lambda: subscribers(node, topic) >= count, what=f"{count} subscribers of {topic}")


def take(subs: list[zmesh.Subscription], n: int) -> list[zmesh.Message]:
    """``n`` messages from any of ``subs``, each acked."""
    got: list[zmesh.Message] = []

    def more() -> bool:
        for sub in subs:
            for msg in sub.fetch(100, timeout=0.02):
                msg.ack()
                got.append(msg)
        return len(got) >= n

    wait_until(more, what=f"{n} messages")
    return got


def test_names_with_wildcards_are_refused_where_one_topic_is_meant(make_node) -> None:
    node = make_node("n")
    for bad in ("a.*", "a.>", "a..b", "a.", "a b"):
        with pytest.raises(zmesh.ConfigError):
            node.publish(bad, b"x")
    with pytest.raises(zmesh.ConfigError, match="'>' may only be its last token"):
        node.subscribe("a.>.b", "g")
    with pytest.raises(zmesh.ConfigError):
        node.dead_letters("a.*", "g")
    node.subscribe("a.*.c", "g")  # (patterns are for subscriptions)


@pytest.mark.parametrize("name", ["plant.température", "été.temp"])
def test_a_name_with_letters_past_ascii_is_refused_saying_so(make_node, name) -> None:
    # "é" is a letter: "holds a character other than letters" sent users looking for
    # another character; the rule is ASCII letters.
    node = make_node("n")
    for call in (node.publish, node.request):
        with pytest.raises(zmesh.ConfigError, match="ASCII letter") as info:
            call(name, b"x")
        assert "other than letters" not in str(info.value)
    with pytest.raises(zmesh.ConfigError, match="ASCII letter"):
        node.subscribe(name.replace("temp", "*"), "g")


def test_broadcast_and_ephemeral_patterns(make_node) -> None:
    prod = make_node("prod")
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    copies = [c.subscribe("site.*.temp", "screens", mode="broadcast") for c in (c1, c2)]
    watch = c1.subscribe("site.>")  # ephemeral
    subscribed(prod, "site.*.temp", 2)
    subscribed(prod, "site.>")
    topics = ["site.a.temp", "site.b.temp", "site.a.wind", "site.b.c.temp"]
    for topic in topics:
        prod.publish_many(topic, [f"{topic}:{i}".encode() for i in range(10)])
    for sub in copies:  # each member its own copy of each matching topic
        got = drain(sub, 20)
        assert Counter(m.topic for m in got) == {"site.a.temp": 10, "site.b.temp": 10}
    seen = fetched(watch, 40)
    assert Counter(m.topic for m in seen) == dict.fromkeys(topics, 10)
    assert all(m.payload.decode().startswith(m.topic) for m in seen)


def test_a_node_with_a_topic_and_a_pattern_in_one_group_gets_each_message_once(make_node):
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    exact = cons.subscribe("orders.eu", "billing")
    wide = cons.subscribe("orders.*", "billing")
    subscribed(prod, "orders.*")
    subscribed(prod, "orders.eu")
    prod.publish_many("orders.eu", [b"%d" % i for i in range(50)])
    prod.publish_many("orders.us", [b"%d" % i for i in range(50)])
    got = take([exact, wide], 100)
    assert Counter(m.topic for m in got) == {"orders.eu": 50, "orders.us": 50}
    assert len({m.id for m in got}) == 100
    wait_until(lambda: prod.status()["outbox"] == 0, what="all acked")
    assert sorted(g["topic"] for g in prod.groups()) == ["orders.eu", "orders.us"]


def test_settings_by_pattern_the_most_specific_winning(make_node) -> None:
    topics = {
        "plant.>": zmesh.TopicConfig(partitions=2),
        "plant.*.temp": zmesh.TopicConfig(partitions=3, ttl_s=60.0),
    }
    prod = make_node("prod", topics=topics)
    prod.topic("plant.l9.temp", partitions=5)  # a topic's own settings beat every pattern's
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("plant.>", "g")
    subscribed(prod, "plant.>")
    expect = {"plant.l1.temp": 3, "plant.l1.wind": 2, "plant.l9.temp": 5}
    for topic in expect:
        prod.publish_many(topic, [b"x"] * 40, keys=[f"k{i}" for i in range(40)])
    got = drain(sub, 120)
    for topic, partitions in expect.items():
        assert {m.partition for m in got if m.topic == topic} == set(range(partitions))
    # A pattern set later applies from then on to the topics without settings of their own.
    prod.topic("plant.*.wind", partitions=1)
    prod.publish_many("plant.l2.wind", [b"y"] * 20, keys=[f"k{i}" for i in range(20)])
    assert {m.partition for m in drain(sub, 20)} == {0}


def test_a_pattern_group_survives_a_producer_restart_and_owes_new_topics(
    make_node, tmp_path: Path, mesh_name: str
) -> None:
    data = tmp_path / "prod"
    prod = make_node("prod", data_dir=str(data))
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("jobs.>", "workers")
    subscribed(prod, "jobs.>")
    sub.close()  # the group is offline
    prod.close()
    again = zmesh.Node(
        "prod", mesh=mesh_name, data_dir=str(data), interfaces=LOOPBACK, mdns=False
    ).start()
    try:
        assert [g["pattern"] for g in again.status()["pattern_groups"]] == ["jobs.>"]
        # A topic never published before: owed to the group remembered.
        again.publish_many("jobs.new", [b"a", b"b", b"c"]).wait_stored(5)
        assert again.status()["outbox"] == 3
        [lane] = again.groups("jobs.new")
        assert (lane["group"], lane["pending"]) == ("workers", 3)
        back = cons.subscribe("jobs.>", "workers")
        cons_seeds = [again.control_address]
        joined = make_node("joined", seeds=cons_seeds)
        late = joined.subscribe("jobs.>", "workers")
        subscribed(again, "jobs.>")
        got = take([back, late], 3)
        assert sorted(m.payload for m in got) == [b"a", b"b", b"c"]
    finally:
        again.close()


def test_deleting_a_pattern_group_drops_its_lanes_and_the_pattern(make_node) -> None:
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("logs.*", "archive")
    other = cons.subscribe("logs.web", "alerts")
    subscribed(prod, "logs.*")
    subscribed(prod, "logs.web")
    sub.close()
    # (a group deleted while a member still subscribes to it is made again at once)
    wait_until(lambda: subscribers(prod, "logs.*") == 0, what="the subscriber of logs.* gone")
    for topic in ("logs.web", "logs.db"):
        prod.publish_many(topic, [b"x"] * 5).wait_stored(5)
    result = prod.delete_group("logs.*", "archive")
    assert result["dropped"] == 10
    assert prod.status()["pattern_groups"] == []
    assert [(g["topic"], g["group"]) for g in prod.groups("logs.*")] == [("logs.web", "alerts")]
    assert len(drain(other, 5)) == 5
    assert prod.stats()["pattern_groups_retired"] == 1
