"""Fault-test fixtures: figures of crash runs, printed at the end of the test run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

_LINES: list[str] = []


@pytest.fixture
def record_summary() -> Callable[[str], None]:
    """Keep a line of a crash run's figures for the summary at the end of the run."""
    return _LINES.append


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LINES:
        terminalreporter.section("crash recovery figures")
        for line in _LINES:
            terminalreporter.write_line(line)
