"""The zmesh sink when a streaming query fails mid-batch and is restarted."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zmesh
import zmesh.spark
from tests.conftest import wait_members, wait_until
from zmesh.errors import ArgumentError
from zmesh.spark import BridgeError
from zmesh.spark._client import BridgeClient
from zmesh.spark._options import SinkOptions
from zmesh.spark._rows import Chunk

from .conftest import Bridged, Collector, Pair, needs_spark, run_to_end

pytestmark = needs_spark


def test_a_batch_replayed_with_other_parallelism_publishes_each_row_once(
    spark: Any,
    bridged: Callable[..., Bridged],
    make_node: Callable[..., zmesh.Node],
    tmp_path: Path,
) -> None:
    """The sink names a row by its Spark partition and its place there; the source cut a
    micro-batch into partitions by minPartitions (by default the session's cores) when
    the batch ran, so a batch replayed by a query restarted with other parallelism (a
    driver on a bigger machine, another number of executors) was cut otherwise: rows took
    places that other rows had had, and were published twice or not at all. A batch is
    now cut as it was when the query first planned it."""
    b = bridged()
    node = make_node("consumer", seeds=[b.node.control_address])
    out = Collector(node, "copies", "checker")
    wait_members(b.node, "copies", "checker", 1)
    b.publish("readings", 100)
    source = {"endpoint": b.endpoint, "reader": "replayed"}
    sink = {"endpoint": b.endpoint, "batchRows": 5, "checkpointLocation": str(tmp_path / "ck")}

    def start(min_partitions: int, topic: str) -> Any:
        df = spark.readStream.format("zmesh").options(**source, minPartitions=min_partitions)
        rows = df.load().selectExpr("key", "payload", f"{topic} as topic")
        return rows.writeStream.format("zmesh").options(**sink).trigger(availableNow=True).start()

    # the first run fails at the last rows of its last stream (a topic name the bridge
    # refuses), after its second task published the chunks before them (and its first
    # task some or all of its rows, as far as it got before Spark stopped it)
    last = int(sorted(b.bridge.streams())[-1].rpartition("/")[2])
    bad = f"case when partition = {last} and offset >= 15 then 'no topic!' else 'copies' end"
    with pytest.raises(Exception, match="no topic!"):
        run_to_end(start(2, bad))
    assert b.bridge.stats()["published"] >= 45  # (the failing task's first 45 rows)
    # restarted from its checkpoint on "more cores": the failed batch runs again, whole
    run_to_end(start(3, "'copies'"))
    wait_until(lambda: len(out) >= 100, 30, what="100 copies handled")
    wait_until(lambda: b.node.status()["outbox"] == 0, 30, what="bridge outbox drained")
    counts = Counter(json.loads(m.payload)["i"] for m in out.messages)
    assert {i for i, n in counts.items() if n > 1} == set()
    assert sorted(counts) == list(range(100))


def test_a_topic_column_that_is_not_text_is_refused_when_the_writer_is_made(
    spark: Any, bridged: Callable[..., Bridged]
) -> None:
    """The writer checks its columns before any task runs, but not the topic column: a
    number there published each row to a topic named by its digits ("0", "1", ...), and
    a struct failed each task as it met it, after other tasks had published."""
    b = bridged()
    df = spark.range(0, 20).selectExpr("'x' as payload", "id % 3 as topic", "id")
    for rows, typ in ((df, "bigint"), (df.selectExpr("payload", "struct(id) as topic"), "struct")):
        with pytest.raises(Exception, match=f"column topic must be string or binary.*got {typ}"):
            rows.write.format("zmesh").mode("append").option("endpoint", b.endpoint).save()
    assert b.bridge.stats().get("published", 0) == 0


def test_rows_of_one_id_are_published_once_through_several_bridges(
    spark: Any, bridged_pair: Callable[..., Pair], make_node: Callable[..., zmesh.Node]
) -> None:
    """With idColumns, rows equal in them are one row: only the first is published. A
    task's partition picked its bridge, and each bridge remembers only what it published,
    so two such rows in partitions of different bridges (or one row that a rerun of a
    plan not deterministic puts in another partition) were both published. A row with
    an id now goes to the bridge its id picks."""
    pair = bridged_pair()
    node = make_node("consumer", seeds=pair.controls)
    out = Collector(node, "out", "checker")
    for b in (pair.first, pair.second):
        wait_members(b.node, "out", "checker", 1)
    # partition 0 holds ids 0..19, partition 1 ids 20..39: each n once in each
    df = spark.range(0, 40, numPartitions=2).selectExpr(
        "id % 20 as n", "cast(id as string) as payload"
    )
    writer = (
        df.write.format("zmesh")
        .mode("append")
        .options(endpoint=pair.endpoints, topic="out", idColumns="n", writeId="once")
    )
    writer.save()
    writer.save()  # (a rerun of the job: nothing new)
    for b in (pair.first, pair.second):
        wait_until(lambda b=b: b.node.status()["outbox"] == 0, 30, what="bridge outbox drained")
    wait_until(lambda: len(out) >= 20, 30, what="20 rows handled")
    published = [b.bridge.stats().get("published", 0) for b in (pair.first, pair.second)]
    assert sum(published) == len(out) == 20
    assert sorted(int(m.payload) % 20 for m in out.messages) == list(range(20))


@pytest.mark.parametrize("ids", [False, True])
def test_a_task_name_too_long_to_remember_is_refused_and_the_bridge_serves_on(
    bridged: Callable[..., Bridged], ids: bool
) -> None:
    """The bridge remembers a task's published rows under its name (with idColumns, under
    each row's id), in LMDB keys of at most 511 bytes. A longer one (from a writeId of
    some 500 characters, or 130 of Chinese text with idColumns) was published, then the
    write remembering it failed and stopped the bridge thread: the bridge answered and
    logged nothing more. It is refused before anything is published."""
    b = bridged()
    long_id = "写" * 200 + ":" + "0" * 32  # (256 characters, 633 bytes: no msg_id)
    chunk = Chunk(0, [b"x"], None, None, None, [long_id] if ids else None)
    task = "w:0" if ids else "w" * 600 + ":0"
    with BridgeClient(b.endpoint, timeout_s=10, attempts=1) as client:
        with pytest.raises(BridgeError, match="refused publish: .*bytes"):
            list(client.publish(task, [chunk], "out"))
        assert client.bounds().log_id == b.bridge.log_id, "the bridge still answers"
    assert b.bridge.stats().get("published", 0) == 0
    b.publish("readings", 5)  # and still logs what it consumes
    assert b.logged("readings") == 5


def test_a_write_id_too_long_to_name_rows_is_refused_naming_the_option() -> None:
    with pytest.raises(ArgumentError, match="option writeId .* at most 200 bytes"):
        SinkOptions.parse({"endpoint": "tcp://127.0.0.1:1", "writeId": "w" * 201})
    assert SinkOptions.parse({"endpoint": "tcp://127.0.0.1:1", "writeId": "w" * 200}).write_id


def test_a_full_outbox_fails_a_sink_write_with_its_reason(
    make_node: Callable[..., zmesh.Node], tmp_path: Path
) -> None:
    """A chunk waits for room in the bridge node's outbox up to publish_timeout_s (30 s);
    a writer waits as long (requestTimeoutMs) for an answer, then sends the chunk again
    on a new socket. When the pager of a topic was away and its outbox full, the writer
    gave up first each time and failed with "did not answer 'publish' ... 3 times"
    (the bridge serving nothing while it waited, three times over); the bridge's reason
    never reached it. The bridge now waits at most half the writer's timeout."""
    pager = zmesh.TopicConfig(groups=["pager"])
    node = make_node("bridge", max_outbox_messages=10, topics={"alerts": pager})
    log_dir = str(tmp_path / "bridge-log")
    with zmesh.spark.Bridge(node, topics=["readings"], log_dir=log_dir) as bridge:
        rows = [Chunk(0, [b"x"] * 10, None, None, None, None)]  # (fills the outbox)
        rows.append(Chunk(10, [b"y"] * 5, None, None, None, None))
        client = BridgeClient(bridge.endpoint, timeout_s=2, attempts=3)
        with client, pytest.raises(BridgeError, match="refused publish: .*outbox holds 10"):
            list(client.publish("w:0", rows, "alerts"))
        assert bridge.stats()["published"] == 10
