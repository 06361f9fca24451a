"""A mesh of N nodes, one per network namespace, and what it shows: the scale harness.

    python -m tests.faults.netns.scale --nodes 64 --hold 600          # mDNS, started together
    python -m tests.faults.netns.scale --nodes 96 --seeds --hold 60   # gossip from seeds only
    python -m tests.faults.netns.scale --spread --members 16 --partitions 64 --add 4 --remove 4

(root only; ``--json PATH`` writes the figures.) A *mesh run* starts every node at once
(``scale_worker.py member``: no subscriptions, default timing) and reports: discovery
(from the last node's start until every node sees all the others alive), suspicions,
false deaths and flaps (any node's view of a node nobody killed turning suspect or dead,
during the whole run and after convergence), the idle CPU of the whole mesh (user +
system time of every node over the quiet part of the hold, in % of one core), RSS per
node, then how long until every node sees a killed node dead, and a restarted one alive
again (from its ``start()``). Each node samples its own view every 0.25 s, which bounds
the precision of these times.

A *spread run* (spread.py) is one producer and ``--members`` consumers of one shared group
over ``--partitions`` partitions: it reports each member's partitions at the producer and
the messages each handled, adds and removes members while the producer publishes keyed
messages, and checks that none is lost and that each key's messages were first handled
in publish order across the moves (with how many partitions moved).

Every namespace, process and file the run makes is removed at its end, pass or fail.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.waiting import until

from .hosts import HostNet, check_netns_available
from .scale_nodes import START_S_PER_NODE, Nodes, cpu_seconds, rss_mib
from .spread import SpreadFigures, spread_run

QUIET_AFTER_S = 10.0  # idle CPU is measured from this long after convergence


@dataclass
class MeshFigures:
    """What a mesh run measured (times in seconds, CPU in % of one core)."""

    nodes: int
    discovery: str  # "mdns" or "seeds"
    start_spread_s: float = 0.0  # first start to last start
    discovery_s: float | None = None
    hold_s: float = 0.0
    suspicions: int = 0  # a node not killed seen suspect by someone, whole run
    suspicions_after_convergence: int = 0  # (refuted: still a member of every lane)
    false_deaths: int = 0  # ... seen dead, whole run
    false_deaths_before_convergence: int = 0
    flaps: int = 0  # ... seen dead (and alive again) after convergence
    idle_cpu_pct: float | None = None
    rss_mib_mean: float | None = None
    rss_mib_max: float | None = None
    death_noticed_s: float | None = None  # kill -> every other node sees it dead
    death_noticed_first_s: float | None = None
    restart_back_s: float | None = None  # restarted start() -> every node sees it alive
    counters: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"{k}: {v}" for k, v in asdict(self).items() if k != "counters"] + [
            f"counters: {json.dumps(self.counters, sort_keys=True)}"
        ]


def first_full_view(log: list[tuple[float, str, str]], others: set[str]) -> float | None:
    """When a node first saw every one of ``others`` alive (suspect counts as alive)."""
    state: dict[str, str] = {}
    for t, pid, s in log:
        state[pid] = s
        if all(state.get(o) in ("alive", "suspect") for o in others):
            return t
    return None


def noticed(
    nodes: Nodes, watchers: list[str], victim: str, after: float, states: tuple[str, ...]
) -> dict[str, float]:
    """When each of ``watchers`` first saw ``victim`` in one of ``states`` after ``after``."""
    vid = nodes.info(victim)["id"]  # type: ignore[index]
    out = {}
    for name in watchers:
        for t, pid, s in nodes.log(name):
            if pid == vid and t >= after and s in states:
                out[name] = t
                break
    return out


def mesh_run(
    bed: HostNet, root: Path, *, seeds_only: bool, hold_s: float, kill: bool = True
) -> MeshFigures:
    """Start ``bed.count`` nodes together; discovery, a hold, a kill and a restart."""
    n = bed.count
    nodes = Nodes(bed, root, mdns=not seeds_only)
    names = [f"n{h.index}" for h in bed.hosts]
    figures = MeshFigures(nodes=n, discovery="seeds" if seeds_only else "mdns")
    start_timeout = 30 + START_S_PER_NODE * n
    if seeds_only:
        # Seeds need a known address: three nodes first, then the rest at once, each
        # given one of the three (it learns everyone else by gossip).
        first = names[:3]
        for i, name in enumerate(first):
            seeds = [nodes.info(first[0])["control"]] if i else []  # type: ignore[index]
            nodes.spawn(name, bed.hosts[i], ["member"], seeds)
            nodes.wait_started([name], start_timeout)
        seeds_of = [nodes.info(s)["control"] for s in first]  # type: ignore[index]
        for i, name in enumerate(names[3:], 3):
            nodes.spawn(name, bed.hosts[i], ["member"], [seeds_of[i % 3]])
    else:
        for host, name in zip(bed.hosts, names, strict=True):
            nodes.spawn(name, host, ["member"])
    infos = nodes.wait_started(names, start_timeout)
    starts = [i["started_at"] for i in infos.values()]
    last_start = max(starts)
    figures.start_spread_s = round(last_start - min(starts), 2)
    ids = {name: infos[name]["id"] for name in names}

    def full_views() -> dict[str, float] | None:
        nodes.check_running()
        out = {}
        for name in names:
            t = first_full_view(nodes.log(name), set(ids.values()) - {ids[name]})
            if t is None:
                return None
            out[name] = t
        return out

    converged = until(full_views, 60 + n, 0.5)
    if converged:
        converged_at = max(converged.values())
        figures.discovery_s = round(converged_at - last_start, 2)
    else:
        converged_at = time.time()
    # The hold: nothing happens; the quiet part of it is where idle CPU is measured.
    until(lambda: time.time() >= converged_at + QUIET_AFTER_S, QUIET_AFTER_S + 5, 0.5)
    pids = {name: nodes.procs[name].pid for name in names}
    cpu0, t0 = sum(cpu_seconds(p) for p in pids.values()), time.monotonic()
    until(lambda: time.time() >= converged_at + hold_s, hold_s + 5, 1.0)
    nodes.check_running()
    cpu1, t1 = sum(cpu_seconds(p) for p in pids.values()), time.monotonic()
    figures.hold_s = round(time.time() - converged_at, 1)
    figures.idle_cpu_pct = round(100 * (cpu1 - cpu0) / (t1 - t0), 1)
    rss = [rss_mib(p) for p in pids.values()]
    figures.rss_mib_mean = round(sum(rss) / len(rss), 1)
    figures.rss_mib_max = round(max(rss), 1)
    _count_false_states(figures, nodes, names, ids, converged_at, killed=set())
    if kill:
        victim = names[n // 2]
        others = [m for m in names if m != victim]
        killed_at = nodes.kill9(victim)

        def all_noticed() -> dict[str, float] | None:
            seen = noticed(nodes, others, victim, killed_at, ("dead", "gone"))
            return seen if len(seen) == len(others) else None

        seen = until(all_noticed, 30.0, 0.25)
        if seen:
            figures.death_noticed_s = round(max(seen.values()) - killed_at, 2)
            figures.death_noticed_first_s = round(min(seen.values()) - killed_at, 2)
        nodes.spawn(victim, nodes.hosts[victim], ["member"], [])
        back = nodes.wait_started([victim], start_timeout)[victim]["started_at"]

        def all_back() -> dict[str, float] | None:
            seen = noticed(nodes, others, victim, killed_at, ("alive",))
            return seen if len(seen) == len(others) else None

        seen = until(all_back, 30.0, 0.25)
        if seen:
            figures.restart_back_s = round(max(seen.values()) - back, 2)
    bad = nodes.terminate(names)
    totals: Counter[str] = Counter()
    for name in names:
        totals.update(nodes.stats(name))  # (as each wrote them at its clean exit)
    figures.counters = {
        k: v
        for k, v in totals.items()
        if k.startswith(("peer", "refuted", "probes", "handshake", "untrusted"))
    }
    if bad:
        raise RuntimeError(f"nodes that did not close cleanly: {bad}")
    return figures


def _count_false_states(
    figures: MeshFigures,
    nodes: Nodes,
    names: list[str],
    ids: dict[str, str],
    converged_at: float,
    killed: set[str],
) -> None:
    spared = {ids[n] for n in names if n not in killed}
    for name in names:
        for t, pid, s in nodes.log(name):
            if pid not in spared:
                continue
            if s == "suspect":
                figures.suspicions += 1
                figures.suspicions_after_convergence += t >= converged_at
            elif s in ("dead", "gone"):
                figures.false_deaths += 1
                if t < converged_at:
                    figures.false_deaths_before_convergence += 1
                else:
                    figures.flaps += 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.netns.scale")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--hold", type=float, default=60.0, help="seconds held after convergence")
    ap.add_argument("--seeds", action="store_true", help="no mDNS: gossip from seeds only")
    ap.add_argument("--no-kill", dest="kill", action="store_false")
    ap.add_argument("--spread", action="store_true", help="a spread run instead")
    ap.add_argument("--members", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--add", type=int, default=4)
    ap.add_argument("--remove", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=60.0, help="the spread run's stream")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the run's files (say where)")
    args = ap.parse_args(argv)
    check_netns_available()
    hosts = 1 + args.members + args.add if args.spread else args.nodes
    tmp = Path(tempfile.mkdtemp(prefix="zmesh-scale-"))
    bed = HostNet(hosts, neighbours=True)
    try:
        bed.create()
        figures: MeshFigures | SpreadFigures
        if args.spread:
            figures = spread_run(
                bed,
                tmp,
                members=args.members,
                partitions=args.partitions,
                add=args.add,
                remove=args.remove,
                rate=args.rate,
                seconds=args.seconds,
            )
        else:
            figures = mesh_run(bed, tmp, seeds_only=args.seeds, hold_s=args.hold, kill=args.kill)
    finally:
        problems = bed.close()
        if problems:
            print(f"teardown: {problems}", file=sys.stderr)
        if args.keep:
            print(f"the run's files are in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(figures.lines()))
    if args.json:
        args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
