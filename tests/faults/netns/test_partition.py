"""A partitioned consumer's partitions move to another member and come back after healing.

Host A runs the producer; c1 (host B) and c2 (host C) share group g1. Mid-stream, B's link
goes down in the hub: the producer hears nothing from c1, declares it dead after
``dead_after_s`` and hands its partitions to c2, which then handles messages of partitions
that were c1's. The link comes up again: c1's hellos get through, it is a member again,
and its partitions return (it handles messages published after the healing). The stream
runs through all of it; every index must reach g1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from zmesh._engine.routing import rendezvous

from .cluster import PRODUCER, Cluster, Figures
from .hosts import HostNet
from .node_worker import PARTITIONS

N = 8000
RATE = 500.0  # a 16 s stream: long enough to cover the cut, the detection and the return
# The producer holds its last second of messages back until healed c1 is a member again,
# so that some are certainly published for it after the healing.
HOLD_LAST = int(RATE)
DISCOVERY_TIMEOUT_S = 20.0
BEFORE_CUT = 50  # messages each consumer handles before the cut (see MOVED_MIN)
DETECT_TIMEOUT_S = 10.0  # dead_after_s is 1.5 s
MOVED_MIN = 50  # new messages of c1's partitions that c2 handles before the healing
# Both are small because c1's share of the stream is its share of the 8 partitions (the
# cluster picks ids so that it owns some): at 1 of 8 it gets ~62 msgs/s, and 300 would let
# the stream end before the healing.
MOVE_TIMEOUT_S = 10.0
RETURN_TIMEOUT_S = 20.0  # TCP retransmission backoff may add seconds after the link is up
FINISH_TIMEOUT_S = 60.0


def owners(cluster: Cluster, members: list[str]) -> dict[int, str]:
    """Which member owns each of the producer's partitions (the producer's own routing)."""
    producer = bytes.fromhex(cluster.node_id(PRODUCER))
    ids = {bytes.fromhex(cluster.node_id(m)): m for m in members}
    return {p: ids[rendezvous(sorted(ids), producer, p)] for p in range(PARTITIONS)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_partitioned_consumer_moves_and_returns(
    tmp_path: Path,
    make_hostnet: Callable[[int], HostNet],
    record_figures: Callable[[Figures], None],
) -> None:
    bed = make_hostnet(3)
    a, b, c = bed.hosts
    cluster = Cluster(
        bed,
        tmp_path,
        producer_host=a,
        consumers={"c1": (b, "g1"), "c2": (c, "g1")},
        count=N,
        rate=RATE,
        hold_last=HOLD_LAST,
    )
    c1_log, c2_log = cluster.logs["c1"], cluster.logs["c2"]
    everyone = (PRODUCER, "c1", "c2")
    try:
        cluster.start_all()
        cluster.wait_members(
            "g1", {"c1", "c2"}, DISCOVERY_TIMEOUT_S, "c1 and c2 in g1 at the producer (mDNS)"
        )
        owner = owners(cluster, ["c1", "c2"])
        c1_parts = {p for p, m in owner.items() if m == "c1"}
        assert c1_parts and len(c1_parts) < PARTITIONS, (
            f"rendezvous gave c1 {len(c1_parts)} of {PARTITIONS} partitions: the test needs "
            "both members to own some"
        )
        cluster.go()

        def both_busy() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            return len(c1_log.entries) >= BEFORE_CUT and len(c2_log.entries) >= BEFORE_CUT

        wait_until(both_busy, 30.0, what=f"c1 and c2 to handle {BEFORE_CUT} messages each")
        assert {e[3] for e in c1_log.entries} <= c1_parts, "c1 got partitions it does not own"

        # The cut: c1 is declared dead, its partitions go to c2.
        bed.partition(b)
        cut_at = time.monotonic()
        detect_s = cluster.wait_members(
            "g1", {"c2"}, DETECT_TIMEOUT_S, "the producer to declare partitioned c1 dead"
        )
        cluster.poll_logs()
        c2_mark = len(c2_log.entries)
        progress_at_dead = cluster.progress_index()

        def taken_over() -> int:
            return sum(
                1 for e in c2_log.entries[c2_mark:] if e[3] in c1_parts and e[0] > progress_at_dead
            )

        def c2_took_over() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            return taken_over() >= MOVED_MIN

        wait_until(
            c2_took_over,
            MOVE_TIMEOUT_S,
            what=f"c2 to handle {MOVED_MIN} new messages of c1's partitions",
        )
        moved = taken_over()

        # Healing: c1 is a member again and gets its partitions back.
        progress_at_heal = cluster.progress_index()
        assert progress_at_heal < N - HOLD_LAST, "the producer did not hold its last messages"
        bed.heal(b)
        heal_at = time.monotonic()
        return_s = cluster.wait_members(
            "g1", {"c1", "c2"}, RETURN_TIMEOUT_S, "healed c1 to be a member of g1 again"
        )
        cluster.release()
        cluster.poll_logs()
        c1_mark = len(c1_log.entries)

        def c1_back() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            return any(e[0] > progress_at_heal for e in c1_log.entries[c1_mark:])

        wait_until(
            c1_back,
            RETURN_TIMEOUT_S,
            what="healed c1 to handle messages published after the healing",
        )
        assert {e[3] for e in c1_log.entries[c1_mark:]} <= c1_parts, (
            "after healing c1 got partitions it does not own"
        )
        fresh_s = time.monotonic() - heal_at
        print(
            f"\npartition: c1 owns partitions {sorted(c1_parts)}; declared dead "
            f"{detect_s:.1f}s after the cut; c2 handled {moved} new messages of them; "
            f"healed {heal_at - cut_at:.1f}s after the cut; c1 a member again "
            f"{return_s:.1f}s and handling new messages {fresh_s:.1f}s after healing"
        )

        cluster.wait_producer_done(FINISH_TIMEOUT_S)
        cluster.wait_all_logged()
        cluster.terminate_consumers()
        figures, reports = cluster.summary("test_partitioned_consumer_moves_and_returns")
        record_figures(figures)
        cluster.assert_complete(reports)
    except BaseException:
        cluster.dump_on_failure("test_partitioned_consumer_moves_and_returns")
        raise
