"""Fixtures of the integration tests."""

from __future__ import annotations

import os
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


@pytest.fixture(autouse=True)
def own_cli_settings(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI children of a test read no contexts and no ZMESH_* variables of the user
    running the tests: a config dir of their own (XDG_CONFIG_HOME), nothing set."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    for name in [n for n in os.environ if n.startswith("ZMESH_")]:
        monkeypatch.delenv(name)
