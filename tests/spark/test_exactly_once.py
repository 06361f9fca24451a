"""Exactly once across driver crashes.

One driver process runs two streaming queries through the bridge: into a Parquet sink,
and back into the mesh through the zmesh sink to a consumer group. The driver (its whole
process group: Python, the JVM, Python workers) is SIGKILLed twice mid-stream and started
again from the checkpoints; messages keep arriving throughout. Each kill lands while a
micro-batch has written output but is not committed, so the restarted query replays it (a
kill that Spark's commit beat is followed by another, on a later batch of a new run).
In the end the Parquet sink holds every message once and the group handled every
message once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zmesh
from tests.conftest import spawn, wait_members, wait_until
from tests.waiting import pause, until

from .conftest import Bridged, Collector, Pair, needs_spark, reading

pytestmark = [needs_spark, pytest.mark.slow]

JOB = str(Path(__file__).with_name("stream_job.py"))
CHUNKS = (800, 600, 600)  # published before run 1, during run 1, during run 2
MAX_RECORDS = 200
KILL_TIMEOUT_S = 150.0
KILL_ATTEMPTS = 4  # kills of one run's queries, each in a new run, until one lands mid-batch
TOP_UP = 2 * MAX_RECORDS  # published before a run that follows a kill which missed
DRAIN_TIMEOUT_S = 180.0


def batch_ids(checkpoint: Path, kind: str) -> list[int]:
    folder = checkpoint / kind
    return (
        sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
        if (folder.is_dir())
        else []
    )


def in_flight(checkpoint: Path) -> int | None:
    """The batch planned but not committed, if any."""
    offsets, commits = batch_ids(checkpoint, "offsets"), batch_ids(checkpoint, "commits")
    if offsets and (not commits or offsets[-1] > commits[-1]):
        return offsets[-1]
    return None


class Driver:
    """Runs stream_job.py again and again on the same checkpoints; kills its group."""

    def __init__(self, tmp_path: Path, cfg: dict[str, Any]) -> None:
        self.tmp_path = tmp_path
        self.cfg = cfg
        self.runs = 0
        self.trigger = ""
        self.proc: subprocess.Popen | None = None

    def start(self, trigger: str, **overrides: Any) -> None:
        self.runs += 1
        self.trigger = trigger
        cfg = {**self.cfg, "trigger": trigger, **overrides}
        with (self.tmp_path / f"driver-{self.runs}.log").open("wb") as log:
            self.proc = spawn(
                [JOB, json.dumps(cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def output(self) -> str:
        """The driver's log: from its first error on (a Java trace names the cause at its
        top), and its end."""
        text = (self.tmp_path / f"driver-{self.runs}.log").read_text(errors="replace")
        first = re.search(r"^.*(Exception|Error)\b", text, re.MULTILINE)
        if first is None or len(text) <= 4000:
            return text[-4000:]
        return f"{text[first.start() : first.start() + 2000]}\n[...]\n{text[-2000:]}"

    def kill_mid_batch(
        self, checkpoint: Path, progress: Callable[[], int], before_retry: Callable[[], None]
    ) -> tuple[int, int]:
        """SIGKILL the driver mid-batch: once a batch of ``checkpoint`` is in flight and
        ``progress`` (its sink's output) moved after that batch was planned. Spark may
        commit the batch between that look and the kill; then the kill did not land
        mid-batch, and after ``before_retry`` the driver runs again and is killed on a
        later batch, up to KILL_ATTEMPTS times. Returns the batch left uncommitted and the
        kills it took."""
        for attempt in range(1, KILL_ATTEMPTS + 1):
            batch = self._kill_with_output_in_flight(checkpoint, progress)
            left = in_flight(checkpoint)
            if left == batch:
                return batch, attempt
            print(
                f"run {self.runs}: batch {batch} was committed when the kill landed "
                f"(in flight now: {left}); again, on a later batch",
                flush=True,
            )
            before_retry()
            self.start(self.trigger)
        pytest.fail(f"none of {KILL_ATTEMPTS} kills landed before their batch's commit")

    def _kill_with_output_in_flight(self, checkpoint: Path, progress: Callable[[], int]) -> int:
        proc = self.proc
        assert proc is not None
        watching: tuple[int, int] | None = None  # (batch, progress when it was planned)

        def output_in_flight() -> bool:
            nonlocal watching
            if proc.poll() is not None:
                pytest.fail(f"driver exited {proc.returncode}:\n{self.output()}")
            batch = in_flight(checkpoint)
            if batch is None:
                watching = None
            elif watching is None or watching[0] != batch:
                watching = (batch, progress())
            else:
                return progress() > watching[1]
            return False

        if not until(output_in_flight, KILL_TIMEOUT_S, 0.003):
            pytest.fail(f"no batch with output in flight to kill:\n{self.output()}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert watching is not None
        return watching[0]

    def run_to_end(self) -> None:
        self.start("available-now", max_records=5 * MAX_RECORDS)  # fewer, larger batches
        assert self.proc is not None
        try:
            code = self.proc.wait(DRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.close()
            pytest.fail(f"available-now run did not finish:\n{self.output()}")
        assert code == 0, self.output()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class Feeder(threading.Thread):
    """Publishes readings [start, start + n) in paced bursts of 100."""

    def __init__(self, b: Bridged, start: int, n: int) -> None:
        super().__init__(name="feeder", daemon=True)
        self.b, self.first, self.n = b, start, n
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.first, self.first + self.n, 100):
                self.b.publish("readings", min(100, self.first + self.n - i), start=i)
                pause(0.2)  # (bursts spread over the query's micro-batches)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(60)
        assert not self.is_alive() and self.error is None, self.error


def parquet_files(out: Path) -> int:
    return len(list(out.glob("part-*.parquet"))) if out.is_dir() else 0


def test_driver_kills_lose_and_duplicate_nothing(
    spark: Any,
    bridged: Callable[..., Bridged],
    make_node: Callable[..., zmesh.Node],
    tmp_path: Path,
) -> None:
    b = bridged()
    handled = Collector(make_node("consumer", seeds=[b.node.control_address]), "copies", "checker")
    wait_members(b.node, "copies", "checker", 1)

    out, ck_files, ck_mesh = tmp_path / "out", tmp_path / "ck-parquet", tmp_path / "ck-mesh"
    driver = Driver(
        tmp_path,
        {
            "endpoint": b.endpoint,
            "max_records": MAX_RECORDS,
            "queries": [
                {
                    "sink": "parquet",
                    "out": str(out),
                    "reader": "to-parquet",
                    "checkpoint": str(ck_files),
                },
                {
                    "sink": "zmesh",
                    "topic": "copies",
                    "reader": "to-mesh",
                    "checkpoint": str(ck_mesh),
                },
            ],
        },
    )
    first, second, third = CHUNKS
    total = 0  # readings published so far: [0, total)
    t0 = time.monotonic()

    def mark(what: str) -> None:  # a timeline, shown when the test fails
        print(f"{time.monotonic() - t0:7.1f}s {what}", flush=True)

    def feed(n: int) -> Feeder:
        nonlocal total
        fed = Feeder(b, total, n)
        total += n
        fed.start()
        return fed

    def top_up() -> None:
        """Before a run that follows a kill which missed: fresh readings for its batches."""
        nonlocal total
        feeder.finish()
        b.publish("readings", TOP_UP, start=total)
        total += TOP_UP

    try:
        b.publish("readings", first)
        total = first
        driver.start("continuous")
        feeder = feed(second)
        batch, kills = driver.kill_mid_batch(ck_files, lambda: parquet_files(out), top_up)
        mark(f"run {driver.runs} killed in batch {batch} ({kills} kills)")
        feeder.finish()
        driver.start("continuous")
        feeder = feed(third)
        batch, kills = driver.kill_mid_batch(
            ck_mesh, lambda: b.bridge.stats().get("published", 0), top_up
        )
        mark(f"run {driver.runs} killed in batch {batch} ({kills} kills)")
        feeder.finish()
        assert b.logged("readings") == total
        driver.run_to_end()
        mark("last run drained the log")
    finally:
        driver.close()

    rows = spark.read.parquet(str(out)).select("topic", "partition", "offset", "payload").collect()
    assert len(rows) == total
    assert len({(r.topic, r.partition, r.offset) for r in rows}) == total
    assert sorted(json.loads(r.payload)["i"] for r in rows) == list(range(total))
    assert parquet_files(out) > len(spark.read.parquet(str(out)).inputFiles()), (
        "the killed batch left files that the sink's log does not list"
    )

    wait_until(lambda: len(handled) >= total, 60, what=f"{total} copies handled")
    wait_until(lambda: b.node.status()["outbox"] == 0, 30, what="copies acked")
    assert len(handled) == total
    assert sorted(json.loads(m.payload)["i"] for m in handled.messages) == list(range(total))
    assert all(m.key == reading(json.loads(m.payload)["i"])["sensor"] for m in handled.messages)
    assert b.bridge.stats().get("publish_duplicates", 0) > 0, "a replayed batch was dropped"


def test_two_bridges_of_one_group_and_a_driver_kill(
    spark: Any,
    bridged_pair: Callable[..., Pair],
    make_node: Callable[..., zmesh.Node],
    tmp_path: Path,
) -> None:
    """The same through two bridges that share the group's partitions, read as one stream
    and written through both (each task's rows through the bridge of its partition): one
    driver kill mid-batch, then a run to the end."""
    pair = bridged_pair()
    handled = Collector(make_node("consumer", seeds=pair.controls), "copies", "checker")
    for b in (pair.first, pair.second):
        wait_members(b.node, "copies", "checker", 1)
    out, ck_files, ck_mesh = tmp_path / "out", tmp_path / "ck-parquet", tmp_path / "ck-mesh"
    driver = Driver(
        tmp_path,
        {
            "endpoint": pair.endpoints,
            "max_records": MAX_RECORDS,
            "queries": [
                {
                    "sink": "parquet",
                    "out": str(out),
                    "reader": "to-parquet",
                    "checkpoint": str(ck_files),
                },
                {
                    "sink": "zmesh",
                    "topic": "copies",
                    "reader": "to-mesh",
                    "checkpoint": str(ck_mesh),
                },
            ],
        },
    )
    first, second, _third = CHUNKS
    total = first + second

    def top_up() -> None:
        nonlocal total
        feeder.finish()
        pair.first.publish("readings", TOP_UP, start=total)
        total += TOP_UP

    try:
        pair.first.publish("readings", first)
        assert pair.first.logged() > 0 and pair.second.logged() > 0, "both took a share"
        driver.start("continuous")
        feeder = Feeder(pair.first, first, second)
        feeder.start()
        batch, kills = driver.kill_mid_batch(ck_files, lambda: parquet_files(out), top_up)
        print(f"run {driver.runs} killed in batch {batch} ({kills} kills)", flush=True)
        feeder.finish()
        assert pair.logged("readings") == total
        driver.run_to_end()
    finally:
        driver.close()

    rows = spark.read.parquet(str(out)).select("payload").collect()
    assert sorted(json.loads(r.payload)["i"] for r in rows) == list(range(total))
    wait_until(lambda: len(handled) >= total, 60, what=f"{total} copies handled")
    for b in (pair.first, pair.second):
        wait_until(lambda b=b: b.node.status()["outbox"] == 0, 30, what="copies acked")
    assert sorted(json.loads(m.payload)["i"] for m in handled.messages) == list(range(total))
