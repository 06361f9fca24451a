"""Last values per key between real processes: a late joiner gets, from every producer,
the values kept of each key, then the live messages, with nothing missing in between."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import pytest

import zmesh
from tests.conftest import wait_until
from tests.integration.workers import Worker

PRODUCERS = ("p1", "p2", "p3")
TOPICS = ["plant.l1.temp", "plant.l2.temp", "plant.l3.pressure"]
KEYS = 4
FIRST_ROUNDS = 5  # published before anyone joins
LIVE_ROUNDS = 60  # published while the late joiners join
LIVE_PAUSE_S = 0.02


class Seen:
    """What a late joiner got: per (producer, topic, key) the counters, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: defaultdict[tuple[str, str, str], list[int]] = defaultdict(list)

    def handle(self, msg: zmesh.Message) -> None:
        producer, topic, key, n = msg.payload.decode().split(":")
        assert (topic, key) == (msg.topic, msg.key)
        with self.lock:
            self.values[(producer, topic, key)].append(int(n))

    def total(self) -> int:
        with self.lock:
            return sum(map(len, self.values.values()))


@pytest.fixture
def producers(tmp_path: Path, mesh_name: str):
    workers = []
    try:
        for name in PRODUCERS:
            workers.append(Worker(name, mesh_name, tmp_path / name, keep_last={"plant.>": 1}))
        yield workers
    finally:
        for w in workers:
            w.quit()


def everything(seen: Seen, topics: list[str], end: int) -> None:
    """Wait until ``seen`` has every key of ``topics`` from every producer up to ``end``."""
    keys = {(p, t, f"k{k}") for p in PRODUCERS for t in topics for k in range(KEYS)}
    wait_until(
        lambda: set(seen.values) == keys and all(v[-1] == end for v in seen.values.values()),
        30,
        what=f"every key of {topics} up to {end}",
    )


def test_a_late_joiner_gets_the_last_values_then_every_live_message(
    producers: list[Worker], make_node
) -> None:
    # A group that takes everything from the start (a message published before any group
    # is known would go to the first group learned: "board" below would get them all).
    seeds = [w.address for w in producers]
    archive = make_node("archive", seeds=seeds)
    archive.subscribe("plant.>", "archive", handler=lambda msg: None)
    for w in producers:
        w.wait_sees("archive", "plant.>")
    topics = " ".join(TOPICS)
    for w in producers:
        assert w.ask(f"stream {FIRST_ROUNDS} 0 {KEYS} {topics}") == "streaming"
    for w in producers:
        assert w.ask("streamed") == f"streamed {FIRST_ROUNDS * KEYS * len(TOPICS)}"
    kept = FIRST_ROUNDS - 1  # the counter of every key's last value

    # What every producer keeps: the last value of each key (keep_last 1).
    reader = make_node("reader", seeds=seeds)
    wait_until(
        lambda: {p["name"] for p in reader.peers() if p["alive"]} >= set(PRODUCERS),
        what="the producers",
    )
    values = [m.payload.decode() for m in reader.last("plant.*.temp")]
    assert sorted(values) == sorted(
        f"{p}:{t}:k{k}:{kept}" for p in PRODUCERS for t in TOPICS[:2] for k in range(KEYS)
    )

    # Joiners while nothing is published: the kept values, one of each key.
    watcher, board = Seen(), Seen()
    late = make_node("late", seeds=seeds)
    late.subscribe("plant.*.temp", deliver="last_per_key", handler=watcher.handle)
    late.subscribe("plant.>", "board", deliver="last_per_key", handler=board.handle)
    everything(watcher, TOPICS[:2], kept)
    everything(board, TOPICS, kept)

    # Then live messages, and a joiner in the middle of them.
    for w in producers:
        assert w.ask(f"stream {LIVE_ROUNDS} {LIVE_PAUSE_S} {KEYS} {topics}") == "streaming"
    wait_until(lambda: watcher.total() > len(values) + 20, what="live messages")
    midway = Seen()
    joiner = make_node("joiner", seeds=seeds)
    joiner.subscribe("plant.>", deliver="last_per_key", handler=midway.handle)
    for w in producers:
        assert w.ask("streamed") == f"streamed {(FIRST_ROUNDS + LIVE_ROUNDS) * KEYS * 3}"
    end = FIRST_ROUNDS + LIVE_ROUNDS - 1
    for seen, topics_seen in ((watcher, TOPICS[:2]), (board, TOPICS), (midway, TOPICS)):
        everything(seen, topics_seen, end)
    for values_of_key in (*watcher.values.values(), *board.values.values()):
        assert values_of_key == list(range(kept, end + 1))  # kept first, then every live one
    for values_of_key in midway.values.values():
        # The value kept when the producer learned of it, then every later one.
        assert values_of_key == list(range(values_of_key[0], end + 1))
        assert values_of_key[0] >= kept


def test_a_timeout_longer_than_one_poll_is_waited_for(make_node) -> None:
    """A finite timeout past what one ZeroMQ poll takes (2**31 - 1 ms) is a long wait,
    not an OverflowError."""
    prod = make_node("prod", topics={"plant.>": zmesh.TopicConfig(keep_last=1)})
    cons = make_node("cons", seeds=[prod.control_address])
    wait_until(lambda: any(p["alive"] for p in cons.peers()), what="the producer")
    prod.publish("plant.l1.temp", b"21", key="k0").wait_stored(5)
    assert [m.payload for m in cons.last("plant.>", timeout=2.2e6)] == [b"21"]
    assert [m.payload for m in prod.last("plant.>", timeout=1e300)] == [b"21"]
