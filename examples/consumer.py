"""Consume a topic as a member of a group: print each message, then ack it.

    python examples/consumer.py --interface 127.0.0.1 --count 10

Start it before or after examples/producer.py; messages wait in the producer's outbox
until this group acks them. Run it twice with the same --group and the two copies share
the work (one key's messages always go to one of them): give each --count 0, which
prints what comes until --timeout.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import tempfile
import threading
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


def show(msg: zmesh.Message) -> None:
    # A payload is bytes: shown as text, with any byte that is not UTF-8 replaced.
    print(f"received {msg.payload.decode(errors='replace')} (key {msg.key})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="examples", help="mesh to join")
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="control address of a peer (printed by the producer)",
    )
    parser.add_argument(
        "--interface",
        action="append",
        default=[],
        metavar="IP",
        help="where to bind and speak mDNS (default: all interfaces)",
    )
    parser.add_argument("--no-mdns", action="store_true", help="use --seed only")
    parser.add_argument(
        "--count", type=count, default=10, help="stop after this many (0: at --timeout)"
    )
    parser.add_argument("--timeout", type=seconds, default=60.0, help="give up after seconds")
    parser.add_argument("--topic", default="readings")
    parser.add_argument("--group", default="printers")
    parser.add_argument(
        "--handler", action="store_true", help="use subscribe(handler=...) instead of iterating"
    )
    args = parser.parse_args()
    stopped: list[int] = []  # the signal that stopped it
    done = threading.Event()  # --count messages came, --timeout passed, or a signal
    on_stop_signal(lambda signum: (stopped.append(signum), done.set()))

    # The data dir holds the node's id and its dedupe window; a real consumer keeps it.
    with (
        tempfile.TemporaryDirectory(prefix="zmesh-consumer-") as data_dir,
        zmesh.Node(
            "consumer",
            mesh=args.mesh,
            data_dir=data_dir,
            interfaces=args.interface,
            mdns=not args.no_mdns,
            seeds=args.seed,
        ) as node,
    ):
        print(f"consumer up: control {node.control_address}", flush=True)
        received = 0
        wait_s = min(args.timeout, threading.TIMEOUT_MAX)  # (a longer wait is an OverflowError)

        if args.handler:
            # Handlers run on worker threads: the message is acked when handle() returns
            # and nacked (redelivered later) when it raises.
            def handle(msg: zmesh.Message) -> None:
                nonlocal received
                show(msg)
                received += 1
                if received == args.count:
                    done.set()

            node.subscribe(args.topic, group=args.group, handler=handle)
            done.wait(wait_s)
        else:
            sub = node.subscribe(args.topic, group=args.group)
            # Iteration ends when the subscription closes: at --timeout, or at a signal.
            closer = threading.Thread(target=lambda: (done.wait(wait_s), sub.close()))
            closer.start()
            try:
                for msg in sub:
                    show(msg)
                    msg.ack()  # or msg.nack(delay=5.0), or msg.fail("bad record")
                    received += 1
                    if received == args.count:
                        break
            finally:
                done.set()
                closer.join()
    if stopped:
        raise Stopped(stopped[0])
    print(f"consumer done: {received} messages", flush=True)
    if received < args.count:
        # (members of one group share its messages: there, --count 0 waits for --timeout)
        raise SystemExit(f"consumer: {received} of {args.count} messages in {args.timeout:g}s")


if __name__ == "__main__":
    try:
        main()
    except Stopped as exc:
        signum = exc.args[0]
        print(f"consumer: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    except (zmesh.ConfigError, zmesh.ArgumentError) as exc:  # a bad option
        print(f"consumer: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except zmesh.ZMeshError as exc:
        raise SystemExit(f"consumer: {exc}") from None
