"""A child process of the crash-recovery test: one producer or one consumer node.

    python tests/faults/crash_worker.py producer --mesh M --data-dir D --addr-dir A \
        --progress P --count N
    python tests/faults/crash_worker.py consumer --mesh M --data-dir D --addr-dir A \
        --name c1 --group g1 --log L

Every node binds 127.0.0.1 only, with mDNS off. The producer writes its control address
to ``ADDR_DIR/producer.addr`` (atomically); consumers take it as their static seed and
meet each other by gossip through the producer. The producer has no seeds: restarted on a
new port, it must find the consumers again from what its data dir remembers of its peers.

The producer publishes message indexes ``start..N-1`` to topic ``crash`` (groups g1 and g2
declared up front), one by one or ``--batch`` at a time with ``publish_many``, and
appends, fsync'd, the highest index known stored to the progress file every
``--checkpoint`` messages; a restarted producer resumes after the last recorded index. It
exits 0 once its outbox is empty (every message acked by both groups).

A consumer appends ``index seq attempt`` per message to its log, flushes and fsyncs the
batch, then acks it. SIGTERM closes the node cleanly and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import zmesh
from tests.waiting import until

TOPIC = "crash"
GROUPS = ("g1", "g2")
LOOPBACK = ["127.0.0.1"]
TIMING = {"heartbeat_interval_s": 0.2, "dead_after_s": 1.5}
ADDR_WAIT_S = 30.0
PUBLISH_ATTEMPTS = 12  # each waits up to publish_timeout_s for room in the outbox
DRAIN_TIMEOUT_S = 110.0
HOLD_TIMEOUT_S = 60.0
FETCH_MAX = 500
# Each consumer's window: what a crash can leave handled but unknown to the producer as
# acked is bounded by it (the test's bound on duplicates is made from it).
MAX_IN_FLIGHT = 1000


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_addr(path: Path, timeout_s: float) -> str:
    text = until(lambda: path.exists() and path.read_text().strip(), timeout_s)
    if not text:
        raise SystemExit(f"no address in {path} after {timeout_s:g}s")
    return text


def last_progress(path: Path) -> int:
    """The highest index recorded as stored, or -1."""
    if not path.exists():
        return -1
    lines = path.read_text().split("\n")[:-1]  # a torn last line (killed mid-write) is not one
    return max((int(line) for line in lines if line.isdigit()), default=-1)


def back_again(node: zmesh.Node, name: str, incarnation: int) -> bool:
    """Whether peer ``name`` is alive in life ``incarnation`` or a later one, a member of
    every lane it subscribes."""
    status = node.status()
    peer = next((p for p in status["peers"] if p["name"] == name), None)
    if peer is None or not peer["alive"] or peer["incarnation"] < incarnation:
        return False
    groups = {group for _topic, group, _mode in peer["subscriptions"]}
    lanes = [lane for lane in status["lanes"] if lane["group"] in groups]
    return bool(lanes) and all(peer["id"] in lane["members"] for lane in lanes)


def members_of(node: zmesh.Node) -> dict[str, int]:
    """How many members each group's lane of the topic has at this producer."""
    return {lane["group"]: len(lane["members"]) for lane in node.status()["lanes"]}


def wait_for_members(node: zmesh.Node, wanted: dict[str, int]) -> None:
    """Wait until every group has ``wanted`` members here: a stream that began before a
    member joined could be handled by the others before it is a member at all."""
    if not until(
        lambda: all(members_of(node).get(g, 0) >= n for g, n in wanted.items()),
        HOLD_TIMEOUT_S,
        0.02,
    ):
        raise SystemExit(f"members {members_of(node)} not {wanted} after {HOLD_TIMEOUT_S:g}s")


def hold(node: zmesh.Node, resume: Path, index: int) -> None:
    """Wait at ``index`` until ``resume`` names a peer and its life (``c1 2``) and that
    peer is back: a stream that goes on meanwhile could end before it is."""
    print(f"producer holds at index {index}", flush=True)
    text = until(lambda: resume.exists() and resume.read_text().strip(), HOLD_TIMEOUT_S)
    if not text:
        raise SystemExit(f"no {resume} after {HOLD_TIMEOUT_S:g}s")
    name, incarnation = text.split()
    if not until(lambda: back_again(node, name, int(incarnation)), HOLD_TIMEOUT_S, 0.02):
        raise SystemExit(f"{name} not back in life {incarnation} after {HOLD_TIMEOUT_S:g}s")
    print(f"producer resumes at index {index}: {name} is back", flush=True)


def run_producer(args: argparse.Namespace) -> int:
    own = Path(args.addr_dir) / "producer.addr"
    progress = Path(args.progress)
    start = last_progress(progress) + 1
    node = zmesh.Node(
        "producer",
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=LOOPBACK,
        mdns=False,
        max_outbox_messages=args.max_outbox,
        publish_timeout_s=10.0,
        **TIMING,
    )
    node.start()
    try:
        node.topic(TOPIC, groups=list(GROUPS))
        write_atomic(own, node.control_address)
        print(
            f"producer {node.id[:12]} at {node.control_address} resumes at index {start} "
            f"(outbox {node.status()['outbox']})",
            flush=True,
        )
        if start == 0 and args.members:  # (a first start: each member there from the first)
            wanted = dict(item.split("=") for item in args.members.split(","))
            wait_for_members(node, {g: int(n) for g, n in wanted.items()})
        with open(progress, "a") as prog:
            receipt = None
            for first in range(start, args.count, args.batch):
                indexes = range(first, min(first + args.batch, args.count))
                index = indexes[-1]
                if args.hold_at in indexes:
                    hold(node, Path(args.resume), args.hold_at)
                for attempt in range(PUBLISH_ATTEMPTS):
                    try:
                        if args.batch == 1:
                            receipt = node.publish(TOPIC, str(index).encode())
                        else:
                            receipt = node.publish_many(TOPIC, [str(i).encode() for i in indexes])
                        break
                    except zmesh.OutboxFullError:
                        print(f"outbox full at index {first} (attempt {attempt + 1})", flush=True)
                else:
                    print(f"gave up publishing index {first}", flush=True)
                    return 2
                if (
                    index + 1
                ) // args.checkpoint > first // args.checkpoint or index == args.count - 1:
                    # Receipts resolve in publish order: every index up to this one is stored.
                    receipt.wait_stored(timeout=30)
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
        print(f"producer done: {node.stats()}", flush=True)
        return 0
    finally:
        node.close()


def run_consumer(args: argparse.Namespace) -> int:
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    seed = read_addr(Path(args.addr_dir) / "producer.addr", ADDR_WAIT_S)
    node = zmesh.Node(
        args.name,
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=LOOPBACK,
        mdns=False,
        seeds=[seed],
        **TIMING,
    )
    node.start()
    try:
        sub = node.subscribe(TOPIC, group=args.group, max_in_flight=MAX_IN_FLIGHT)
        print(
            f"consumer {args.name} ({args.group}) {node.id[:12]} at "
            f"{node.control_address}, seed {seed}",
            flush=True,
        )
        with open(args.log, "a") as log:
            fd = log.fileno()
            while not stop:
                msgs = sub.fetch(FETCH_MAX, timeout=0.1)
                if not msgs:
                    continue
                log.write("".join(f"{int(m.payload)} {m.id.seq} {m.attempt}\n" for m in msgs))
                log.flush()
                os.fsync(fd)
                for m in msgs:
                    m.ack()
        print(f"consumer {args.name} stopping: {node.stats()}", flush=True)
        return 0
    finally:
        node.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="crash_worker")
    roles = parser.add_subparsers(dest="role", required=True)
    prod = roles.add_parser("producer")
    cons = roles.add_parser("consumer")
    for p in (prod, cons):
        p.add_argument("--mesh", required=True)
        p.add_argument("--data-dir", required=True)
        p.add_argument("--addr-dir", required=True)
    prod.add_argument("--progress", required=True)
    prod.add_argument("--count", type=int, required=True)
    prod.add_argument("--checkpoint", type=int, default=1000)
    prod.add_argument(
        "--batch", type=int, default=1, help="messages per publish_many (1: publish one by one)"
    )
    # A bounded outbox keeps the producer at the consumers' pace (publish blocks when it is
    # full), so the stream is still being published when the test kills the producer.
    prod.add_argument("--max-outbox", type=int, default=20_000)
    prod.add_argument(
        "--hold-at", type=int, default=-1, help="the index to wait at until --resume says so"
    )
    prod.add_argument("--resume", help="a file naming the peer to wait for and its life")
    prod.add_argument(
        "--members", default="", help="GROUP=N,...: the members to wait for before a first start"
    )
    cons.add_argument("--name", required=True)
    cons.add_argument("--group", required=True, choices=GROUPS)
    cons.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    return run_producer(args) if args.role == "producer" else run_consumer(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
