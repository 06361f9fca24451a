"""A child process of the full-disk test: a producer whose data dir is on a small disk.

    python tests/faults/disk_worker.py fill --mesh M --data-dir D --payload-bytes N [--alone]
    python tests/faults/disk_worker.py drain --mesh M --data-dir D --first I --more K

``fill`` publishes message indexes 0, 1, ... to topic ``t`` (group ``g`` declared, no
consumer) until ``publish()`` gives up with StoreFullError (plain publishes, stored as
runs; ``--alone``: with a priority, each stored alone, so that acking them changes many
pages), and prints one JSON line:
the error, how many publishes returned, how many of them are stored (receipts resolve in
publish order: a prefix) and the node's status. Then, at each line on stdin, it prints
its status again as a JSON line; the test kills it with SIGKILL.

``drain`` reopens the data dir (the disk still full), prints a JSON line with its control
address and status, publishes indexes ``I..I+K-1`` (they wait for room: the consumer's
acks make it) and prints ``stored`` once they are, then ``drained`` once the outbox is
empty, with its store's status in a JSON line, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys

import zmesh
from tests.waiting import until

TOPIC = "t"
LOOPBACK = ["127.0.0.1"]
TIMING = {"heartbeat_interval_s": 0.2, "dead_after_s": 1.5}
DRAIN_TIMEOUT_S = 90.0


def _node(args: argparse.Namespace, timeout_s: float) -> zmesh.Node:
    return zmesh.Node(
        "producer",
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=LOOPBACK,
        mdns=False,
        publish_timeout_s=timeout_s,
        topics={TOPIC: zmesh.TopicConfig(groups=("g",))},
        **TIMING,
    )


def payload(index: int, size: int) -> bytes:
    return str(index).encode().ljust(size, b".")


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def fill(args: argparse.Namespace) -> int:
    node = _node(args, 1.0).start()
    receipts = []
    priority = 1 if args.alone else 0
    try:
        while True:
            receipts.append(
                node.publish(TOPIC, payload(len(receipts), args.payload_bytes), priority=priority)
            )
    except zmesh.StoreFullError as exc:
        error = exc
    stored = next((i for i, r in enumerate(receipts) if not r.stored), len(receipts))
    say(
        error=str(error),
        disk=error.disk,
        free_bytes=error.free_bytes,
        published=len(receipts),
        stored=stored,
        status=node.status()["store"],
    )
    for _line in sys.stdin:
        say(status=node.status()["store"])
    return 0


def drain(args: argparse.Namespace) -> int:
    with _node(args, 60.0) as node:
        say(
            address=node.control_address,
            status=node.status()["store"],
            outbox=node.status()["outbox"],
        )
        receipts = [
            node.publish(TOPIC, payload(i, 100)) for i in range(args.first, args.first + args.more)
        ]
        for r in receipts:
            r.wait_stored(60)
        print("stored", flush=True)
        if not until(lambda: node.status()["outbox"] == 0, DRAIN_TIMEOUT_S, 0.05):
            say(stuck=node.status())
            return 3
        print("drained", flush=True)
        say(status=node.status()["store"], counters=node.stats())
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="disk_worker")
    roles = parser.add_subparsers(dest="role", required=True)
    fill_p = roles.add_parser("fill")
    drain_p = roles.add_parser("drain")
    for p in (fill_p, drain_p):
        p.add_argument("--mesh", required=True)
        p.add_argument("--data-dir", required=True)
    fill_p.add_argument("--payload-bytes", type=int, default=1000)
    fill_p.add_argument("--alone", action="store_true")
    drain_p.add_argument("--first", type=int, required=True)
    drain_p.add_argument("--more", type=int, default=100)
    args = parser.parse_args(argv)
    return fill(args) if args.role == "fill" else drain(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
