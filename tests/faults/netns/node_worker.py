"""One zmesh node of the netns fault tests, run inside a host namespace.

    ip netns exec NS python node_worker.py producer --name p --mesh M --data-dir D \
        --iface 10.77.0.1 --run-dir R --count N --rate R --groups g1,g2 [--hold-last K]
    ip netns exec NS python node_worker.py consumer --name c1 --mesh M --data-dir D \
        --iface 10.77.0.2 --run-dir R --group g1
    ip netns exec NS python node_worker.py replica --name r1 --mesh M --data-dir D \
        --iface 10.77.0.5 --run-dir R

Every node binds its host's ``eth0`` address only and finds the others over mDNS on it (no
seeds), with short heartbeats. It writes ``RUN_DIR/NAME.info.json`` (id, control address,
incarnation, pid) once started, and ``RUN_DIR/NAME.status.json`` (its ``node.status()``)
every ``STATUS_INTERVAL_S``; both atomically.

The producer waits for ``RUN_DIR/go``, then publishes message indexes ``start..N-1`` to
topic ``stream`` at ``--rate`` per second (the groups declared up front, so nothing depends
on who is discovered first), and appends, fsync'd, the highest index known stored to
``RUN_DIR/progress`` every ``CHECKPOINT`` messages. A restarted producer resumes after the
last recorded index. It exits 0 once its outbox is empty (every group acked everything).
With ``--hold-last K`` it waits again before its last K messages, until
``RUN_DIR/release`` exists (at most ``RELEASE_WAIT_S``; exit 5 without it), then goes on at
its rate: the stream cannot end before the test has done what it needs the stream for.

A consumer appends ``index seq attempt partition incarnation`` per message to
``RUN_DIR/NAME.log``, flushes and fsyncs the batch, then acks it. SIGTERM closes it
cleanly (exit 0).

Replicas (``--replicas K``: the producer's topic has K replicas): a ``replica`` node only
hosts copies (and takes over the lanes of a producer gone for ``--takeover-after`` s);
``--no-replica-host`` keeps a node from hosting any. The producer then waits up to
``STORED_WAIT_S`` for a checkpoint's receipt to be stored (its replicas may be away).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import zmesh
from tests.waiting import pause, until

TOPIC = "stream"
PARTITIONS = 8
TIMING = {"heartbeat_interval_s": 0.2, "dead_after_s": 1.5}
STATUS_INTERVAL_S = 0.1
CHECKPOINT = 200
PACE_CHUNK = 20
GO_WAIT_S = 60.0
RELEASE_WAIT_S = 300.0  # the tests' own timeout: a test that never releases has failed
PUBLISH_ATTEMPTS = 6  # each waits up to publish_timeout_s for room in the outbox
DRAIN_TIMEOUT_S = 120.0
FETCH_MAX = 500
STORED_WAIT_S = 240.0  # a checkpoint's receipt stored (replicas away: until they are back)


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """The arguments every worker role takes: who the node is and where it runs."""
    for arg in ("--name", "--mesh", "--data-dir", "--iface", "--run-dir"):
        parser.add_argument(arg, required=True)


def node_args(name: str, mesh: str, root: Path, iface: str, run_dir: Path) -> list[str]:
    """Those arguments for node ``name`` of ``mesh`` on ``iface`` (its data dir:
    ``root/data-NAME``)."""
    return [
        "--name",
        name,
        "--mesh",
        mesh,
        "--data-dir",
        str(root / f"data-{name}"),
        "--iface",
        iface,
        "--run-dir",
        str(run_dir),
    ]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def wait_for(path: Path, timeout_s: float) -> bool:
    """Wait until the test creates ``path``; False (said on stdout) after ``timeout_s``."""
    if not until(path.exists, timeout_s):
        print(f"no {path} after {timeout_s:g}s", flush=True)
        return False
    return True


def last_progress(path: Path) -> int:
    """The highest index recorded as stored, or -1."""
    if not path.exists():
        return -1
    lines = path.read_text().split("\n")[:-1]  # a torn last line (killed mid-write) is not one
    return max((int(line) for line in lines if line.isdigit()), default=-1)


class StatusWriter:
    """Writes the node's status to a file every STATUS_INTERVAL_S, off the main thread."""

    def __init__(self, node: zmesh.Node, path: Path) -> None:
        self.node = node
        self.path = path
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the main thread writes a last status too
        self._thread = threading.Thread(target=self._run, name="status-writer", daemon=True)

    def start(self) -> StatusWriter:
        self.write()
        self._thread.start()
        return self

    def write(self) -> None:
        with self._lock:
            status = self.node.status()
            status["written_at"] = time.time()
            write_atomic(self.path, json.dumps(status, default=str))

    def _run(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL_S):
            try:
                self.write()
            except zmesh.ZMeshError:
                return  # the node is closing

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def make_node(args: argparse.Namespace, **options: object) -> zmesh.Node:
    node = zmesh.Node(
        args.name,
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=[args.iface],
        mdns=True,
        replica_host=args.replica_host,
        takeover_after_s=args.takeover_after,
        **TIMING,
        **options,
    )
    node.start()
    run_dir = Path(args.run_dir)
    write_atomic(
        run_dir / f"{args.name}.info.json",
        json.dumps(
            {
                "id": node.id,
                "control": node.control_address,
                "pid": os.getpid(),
                "incarnation": node.status()["node"]["incarnation"],
            }
        ),
    )
    return node


def run_producer(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    progress = run_dir / "progress"
    start = last_progress(progress) + 1
    node = make_node(args, max_outbox_messages=args.max_outbox, publish_timeout_s=10.0)
    status = None
    try:
        node.topic(
            TOPIC, groups=args.groups.split(","), partitions=PARTITIONS, replicas=args.replicas
        )
        status = StatusWriter(node, run_dir / f"{args.name}.status.json").start()
        print(
            f"producer {node.id[:12]} at {node.control_address} resumes at index {start} "
            f"(outbox {node.status()['outbox']})",
            flush=True,
        )
        if not wait_for(run_dir / "go", GO_WAIT_S):
            return 4
        t0 = time.monotonic()
        held_at = args.count - args.hold_last if args.hold_last > 0 else None
        with open(progress, "a") as prog:
            receipt = None
            for index in range(start, args.count):
                if index == held_at:
                    print(f"holding before index {index} until released", flush=True)
                    if not wait_for(run_dir / "release", RELEASE_WAIT_S):
                        return 5
                    print("released", flush=True)
                    t0 = time.monotonic() - (index - start) / args.rate  # the rate, not a burst
                if (index - start) % PACE_CHUNK == 0:
                    due = t0 + (index - start) / args.rate
                    delay = due - time.monotonic()
                    if delay > 0:
                        pause(delay)  # (the stream's pace)
                for attempt in range(PUBLISH_ATTEMPTS):
                    try:
                        receipt = node.publish(TOPIC, str(index).encode())
                        break
                    except zmesh.OutboxFullError:
                        print(f"outbox full at index {index} (attempt {attempt + 1})", flush=True)
                else:
                    print(f"gave up publishing index {index}", flush=True)
                    return 2
                if (index + 1) % CHECKPOINT == 0 or index == args.count - 1:
                    # Receipts resolve in publish order: every index up to this one is stored.
                    try:
                        receipt.wait_stored(timeout=STORED_WAIT_S)
                    except zmesh.TimeoutError:
                        print(f"index {index} not stored after {STORED_WAIT_S:g}s", flush=True)
                        return 6
                    prog.write(f"{index}\n")
                    prog.flush()
                    os.fsync(prog.fileno())
        print(f"producer published up to {args.count - 1}; draining", flush=True)
        if not until(lambda: node.status()["outbox"] == 0, DRAIN_TIMEOUT_S, 0.05):
            print(
                f"outbox still holds {node.status()['outbox']} after {DRAIN_TIMEOUT_S:g}s: "
                f"{node.status()['lanes']}",
                flush=True,
            )
            return 3
        status.write()
        print(f"producer done: {node.stats()}", flush=True)
        return 0
    finally:
        if status is not None:
            status.stop()
        node.close()


def run_consumer(args: argparse.Namespace) -> int:
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    run_dir = Path(args.run_dir)
    node = make_node(args)
    status = None
    try:
        incarnation = node.status()["node"]["incarnation"]
        sub = node.subscribe(TOPIC, group=args.group)
        status = StatusWriter(node, run_dir / f"{args.name}.status.json").start()
        print(
            f"consumer {args.name} ({args.group}) {node.id[:12]} at {node.control_address}",
            flush=True,
        )
        with open(run_dir / f"{args.name}.log", "a") as log:
            fd = log.fileno()
            while not stop:
                msgs = sub.fetch(FETCH_MAX, timeout=0.1)
                if not msgs:
                    continue
                log.write(
                    "".join(
                        f"{int(m.payload)} {m.id.seq} {m.attempt} {m.partition} {incarnation}\n"
                        for m in msgs
                    )
                )
                log.flush()
                os.fsync(fd)
                for m in msgs:
                    m.ack()
        print(f"consumer {args.name} stopping: {node.stats()}", flush=True)
        return 0
    finally:
        if status is not None:
            status.stop()
        node.close()


def run_replica(args: argparse.Namespace) -> int:
    """Host copies of the producer's outbox until SIGTERM (and serve its lanes if it is
    gone for good)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    node = make_node(args)
    status = StatusWriter(node, Path(args.run_dir) / f"{args.name}.status.json").start()
    try:
        print(f"replica {args.name} {node.id[:12]} at {node.control_address}", flush=True)
        stop.wait()
        print(f"replica {args.name} stopping: {node.stats()}", flush=True)
        return 0
    finally:
        status.stop()
        node.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="node_worker")
    roles = parser.add_subparsers(dest="role", required=True)
    prod = roles.add_parser("producer")
    cons = roles.add_parser("consumer")
    repl = roles.add_parser("replica")
    for p in (prod, cons, repl):
        add_node_args(p)
        p.add_argument("--no-replica-host", dest="replica_host", action="store_false")
        p.add_argument("--takeover-after", type=float, default=None)
    prod.add_argument("--count", type=int, required=True)
    prod.add_argument("--rate", type=float, required=True)
    prod.add_argument("--groups", required=True)
    prod.add_argument("--max-outbox", type=int, default=20_000)
    prod.add_argument("--replicas", type=int, default=1)
    prod.add_argument(
        "--hold-last",
        type=int,
        default=0,
        help="wait for RUN_DIR/release before the last K messages (0: never)",
    )
    cons.add_argument("--group", required=True)
    args = parser.parse_args(argv)
    run = {"producer": run_producer, "consumer": run_consumer, "replica": run_replica}
    return run[args.role](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
