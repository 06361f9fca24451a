"""After a partition heals, a returning member gets data promptly.

The producer judges a member's liveness by the hellos the member sends on its own TCP
connection, but sends it data on another one: its PUSH to the member's PULL. Across a
partition that PUSH connection holds unacknowledged batches, and the producer's kernel
retransmits them with exponential backoff (the RTO doubles, up to 120 s). A member that
comes back therefore gets new sockets (and ``ZMQ_TCP_MAXRT`` bounds a stuck connection);
this test holds a partition for 8 s (long enough for a left-alone connection to back off
past 6 s), heals it, and measures how long
the healed member, once live again, waits for a new message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until

from .cluster import PRODUCER, Cluster, Figures
from .hosts import HostNet

N = 8000
RATE = 500.0
DISCOVERY_TIMEOUT_S = 20.0
PARTITION_S = 8.0
RETURN_TIMEOUT_S = 20.0
FRESH_TIMEOUT_S = 40.0
FRESH_WITHIN_S = 3.0  # a healed, live member gets new messages within this, or it stalled
FINISH_TIMEOUT_S = 60.0
C1_BUSY_MESSAGES = 50


class DataPathStalled(AssertionError):
    """A live member got no data for longer than FRESH_WITHIN_S."""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_healed_member_gets_data_promptly(
        tmp_path: Path, make_hostnet: Callable[[int], HostNet],
        record_figures: Callable[[Figures], None]) -> None:
    bed = make_hostnet(3)
    a, b, c = bed.hosts
    cluster = Cluster(bed, tmp_path, producer_host=a,
                      consumers={"c1": (b, "g1"), "c2": (c, "g1")}, count=N, rate=RATE)
    c1_log = cluster.logs["c1"]
    everyone = (PRODUCER, "c1", "c2")
    try:
        cluster.start_all()
        cluster.wait_members("g1", {"c1", "c2"}, DISCOVERY_TIMEOUT_S,
                             "c1 and c2 in g1 at the producer (mDNS)")
        cluster.go()

        # c1's share of the stream is the share of partitions rendezvous hashing gives it
        # (1 of 8 at worst, as the cluster picks the ids: ~62 msgs/s at 500 msgs/s), so a
        # few dozen messages prove its data path without letting the stream run far before
        # the partition.
        def c1_busy() -> bool:
            cluster.check_running(*everyone)
            return c1_log.poll() >= C1_BUSY_MESSAGES
        wait_until(c1_busy, 30.0, what=f"c1 to handle {C1_BUSY_MESSAGES} messages")

        bed.partition(b)
        cluster.wait_members("g1", {"c2"}, 10.0, "the producer to declare partitioned c1 dead")

        # Long enough that a connection left to TCP would be deep in retransmission
        # backoff (RTO 0.2 s doubling: ~6 s and more by now).
        cut_at = time.monotonic()

        def long_enough() -> bool:
            cluster.check_running(*everyone)
            return time.monotonic() - cut_at >= PARTITION_S
        wait_until(long_enough, PARTITION_S + 10, what=f"a {PARTITION_S:g}s partition")
        progress_at_heal = cluster.progress_index()
        assert progress_at_heal < N - 1 - 2 * RATE, "the stream is nearly over: make it longer"
        bed.heal(b)
        c1_mark = c1_log.poll()
        cluster.wait_members("g1", {"c1", "c2"}, RETURN_TIMEOUT_S,
                             "healed c1 to be a member of g1 again")
        live_at = time.monotonic()

        def c1_fresh() -> bool:
            cluster.check_running(*everyone)
            c1_log.poll()
            return any(e[0] > progress_at_heal for e in c1_log.entries[c1_mark:])
        wait_until(c1_fresh, FRESH_TIMEOUT_S, interval=0.05,
                   what="healed c1 to handle messages published after the healing")
        stalled_s = time.monotonic() - live_at
        print(f"\nstalled data path: c1 live again, first new message {stalled_s:.1f}s later")

        cluster.wait_producer_done(FINISH_TIMEOUT_S)
        cluster.wait_all_logged()
        cluster.terminate_consumers()
        figures, reports = cluster.summary("test_healed_member_gets_data_promptly")
        record_figures(figures)
        cluster.assert_complete(reports)
    except BaseException:
        cluster.dump_on_failure("test_healed_member_gets_data_promptly")
        raise
    if stalled_s > FRESH_WITHIN_S:
        raise DataPathStalled(f"c1 was a live member of g1 for {stalled_s:.1f}s before it got "
                              f"a new message (limit {FRESH_WITHIN_S:g}s)")
