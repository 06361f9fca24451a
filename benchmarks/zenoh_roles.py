"""Zenoh in peer mode, the worker side (eclipse-zenoh): brokerless like zmesh, no acks.

The subscriber's session listens on ``tcp/127.0.0.1:PORT`` (a port the parent found free),
the publisher's connects to it and listens on loopback only; scouting (multicast and
gossip) is off, so nothing leaves the machine. Zenoh keeps nothing for an absent
subscriber and has no acknowledgements: its figures compare with raw PUSH/PULL, not with
zmesh's acked delivery.

- ``zenoh_producer``: a publisher with congestion control ``BLOCK`` (the default, ``DROP``,
  discards what the link cannot take at once), ``put`` per message, after the subscriber
  matched.
- ``zenoh_consumer``: a subscriber with a callback (run on a Zenoh thread), which counts
  each sample and, paced, reads its stamp.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ._peerio import Tally, check, pace, produce
from ._wio import Commands, emit, payload, stamped

KEY = "bench/data"
MATCH_TIMEOUT_S = 30.0
WAIT_TICK_S = 0.01


def _session(listen: str, connect: str | None) -> Any:
    import zenoh

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("scouting/gossip/enabled", "false")
    conf.insert_json5("listen/endpoints", f'["{listen}"]')
    if connect:
        conf.insert_json5("connect/endpoints", f'["{connect}"]')
    return zenoh.open(conf)


def _wait(pred: Any, timeout: float, what: str, cmds: Commands) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        check(cmds, deadline, f"waiting for {what}")
        time.sleep(WAIT_TICK_S)


def _put(pub: Any, count: int, rate: float, deadline: float, cmds: Commands) -> None:
    put = pub.put
    if rate:
        wait = pace(rate)
        for _ in range(count):
            check(cmds, deadline, "paced publishing")
            time.sleep(wait())
            put(stamped())
        return
    body = payload()
    for i in range(count):
        if not i % 1024:
            check(cmds, deadline, "publishing")
        put(body)


def zenoh_producer(p: dict[str, Any], cmds: Commands) -> None:
    import zenoh

    deadline = time.monotonic() + p["deadline_s"]
    session = _session("tcp/127.0.0.1:0", p["url"])
    try:
        pub = session.declare_publisher(KEY, congestion_control=zenoh.CongestionControl.BLOCK)
        _wait(lambda: pub.matching_status.matching, MATCH_TIMEOUT_S, "the subscriber", cmds)
        emit("ready")
        rate = p.get("rate", 0.0)
        produce(p, cmds, lambda n: _put(pub, n, rate, deadline, cmds))
    finally:
        session.close()


def zenoh_consumer(p: dict[str, Any], cmds: Commands) -> None:
    t_start = time.monotonic()
    emit("started", t=t_start)
    session = _session(p["url"], None)
    tally = Tally(p)
    finished = threading.Event()
    latency, seen = tally.latency, [0]
    marks = {1, tally.warmup, tally.expect}  # (the tally is told at these and every 1,024)

    def on_sample(sample: Any) -> None:
        if latency:
            tally.took((sample.payload.to_bytes(),))
        seen[0] = n = seen[0] + 1
        if n in marks or not n & 1023:
            tally.took(())
            tally.acked(n - tally.count)
            if tally.finished:
                finished.set()

    try:
        sub = session.declare_subscriber(KEY, on_sample)
        emit("ready", t_subscribed=time.monotonic())
        _wait(lambda: finished.is_set() or cmds.stopping, p["deadline_s"], "every sample", cmds)
        sub.undeclare()
        tally.acked(seen[0] - tally.count)
        tally.result(start_s=time.monotonic() - t_start)
        cmds.wait_stop(p["deadline_s"])
    finally:
        session.close()


ROLES = {"zenoh_producer": zenoh_producer, "zenoh_consumer": zenoh_consumer}
