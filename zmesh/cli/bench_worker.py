"""One node process of ``zmesh bench``: ``python -m zmesh.cli.bench_worker ROLE ...``.

Workers talk to ``zmesh bench`` in JSON lines on stdout; logs go to stderr. A worker stops
on SIGTERM, on a ``stop`` line, when its stdin closes, or after --max-seconds.

Payloads are ``--size`` bytes: the wall-clock send time (8 bytes), a phase byte (0 warm-up,
1 throughput, 2 latency), then padding. The consumer acks every message on its own and
measures latency as its receive time minus the send time (one host, one clock).

- ``producer`` publishes the warm-up and waits for its acks, then N messages as fast as it
  can, one ``publish()`` each, and reports the time until every one was acked; then L
  messages paced at --rate for the latency figures.
- ``consumer`` reports latency percentiles once it has every latency message.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import struct
import sys
import threading
import time
from typing import Any

from .._receipt import Receipt
from ..node import Node
from .stopflag import StopFlag

TOPIC = "bench"
GROUP = "bench"
LOOPBACK = ["127.0.0.1"]
HEADER = struct.Struct("<dB")
PROGRESS_EVERY_S = 0.1

log = logging.getLogger(__name__)
_emit_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _emit_lock:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def _watch_stop() -> StopFlag:
    stop = StopFlag()  # (set by signal handlers: stopflag.py)

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read, daemon=True, name="bench-stdin").start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def _node(args: argparse.Namespace, name: str, seeds: list[str]) -> Node:
    return Node(
        name,
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=LOOPBACK,
        mdns=False,
        seeds=seeds,
        heartbeat_interval_s=0.5,
        dead_after_s=5.0,
    )


def _payload(phase: int, size: int) -> bytes:
    return HEADER.pack(time.time(), phase) + b"x" * max(0, size - HEADER.size)


def _wait_acked(receipts: list[Receipt], deadline: float, stop: StopFlag, phase: str) -> bool:
    next_report = 0.0
    for n, receipt in enumerate(receipts):
        while not receipt.acked:
            now = time.monotonic()
            if now >= deadline or stop.is_set():
                return False
            if now >= next_report:
                next_report = now + PROGRESS_EVERY_S
                emit("progress", phase=phase, acked=n, total=len(receipts))
            with contextlib.suppress(TimeoutError):
                receipt.wait_acked(min(PROGRESS_EVERY_S, deadline - now))
    emit("progress", phase=phase, acked=len(receipts), total=len(receipts))
    return True


def run_producer(args: argparse.Namespace, stop: StopFlag) -> int:
    deadline = time.monotonic() + args.max_seconds
    with _node(args, "bench-producer", [args.seed]) as node:
        node.topic(TOPIC, groups=[GROUP], durability=args.durability, ack_timeout_s=30.0)
        while not any(
            ln["topic"] == TOPIC and ln["lane"] == GROUP and ln["members"]
            for ln in node.status()["lanes"]
        ):
            if stop.wait(0.05) or time.monotonic() >= deadline:
                emit("error", message="the consumer did not join")
                return 1
        emit("ready", control=node.control_address)
        warm = [node.publish(TOPIC, _payload(0, args.size)) for _ in range(args.warmup)]
        if not _wait_acked(warm, deadline, stop, "warm-up"):
            emit("error", message="warm-up messages were not acked in time")
            return 1
        t0 = time.perf_counter()
        receipts = []
        next_report = time.monotonic() + PROGRESS_EVERY_S
        for _ in range(args.messages):
            receipts.append(node.publish(TOPIC, _payload(1, args.size)))
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + PROGRESS_EVERY_S
                emit("progress", phase="throughput", published=len(receipts), total=args.messages)
        if not _wait_acked(receipts, deadline, stop, "throughput"):
            emit(
                "error",
                message=f"only {sum(r.acked for r in receipts)} of "
                f"{len(receipts)} messages acked in time",
            )
            return 1
        emit("throughput", messages=args.messages, seconds=time.perf_counter() - t0)
        start = time.monotonic()
        paced = []
        for i in range(args.latency_messages):
            wait = start + i / args.rate - time.monotonic()
            if wait > 0 and stop.wait(wait):  # pacing the latency run at --rate
                return 1
            paced.append(node.publish(TOPIC, _payload(2, args.size)))
        if not _wait_acked(paced, deadline, stop, "latency"):
            emit("error", message="latency messages were not acked in time")
            return 1
        emit("done", stats=node.stats())
    return 0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_consumer(args: argparse.Namespace, stop: StopFlag) -> int:
    deadline = time.monotonic() + args.max_seconds
    seen: set[int] = set()
    counts = [0, 0, 0]
    latencies: list[float] = []
    duplicates = 0
    reported = False
    with _node(args, "bench-consumer", []) as node:
        sub = node.subscribe(TOPIC, group=GROUP)
        emit("up", control=node.control_address)
        while not stop.is_set() and time.monotonic() < deadline:
            batch = sub.fetch(500, timeout=PROGRESS_EVERY_S)
            received = time.time()
            for msg in batch:
                sent, phase = HEADER.unpack_from(msg.payload)
                if msg.id.seq in seen:
                    duplicates += 1
                else:
                    seen.add(msg.id.seq)
                    counts[phase] += 1
                    if phase == 2:
                        latencies.append(received - sent)
                msg.ack()
            if not reported and counts[1] >= args.messages and counts[2] >= args.latency_messages:
                reported = True
                emit(
                    "result",
                    received=counts,
                    duplicates=duplicates,
                    samples=len(latencies),
                    p50_ms=_percentile(latencies, 0.50) * 1e3,
                    p99_ms=_percentile(latencies, 0.99) * 1e3,
                    max_ms=max(latencies, default=0.0) * 1e3,
                )
        sub.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zmesh.cli.bench_worker")
    parser.add_argument("role", choices=["producer", "consumer"])
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--latency-messages", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--durability", default="process")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    stop = _watch_stop()
    try:
        if args.role == "producer":
            return run_producer(args, stop)
        return run_consumer(args, stop)
    except Exception as exc:
        log.exception("bench %s failed", args.role)
        emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
