"""The bridge with real nodes on loopback: logging before acking, serving ranges, sink
publishes with row-id dedupe, retention, restarts and a kill -9 mid-stream (no Spark)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
import zmq

import zmesh
import zmesh.spark
from tests.conftest import spawn, wait_members, wait_until
from zmesh.spark import BridgeError
from zmesh.spark._client import BridgeClient
from zmesh.spark._log import BridgeLog

from .conftest import Bridged

EXAMPLE_TOML = Path(__file__).parents[2] / "examples" / "metrics_pipeline" / "spark-bridge.toml"


def records(client: BridgeClient, stream: str, start: int, end: int) -> list[list]:
    first, recs = client.fetch(stream, start, end, 10_000)
    assert first == start
    return [msgpack.unpackb(r) for r in recs]


def test_messages_get_offsets_and_are_acked_after_logging(
        bridged: Callable[..., Bridged]) -> None:
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
            assert len(recs) == end
            seqs = [r[1] for r in recs]
            assert seqs == sorted(seqs), "one partition keeps the producer's order"
            for producer, _seq, key, headers, _pub, _app, payload in recs:
                assert producer.hex() == b.producer.id
                body = json.loads(payload)
                assert key == f"sensor-{body['i'] % 5}" and headers == {"i": str(body["i"])}
                seen.append(body["i"])
        assert sorted(seen) == list(range(300))


def test_sink_rows_are_published_once_per_row_id(bridged: Callable[..., Bridged],
                                                 make_node: Callable[..., zmesh.Node]) -> None:
    b = bridged()
    got: list[zmesh.Message] = []
    lock = threading.Lock()

    def handle(m: zmesh.Message) -> None:
        with lock:
            got.append(m)

    consumer = make_node("consumer", seeds=[b.node.control_address])
    consumer.subscribe("alerts", group="pager", handler=handle)
    wait_members(b.node, "alerts", "pager", 1)
    rows = [[f"q:0:0:{i}", "alerts", f"k{i}", {"h": "v"}] for i in range(50)]
    payloads = [f"alert {i}".encode() for i in range(50)]
    with BridgeClient(b.endpoint) as client:
        assert client.publish(rows, payloads) == {"published": 50, "duplicates": 0}
        # a retried batch: the same ids again, plus ten new rows
        rows2 = rows[25:] + [[f"q:1:0:{i}", "alerts", None, None] for i in range(10)]
        assert client.publish(rows2, payloads[25:] + [b"new"] * 10) == {
            "published": 10, "duplicates": 25}
        with pytest.raises(BridgeError, match="payloads"):
            client.publish(rows[:2], payloads[:1])
    wait_until(lambda: len(got) >= 60, what="60 alerts handled")
    wait_until(lambda: b.node.status()["outbox"] == 0, what="alerts acked")
    assert len(got) == 60 and len({m.payload for m in got}) == 51
    first = next(m for m in got if m.payload == b"alert 0")
    assert first.key == "k0" and first.headers == {"h": "v"}
    assert b.bridge.stats()["publish_duplicates"] == 25


def test_watermarks_drive_retention_over_the_network(bridged: Callable[..., Bridged]) -> None:
    b = bridged(retain_s=0.0)
    b.publish("readings", 100)
    with BridgeClient(b.endpoint) as client:
        streams = client.info(reader="job", topics=["readings"], watermark={})
        b.bridge.prune()
        assert client.info() == streams, "a registered reader without marks holds everything"
        stream, (_head, end) = next(iter(streams.items()))
        client.info(reader="job", topics=["readings"], watermark={stream: end - 1})
        b.bridge.prune()
        first, recs = client.fetch(stream, 0, end, 100)
        assert (first, len(recs)) == (end - 1, 1)
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
    with BridgeClient("tcp://127.0.0.1:9", timeout_s=0.2, attempts=2) as client, \
            pytest.raises(BridgeError, match="did not answer"):
        client.info()


def test_a_full_log_pushes_back_until_retention_frees_it(
        bridged: Callable[..., Bridged]) -> None:
    b = bridged(map_size_bytes=1 << 20, retain_s=0.0, prune_interval_s=0.2)
    payload = b"x" * 1500
    receipts = [b.producer.publish("readings", payload, key=str(i)) for i in range(400)]
    for r in receipts:
        r.wait_acked(60)
    stats = b.bridge.stats()
    assert stats["appended"] == 400 and stats["log_write_failures"] >= 1
    assert stats["pruned"] > 0


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
        (stream, (head, end)), = bridge.streams().items()
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
        make_node: Callable[..., zmesh.Node], tmp_path: Path, mesh_name: str) -> None:
    producer = make_node("producer")
    args = [str(Path(__file__).with_name("bridge_worker.py")), mesh_name,
            str(tmp_path / "bridge"), str(tmp_path / "log"), "readings",
            producer.control_address]

    def start() -> subprocess.Popen:
        proc = spawn(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("READY"), f"bridge worker said {line!r}"
        return proc

    def stop(proc: subprocess.Popen, sig: int) -> str:
        os.killpg(proc.pid, sig)
        return proc.communicate(timeout=20)[0] or ""

    n = 6000

    def publish(first: int, last: int) -> list[zmesh.Receipt]:
        return [producer.publish("readings", str(i).encode(), key=str(i % 7))
                for i in range(first, last)]

    proc = start()
    wait_members(producer, "readings", "spark", 1)
    receipts = publish(0, n // 2)
    receipts[n // 4].wait_acked(30)
    stop(proc, signal.SIGKILL)
    # The second half is published while the bridge is down, so the restarted bridge
    # certainly appends part of the stream, whatever the first one got to before the kill.
    receipts += publish(n // 2, n)
    proc = start()
    try:
        for r in receipts:
            r.wait_acked(60)
    finally:
        tail = stop(proc, signal.SIGTERM)
    stats = json.loads(tail.split("STATS ", 1)[1])
    assert n // 2 <= stats.get("appended", 0) < n, "the kill came mid-stream"
    log = BridgeLog(tmp_path / "log")
    try:
        payloads = []
        for stream, (_head, end) in log.streams().items():
            payloads += [msgpack.unpackb(r)[6] for r in log.read(stream, 0, end, n)[1]]
    finally:
        log.close()
    assert len(payloads) == n and len(set(payloads)) == n
