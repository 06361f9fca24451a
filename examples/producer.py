"""Publish a few readings and wait until every consumer group acked them.

    python examples/producer.py --interface 127.0.0.1 --count 10

Each message is stored in this node's outbox before it is sent, and stays there until
every group of the topic acked it: start examples/consumer.py before or after this.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import zmesh


class Stopped(Exception):
    """SIGINT (Ctrl-C) or SIGTERM came: main() closed the node and removed the temporary
    data dir."""


def count(text: str) -> int:
    """--count: an int >= 0 (argparse says why not)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def seconds(text: str) -> float:
    """--timeout: a finite number of seconds > 0 (argparse says why not)."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def on_stop_signal(then: Callable[[int], None]) -> None:
    """Call ``then(signum)`` on a thread of its own when SIGINT or SIGTERM comes. The
    signals are blocked in every thread (zmesh's too, started after this) and waited for
    there: no call is interrupted halfway, as an exception raised by a handler would."""
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    threading.Thread(target=lambda: then(signal.sigwait(signals)), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="examples", help="mesh to join")
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="control address of a peer (printed by the consumer)",
    )
    parser.add_argument(
        "--interface",
        action="append",
        default=[],
        metavar="IP",
        help="where to bind and speak mDNS (default: all interfaces)",
    )
    parser.add_argument("--no-mdns", action="store_true", help="use --seed only")
    parser.add_argument("--count", type=count, default=10, help="messages to publish")
    parser.add_argument("--timeout", type=seconds, default=60.0, help="seconds to wait for acks")
    parser.add_argument("--topic", default="readings")
    parser.add_argument(
        "--group",
        action="append",
        help="a group that gets every message, even if it starts later; repeat for more "
        "(default: printers)",
    )
    args = parser.parse_args()
    stopped: list[int] = []  # the signal that stopped it
    done = threading.Event()  # every message acked (or the wait failed), or a signal
    on_stop_signal(lambda signum: (stopped.append(signum), done.set()))
    failed: list[Exception] = []  # what publishing or waiting raised, for main() to raise

    # The outbox lives in the data dir: keep it (not a temp dir) to survive restarts.
    with (
        tempfile.TemporaryDirectory(prefix="zmesh-producer-") as data_dir,
        zmesh.Node(
            "producer",
            mesh=args.mesh,
            data_dir=data_dir,
            interfaces=args.interface,
            mdns=not args.no_mdns,
            seeds=args.seed,
        ) as node,
    ):
        print(f"producer up: control {node.control_address}", flush=True)
        # A message is owed to the groups this node knows when it stores it: the declared
        # ones from the start, a group it learns of from a consumer only from then on.
        node.topic(args.topic, groups=args.group or ["printers"])

        # On a thread of its own: at a signal, main() leaves the `with` without waiting for
        # it, and the node's close wakes its waits (a publish() waiting for room,
        # wait_acked) with NodeClosedError.
        def publish() -> None:
            try:
                receipts = [
                    node.publish(
                        args.topic, f"reading {i}", key=f"sensor-{i % 4}", headers={"unit": "C"}
                    )
                    for i in range(args.count)
                ]
                deadline = time.monotonic() + args.timeout
                for receipt in receipts:
                    receipt.wait_acked(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                failed.append(exc)
            finally:
                done.set()

        publisher = threading.Thread(target=publish)
        publisher.start()
        done.wait()
    publisher.join()
    if stopped:
        raise Stopped(stopped[0])
    if failed:
        raise failed[0]
    print(f"producer done: {args.count} messages acknowledged", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Stopped as exc:
        signum = exc.args[0]
        print(f"producer: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    except (zmesh.ConfigError, zmesh.ArgumentError) as exc:  # a bad option
        print(f"producer: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except zmesh.ZMeshError as exc:
        raise SystemExit(f"producer: {exc}") from None
