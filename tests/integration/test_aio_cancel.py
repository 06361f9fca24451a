"""zmesh.aio under cancellation: a cancelled call leaves nothing running behind it."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from collections.abc import Callable

import pytest

import zmesh
import zmesh.aio
from tests.integration.test_aio import COMMON, run


async def underway(what: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait, one loop step at a time, until ``what()`` says a call's thread got there:
    the task that awaits that call has not had its result yet (that takes the loop two
    more steps)."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            pytest.fail("the call's thread never got there")
        await asyncio.sleep(0)


def test_a_start_cancelled_midway_leaves_no_node_running(tmp_path, mesh_name):
    # A cancelled ``async with`` calls no __aexit__: the node its start went on to make
    # (in its thread) ran on with nobody to close it, its IO thread, sockets and data
    # dir held until the process ended.
    def io_thread() -> bool:
        return any(t.name == "zmesh-io-p" for t in threading.enumerate())

    async def main() -> None:
        async def enter() -> None:
            async with zmesh.aio.Node("p", mesh=mesh_name, data_dir=str(tmp_path / "p"), **COMMON):
                pytest.fail("the start was cancelled: the block never runs")

        entering = asyncio.create_task(enter())
        await underway(io_thread)
        entering.cancel()
        with pytest.raises(asyncio.CancelledError):
            await entering
        assert not io_thread()
        # The data dir is free again: a node opens it at once.
        async with zmesh.aio.Node("p", mesh=mesh_name, data_dir=str(tmp_path / "p"), **COMMON):
            pass

    run(main())


def test_a_replay_cancelled_midway_leaves_no_reader_open(tmp_path, mesh_name):
    # The reader its thread went on to make held a ZeroMQ context and sockets that
    # nobody could close (the garbage collector did, with a ResourceWarning).
    topics = {"t": zmesh.TopicConfig(retention_s=600)}
    node = zmesh.aio.Node(
        "p", mesh=mesh_name, data_dir=str(tmp_path / "p"), topics=topics, **COMMON
    )

    async def main() -> None:
        await node.start()
        opening = asyncio.create_task(node.replay("t", 0))
        await underway(lambda: len(node.sync._readers))
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            run(main())
            gc.collect()  # (what nobody holds any more is let go of now)
        assert [str(w.message) for w in caught] == []
        assert [r for r in node.sync._readers if not r.closed] == []
    finally:
        node.sync.close()
