"""The scale harness at a small size: a mesh of namespace hosts holds with no false death,
notices a kill and a restart; a shared group's partitions are spread within one of the
fair share and move, while a producer publishes, with no loss and each key in order.

The figures of the large runs (64 and 96 nodes, 16 members over 64 partitions) come from
the same code run by hand (``python -m tests.faults.netns.scale``); see
docs/performance.md. Times are printed, not asserted: what is asserted is what must hold
on any machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .hosts import HostNet
from .scale import mesh_run
from .spread import spread_run

NODES = 6
HOLD_S = 15.0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_small_mesh_holds_and_notices_a_kill_and_a_restart(
    tmp_path: Path, make_hostnet: Callable[..., HostNet]
) -> None:
    bed = make_hostnet(NODES, neighbours=True)
    figures = mesh_run(bed, tmp_path, seeds_only=False, hold_s=HOLD_S)
    print("\nmesh scale: " + "; ".join(figures.lines()))
    assert figures.discovery_s is not None, "the nodes never all saw each other alive"
    assert figures.false_deaths == 0 and figures.flaps == 0
    assert figures.death_noticed_s is not None, "not every node saw the killed node dead"
    assert figures.restart_back_s is not None, "not every node saw the restarted node alive"
    assert figures.counters.get("peers_dead", 0) >= NODES - 1  # (the kill, at each node)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_partitions_are_spread_and_move_in_key_order(
    tmp_path: Path, make_hostnet: Callable[..., HostNet]
) -> None:
    bed = make_hostnet(5, neighbours=True)
    figures = spread_run(
        bed, tmp_path, members=3, partitions=8, add=1, remove=1, rate=500.0, seconds=15.0
    )
    print("\npartition spread: " + "; ".join(figures.lines()))
    assert figures.assigned == [2, 3, 3]  # 8 over 3: each within one of 2.67
    assert figures.lost == 0
    assert figures.out_of_order == 0
    # a join and a leave: what the newcomer got (2 of 8), then the leaver's (2 of 8)
    assert figures.partitions_moved == 4
