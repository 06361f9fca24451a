"""The pager: a consumer group member that prints every alert the Spark job publishes.

    python alerts_consumer.py --mesh plant --seed 127.0.0.1:41235

Runs until SIGTERM or Ctrl-C; each alert is printed once and acked.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable

import zmesh


class Stopped(Exception):
    """SIGINT (Ctrl-C) or SIGTERM came: main() closed the node."""


def on_stop_signal(then: Callable[[int], None]) -> None:
    """Call ``then(signum)`` on a thread of its own when SIGINT or SIGTERM comes. The
    signals are blocked in every thread (zmesh's too, started after this) and waited for
    there: no call is interrupted halfway, as an exception raised by a handler would."""
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    threading.Thread(target=lambda: then(signal.sigwait(signals)), daemon=True).start()


def show(msg: zmesh.Message) -> None:
    a = json.loads(msg.payload)
    print(
        f"ALERT {a['sensor']} window {a['window_start']} avg={a['avg_value']:.1f} "
        f"max={a['max_value']:.1f} over {a['readings']} readings",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="plant")
    parser.add_argument("--seed", action="append", default=[], metavar="HOST:PORT")
    parser.add_argument("--interface", action="append", default=[], metavar="IP")
    parser.add_argument("--no-mdns", action="store_true")
    parser.add_argument("--data-dir", default="var/pager")
    args = parser.parse_args()
    stopped: list[int] = []  # the signal that stopped it
    done = threading.Event()
    on_stop_signal(lambda signum: (stopped.append(signum), done.set()))
    with zmesh.Node(
        "pager",
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=args.interface,
        mdns=not args.no_mdns,
        seeds=args.seed,
    ) as node:
        node.subscribe("alerts", group="pager", handler=show)
        print(f"pager up: control {node.control_address}", flush=True)
        done.wait()  # until SIGTERM or Ctrl-C
    raise Stopped(stopped[0])


if __name__ == "__main__":
    try:
        main()
    except Stopped as exc:
        signum = exc.args[0]
        print(f"alerts_consumer: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    except (zmesh.ConfigError, zmesh.ArgumentError) as exc:  # a bad option
        print(f"alerts_consumer: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except zmesh.ZMeshError as exc:  # e.g. its data dir in use by another pager
        raise SystemExit(f"alerts_consumer: {exc}") from None
