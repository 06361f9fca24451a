"""Fixtures of the netns fault tests: the namespace hosts and the run's figures.

The tests need root (they make network namespaces, veth pairs and a bridge); where that is
not possible they skip, saying why. Whatever a test makes it removes: node processes are
killed by pid and namespaces deleted by name in the fixtures' finalizers, pass or fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from .cluster import Figures
from .hosts import HostNet, NetnsUnavailable, check_netns_available, existing_namespaces

_FIGURES: list[Figures] = []


@pytest.fixture(scope="session")
def netns_available() -> None:
    """Skip (with the reason) where network namespaces cannot be made."""
    try:
        check_netns_available()
    except NetnsUnavailable as exc:
        pytest.skip(f"netns fault tests skipped: {exc}")


@pytest.fixture
def make_hostnet(netns_available: None) -> Iterator[Callable[..., HostNet]]:
    """``make_hostnet(n, neighbours=False)``: n hosts on a bridge (with permanent neighbour
    entries between them); all of it removed after the test."""
    beds: list[HostNet] = []

    def make(count: int, neighbours: bool = False) -> HostNet:
        bed = HostNet(count, neighbours=neighbours)
        beds.append(bed)  # before create(): a half-built host network is removed too
        return bed.create()

    yield make
    problems = []
    names = []
    for bed in reversed(beds):
        names += [bed.hub, *(h.netns for h in bed.hosts)]
        problems += bed.close()
    left = set(names) & existing_namespaces()
    assert not problems and not left, (
        f"host network teardown: {problems}; namespaces left: {sorted(left)}"
    )


@pytest.fixture
def record_figures() -> Callable[[Figures], None]:
    """Keep a test's figures for the summary printed at the end of the run."""
    return _FIGURES.append


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("netns fault figures")
        for fig in _FIGURES:
            terminalreporter.write_line(fig.line())
