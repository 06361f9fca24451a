"""Three namespace hosts find each other over mDNS alone (no seeds) and deliver a stream.

Host 1 runs the producer, host 2 a consumer of group g1, host 3 one of group g2. Each node
binds and speaks mDNS on its host's eth0 only; nobody is given a seed, so every peer a node
knows came from an mDNS record that crossed the bridge (or from gossip by such a peer).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until

from .cluster import PRODUCER, Cluster, Figures
from .hosts import HostNet

N = 2000
RATE = 1000.0
DISCOVERY_TIMEOUT_S = 20.0
FINISH_TIMEOUT_S = 40.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mdns_discovery_across_hosts(
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
        consumers={"c1": (b, "g1"), "c2": (c, "g2")},
        count=N,
        rate=RATE,
    )
    names = (PRODUCER, "c1", "c2")
    addr = {PRODUCER: a.addr, "c1": b.addr, "c2": c.addr}
    try:
        cluster.start_all()

        # Every node sees the two others alive, at the address of their own host.
        def everyone_found() -> bool:
            cluster.check_running(*names)
            for name in names:
                status = cluster.status(name)
                if status is None:
                    return False
                seen = {p["id"]: p for p in status["peers"] if p["alive"]}
                for other in names:
                    peer = seen.get(cluster.node_id(other)) if other != name else None
                    if other != name and (
                        peer is None or not peer["control"].startswith(f"tcp://{addr[other]}:")
                    ):
                        return False
            return True

        wait_until(
            everyone_found,
            DISCOVERY_TIMEOUT_S,
            interval=0.1,
            what="every node to discover the two others over mDNS",
        )
        cluster.wait_members("g1", {"c1"}, DISCOVERY_TIMEOUT_S, "c1 in g1 at the producer")
        cluster.wait_members("g2", {"c2"}, DISCOVERY_TIMEOUT_S, "c2 in g2 at the producer")
        cluster.go()

        cluster.wait_producer_done(FINISH_TIMEOUT_S)
        cluster.wait_all_logged()
        cluster.terminate_consumers()
        figures, reports = cluster.summary("test_mdns_discovery_across_hosts")
        record_figures(figures)
        cluster.assert_complete(reports)
        for name in ("c1", "c2"):
            assert cluster.logs[name].entries, f"{name} handled nothing"
    except BaseException:
        cluster.dump_on_failure("test_mdns_discovery_across_hosts")
        raise
