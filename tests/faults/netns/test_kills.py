"""SIGKILL and restart of consumers and of the producer during a stream across hosts.

Host A runs the producer; group g1 is shared by c1 (host B) and c2 (host C); group g2 is
c3 (host D). Mid-stream c1 is SIGKILLed and restarted on its data dir (its host keeps its
address; the node comes back on new ports and is found over mDNS again). Once the restarted
c1 handles messages again, c3 is SIGKILLed: the producer declares it dead and keeps g2's
backlog while the stream goes on, until c3 is restarted. Then the producer is SIGKILLed
between two progress records and restarted on its data dir: it resumes publishing after
its last recorded index (so the indexes stored after that record are published twice,
under new ids) and redelivers its reopened outbox. The producer holds its last messages
until it has been killed, so the kill is certainly mid-stream. Every index must reach each
group; duplicates are counted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until

from .cluster import PRODUCER, Cluster, Figures
from .hosts import HostNet

N = 12_000
RATE = 800.0  # a 15 s stream
# The producer holds its last messages back until it has been killed, so it cannot finish
# first; 500 puts the hold between two progress records (every 200), as a kill lands.
HOLD_LAST = 500
DISCOVERY_TIMEOUT_S = 20.0
KILL_C1_AT = N // 5  # g1 has handled this many messages
C3_DOWN_BACKLOG = 1000  # published while g2 has no live member
KILL_PRODUCER_AT = N // 2  # the producer has recorded this index as stored
KILL_PRODUCER_LAG = 500  # ... and g2 has handled this many more since
PHASE_TIMEOUT_S = 30.0
FINISH_TIMEOUT_S = 90.0
MAX_DUPLICATE_FRACTION = 0.2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kills_during_stream(
    tmp_path: Path,
    make_hostnet: Callable[[int], HostNet],
    record_figures: Callable[[Figures], None],
) -> None:
    bed = make_hostnet(4)
    a, b, c, d = bed.hosts
    cluster = Cluster(
        bed,
        tmp_path,
        producer_host=a,
        consumers={"c1": (b, "g1"), "c2": (c, "g1"), "c3": (d, "g2")},
        count=N,
        rate=RATE,
        hold_last=HOLD_LAST,
    )
    logs = cluster.logs
    everyone = (PRODUCER, "c1", "c2", "c3")
    try:
        cluster.start_all()
        cluster.wait_members(
            "g1", {"c1", "c2"}, DISCOVERY_TIMEOUT_S, "c1 and c2 in g1 at the producer (mDNS)"
        )
        cluster.wait_members("g2", {"c3"}, DISCOVERY_TIMEOUT_S, "c3 in g2 at the producer")
        cluster.go()

        # Phase 1: kill -9 c1 while g1 is busy, restart it at once.
        def g1_busy() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            c1, c2 = len(logs["c1"].entries), len(logs["c2"].entries)
            return c1 >= 500 and c1 + c2 >= KILL_C1_AT

        wait_until(g1_busy, PHASE_TIMEOUT_S, what=f"g1 to handle {KILL_C1_AT} messages")
        cluster.kill9(
            "c1", f"after {logs['c1'].poll()} handled; producer at index {cluster.progress_index()}"
        )
        c1_lines_at_kill = len(logs["c1"].entries)
        cluster.start_consumer("c1")
        cluster.wait_started("c1")
        c1_incarnation = cluster.info("c1")["incarnation"]  # type: ignore[index]

        # Phase 2: the restarted c1 handles messages again; kill -9 c3, g2's only member:
        # once the producer has declared it dead, g2's backlog grows with nobody to take
        # it until c3 is restarted.
        def c1_back() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            return any(e[4] == c1_incarnation for e in logs["c1"].entries[c1_lines_at_kill:])

        wait_until(c1_back, PHASE_TIMEOUT_S, what="restarted c1 to handle messages")
        cluster.kill9(
            "c3", f"after {logs['c3'].poll()} handled; producer at index {cluster.progress_index()}"
        )
        cluster.wait_members("g2", set(), PHASE_TIMEOUT_S, "the producer to declare killed c3 dead")
        backlog_from = cluster.progress_index()

        def backlog_grew() -> bool:
            cluster.check_running(PRODUCER, "c1", "c2")
            return cluster.progress_index() >= backlog_from + C3_DOWN_BACKLOG

        wait_until(
            backlog_grew,
            PHASE_TIMEOUT_S,
            what=f"{C3_DOWN_BACKLOG} more messages published while g2 has no member",
        )
        c3_lines_at_kill = len(logs["c3"].entries)
        cluster.start_consumer("c3")
        cluster.wait_started("c3")
        c3_incarnation = cluster.info("c3")["incarnation"]  # type: ignore[index]

        # Phase 3: c3 handles again; kill -9 the producer mid-stream, past its half-way mark.
        def c3_back_and_half_way() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            return (
                any(e[4] == c3_incarnation for e in logs["c3"].entries[c3_lines_at_kill:])
                and cluster.progress_index() >= KILL_PRODUCER_AT
            )

        wait_until(
            c3_back_and_half_way,
            PHASE_TIMEOUT_S,
            what=f"restarted c3 handling and the producer past index {KILL_PRODUCER_AT}",
        )
        c3_mark = len(logs["c3"].entries) + KILL_PRODUCER_LAG

        def stream_moved_on() -> bool:
            cluster.check_running(*everyone)
            cluster.poll_logs()
            return len(logs["c3"].entries) >= c3_mark

        wait_until(stream_moved_on, PHASE_TIMEOUT_S, what=f"c3 to handle {c3_mark} messages")
        progress_at_kill = cluster.progress_index()
        cluster.kill9(PRODUCER, f"with index {progress_at_kill} recorded stored")
        assert progress_at_kill < N - HOLD_LAST, "the producer did not hold its last messages"
        cluster.release()  # the restarted producer publishes the rest
        cluster.start_producer()
        cluster.wait_started(PRODUCER)

        # Phase 4: the restarted producer resumes, drains its outbox and exits 0.
        cluster.wait_producer_done(FINISH_TIMEOUT_S)
        cluster.wait_all_logged()
        cluster.terminate_consumers()
        figures, reports = cluster.summary("test_kills_during_stream")
        record_figures(figures)
        cluster.assert_complete(reports)
        for group, rep in reports.items():
            assert rep["duplicates"] < MAX_DUPLICATE_FRACTION * N, (
                f"{group}: {rep['duplicates']} duplicate deliveries"
            )
    except BaseException:
        cluster.dump_on_failure("test_kills_during_stream")
        raise
