"""Subscriptions by pattern between real processes: a wildcard group is one group across
every matching topic of every producer, topics first published later included, and a
topic first published while the group is offline is owed to it."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh
from tests.conftest import LOOPBACK, wait_until
from tests.integration.test_delivery import drain
from tests.integration.workers import Worker
from zmesh import _subjects as subjects_module
from zmesh import node as node_module
from zmesh._engine.outbox import groups as groups_module

PRODUCERS = ("p1", "p2", "p3")
PER_TOPIC = 12  # messages each producer publishes to each topic
KEYS = 3


class Handled:
    """What a handler saw: (producer, seq) -> how many times, and who took which key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: Counter[tuple[str, int]] = Counter()
        self.payloads: dict[tuple[str, int], str] = {}
        self.topics: dict[tuple[str, int], str] = {}
        self.members: defaultdict[tuple[str, str, str | None], set[str]] = defaultdict(set)

    def handler(self, member: str):
        def handle(msg: zmesh.Message) -> None:
            with self.lock:
                mid = (msg.id.producer, msg.id.seq)
                self.times[mid] += 1
                self.payloads[mid] = msg.payload.decode()
                self.topics[mid] = msg.topic
                self.members[(msg.id.producer, msg.topic, msg.key)].add(member)

        return handle

    def count(self) -> int:
        with self.lock:
            return len(self.times)


@pytest.fixture
def producers(tmp_path: Path, mesh_name: str) -> Iterator[list[Worker]]:
    workers: list[Worker] = []
    try:
        for name in PRODUCERS:
            workers.append(Worker(name, mesh_name, tmp_path / name))
        yield workers
    finally:
        for w in workers:
            w.quit()


def expected(topics: list[str]) -> Counter[str]:
    """The payloads the producers publish to ``topics``, once each."""
    return Counter(f"{p}:{t}:{i}" for p in PRODUCERS for t in topics for i in range(PER_TOPIC))


def publish(producers: list[Worker], topics: list[str]) -> None:
    for w in producers:
        for topic in topics:
            assert w.ask(f"pub {topic} {PER_TOPIC} {KEYS}") == "published"


def test_a_wildcard_group_across_producers_and_topics_gets_each_message_once(
    producers: list[Worker], make_node, mesh_name: str, tmp_path: Path
) -> None:
    seeds = [w.address for w in producers]
    agg, arch = Handled(), Handled()
    a1 = make_node("a1", seeds=seeds)
    a2 = make_node("a2", seeds=seeds)
    for node in (a1, a2):  # one shared group, two members, across plant.*.temp
        node.subscribe("plant.*.temp", group="agg", handler=agg.handler(node.name))
    archiver_dir = tmp_path / "r1"
    r1 = make_node("r1", seeds=seeds, data_dir=str(archiver_dir))
    r1.subscribe("plant.>", group="arch", handler=arch.handler("r1"))
    for w in producers:
        for name, pattern in (("a1", "plant.*.temp"), ("a2", "plant.*.temp"), ("r1", "plant.>")):
            w.wait_sees(name, pattern)

    # Topics first published after the groups were learned, then more of them later.
    first = [f"plant.l{i}.temp" for i in range(10)] + [f"plant.l{i}.pressure" for i in range(4)]
    later = [f"plant.l{i}.temp" for i in range(10, 16)]
    publish(producers, first)
    publish(producers, later)
    for w in producers:
        assert w.ask("drained 60") == "drained"
    temps = [t for t in first + later if t.endswith(".temp")]
    assert Counter(agg.payloads.values()) == expected(temps)
    assert Counter(arch.payloads.values()) == expected(first + later)
    assert set(agg.times.values()) == {1} and set(arch.times.values()) == {1}
    # Shared by the two members, each (producer, topic, key) with one of them.
    assert {m for ms in agg.members.values() for m in ms} == {"a1", "a2"}
    assert all(len(ms) == 1 for ms in agg.members.values())
    for w in producers:
        groups = {(g["group"], g["pattern"]) for g in w.json("patterns")}
        assert groups == {("agg", "plant.*.temp"), ("arch", "plant.>")}

    # The archivers go offline; topics first published now are owed to them.
    r1.close()
    for w in producers:
        wait_until(lambda w=w: not w.sees("r1", "plant.>"), 20, what="the archiver gone")
    offline = [f"plant.l{i}.humidity" for i in range(16, 20)]
    publish(producers, offline)
    for w in producers:
        assert w.ask("outbox") == f"outbox {len(offline) * PER_TOPIC}"
    before = arch.count()
    back = zmesh.Node(
        "r1",
        mesh=mesh_name,
        data_dir=str(archiver_dir),
        interfaces=LOOPBACK,
        mdns=False,
        seeds=seeds,
        heartbeat_interval_s=0.2,
        dead_after_s=1.5,
    ).start()
    try:
        back.subscribe("plant.>", group="arch", handler=arch.handler("r1"))
        for w in producers:
            assert w.ask("drained 60") == "drained"
        wait_until(lambda: arch.count() == before + len(expected(offline)), what="the backlog")
    finally:
        back.close()
    assert Counter(arch.payloads.values()) == expected(first + later + offline)
    assert set(arch.times.values()) == {1}
    assert not any(t.endswith(".humidity") for t in agg.topics.values())


def test_quiet_lanes_of_a_pattern_group_go_and_come_back_with_the_next_publish(
    make_node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Topics that come and go (one per device): a producer forgets a topic's lane of a
    group subscribed by pattern once it has been quiet, so its lanes do not grow with
    every topic it ever published, and the topic's next message still reaches the
    group."""
    monkeypatch.setattr(groups_module, "QUIET_LANE_FORGET_S", 0.3)
    prod = make_node("prod")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("dev.*", group="agg")
    topics = [f"dev.{i}" for i in range(20)]

    def lanes() -> list[str]:
        return [lane["topic"] for lane in prod.status()["lanes"] if lane["group"] == "agg"]

    wait_until(lambda: prod.status()["pattern_groups"], what="the pattern group at the producer")
    for rounds in (1, 2):
        for topic in topics:
            prod.publish(topic, topic.encode(), key="k")
        got = drain(sub, len(topics))
        assert sorted(m.payload.decode() for m in got) == sorted(topics)
        wait_until(lambda: not lanes(), what="the quiet lanes to be forgotten")
        assert prod.stats()["lanes_forgotten"] == rounds * len(topics)
    assert prod.status()["outbox"] == 0 and "lanes_retired" not in prod.stats()


def test_a_node_publishing_to_topics_that_come_and_go_keeps_bounded_caches(
    make_node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a node caches per topic name (checked names, partitions, settings, ephemeral
    subscribers) stays within CACHED_TOPICS however many topics it publishes to."""
    for module in (node_module, subjects_module):
        monkeypatch.setattr(module, "CACHED_TOPICS", 16)
    prod = make_node("prod", topics={"dev.5": zmesh.TopicConfig(partitions=4)})
    receipts = [prod.publish(f"dev.{i}", b"x") for i in range(100)]
    for r in receipts:
        r.wait_stored(5)
    engine = prod._engine
    assert len(prod._known_topics) <= 16 and len(prod._plain_partitions) <= 16
    assert len(prod._topics._resolved) <= 16
    assert len(engine.outbox.lanes.topics._resolved) <= 16
    prod.publish("dev.5", b"y").wait_stored(5)
    assert prod.status()["outbox"] == 101
    [lane] = [lane for lane in prod.status()["lanes"] if lane["topic"] == "dev.5"]
    assert lane["pending"] == 2
