"""zmesh.aio objects awaited from one event loop after another (each ``asyncio.run``)."""

from __future__ import annotations

import zmesh
import zmesh.aio
from tests.integration.test_aio import COMMON, run


def test_a_replay_reader_goes_on_in_the_next_event_loop(tmp_path, mesh_name):
    # Its fetching thread handed batches to the loop of its first step only: once that
    # loop was closed, the thread ended on the error and the next loop waited for good.
    topics = {"t": zmesh.TopicConfig(retention_s=600, partitions=1)}
    node = zmesh.aio.Node(
        "p", mesh=mesh_name, data_dir=str(tmp_path / "p"), topics=topics, **COMMON
    )

    async def first() -> tuple[zmesh.aio.ReplayReader, bytes]:
        await node.start()
        await (await node.publish("t", b"old")).wait_stored(5)
        reader = await node.replay("t", 0)
        return reader, (await reader.__anext__()).payload

    async def then(reader: zmesh.aio.ReplayReader) -> list[bytes]:
        await (await node.publish("t", b"new")).wait_stored(5)
        got = [(await reader.__anext__()).payload]
        await node.close()
        got += [m.payload async for m in reader]  # (closed with its node: it ends)
        return got

    try:
        reader, old = run(first())
        assert old == b"old"
        assert run(then(reader), timeout=10) == [b"new"]
    finally:
        node.sync.close()
