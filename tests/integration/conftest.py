"""Fixtures of the integration tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Protocol

import pytest


class Child(Protocol):
    """A test's child process (test_cli.Proc, test_examples.Script)."""

    popen: subprocess.Popen


@pytest.fixture
def procs() -> Iterator[list[Child]]:
    """Every process a test starts is stopped by pid at the end, killed if it must be."""
    started: list[Child] = []
    yield started
    for p in started:
        if p.popen.stdin is not None:
            p.popen.stdin.close()
        if p.popen.poll() is None:
            p.popen.terminate()
    for p in started:
        try:
            p.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(timeout=10)
