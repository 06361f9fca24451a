"""Replicated outboxes across hosts: the producer lost for good, a replica lost, both at
once, and the producer cut off and back.

Host A runs the producer of topic ``stream`` with ``replicas`` K; replica nodes (hosts of
their own, which only hold copies) and consumers (c1 and c2 share group g1, c3 is g2;
none hosts replicas) on the other hosts. Every node finds the others over mDNS. The
producer records, every 200 messages, the highest index whose receipt is stored (its
replicas hold it); whatever happens, every index up to the last one recorded must reach
each group, and no handler may see an index twice (every consumer acks after logging).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.waiting import pause

from .cluster import EXIT_TIMEOUT_S, PRODUCER, Cluster, Figures
from .hosts import HostNet

N = 50_000
RATE = 2500.0  # a 20 s stream
TAKEOVER_AFTER_S = 4.0  # dead_after_s is 1.5 s
KILL_AT = N // 3  # the producer has recorded this index as stored
BACKLOG = 5000  # g2's backlog at the producer's end: c3 is down for about as many messages
PARTITION_S = 30.0
DISCOVERY_TIMEOUT_S = 30.0
SYNC_TIMEOUT_S = 30.0
DELIVERED_TIMEOUT_S = 120.0
FINISH_TIMEOUT_S = 180.0
CONSUMERS = {"c1": "g1", "c2": "g1", "c3": "g2"}


def _cluster(bed: HostNet, root: Path, k: int, replicas: int) -> Cluster:
    hosts = bed.hosts
    names = [f"r{i + 1}" for i in range(replicas)]
    return Cluster(
        bed,
        root,
        producer_host=hosts[0],
        replicas={name: hosts[1 + i] for i, name in enumerate(names)},
        consumers={
            name: (hosts[1 + replicas + i], group)
            for i, (name, group) in enumerate(CONSUMERS.items())
        },
        count=N,
        rate=RATE,
        producer_args=("--replicas", str(k), "--max-outbox", "100000", "--no-replica-host"),
        consumer_args=("--no-replica-host",),
        replica_args=("--takeover-after", str(TAKEOVER_AFTER_S)),
    )


def _start(cluster: Cluster, k: int) -> list[str]:
    """Start everyone, wait for the groups' members and a whole replica set; the
    producer's replicas, best first."""
    cluster.start_all()
    cluster.wait_members("g1", {"c1", "c2"}, DISCOVERY_TIMEOUT_S, "c1 and c2 in g1 (mDNS)")
    cluster.wait_members("g2", {"c3"}, DISCOVERY_TIMEOUT_S, "c3 in g2 (mDNS)")
    return _replica_set(cluster, k - 1, set(), SYNC_TIMEOUT_S)


def _replica_set(cluster: Cluster, size: int, without: set[str], timeout: float) -> list[str]:
    """The producer's replica set once it has ``size`` whole copies, none of ``without``."""
    chosen: list[str] = []

    def whole() -> bool:
        cluster.check_running(PRODUCER)
        status = cluster.status(PRODUCER)
        members = [] if status is None else status["replicas"]["set"]
        chosen[:] = [m["name"] for m in members if m["state"] == "whole"]
        return len(chosen) == size and not set(chosen) & without

    wait_until(whole, timeout, interval=0.1, what=f"{size} whole replicas at the producer")
    return list(chosen)


def _serving(cluster: Cluster, name: str) -> list[dict]:
    status = cluster.status(name)
    return [] if status is None else status["replicas"]["serving"]


def _wait_delivered(cluster: Cluster, upto: int, running: tuple[str, ...]) -> None:
    """Every index up to ``upto`` in each group's logs."""
    wanted = set(range(upto + 1))

    def logged() -> bool:
        cluster.check_running(*running)
        cluster.poll_logs()
        return all(wanted <= cluster.indexes(g) for g in cluster.groups)

    wait_until(logged, DELIVERED_TIMEOUT_S, interval=0.2, what=f"indexes 0..{upto} in each group")


def _check(cluster: Cluster, test: str, upto: int) -> Figures:
    """Each group got every index up to ``upto`` and no index twice; the figures."""
    cluster.poll_logs()
    lost = duplicates = 0
    for group, members in cluster.groups.items():
        seen = Counter(e[0] for name in members for e in cluster.logs[name].entries)
        missing = set(range(upto + 1)) - seen.keys()
        twice = {i: c for i, c in seen.items() if c > 1}
        print(
            f"  {group}: {sum(seen.values())} handled, {len(seen)} distinct, "
            f"{len(missing)} stored but lost, {len(twice)} handled twice"
        )
        lost += len(missing)
        duplicates += sum(c - 1 for c in twice.values())
    figures = Figures(
        test=test,
        hosts=cluster.bed.count,
        messages=upto + 1,
        kills=len(cluster.kills),
        partitions=cluster.bed.partitions,
        duplicates=duplicates,
        lost=lost,
        seconds=time.monotonic() - cluster.t0,
    )
    print(figures.line())
    for kill in cluster.kills:
        print(f"  killed {kill}")
    assert lost == 0, f"{lost} messages whose receipts were stored never reached a group"
    assert duplicates == 0, f"{duplicates} messages handled twice"
    return figures


def _wait_progress(cluster: Cluster, index: int, running: tuple[str, ...]) -> None:
    def far() -> bool:
        cluster.check_running(*running)
        return cluster.progress_index() >= index

    wait_until(far, FINISH_TIMEOUT_S, interval=0.1, what=f"the producer past index {index}")


def _g2_down(cluster: Cluster, running: tuple[str, ...]) -> None:
    """Stop c3, g2's only member (cleanly: a consumer killed between handling a batch and
    acking it sees it again, which is no fault of replicas), and wait until BACKLOG more
    messages are stored: g2's backlog, which a taker must deliver."""
    _wait_progress(cluster, KILL_AT - BACKLOG, running)
    proc = cluster.procs["c3"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(EXIT_TIMEOUT_S) == 0, "c3 did not stop cleanly"
    _wait_progress(cluster, KILL_AT, tuple(n for n in running if n != "c3"))


def _wait_taker_acked(cluster: Cluster, taker: str, least: int) -> dict:
    """What ``taker`` serves, once the consumers' acks of at least ``least`` messages
    reached it (its status is written every 0.1 s)."""
    served: list[dict] = []

    def acked() -> bool:
        served[:] = _serving(cluster, taker)
        return len(served) == 1 and served[0]["counters"].get("acked", 0) >= least

    wait_until(acked, 10, interval=0.1, what=f"{taker} to get acks of {least} messages")
    return served[0]


def _lose_producer(cluster: Cluster) -> int:
    """SIGKILL the producer and delete its data dir: gone for good. The last index it
    recorded as stored."""
    cluster.kill9(PRODUCER, f"with index {cluster.progress_index()} recorded stored")
    shutil.rmtree(cluster.root / f"data-{PRODUCER}")
    return cluster.progress_index()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_producer_lost_for_good_its_replica_delivers_the_rest(
    tmp_path: Path,
    make_hostnet: Callable[[int], HostNet],
    record_figures: Callable[[Figures], None],
) -> None:
    cluster = _cluster(make_hostnet(6), tmp_path, k=2, replicas=2)
    everyone = (*CONSUMERS, "r1", "r2")
    try:
        (taker,) = _start(cluster, 2)
        cluster.go()
        _g2_down(cluster, (PRODUCER, *everyone))
        stored = _lose_producer(cluster)
        wait_until(
            lambda: _serving(cluster, taker),
            TAKEOVER_AFTER_S + 10,
            what=f"{taker} to take the producer's lanes over",
        )
        cluster.start_consumer("c3")  # (back: its group's backlog comes from the taker)
        _wait_delivered(cluster, stored, everyone)
        served = _wait_taker_acked(cluster, taker, BACKLOG // 2)  # (g2's backlog)
        assert served["producer"] == cluster.node_id(PRODUCER)
        other = "r2" if taker == "r1" else "r1"
        assert not _serving(cluster, other)
        cluster.terminate_consumers()
        record_figures(_check(cluster, "test_producer_lost_for_good", stored))
    except BaseException:
        cluster.dump_on_failure("test_producer_lost_for_good")
        raise


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_replica_lost_the_producer_picks_another(
    tmp_path: Path,
    make_hostnet: Callable[[int], HostNet],
    record_figures: Callable[[Figures], None],
) -> None:
    cluster = _cluster(make_hostnet(6), tmp_path, k=2, replicas=2)
    try:
        (first,) = _start(cluster, 2)
        cluster.go()
        _wait_progress(cluster, KILL_AT, (PRODUCER, *CONSUMERS, "r1", "r2"))
        cluster.kill9(first, f"the replica, producer at index {cluster.progress_index()}")
        other = "r2" if first == "r1" else "r1"
        assert _replica_set(cluster, 1, {first}, SYNC_TIMEOUT_S) == [other]
        cluster.wait_producer_done(FINISH_TIMEOUT_S)
        status = cluster.status(PRODUCER)
        assert status is not None and status["counters"]["replica_set_changes"] >= 2
        _wait_delivered(cluster, N - 1, (*CONSUMERS, other))
        cluster.terminate_consumers()
        record_figures(_check(cluster, "test_replica_lost", N - 1))
    except BaseException:
        cluster.dump_on_failure("test_replica_lost")
        raise


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_producer_and_its_first_replica_lost_the_second_delivers(
    tmp_path: Path,
    make_hostnet: Callable[[int], HostNet],
    record_figures: Callable[[Figures], None],
) -> None:
    cluster = _cluster(make_hostnet(6), tmp_path, k=3, replicas=2)
    try:
        first, second = _start(cluster, 3)
        cluster.go()
        _g2_down(cluster, (PRODUCER, *CONSUMERS, "r1", "r2"))
        # The replica that would take over goes with the producer.
        cluster.kill9(first, "the producer's first replica, with it")
        stored = _lose_producer(cluster)
        wait_until(
            lambda: _serving(cluster, second),
            TAKEOVER_AFTER_S + 10,
            what=f"{second} to take the producer's lanes over",
        )
        cluster.start_consumer("c3")
        _wait_delivered(cluster, stored, (*CONSUMERS, second))
        _wait_taker_acked(cluster, second, BACKLOG // 2)
        cluster.terminate_consumers()
        record_figures(_check(cluster, "test_producer_and_first_replica_lost", stored))
    except BaseException:
        cluster.dump_on_failure("test_producer_and_first_replica_lost")
        raise


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_producer_cut_off_and_back_gets_its_lanes_handed_back(
    tmp_path: Path,
    make_hostnet: Callable[[int], HostNet],
    record_figures: Callable[[Figures], None],
) -> None:
    bed = make_hostnet(6)
    cluster = _cluster(bed, tmp_path, k=2, replicas=2)
    everyone = (PRODUCER, *CONSUMERS, "r1", "r2")
    try:
        (taker,) = _start(cluster, 2)
        cluster.go()
        _g2_down(cluster, everyone)
        bed.partition(cluster.producer_host)
        cut_at = time.monotonic()
        stored_before = cluster.progress_index()
        # Cut off, the producer lives on (its new receipts wait for a replica); its
        # replica takes its lanes over and delivers what it holds.
        wait_until(
            lambda: _serving(cluster, taker),
            TAKEOVER_AFTER_S + 10,
            what=f"{taker} to take the producer's lanes over",
        )
        cluster.start_consumer("c3")
        _wait_delivered(cluster, stored_before, everyone)
        _wait_taker_acked(cluster, taker, BACKLOG // 2)
        pause(max(0.0, PARTITION_S - (time.monotonic() - cut_at)))  # (the cut's length)
        bed.heal(cluster.producer_host)
        # Back, it gets its lanes handed back before it sends anything, then finishes.
        cluster.wait_producer_done(FINISH_TIMEOUT_S)
        _wait_delivered(cluster, N - 1, (*CONSUMERS, "r1", "r2"))
        status = cluster.status(PRODUCER)
        assert status is not None and status["counters"]["handbacks_received"] == 1
        taker_status = cluster.status(taker)
        assert taker_status is not None and taker_status["counters"]["handbacks"] == 1
        assert not _serving(cluster, taker)
        cluster.terminate_consumers()
        record_figures(_check(cluster, "test_producer_cut_off_and_back", N - 1))
    except BaseException:
        cluster.dump_on_failure("test_producer_cut_off_and_back")
        raise
