"""Spark test fixtures: one SparkSession per test session, bridges with a producer."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import zmesh
import zmesh.spark
from tests.conftest import wait_members
from zmesh.spark._local import local_session as build_session

HAVE_PYSPARK = importlib.util.find_spec("pyspark") is not None
needs_spark = pytest.mark.skipif(
    not HAVE_PYSPARK, reason="pyspark is not installed (pip install -e '.[spark]')"
)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared local SparkSession (starting one takes ~5 s)."""
    if not HAVE_PYSPARK:
        pytest.skip("pyspark is not installed (pip install -e '.[spark]')")
    session = build_session("zmesh-tests")
    yield session
    session.stop()


def sensor_key(i: int) -> str:
    """Message ``i``'s key: the sensor of ``reading(i)``."""
    return f"sensor-{i % 5}"


def stream_to_end(
    spark: Any,
    source: dict[str, Any],
    sink: str,
    *,
    columns: tuple[str, ...] = (),
    name: str | None = None,
    **sink_options: Any,
) -> Any:
    """Run an available-now query from the zmesh source (``source``: its options) into
    ``sink`` to its end (``columns``: only those; ``name``: a memory sink's table)."""
    df = spark.readStream.format("zmesh").options(**source).load()
    writer = (df.select(*columns) if columns else df).writeStream.format(sink)
    if name is not None:
        writer = writer.queryName(name)
    return run_to_end(writer.options(**sink_options).trigger(availableNow=True).start())


@dataclass
class Bridged:
    """A bridge node with its Bridge, and a producer node seeded to it."""

    node: zmesh.Node
    bridge: zmesh.spark.Bridge
    producer: zmesh.Node
    log_dir: str
    key: Callable[[int], str] = sensor_key  # (``publish``'s key of message i)

    @property
    def endpoint(self) -> str:
        return self.bridge.endpoint

    def publish(self, topic: str, n: int, start: int = 0, timeout: float = 60.0) -> None:
        """Publish messages {"i": i, ...} for i in [start, start + n) and wait for acks."""
        receipts = [
            self.producer.publish(
                topic, json.dumps(reading(i)).encode(), key=self.key(i), headers={"i": str(i)}
            )
            for i in range(start, start + n)
        ]
        for r in receipts:
            r.wait_acked(timeout)

    def logged(self, topic: str | None = None) -> int:
        return sum(
            end
            for s, (_h, end) in self.bridge.streams().items()
            if topic is None or s.startswith(topic + "/")
        )


class Collector:
    """A consumer group member that keeps what it handles."""

    def __init__(self, node: zmesh.Node, topic: str, group: str) -> None:
        self.messages: list[zmesh.Message] = []
        self._lock = threading.Lock()
        node.subscribe(topic, group=group, handler=self._handle)

    def _handle(self, msg: zmesh.Message) -> None:
        with self._lock:
            self.messages.append(msg)

    def __len__(self) -> int:
        return len(self.messages)


def reading(i: int) -> dict[str, Any]:
    return {"i": i, "sensor": f"sensor-{i % 5}", "value": float(i % 97)}


def run_to_end(query: Any, timeout_s: float = 120.0) -> Any:
    """Wait for a streaming query (an available-now one) to end by itself; stop it either
    way, so that one which overran does not keep running in the shared SparkSession."""
    try:
        assert query.awaitTermination(timeout_s), (
            f"query {query.name or query.id} still running after {timeout_s:g}s: {query.status}"
        )
    finally:
        query.stop()
    return query


@dataclass
class Pair:
    """Two bridges in one group, each on a node of its own, and a producer of both."""

    first: Bridged
    second: Bridged

    @property
    def endpoints(self) -> str:
        return f"{self.first.endpoint},{self.second.endpoint}"

    @property
    def controls(self) -> list[str]:
        return [self.first.node.control_address, self.second.node.control_address]

    def logged(self, topic: str | None = None) -> int:
        return self.first.logged(topic) + self.second.logged(topic)


@pytest.fixture
def start_bridge(
    make_node: Callable[..., zmesh.Node], tmp_path: Path
) -> Iterator[Callable[..., tuple[zmesh.Node, Any, str]]]:
    """Start a bridge node ``name`` with its Bridge (group ``spark``) on ``topics``."""
    made: list[zmesh.spark.Bridge] = []

    def start(name: str, topics: tuple[str, ...], **options: Any) -> tuple[zmesh.Node, Any, str]:
        node = make_node(name)
        log_dir = str(tmp_path / f"{name}-log")
        bridge = zmesh.spark.Bridge(node, topics=list(topics), log_dir=log_dir, **options).start()
        made.append(bridge)
        return node, bridge, log_dir

    yield start
    for bridge in made:
        bridge.close()


@pytest.fixture
def bridged(
    start_bridge: Callable[..., tuple[zmesh.Node, Any, str]], make_node: Callable[..., zmesh.Node]
) -> Callable[..., Bridged]:
    """Make a bridge (group ``spark``) on ``topics`` and a producer that knows it."""

    def make(topics: tuple[str, ...] = ("readings",), **options: Any) -> Bridged:
        node, bridge, log_dir = start_bridge("bridge", topics, **options)
        producer = make_node("producer", seeds=[node.control_address])
        for topic in topics:
            wait_members(producer, topic, "spark", 1)
        return Bridged(node, bridge, producer, log_dir)

    return make


@pytest.fixture
def bridged_pair(
    start_bridge: Callable[..., tuple[zmesh.Node, Any, str]], make_node: Callable[..., zmesh.Node]
) -> Callable[..., Pair]:
    """Make two bridges in group ``spark`` on ``topics``, sharing their partitions, and
    a producer seeded to both (each Bridged of the pair has it). The pair's messages are
    keyed each by its number: the five sensors' keys fall in 5 of the 16 partitions,
    which one bridge owns alone in about 1 assignment of 40; the first 50 numbers fall
    in all 16, so both bridges take a share whichever partitions each owns."""

    def make(topics: tuple[str, ...] = ("readings",), **options: Any) -> Pair:
        a = start_bridge("bridge-a", topics, **options)
        b = start_bridge("bridge-b", topics, **options)
        producer = make_node("producer", seeds=[a[0].control_address, b[0].control_address])
        for topic in topics:
            wait_members(producer, topic, "spark", 2)
        return Pair(
            Bridged(a[0], a[1], producer, a[2], key=str),
            Bridged(b[0], b[1], producer, b[2], key=str),
        )

    return make
