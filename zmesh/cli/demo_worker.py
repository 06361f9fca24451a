"""One node process of ``zmesh demo``: ``python -m zmesh.cli.demo_worker ROLE ...``.

Each worker talks to the demo as JSON lines on stdout (``{"event": ...}``); its logs go to
stderr. A worker stops on SIGTERM, on a ``stop`` line, or when its stdin closes (the demo
went away), so it never outlives the demo for long.

- ``producer`` declares the demo topic with both groups, waits until every consumer joined,
  publishes N messages (payload: index and send time), and waits until all are acked. With
  ``--pause-at K`` it stops publishing after K messages until the demo sends ``go`` (after
  the crash), so the crash always happens mid-run.
- ``consumer`` joins a group and, per fetched batch, appends one record per message to its
  records file *before* acking: ``index attempt sent_at received_at``. With
  ``--crash-after K`` it stops after recording a batch past K messages, without acking it,
  and reports ``crash-point`` so the demo can kill it there: the window where work is done
  but the ack is not, which at-least-once delivery has to cover. If its share of the
  messages runs out before K (the producer is paused), it reports ``crash-point`` idle.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from .._receipt import Receipt
from ..node import Node
from ..subscription import Message
from .stopflag import StopFlag

TOPIC = "demo.readings"
LOOPBACK = ["127.0.0.1"]
HEARTBEAT_S = 0.5
DEAD_AFTER_S = 3.0
ACK_TIMEOUT_S = 10.0
PROGRESS_EVERY_S = 0.1
FETCH_MAX = 500
IDLE_CRASH_S = 1.0

_emit_lock = threading.Lock()
log = logging.getLogger(__name__)


def emit(event: str, **fields: Any) -> None:
    """One JSON line to the demo."""
    line = json.dumps({"event": event, **fields})
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Commands:
    """What the demo tells a worker on stdin: ``go`` (producer) and ``stop`` (all).

    SIGTERM and SIGINT also stop; so does the end of stdin (the demo is gone).
    """

    def __init__(self) -> None:
        self.stop = StopFlag()  # (set by signal handlers: stopflag.py)
        self.go = threading.Event()
        threading.Thread(target=self._read, daemon=True, name="demo-stdin").start()
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                self.go.set()
            elif line.strip() == "stop":
                break
        self.stop.set()


def _node(args: argparse.Namespace, name: str, seeds: list[str]) -> Node:
    # mDNS speaks on loopback only; the seed makes discovery independent of it.
    return Node(
        name,
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=LOOPBACK,
        mdns=True,
        seeds=seeds,
        heartbeat_interval_s=HEARTBEAT_S,
        dead_after_s=DEAD_AFTER_S,
    )


def _groups(spec: str) -> dict[str, int]:
    return {g: int(n) for g, n in (part.split(":") for part in spec.split(","))}


def run_producer(args: argparse.Namespace, cmds: Commands) -> int:
    groups = _groups(args.groups)
    with _node(args, "producer", []) as node:
        node.topic(TOPIC, groups=sorted(groups), ack_timeout_s=ACK_TIMEOUT_S)
        emit("up", control=node.control_address, id=node.id)
        deadline = time.monotonic() + args.join_timeout
        while True:
            members = {g: 0 for g in groups}
            for lane in node.status()["lanes"]:
                if lane["topic"] == TOPIC and lane["group"] in members:
                    members[lane["group"]] = len(lane["members"])
            emit("joining", members=members)
            if all(members[g] >= n for g, n in groups.items()):
                break
            if time.monotonic() >= deadline:
                emit(
                    "error",
                    message=f"consumers did not join within {args.join_timeout:g}s "
                    f"(members per group: {members})",
                )
                return 1
            if cmds.stop.wait(0.1):
                return 1
        emit("ready")
        receipts: list[Receipt] = []
        started = time.time()
        next_report = time.monotonic() + PROGRESS_EVERY_S
        for i in range(args.messages):
            if i == args.pause_at and i:
                emit("paused", published=i)
                deadline = time.monotonic() + args.join_timeout
                while not cmds.go.wait(PROGRESS_EVERY_S):
                    emit("progress", published=i, acked=sum(r.acked for r in receipts))
                    if cmds.stop.is_set() or time.monotonic() >= deadline:
                        emit("error", message=f"no 'go' within {args.join_timeout:g}s")
                        return 1
            payload = f"{i} {time.time():.6f}"
            receipts.append(node.publish(TOPIC, payload, key=f"sensor-{i % 64}"))
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + PROGRESS_EVERY_S
                emit("progress", published=i + 1, acked=sum(r.acked for r in receipts))
            if cmds.stop.is_set():
                return 1
        deadline = time.monotonic() + args.timeout
        while True:
            acked = sum(r.acked for r in receipts)
            emit("progress", published=len(receipts), acked=acked)
            if acked == len(receipts):
                break
            if time.monotonic() >= deadline:
                log.warning(
                    "only %d of %d messages acked in time; status %s",
                    acked,
                    len(receipts),
                    node.status(),
                )
                emit(
                    "timeout",
                    published=len(receipts),
                    acked=acked,
                    started=started,
                    finished=time.time(),
                    counters=node.stats(),
                )
                return 1
            if cmds.stop.wait(PROGRESS_EVERY_S):
                return 1
        finished = time.time()
        log.info("all %d messages acked; counters %s", len(receipts), node.stats())
        emit(
            "done",
            published=len(receipts),
            acked=len(receipts),
            started=started,
            finished=finished,
            counters=node.stats(),
        )
    return 0


def _record(fd: int, msgs: list[Message], received: float) -> None:
    lines = []
    for msg in msgs:
        index, sent = msg.payload.split(b" ", 1)
        lines.append(f"{int(index)} {msg.attempt} {float(sent):.6f} {received:.6f}\n")
    data = "".join(lines).encode()
    while data:
        data = data[os.write(fd, data) :]


def _crash_point(cmds: Commands, args: argparse.Namespace, handled: int, unacked: int) -> None:
    emit("crash-point", handled=handled, unacked=unacked)
    # The demo SIGKILLs us here; carry on if it does not within the wait.
    cmds.stop.wait(args.hang_s)


def run_consumer(args: argparse.Namespace, cmds: Commands) -> int:
    fd = os.open(args.records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    handled = 0
    crash_after = args.crash_after
    try:
        with _node(args, args.name, [args.seed]) as node:
            sub = node.subscribe(TOPIC, group=args.group, max_in_flight=2000, batch_size=200)
            emit("up", name=args.name, control=node.control_address, id=node.id)
            next_report = 0.0
            last_batch = time.monotonic()
            give_up = time.monotonic() + args.max_seconds  # never outlive a lost demo
            while not cmds.stop.is_set() and time.monotonic() < give_up:
                batch = sub.fetch(FETCH_MAX, timeout=PROGRESS_EVERY_S)
                now = time.monotonic()
                if batch:
                    last_batch = now
                    _record(fd, batch, time.time())
                    handled += len(batch)
                    if crash_after and handled >= crash_after:
                        crash_after = 0
                        _crash_point(cmds, args, handled, len(batch))
                    for msg in batch:
                        msg.ack()
                elif crash_after and handled and now - last_batch >= IDLE_CRASH_S:
                    crash_after = 0  # our share ran out first: crash between batches
                    _crash_point(cmds, args, handled, 0)
                if now >= next_report:
                    next_report = now + PROGRESS_EVERY_S
                    emit("progress", handled=handled)
            sub.close()
            log.info("stopping after %d messages; counters %s", handled, node.stats())
    finally:
        os.close(fd)
    emit("bye", handled=handled)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zmesh.cli.demo_worker")
    parser.add_argument("role", choices=["producer", "consumer"])
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--groups", default="workers:2,audit:1", help="producer: GROUP:N,...")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--pause-at", type=int, default=0)
    parser.add_argument("--join-timeout", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--name")
    parser.add_argument("--group")
    parser.add_argument("--seed")
    parser.add_argument("--records")
    parser.add_argument("--crash-after", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=30.0)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    cmds = Commands()
    try:
        if args.role == "producer":
            return run_producer(args, cmds)
        return run_consumer(args, cmds)
    except Exception as exc:
        log.exception("demo %s failed", args.role)
        emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
