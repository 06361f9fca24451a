"""Edge sensors: one zmesh node per sensor, publishing readings into the mesh.

    python sensors.py --mesh plant --seed 127.0.0.1:41235 --sensors 3 --readings 60

Readings are deterministic (see ``reading``), with event times on a simulated clock of one
reading per second, so the pipeline's output can be checked. ``sensor-2`` runs hot for a
while. When done, each sensor sends a heartbeat a minute later in event time, which moves
Spark's watermark past every real window so they are all written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmesh

BASE_TS = 1_700_000_000.0  # event time of reading 0 (a multiple of the window)
STEP_S = 1.0  # event time between two readings of a sensor
HOT = ("sensor-2", 20, 30)  # this sensor reads hot for readings [20, 30)
SPIKE = ("sensor-3", 40, 43)  # a short spike: the window's maximum, not its average


def reading(sensor: int, i: int) -> dict:
    """Reading ``i`` of sensor ``sensor`` (1-based)."""
    name = f"sensor-{sensor}"
    value = 20.0 + sensor + round(3 * math.sin(i / 3), 3)
    if name == HOT[0] and HOT[1] <= i < HOT[2]:
        value = 90.0 + i % 3
    if name == SPIKE[0] and SPIKE[1] <= i < SPIKE[2]:
        value = 95.0
    return {"sensor": name, "ts": BASE_TS + i * STEP_S, "value": value}


def heartbeat(sensor: int, readings: int) -> dict:
    return {
        "sensor": f"sensor-{sensor}",
        "ts": BASE_TS + readings * STEP_S + 60,
        "value": 0.0,
        "heartbeat": True,
    }


class Stopped(Exception):
    """SIGINT (Ctrl-C) or SIGTERM came: main() closed the nodes (what they did not send
    yet stays in their outboxes)."""


def count(text: str) -> int:
    """--sensors, --readings: an int >= 1 (argparse says why not)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
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
    parser.add_argument("--mesh", default="plant")
    parser.add_argument("--seed", action="append", default=[], metavar="HOST:PORT")
    parser.add_argument("--interface", action="append", default=[], metavar="IP")
    parser.add_argument("--no-mdns", action="store_true")
    parser.add_argument("--sensors", type=count, default=3)
    parser.add_argument("--readings", type=count, default=60)
    parser.add_argument("--data-dir", default="var/sensors")
    parser.add_argument("--timeout", type=seconds, default=120.0)
    args = parser.parse_args()
    stopped: list[int] = []  # the signal that stopped it
    done = threading.Event()  # every reading acked (or the wait failed), or a signal
    on_stop_signal(lambda signum: (stopped.append(signum), done.set()))
    failed: list[Exception] = []  # what publishing or waiting raised, for main() to raise

    with contextlib.ExitStack() as nodes:
        batches: list[tuple[zmesh.Node, str, list[dict]]] = []  # (node, its name, payloads)
        for sensor in range(1, args.sensors + 1):
            if done.is_set():
                break  # (a signal came while the nodes started)
            name = f"sensor-{sensor}"
            node = nodes.enter_context(
                zmesh.Node(
                    name,
                    mesh=args.mesh,
                    data_dir=Path(args.data_dir) / name,
                    interfaces=args.interface,
                    mdns=not args.no_mdns,
                    seeds=args.seed,
                )
            )
            node.topic("metrics", groups=["spark"])  # the bridge's group gets every reading
            payloads = [reading(sensor, i) for i in range(args.readings)]
            payloads.append(heartbeat(sensor, args.readings))
            batches.append((node, name, payloads))

        # On a thread of its own: at a signal, main() leaves the `with` without waiting for
        # it, and the nodes' close wakes its waits (a publish() waiting for room,
        # wait_acked) with NodeClosedError.
        def publish() -> None:
            try:
                receipts = [
                    node.publish("metrics", json.dumps(p), key=name)
                    for node, name, payloads in batches
                    for p in payloads
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
    print(
        f"sensors: {args.sensors} x {args.readings} readings acknowledged by the mesh", flush=True
    )


if __name__ == "__main__":
    try:
        main()
    except Stopped as exc:
        signum = exc.args[0]
        print(f"sensors: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    except (zmesh.ConfigError, zmesh.ArgumentError) as exc:  # a bad option
        print(f"sensors: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except zmesh.ZMeshError as exc:
        raise SystemExit(f"sensors: {exc}") from None
