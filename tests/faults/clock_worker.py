"""A child process of the clock-step tests, run with libfaketime preloaded: it steps its
own wall clock (``time.time()``; the monotonic clock is left alone) by rewriting the file
that ``FAKETIME_TIMESTAMP_FILE`` names, as NTP steps a board's clock.

    python tests/faults/clock_worker.py SCENARIO --mesh M --data-dir D --step OFFSET

OFFSET is libfaketime's relative form (``+30d``, ``-3650d``). Scenarios:

``expiry``: a group's member leaves, 5 messages are owed to the group (whose topic's
``group_inactive_expiry_s`` is an hour), the clock steps, then a new member of the group
comes: how many of the 5 it gets.
``ids``: a publish with a ``msg_id``, the clock steps, the same publish again.
``retention``: 3 messages of a topic that retains them an hour, the clock steps, a pass
of retention after it: how many a replay still reads.
``owe`` leaves 5 messages owed to an idle group in the data dir and exits; ``reopen``
steps the clock, reopens the data dir and lets its node run past its start's grace
(``dead_after_s``), then a member of the group comes: how many of the 5 it gets.

Each prints one JSON line: what it found and the producer's counters.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import zmesh
from tests.waiting import pause, until

LOOPBACK = ["127.0.0.1"]
TIMING = {"heartbeat_interval_s": 0.2, "dead_after_s": 1.5}
HOUR = 3600.0


def step(offset: str) -> None:
    """Step this process's wall clock to ``offset`` from the real one."""
    with open(os.environ["FAKETIME_TIMESTAMP_FILE"], "w") as f:
        f.write(offset + "\n")


def producer(args: argparse.Namespace) -> zmesh.Node:
    return zmesh.Node(
        "producer",
        mesh=args.mesh,
        data_dir=args.data_dir,
        interfaces=LOOPBACK,
        mdns=False,
        topics={
            "t": zmesh.TopicConfig(group_inactive_expiry_s=HOUR),
            "r": zmesh.TopicConfig(retention_s=HOUR),
            "q": zmesh.TopicConfig(retention_bytes=1),
        },
        **TIMING,
    ).start()


def consumer(args: argparse.Namespace, name: str, node: zmesh.Node) -> zmesh.Node:
    return zmesh.Node(
        name,
        mesh=args.mesh,
        data_dir=os.path.join(os.path.dirname(args.data_dir), name),
        interfaces=LOOPBACK,
        mdns=False,
        seeds=[f"127.0.0.1:{node.status()['node']['control_port']}"],
        **TIMING,
    ).start()


def counters(node: zmesh.Node) -> dict[str, int]:
    return dict(node.status()["counters"])


def steps_seen(node: zmesh.Node) -> int:
    """Waits for the heartbeat that sees the step (it judges the lanes and the publish-id
    window in the same beat); 0 when none is seen."""
    return until(lambda: counters(node).get("clock_steps", 0), timeout=3.0) or 0


def owe(args: argparse.Namespace, node: zmesh.Node) -> None:
    """5 messages owed to group ``g`` of ``t``, whose one member has left (the producer
    noted the lane idle)."""
    c1 = consumer(args, "c1", node)
    c1.subscribe("t", group="g")
    assert until(lambda: any(g["members"] for g in node.groups("t")), timeout=10.0)
    c1.close()
    assert until(lambda: all(not g["members"] for g in node.groups("t")), timeout=10.0)
    for i in range(5):
        node.publish("t", b"%d" % i).wait_stored(timeout=5.0)
    assert until(lambda: all(g["last_seen"] for g in node.groups("t")), timeout=10.0)


def received(args: argparse.Namespace, node: zmesh.Node) -> int:
    """How many messages of ``t`` a new member of ``g`` gets (all 5 come, or the wait
    ends once the producer owes nothing more)."""
    c2 = consumer(args, "c2", node)
    got = set()
    try:
        sub = c2.subscribe("t", group="g")
        deadline = time.monotonic() + 10.0
        while len(got) < 5 and time.monotonic() < deadline:
            msg = sub.get(timeout=0.5)
            if msg is not None:
                got.add(msg.payload)
                msg.ack()
            elif not node.status()["outbox"]:
                break
    finally:
        c2.close()
    return len(got)


def run(args: argparse.Namespace) -> dict[str, object]:
    if args.scenario == "reopen":
        step(args.step)
        node = producer(args)
        seen = counters(node).get("clock_steps", 0)
        pause(TIMING["dead_after_s"] + 3 * TIMING["heartbeat_interval_s"])  # (its grace)
        found: dict[str, object] = {"steps": seen, "received": received(args, node)}
        return {**found, "counters": counters(node)} | _close(node)
    node = producer(args)
    if args.scenario == "owe":
        owe(args, node)
        return {"counters": counters(node)} | _close(node)
    if args.scenario == "expiry":
        owe(args, node)
        step(args.step)
        found = {"steps": steps_seen(node), "received": received(args, node)}
    elif args.scenario == "ids":
        node.publish("i", b"x", msg_id="once").wait_stored(timeout=5.0)
        step(args.step)
        seen = steps_seen(node)
        node.publish("i", b"x", msg_id="once").wait_stored(timeout=5.0)
        found = {"steps": seen}
    else:  # retention
        c1 = consumer(args, "c1", node)
        c1.subscribe("r", group="g", handler=lambda _msg: None)
        c1.subscribe("q", group="g", handler=lambda _msg: None)
        assert until(lambda: len([g for g in node.groups() if g["members"]]) == 2, timeout=10.0)
        for i in range(3):
            node.publish("r", b"%d" % i).wait_acked(timeout=10.0)
        step(args.step)
        seen = steps_seen(node)
        # A pass of retention after the step: it reclaims q's message (over its bytes)
        # in the same pass that judges r's.
        before = counters(node).get("retention_reclaimed", 0)
        node.publish("q", b"q").wait_acked(timeout=10.0)
        until(lambda: counters(node).get("retention_reclaimed", 0) > before, timeout=10.0)
        c1.close()
        with node.replay("r", follow=False) as reader:
            kept = sum(1 for _ in reader)
        found = {"steps": seen, "kept": kept}
    return {**found, "counters": counters(node)} | _close(node)


def _close(node: zmesh.Node) -> dict[str, object]:
    node.close()
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["expiry", "ids", "retention", "owe", "reopen"])
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--step", default="+0")
    args = parser.parse_args()
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
