"""The bridge with real nodes on loopback: logging before acking, serving ranges, sink
publishes with row-id dedupe, retention, restarts and a kill -9 mid-stream (no Spark)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

import zmesh
import zmesh.spark
from tests.conftest import spawn, wait_members, wait_until
from zmesh.spark import BridgeError
from zmesh.spark._client import BridgeClient
from zmesh.spark._log import BridgeLog
from zmesh.spark._rows import Chunk
from zmesh.spark._runs import Message as Logged
from zmesh.spark._runs import messages

from .conftest import Bridged, Collector

EXAMPLE_TOML = Path(__file__).parents[2] / "examples" / "metrics_pipeline" / "spark-bridge.toml"
READY_TIMEOUT_S = 60.0


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The child's first line of output, read straight from the pipe under a deadline
    (a pipe's readline has none); fails the test if the line does not come in time. Read
    a byte at a time, so that what follows the line stays in the pipe."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            pytest.fail(
                f"no line from child {proc.pid} within {timeout_s:g}s "
                f"(exit code {proc.poll()}); it said {data!r}"
            )
        chunk = os.read(fd, 1)
        if not chunk:
            pytest.fail(
                f"child {proc.pid} closed its output (exit code {proc.wait(10)}); it said {data!r}"
            )
        data += chunk
    return data.decode(errors="replace")


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL a child that leads a session of its own, and its group, if it still runs;
    reap it and close its pipe."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def records(client: BridgeClient, stream: str, start: int, end: int) -> list[Logged]:
    first, runs = client.fetch(stream, start, end, 10_000)
    assert first == start
    return [
        m
        for run_first, record in runs
        for m in messages(run_first, record)
        if start <= m.offset < end
    ]


def test_messages_get_offsets_and_are_acked_after_logging(bridged: Callable[..., Bridged]) -> None:
    b = bridged()
    b.publish("readings", 300)
    assert b.logged() == 300
    assert b.bridge.stats()["appended"] == 300
    wait_until(lambda: b.producer.status()["outbox"] == 0, what="producer outbox drained")
    with BridgeClient(b.endpoint) as client:
        streams = client.info()
        assert streams == b.bridge.streams()
        seen = []
        for stream, (head, end) in streams.items():
            assert head == 0
            recs = records(client, stream, 0, end)
            assert [m.offset for m in recs] == list(range(end))
            seqs = [m.seq for m in recs]
            assert seqs == sorted(seqs), "one partition keeps the producer's order"
            for m in recs:
                assert m.producer.hex() == b.producer.id
                body = json.loads(m.payload)
                assert m.key == f"sensor-{body['i'] % 5}" and m.headers == {"i": str(body["i"])}
                seen.append(body["i"])
        assert sorted(seen) == list(range(300))


def publish(client: BridgeClient, task: str, chunk: Chunk, topic: str | None) -> dict[str, int]:
    [counts] = client.publish(task, [chunk], topic)
    return counts


def test_a_loop_logs_a_run_per_partition_in_order(bridged: Callable[..., Bridged]) -> None:
    b = bridged()
    batches = [  # without keys: each batch in one partition, the partitions in turn
        b.producer.publish_many("readings", [f"b{j}-{i}".encode() for i in range(50)])
        for j in range(10)
    ]
    # Published alone (a header makes each its own publish): round-robin by sequence.
    alone = [
        b.producer.publish("readings", f"rr{i}".encode(), headers={"i": str(i)}) for i in range(100)
    ]
    receipts = [
        *batches,
        *alone,
        b.producer.publish_many(  # by key
            "readings",
            [f"k{i}".encode() for i in range(300)],
            keys=[f"key-{i % 7}" for i in range(300)],
        ),
        *[b.producer.publish("readings", f"one{i}".encode(), key="solo") for i in range(50)],
    ]
    for r in receipts:
        r.wait_acked(30)
    where: dict[bytes, str] = {}
    with BridgeClient(b.endpoint) as client:
        for stream, (_head, end) in client.info().items():
            recs = records(client, stream, 0, end)
            assert [m.offset for m in recs] == list(range(end))
            assert [m.seq for m in recs] == sorted(m.seq for m in recs), stream
            where.update((m.payload, stream) for m in recs)
    assert len(where) == 950
    assert [where[f"b{j}-0".encode()] for j in range(10)] == [f"readings/{j}" for j in range(10)]
    assert all(len({where[f"b{j}-{i}".encode()] for i in range(50)}) == 1 for j in range(10))
    assert all(where[f"rr{i}".encode()] == f"readings/{r.id.seq % 16}" for i, r in enumerate(alone))
    for key in range(7):
        assert len({where[f"k{i}".encode()] for i in range(key, 300, 7)}) == 1
    assert len({where[f"one{i}".encode()] for i in range(50)}) == 1
    assert b.bridge.stats()["log"] < 100, "runs, not a record per message"


def test_sink_rows_are_published_once_per_row_id(
    bridged: Callable[..., Bridged], make_node: Callable[..., zmesh.Node]
) -> None:
    b = bridged()
    collected = Collector(make_node("consumer", seeds=[b.node.control_address]), "alerts", "pager")
    got = collected.messages
    wait_members(b.node, "alerts", "pager", 1)
    payloads = [f"alert {i}".encode() for i in range(50)]
    keys = [f"k{i}" for i in range(50)]
    headers: list[dict | None] = [{"h": "v"} if i % 10 == 0 else None for i in range(50)]
    with BridgeClient(b.endpoint) as client:
        chunk = Chunk(0, payloads, None, keys, headers, None)
        assert publish(client, "q:0:0", chunk, "alerts") == {"published": 50, "duplicates": 0}
        # a retried task in other chunks: rows 25..59, of which 50..59 are new
        again = Chunk(25, payloads[25:] + [b"new"] * 10, None, None, None, None)
        assert publish(client, "q:0:0", again, "alerts") == {"published": 10, "duplicates": 25}
        # another task, with a topic per row; rows with ids of their own
        per_row = Chunk(0, [b"t1", b"t2"], ["alerts", "alerts"], None, None, None)
        assert publish(client, "q:0:1", per_row, None) == {"published": 2, "duplicates": 0}
        by_id = Chunk(0, [b"id-a", b"id-b", b"id-a"], None, None, None, ["q:x", "q:y", "q:x"])
        assert publish(client, "q:0:2", by_id, "alerts") == {"published": 2, "duplicates": 1}
        with pytest.raises(BridgeError, match="other lengths"):
            publish(client, "q:0:3", Chunk(0, payloads[:2], None, keys[:1], None, None), "alerts")
    wait_until(lambda: len(got) >= 64, what="64 alerts handled")
    wait_until(lambda: b.node.status()["outbox"] == 0, what="alerts acked")
    assert len(got) == 64 and len({m.payload for m in got}) == 51 + 2 + 2
    first = next(m for m in got if m.payload == b"alert 0")
    assert first.key == "k0" and first.headers == {"h": "v"}
    assert next(m for m in got if m.payload == b"alert 1").headers == {}
    assert b.bridge.stats()["publish_duplicates"] == 25 + 1


@pytest.mark.parametrize(
    ("bad", "refusal"),
    [
        ({"keys": ["k" * 5000]}, "key of 5000 characters exceeds 4096"),
        ({"topics": ["bad topic"]}, "topic name 'bad topic' is invalid"),
        ({"headers": [{"h": "x" * 70_000}]}, "headers pack to"),
        ({"ids": ["q:" + "x" * 300]}, "msg_id must be a non-empty str of at most 256"),
    ],
)
def test_a_chunk_with_a_row_the_node_refuses_publishes_none_of_its_rows(
    bridged: Callable[..., Bridged],
    make_node: Callable[..., zmesh.Node],
    bad: dict[str, list],
    refusal: str,
) -> None:
    b = bridged()
    got = Collector(make_node("consumer", seeds=[b.node.control_address]), "out", "g").messages
    wait_members(b.node, "out", "g", 1)
    payloads = [f"row {i}".encode() for i in range(5)]
    columns = {
        "topics": ["out"] * 5,
        "keys": [f"k{i}" for i in range(5)],
        "headers": [{"h": str(i)} for i in range(5)],
        "ids": [f"q:{i}" for i in range(5)] if "ids" in bad else None,
    }
    refused = {n: c and [*c[:3], *bad.get(n, c[3:4]), *c[4:]] for n, c in columns.items()}
    with BridgeClient(b.endpoint) as client:
        with pytest.raises(BridgeError, match=re.escape(f"row 3 of q:0:0: {refusal}")):
            publish(client, "q:0:0", Chunk(0, payloads, **refused), None)
        assert b.node.status()["counters"].get("published", 0) == 0
        counts = publish(client, "q:0:0", Chunk(0, payloads, **columns), None)
        assert counts == {"published": 5, "duplicates": 0}
    wait_until(lambda: len(got) >= 5, what="5 rows handled")
    wait_until(lambda: b.node.status()["outbox"] == 0, what="rows acked")
    assert sorted(m.payload for m in got) == payloads


def test_a_chunk_the_outbox_takes_part_of_keeps_the_stored_rows_once(
    make_node: Callable[..., zmesh.Node], tmp_path: Path
) -> None:
    # The outbox holds two messages (group g, declared, has no member yet): of a chunk
    # of four rows, published a row at a time (each has headers), two are stored, then
    # the third finds no room within the bridge's publish_timeout_s (the node's own is
    # longer). A rerun of the chunk publishes only the other two.
    node = make_node(
        "bridge",
        max_outbox_messages=2,
        publish_timeout_s=5.0,
        topics={"held": zmesh.TopicConfig(groups=("g",))},
    )
    payloads = [f"row {i}".encode() for i in range(4)]
    chunk = Chunk(0, payloads, None, None, [{"h": str(i)} for i in range(4)], None)
    with (
        zmesh.spark.Bridge(
            node, topics=["readings"], log_dir=tmp_path / "log", publish_timeout_s=0.2
        ) as bridge,
        BridgeClient(bridge.endpoint) as client,
    ):
        with pytest.raises(BridgeError, match=r"outbox holds 2 .* no room came within 0\.2s"):
            publish(client, "q:0:0", chunk, "held")
        assert node.status()["outbox"] == 2
        consumer = make_node("consumer", seeds=[node.control_address])
        got = Collector(consumer, "held", "g").messages
        wait_until(lambda: node.status()["outbox"] == 0, what="the two stored rows acked")
        assert publish(client, "q:0:0", chunk, "held") == {"published": 2, "duplicates": 2}
        wait_until(lambda: len(got) >= 4 and node.status()["outbox"] == 0, what="rows acked")
    assert sorted(m.payload for m in got) == payloads


def test_overlapping_chunks_under_way_at_once_publish_each_row_once(
    bridged: Callable[..., Bridged], make_node: Callable[..., zmesh.Node]
) -> None:
    b = bridged()
    got = Collector(make_node("consumer", seeds=[b.node.control_address]), "out", "g").messages
    wait_members(b.node, "out", "g", 1)
    rows = [f"row {i}".encode() for i in range(3000)]
    chunks = [
        Chunk(0, rows[:2000], None, None, None, None),
        Chunk(1000, rows[1000:3000], None, None, None, None),  # (half of it is the first's)
        Chunk(0, rows[:3000], None, None, None, None),
    ]
    with BridgeClient(b.endpoint) as client:
        counts = list(client.publish("q:0:0", chunks, "out", window=3))
    assert counts == [
        {"published": 2000, "duplicates": 0},
        {"published": 1000, "duplicates": 1000},
        {"published": 0, "duplicates": 3000},
    ]
    wait_until(lambda: len(got) >= 3000, what="3000 rows handled")
    wait_until(lambda: b.node.status()["outbox"] == 0, what="rows acked")
    assert sorted(m.payload for m in got) == sorted(rows)


def test_watermarks_drive_retention_over_the_network(bridged: Callable[..., Bridged]) -> None:
    b = bridged(retain_s=0.0)
    b.publish("readings", 100)
    b.publish("readings", 100, start=100)  # (acked first: runs apart from the first's)
    with BridgeClient(b.endpoint) as client:
        streams = client.info(reader="job", topics=["readings"], watermark={})
        b.bridge.prune()
        assert client.info() == streams, "a registered reader without marks holds everything"
        stream, (_head, end) = max(streams.items(), key=lambda s: s[1][1])
        client.info(reader="job", topics=["readings"], watermark={stream: end - 1})
        b.bridge.prune()
        head = b.bridge.streams()[stream][0]
        assert 0 < head <= end - 1, "the runs below the mark went, whole"
        first, runs = client.fetch(stream, 0, end, 100)
        assert first == head and runs[0][0] == head
        assert b.bridge.readers()["job"]["wm"] == {stream: end - 1}
        assert b.bridge.drop_reader("job") and client.info(reader="other") is not None
        assert not client.drop_reader("job")


def test_bad_requests_are_counted_and_dropped(bridged: Callable[..., Bridged]) -> None:
    b = bridged()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(b.endpoint)
    sock.send_multipart([b"\xc1garbage"])
    sock.close()
    ctx.term()  # waits (linger) until the frame is out
    with BridgeClient(b.endpoint) as client:
        with pytest.raises(BridgeError, match="refused fetch"):
            client.call("fetch", {"stream": "readings/0"})
        assert client.info() == {}
    wait_until(lambda: b.bridge.stats().get("decode_errors") == 1, what="decode error counted")
    # A port held by a socket that never listens: nothing answers there, and no other
    # process can take it while the client tries.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        with (
            BridgeClient(f"tcp://127.0.0.1:{port}", timeout_s=0.2, attempts=2) as client,
            pytest.raises(BridgeError, match="did not answer"),
        ):
            client.info()


def test_a_full_log_pushes_back_until_retention_frees_it(bridged: Callable[..., Bridged]) -> None:
    # Retention runs only when the test says (once at start, then not for an hour), so the
    # log certainly fills: 400 payloads of 1.5 kB are more than twice its 512 kB budget
    # (a record counts twice: pages fill about half).
    b = bridged(map_size_bytes=1 << 20, retain_s=0.0, prune_interval_s=3600.0)
    payload = b"x" * 1500
    receipts = [b.producer.publish("readings", payload, key=str(i)) for i in range(400)]

    def failures() -> int:
        return b.bridge.stats().get("log_write_failures", 0)

    def all_acked() -> bool:
        return all(r.acked for r in receipts)

    wait_until(lambda: failures() >= 1, 60, what="the bridge to refuse messages to a full log")
    stuck = b.bridge.stats()["appended"]
    assert 0 < stuck < 400, "nothing logged, or everything: the log was not full"
    # Each refusal means the log is full again: prune it, and the refused messages (nacked
    # back to the producer) are logged on their redelivery, until all 400 are acked.
    prunes = 0
    while True:
        seen = failures()
        b.bridge.prune()
        prunes += 1
        assert prunes <= 20, "the log kept filling: pruning frees nothing?"
        wait_until(
            lambda s=seen: all_acked() or failures() > s,
            60,
            what="every message acked, or the log full again",
        )
        if all_acked():
            break
    stats = b.bridge.stats()
    assert stats["appended"] == 400 and stats["pruned"] >= stuck


def test_restart_keeps_offsets(make_node: Callable[..., zmesh.Node], tmp_path: Path) -> None:
    node = make_node("bridge")
    producer = make_node("producer", seeds=[node.control_address])
    log_dir = tmp_path / "log"
    with zmesh.spark.Bridge(node, topics=["readings"], log_dir=log_dir) as bridge:
        wait_members(producer, "readings", "spark", 1)
        for r in [producer.publish("readings", b"a", key="k") for _ in range(5)]:
            r.wait_acked(30)
        before = bridge.streams()
    with zmesh.spark.Bridge(node, topics=["readings"], log_dir=log_dir) as bridge:
        assert bridge.streams() == before
        for r in [producer.publish("readings", b"b", key="k") for _ in range(5)]:
            r.wait_acked(30)
        ((stream, (head, end)),) = bridge.streams().items()
        assert (head, end) == (0, 10)


def test_bridge_from_toml(tmp_path: Path) -> None:
    text = EXAMPLE_TOML.read_text()
    assert "[bridge]" in text
    path = tmp_path / "bridge.toml"
    path.write_text(text.replace('"var/', f'"{tmp_path}/'))
    bridge = zmesh.spark.Bridge.from_toml(path)
    assert bridge.config.topics == ("metrics",) and bridge.node.name == "spark-bridge"
    bridge.close()


def test_kill_9_of_the_bridge_loses_and_duplicates_nothing(
    make_node: Callable[..., zmesh.Node], tmp_path: Path, mesh_name: str
) -> None:
    producer = make_node("producer")
    args = [
        str(Path(__file__).with_name("bridge_worker.py")),
        mesh_name,
        str(tmp_path / "bridge"),
        str(tmp_path / "log"),
        "readings",
        producer.control_address,
    ]

    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = spawn(args, stdout=subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        line = first_line(proc, READY_TIMEOUT_S)
        assert line.startswith("READY"), f"bridge worker said {line!r}"
        return proc

    def stop(proc: subprocess.Popen, sig: int) -> str:
        os.killpg(proc.pid, sig)
        return (proc.communicate(timeout=20)[0] or b"").decode(errors="replace")

    n = 6000

    def publish(first: int, last: int) -> list[zmesh.Receipt]:
        return [
            producer.publish("readings", str(i).encode(), key=str(i % 7))
            for i in range(first, last)
        ]

    try:
        proc = start()
        wait_members(producer, "readings", "spark", 1)
        receipts = publish(0, n // 2)
        receipts[n // 4].wait_acked(30)
        stop(proc, signal.SIGKILL)
        # The second half is published while the bridge is down, so the restarted bridge
        # certainly appends part of the stream, whatever the first one got to before the kill.
        receipts += publish(n // 2, n)
        proc = start()
        for r in receipts:
            r.wait_acked(60)
        tail = stop(proc, signal.SIGTERM)
    finally:
        for proc in procs:
            end_group(proc)
    stats = json.loads(tail.split("STATS ", 1)[1])
    assert n // 2 <= stats.get("appended", 0) < n, "the kill came mid-stream"
    log = BridgeLog(tmp_path / "log")
    try:
        payloads = []
        for stream, (_head, end) in log.streams().items():
            payloads += [
                m.payload
                for start, record in log.read(stream, 0, end, n)[1]
                for m in messages(start, record)
            ]
    finally:
        log.close()
    assert len(payloads) == n and len(set(payloads)) == n
