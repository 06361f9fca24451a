"""One node of a mesh-scale run (scale.py), inside a host namespace.

    ip netns exec NS python scale_worker.py member --name n7 --mesh M --data-dir D \
        --iface 10.77.0.7 --run-dir R [--seed HOST:PORT ...] [--no-mdns]
    ... consumer --topic T --group G            (a member that consumes T in group G)
    ... producer --topic T --groups G --partitions P --count N --rate R --keys K

Every node writes ``RUN_DIR/NAME.info.json`` once started (id, pid, incarnation, control
address, ``started_at`` on the wall clock), and watches its own view of the mesh every
``SAMPLE_S``: each change of a peer's state is a line ``time id state`` in
``RUN_DIR/NAME.peers`` (``alive``, ``suspect`` or ``dead``; times on the wall clock, which
all namespaces share). The view is read from the node's peer table directly (no call to
the IO thread), so watching costs the node next to nothing. Its counters go to
``RUN_DIR/NAME.stats.json`` every ``STATS_S`` and at a clean exit (SIGTERM).

A consumer appends ``time index seq attempt partition`` per message to ``RUN_DIR/NAME.log``
and flushes each fetched batch before it acks it. A producer writes its status to
``RUN_DIR/NAME.status.json`` (node_worker's ``StatusWriter``), waits for ``RUN_DIR/go``,
publishes indexes ``0..N-1`` with key ``k{index % K}`` at ``--rate`` per second, then waits
until its outbox is empty and exits 0.
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
from tests.faults.netns.node_worker import StatusWriter, add_node_args, wait_for, write_atomic
from tests.waiting import pause, until

SAMPLE_S = 0.25
STATS_S = 5.0
GO_WAIT_S = 600.0
DRAIN_TIMEOUT_S = 120.0
FETCH_MAX = 500


class Watcher:
    """Writes each change of the node's view of its peers, off the IO thread."""

    def __init__(self, node: zmesh.Node, run_dir: Path, name: str) -> None:
        self.node = node
        self.peers_path = run_dir / f"{name}.peers"
        self.stats_path = run_dir / f"{name}.stats.json"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-watcher", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def view(self) -> dict[str, str]:
        mesh = self.node._engine.mesh
        if mesh is None:
            return {}
        peers = mesh.peers.copy()  # (one C call: safe against the IO thread's changes)
        return {pid.hex(): p.state for pid, p in peers.items()}

    def write_stats(self) -> None:
        write_atomic(self.stats_path, json.dumps(self.node.stats()))

    def _run(self) -> None:
        seen: dict[str, str] = {}
        next_stats = time.monotonic() + STATS_S
        with open(self.peers_path, "a") as out:
            while not self._stop.wait(SAMPLE_S):
                now = time.time()
                view = self.view()
                lines = [
                    f"{now:.3f} {pid} {state}\n"
                    for pid, state in view.items()
                    if seen.get(pid) != state
                ]
                lines += [f"{now:.3f} {pid} gone\n" for pid in seen.keys() - view.keys()]
                if lines:
                    out.writelines(lines)
                    out.flush()
                seen = view
                if time.monotonic() >= next_stats:
                    next_stats += STATS_S
                    try:
                        self.write_stats()
                    except zmesh.ZMeshError:
                        return  # closing

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def start_node(args: argparse.Namespace) -> tuple[zmesh.Node, Watcher]:
    node = zmesh.Node(
        args.name,
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=[args.iface],
        mdns=args.mdns,
        seeds=args.seed,
        heartbeat_interval_s=args.heartbeat,
        dead_after_s=args.dead_after,
    )
    node.start()
    started_at = time.time()
    run_dir = Path(args.run_dir)
    watcher = Watcher(node, run_dir, args.name).start()
    write_atomic(
        run_dir / f"{args.name}.info.json",
        json.dumps(
            {
                "id": node.id,
                "pid": os.getpid(),
                "control": node.control_address,
                "incarnation": node.status()["node"]["incarnation"],
                "started_at": started_at,
            }
        ),
    )
    return node, watcher


def stop_flag() -> threading.Event:
    """Set by SIGTERM: the node closes cleanly."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    return stop


def run_member(args: argparse.Namespace) -> int:
    stop = stop_flag()
    node, watcher = start_node(args)
    try:
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        watcher.stop()
        watcher.write_stats()
        node.close()


def run_consumer(args: argparse.Namespace) -> int:
    stop = stop_flag()
    node, watcher = start_node(args)
    try:
        sub = node.subscribe(args.topic, group=args.group)
        with open(Path(args.run_dir) / f"{args.name}.log", "a") as log:
            while not stop.is_set():
                msgs = sub.fetch(FETCH_MAX, timeout=0.1)
                if not msgs:
                    continue
                now = time.time()
                log.write(
                    "".join(
                        f"{now:.4f} {int(m.payload)} {m.id.seq} {m.attempt} {m.partition}\n"
                        for m in msgs
                    )
                )
                log.flush()
                sub.ack_many(msgs)
        return 0
    finally:
        watcher.stop()
        watcher.write_stats()
        node.close()


def run_producer(args: argparse.Namespace) -> int:
    node, watcher = start_node(args)
    run_dir = Path(args.run_dir)
    status = None
    try:
        node.topic(args.topic, groups=args.groups.split(","), partitions=args.partitions)
        status = StatusWriter(node, run_dir / f"{args.name}.status.json").start()
        if not wait_for(run_dir / "go", GO_WAIT_S):
            return 4
        t0 = time.monotonic()
        for index in range(args.count):
            delay = t0 + index / args.rate - time.monotonic()
            if delay > 0:  # (one reading of the clock: a second could be past due)
                pause(delay)  # (the stream's pace)
            node.publish(args.topic, str(index).encode(), key=f"k{index % args.keys}")
        (run_dir / "published").write_text(f"{args.count}\n")
        if not until(lambda: node.status()["outbox"] == 0, DRAIN_TIMEOUT_S, 0.05):
            print(f"outbox still holds {node.status()['outbox']}", flush=True)
            return 3
        status.stop()
        status.write()
        return 0
    finally:
        if status is not None:
            status.stop()
        watcher.stop()
        watcher.write_stats()
        node.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scale_worker")
    roles = parser.add_subparsers(dest="role", required=True)
    member = roles.add_parser("member")
    cons = roles.add_parser("consumer")
    prod = roles.add_parser("producer")
    for p in (member, cons, prod):
        add_node_args(p)
        p.add_argument("--seed", action="append", default=[])
        p.add_argument("--no-mdns", dest="mdns", action="store_false")
        p.add_argument("--heartbeat", type=float, default=1.0)
        p.add_argument("--dead-after", type=float, default=5.0)
    for p in (cons, prod):
        p.add_argument("--topic", required=True)
    cons.add_argument("--group", required=True)
    prod.add_argument("--groups", required=True)
    prod.add_argument("--partitions", type=int, required=True)
    prod.add_argument("--count", type=int, required=True)
    prod.add_argument("--rate", type=float, required=True)
    prod.add_argument("--keys", type=int, required=True)
    args = parser.parse_args(argv)
    run = {"member": run_member, "consumer": run_consumer, "producer": run_producer}
    return run[args.role](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
