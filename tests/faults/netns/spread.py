"""A spread run: one producer and the members of one shared group, each on a namespace host.

The producer (``scale_worker.py producer``) publishes keyed messages (key ``k{i % keys}``)
over ``partitions`` partitions. Once every member is in the group's lane, the run reads
each member's partitions from the producer's status; then, while the producer publishes,
it starts ``add`` more members and, later, closes ``remove`` of the first ones (SIGTERM: a
clean close). At the end it checks that every message reached the group and that each
key's messages were first handled in publish order, across every move of their partition,
and reports how many partitions moved.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.waiting import until

from .hosts import HostNet
from .scale_nodes import START_S_PER_NODE, Nodes

TOPIC = "spread"
GROUP = "g"
MEMBERS_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 180.0


@dataclass
class SpreadFigures:
    """What a spread run measured."""

    members: int
    partitions: int
    messages: int
    assigned: list[int] = field(default_factory=list)  # partitions per member, sorted
    fair_share: float = 0.0
    added: int = 0
    removed: int = 0
    partitions_moved: int = 0  # while the stream ran
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0  # a key's message first handled before an earlier one of it
    handled: list[int] = field(default_factory=list)  # messages per member, sorted

    def lines(self) -> list[str]:
        return [f"{k}: {v}" for k, v in vars(self).items()]


def read_log(path: Path) -> list[tuple[float, int]]:
    """A consumer's handled messages: (time, index)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            out.append((float(parts[0]), int(parts[1])))
    return out


def lane_of(nodes: Nodes) -> dict | None:
    status = nodes.status("producer")
    for lane in status["lanes"] if status else ():
        if lane["lane"] == GROUP:
            return lane
    return None


def spread_run(
    bed: HostNet,
    root: Path,
    *,
    members: int,
    partitions: int,
    add: int,
    remove: int,
    rate: float,
    seconds: float,
    keys: int = 256,
) -> SpreadFigures:
    """``bed`` needs ``1 + members + add`` hosts."""
    assert bed.count >= 1 + members + add
    nodes = Nodes(bed, root)
    count = int(rate * seconds)
    figures = SpreadFigures(members=members, partitions=partitions, messages=count)
    consumer = ["consumer", "--topic", TOPIC, "--group", GROUP]
    producer = [
        "producer",
        "--topic",
        TOPIC,
        "--groups",
        GROUP,
        "--partitions",
        str(partitions),
        "--count",
        str(count),
        "--rate",
        str(rate),
        "--keys",
        str(keys),
    ]
    first = [f"c{i}" for i in range(1, members + 1)]
    extra = [f"c{i}" for i in range(members + 1, members + add + 1)]
    hosts = iter(bed.hosts)
    nodes.spawn("producer", next(hosts), producer)
    for name in first:
        nodes.spawn(name, next(hosts), consumer)
    start_timeout = 30 + START_S_PER_NODE * (members + 1)
    nodes.wait_started(["producer", *first], start_timeout)

    def members_are(names: list[str]) -> bool:
        nodes.check_running("producer", *names)
        lane = lane_of(nodes)
        want = {nodes.info(n)["id"] for n in names}  # type: ignore[index]
        return lane is not None and set(lane["members"]) == want

    if not until(lambda: members_are(first), MEMBERS_TIMEOUT_S, 0.1):
        raise TimeoutError(f"the producer's lane never listed {members} members: {lane_of(nodes)}")
    lane = lane_of(nodes)
    assert lane is not None
    figures.assigned = sorted(len(p) for p in lane["assigned"])
    figures.fair_share = round(partitions / members, 2)
    moved_before = lane["partitions_moved"]  # (as the members joined at the start)
    (nodes.run_dir / "go").write_text("go\n")
    # Moves while the stream runs: members join at a third of it, leave at two thirds.
    t0 = time.monotonic()
    until(lambda: time.monotonic() - t0 >= seconds / 3, seconds, 0.1)
    for name in extra:
        nodes.spawn(name, next(hosts), consumer)
    nodes.wait_started(extra, 30 + START_S_PER_NODE * add)
    everyone = [*first, *extra]
    if not until(lambda: members_are(everyone), MEMBERS_TIMEOUT_S, 0.1):
        raise TimeoutError("the added members never joined the lane")
    figures.added = add
    until(lambda: time.monotonic() - t0 >= 2 * seconds / 3, seconds, 0.1)
    leaving = first[:remove]
    bad = nodes.terminate(leaving)
    if bad:
        raise RuntimeError(f"members that did not close cleanly: {bad}")
    staying = [n for n in everyone if n not in leaving]
    if not until(lambda: members_are(staying), MEMBERS_TIMEOUT_S, 0.1):
        raise TimeoutError("the removed members never left the lane")
    figures.removed = remove

    def drained() -> bool:
        nodes.check_running(*staying)
        return nodes.procs["producer"].poll() is not None

    if not until(drained, seconds + DRAIN_TIMEOUT_S, 0.2):
        raise TimeoutError("the producer did not publish and drain its outbox")
    if nodes.procs["producer"].returncode != 0:
        raise RuntimeError(f"the producer failed:\n{nodes.output('producer')}")
    final = lane_of(nodes)
    figures.partitions_moved = final["partitions_moved"] - moved_before if final else -1
    bad = nodes.terminate(staying)
    if bad:
        raise RuntimeError(f"members that did not close cleanly: {bad}")
    _check(figures, nodes, everyone, count, keys)
    return figures


def _check(figures: SpreadFigures, nodes: Nodes, names: list[str], count: int, keys: int) -> None:
    first_seen: dict[int, float] = {}
    handled: Counter[str] = Counter()
    deliveries = 0
    for name in names:
        entries = read_log(nodes.run_dir / f"{name}.log")
        handled[name] = len(entries)
        deliveries += len(entries)
        for t, index in entries:
            if index not in first_seen or t < first_seen[index]:
                first_seen[index] = t
    figures.lost = count - len(first_seen.keys() & set(range(count)))
    figures.duplicates = deliveries - len(first_seen)
    figures.handled = sorted(handled.values())
    for key in range(keys):
        times = [first_seen[i] for i in range(key, count, keys) if i in first_seen]
        figures.out_of_order += sum(1 for a, b in zip(times, times[1:], strict=False) if b < a)
