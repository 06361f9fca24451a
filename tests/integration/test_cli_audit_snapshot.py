"""``zmesh snapshot`` and ``zmesh store salvage`` stopped while they copy, as real
processes on a real store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import zmesh
from tests.conftest import reap, spawn, wait_until
from tests.integration.test_cli import CLI

PAYLOAD_BYTES = 4 << 20
MESSAGES = 75  # (a store of ~300 MiB: its copy lasts well past the signal)


def big_data_dir(make_node: Callable[..., zmesh.Node]) -> str:
    """The data dir of a closed node whose store holds ~300 MiB: a copy of it lasts
    well past a signal sent as it starts."""
    node = make_node("big", max_message_bytes=PAYLOAD_BYTES)
    node.topic("big", groups=["g"])
    payload = os.urandom(PAYLOAD_BYTES)
    for receipt in [node.publish("big", payload) for _ in range(MESSAGES)]:
        receipt.wait_stored(60)
    node.close()
    return node.config.data_dir


def stop_once_writing(args: list[str], written: Path, sig: signal.Signals) -> tuple[int, str]:
    """Run the CLI with ``args``, send it ``sig`` once it wrote ``written``: its exit
    code and stderr."""
    proc = spawn([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(written.exists, 60, what="the copy to start", interval=0.002)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        reap(proc)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_snapshot_stopped_midway_leaves_no_partial_store(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], sig: signal.Signals
) -> None:
    """A snapshot stopped by a signal while it copies removes what it wrote (as a copy
    that fails does), rather than leave a truncated store in DEST that a restore would
    start from and that makes the next snapshot into DEST refuse."""
    dest = tmp_path / "copy" / "of"
    code, err = stop_once_writing(
        ["snapshot", big_data_dir(make_node), str(dest)], dest / "store" / "data.mdb", sig
    )
    assert code == 128 + sig, err
    assert "interrupted" in err
    assert not (tmp_path / "copy").exists(), list((tmp_path / "copy").rglob("*"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_salvage_stopped_midway_leaves_no_partial_store(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], sig: signal.Signals
) -> None:
    """A salvage stopped midway removes the store it was writing: left, it is a sound
    store with part of the records, which a node started on it (as salvage's own words
    advise) would take for all of them."""
    dest = tmp_path / "salvaged" / "dir"
    code, err = stop_once_writing(
        ["store", "salvage", big_data_dir(make_node), str(dest)], dest / "store" / "data.mdb", sig
    )
    assert code == 128 + sig, err
    assert "interrupted" in err
    assert not (tmp_path / "salvaged").exists(), list((tmp_path / "salvaged").rglob("*"))


def test_salvage_into_a_store_leaves_that_store_alone(
    tmp_path: Path, make_node: Callable[..., zmesh.Node]
) -> None:
    """A salvage refused because DEST holds a store removes nothing of it."""
    data_dir = big_data_dir(make_node)
    done = subprocess.run(
        [sys.executable, *CLI, "store", "salvage", data_dir, data_dir],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert b"holds a store already" in done.stderr
    assert (Path(data_dir) / "store" / "data.mdb").stat().st_size > MESSAGES * PAYLOAD_BYTES
