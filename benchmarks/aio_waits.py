"""zmesh.aio's waits: on the event loop (what it does) against a thread per await.

    python -m benchmarks.aio_waits [--messages 2000] [--pending 300] [--reps 3] [--json PATH]

Both ways wait on the same receipts of the same two nodes (a producer and a consumer
whose handler acks, in this process, on 127.0.0.1):

- ``loop``: ``await receipt.wait_stored()`` / ``wait_acked()`` of zmesh.aio, woken by
  the IO thread's notifications through ``call_soon_threadsafe``;
- ``thread``: ``await asyncio.to_thread(receipt.sync.wait_stored)`` (the sync wait on
  the loop's default executor: what zmesh.aio did before).

Figures (medians over ``--reps``): ``stored_us``, one publish and its wait_stored at a
time (microseconds per message); ``acked_us``, the same with wait_acked (a round trip to
the consumer); ``gather_msgs_s``, ``--messages`` publishes then all their wait_acked
awaited at once with ``asyncio.gather``; ``pending_threads``, the threads blocked in a
receipt's wait while ``--pending`` awaits of receipts nobody acks are pending (a thread
way queues those past the executor's workers); ``cancel_ms``, cancelling those and
closing the nodes (a thread way's close waits in the executor's queue behind the blocked
waits, until their 60 s timeouts). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import zmesh
import zmesh.aio

WAYS = ("loop", "thread")


def _waiter(way: str, acked: bool) -> Callable[[zmesh.aio.Receipt], Awaitable[None]]:
    if way == "loop":
        return (lambda r: r.wait_acked(60)) if acked else (lambda r: r.wait_stored(60))
    if acked:
        return lambda r: asyncio.to_thread(r.sync.wait_acked, 60)
    return lambda r: asyncio.to_thread(r.sync.wait_stored, 60)


def _threads_in(fn: Callable[..., Any]) -> int:
    """Threads whose stack is inside ``fn`` now."""
    code = fn.__code__
    count = 0
    for frame in sys._current_frames().values():
        f: Any = frame
        while f is not None and f.f_code is not code:
            f = f.f_back
        count += f is not None
    return count


async def _members(prod: zmesh.aio.Node, topic: str) -> None:
    for _ in range(500):
        if any(ln["topic"] == topic and ln["members"] for ln in (await prod.status())["lanes"]):
            return
        await asyncio.sleep(0.02)
    raise RuntimeError(f"no member of {topic} joined")


async def _run(way: str, work: Path, messages: int, pending: int) -> dict[str, float]:
    kw: dict[str, Any] = {
        "mesh": f"bench-aio-{os.getpid()}",
        "interfaces": ["127.0.0.1"],
        "mdns": False,
        "max_outbox_messages": 10 * messages,
    }
    stored, acked = _waiter(way, False), _waiter(way, True)
    out: dict[str, float] = {}
    async with (
        zmesh.aio.Node("prod", data_dir=str(work / "prod"), **kw) as prod,
        zmesh.aio.Node(
            "cons", data_dir=str(work / "cons"), seeds=[prod.control_address], **kw
        ) as cons,
    ):
        cons.subscribe("t", group="g", handler=lambda _m: None)
        await _members(prod, "t")
        each = []
        for i in range(messages):
            t0 = time.perf_counter()
            await stored(await prod.publish("t", b"%d" % i))
            each.append(time.perf_counter() - t0)
        out["stored_us"] = statistics.median(each) * 1e6
        each = []
        for i in range(min(messages, 500)):
            t0 = time.perf_counter()
            await acked(await prod.publish("t", b"%d" % i))
            each.append(time.perf_counter() - t0)
        out["acked_us"] = statistics.median(each) * 1e6
        t0 = time.perf_counter()
        receipts = [await prod.publish("t", b"%d" % i) for i in range(messages)]
        await asyncio.gather(*(acked(r) for r in receipts))
        out["gather_msgs_s"] = messages / (time.perf_counter() - t0)
        # Receipts nobody acks: a topic whose group is owed but has no member.
        prod.topic("nobody", groups=["absent"])
        tasks = [
            asyncio.create_task(acked(await prod.publish("nobody", b"x"))) for _ in range(pending)
        ]
        await asyncio.sleep(0.2)  # (every task reaches its await)
        out["pending_threads"] = _threads_in(zmesh.Receipt._wait)
        t0 = time.perf_counter()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out["cancel_ms"] = (time.perf_counter() - t0) * 1e3  # (the node closed too)
    return out


def measure(way: str, messages: int, pending: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zmesh-bench-aio-") as tmp:
        t0 = time.perf_counter()
        result = asyncio.run(_run(way, Path(tmp), messages, pending))
        result["run_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.aio_waits", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--pending", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    logging.getLogger("zmesh").setLevel(logging.ERROR)  # (an open mesh's warning, each run)
    reps: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(args.reps):
        for way in WAYS:  # (interleaved: a busy moment of the machine hits both)
            reps[way].append(measure(way, args.messages, args.pending))
    medians = {
        way: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for way, runs in reps.items()
    }
    print(f"{'figure':<16}" + "".join(f"{way:>12}" for way in WAYS))
    for key in medians["loop"]:
        print(f"{key:<16}" + "".join(f"{medians[way][key]:>12,.1f}" for way in WAYS))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "medians": medians,
                    "reps": reps,
                    "messages": args.messages,
                    "pending": args.pending,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
