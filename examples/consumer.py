"""Consume a topic as a member of a group: print each message, then ack it.

    python examples/consumer.py --interface 127.0.0.1 --count 10

Start it before or after examples/producer.py; messages wait in the producer's outbox
until this group acks them. Run it twice with the same --group and the two copies share
the work (one key's messages always go to one of them): give each --count 0, which
prints what comes until --timeout.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading

import zmesh


class Stopped(Exception):
    """SIGINT (Ctrl-C) or SIGTERM: raised in the main thread, it unwinds main(), which
    closes the node and removes the temporary data dir."""


def stop(signum: int, _frame: object) -> None:
    raise Stopped(signum)


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
        "--count", type=int, default=10, help="stop after this many (0: at --timeout)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="give up after seconds")
    parser.add_argument("--topic", default="readings")
    parser.add_argument("--group", default="printers")
    parser.add_argument(
        "--handler", action="store_true", help="use subscribe(handler=...) instead of iterating"
    )
    args = parser.parse_args()

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
        enough = threading.Event()

        if args.handler:
            # Handlers run on worker threads: the message is acked when handle() returns
            # and nacked (redelivered later) when it raises.
            def handle(msg: zmesh.Message) -> None:
                nonlocal received
                show(msg)
                received += 1
                if received == args.count:
                    enough.set()

            node.subscribe(args.topic, group=args.group, handler=handle)
            enough.wait(args.timeout)
        else:
            sub = node.subscribe(args.topic, group=args.group)
            # Iteration ends when the subscription closes: close it after --timeout.
            timer = threading.Timer(args.timeout, sub.close)
            timer.start()
            try:
                for msg in sub:
                    show(msg)
                    msg.ack()  # or msg.nack(delay=5.0), or msg.fail("bad record")
                    received += 1
                    if received == args.count:
                        break
            finally:
                timer.cancel()
                sub.close()
    print(f"consumer done: {received} messages", flush=True)
    if received < args.count:
        # (members of one group share its messages: there, --count 0 waits for --timeout)
        raise SystemExit(f"consumer: {received} of {args.count} messages in {args.timeout:g}s")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
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
