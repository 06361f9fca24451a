"""A partitioned consumer's partitions move to another member and come back after healing.

Host A runs the producer; c1 (host B) and c2 (host C) share group g1. Mid-stream, B's link
goes down in the hub: the producer hears nothing from c1, declares it dead after
``dead_after_s`` and hands its partitions to c2, which then handles messages of partitions
that were c1's. The link comes up again: c1 is a member again and gets half the
partitions back (it handles messages published after the healing). The stream
runs through all of it; every index must reach g1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until

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
# Both are small beside c1's share of the stream (half the partitions, ~250 msgs/s), so
# the stream is far from its end at the healing.
MOVE_TIMEOUT_S = 10.0
RETURN_TIMEOUT_S = 20.0  # TCP retransmission backoff may add seconds after the link is up
FINISH_TIMEOUT_S = 60.0


def c1_partitions(cluster: Cluster) -> set[int]:
    """c1's partitions in g1 at the producer, once its status shows every partition given
    to c1 or c2 (a balanced assignment: half each)."""

    def both() -> bool:
        return set(cluster.assigned("g1").values()) == {"c1", "c2"}

    wait_until(both, 5.0, interval=0.05, what="the producer's status to list g1's assignment")
    return {p for p, m in cluster.assigned("g1").items() if m == "c1"}


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
        c1_parts = c1_partitions(cluster)
        assert len(c1_parts) == PARTITIONS // 2, f"c1 got {sorted(c1_parts)}: not half of them"
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
        c1_back_parts = c1_partitions(cluster)
        assert len(c1_back_parts) == PARTITIONS // 2, f"c1 got {sorted(c1_back_parts)} back"
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
        assert {e[3] for e in c1_log.entries[c1_mark:]} <= c1_back_parts, (
            "after healing c1 got partitions it does not own"
        )
        fresh_s = time.monotonic() - heal_at
        print(
            f"\npartition: c1 owns partitions {sorted(c1_parts)} "
            f"({sorted(c1_back_parts)} after healing); declared dead "
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
