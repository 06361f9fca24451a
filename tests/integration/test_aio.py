"""The asyncio twin on real nodes."""

from __future__ import annotations

import asyncio
import math

import pytest

import zmesh
import zmesh.aio
from tests.conftest import LOOPBACK


def test_async_publish_subscribe_and_ack(tmp_path, mesh_name):
    async def main() -> list[bytes]:
        common = dict(mesh=mesh_name, interfaces=LOOPBACK, mdns=False,
                      heartbeat_interval_s=0.2, dead_after_s=1.5)
        async with zmesh.aio.Node("p", data_dir=str(tmp_path / "p"), **common) as prod:  # noqa: SIM117 - c seeds from p
            async with zmesh.aio.Node("c", data_dir=str(tmp_path / "c"),
                                      seeds=[prod.control_address], **common) as cons:
                sub = cons.subscribe("t", group="g")
                receipts = [await prod.publish("t", str(i).encode()) for i in range(50)]
                got = []
                async for msg in sub:
                    got.append(msg.payload)
                    msg.ack()
                    if len(got) == 50:
                        break
                for r in receipts:
                    await r.wait_acked(10)
                assert await sub.get(timeout=0.1) is None
                await sub.close()
                return got

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert sorted(int(p) for p in got) == list(range(50))


def test_async_replay_reads_retained_history(tmp_path, mesh_name):
    async def main() -> tuple[list[bytes], list[int], int]:
        common = dict(mesh=mesh_name, interfaces=LOOPBACK, mdns=False,
                      heartbeat_interval_s=0.2, dead_after_s=1.5)
        topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=600)}
        async with zmesh.aio.Node("p", data_dir=str(tmp_path / "p"), topics=topics,
                                  **common) as prod:
            receipt = await prod.publish("t", b"first")
            await receipt.wait_stored(5)
            await (await prod.publish("t", b"second")).wait_stored(5)
            async with await prod.replay("t", 0, follow=False) as reader:
                got = [msg async for msg in reader]
            return [m.payload for m in got], [m.index for m in got], reader.gaps

    payloads, indexes, gaps = asyncio.run(asyncio.wait_for(main(), 30))
    assert payloads == [b"first", b"second"] and indexes == [0, 1] and gaps == 0


def test_async_get_refuses_a_timeout_that_is_not_a_number(tmp_path, mesh_name):
    async def main() -> None:
        async with zmesh.aio.Node("c", data_dir=str(tmp_path / "c"), mesh=mesh_name,
                                  interfaces=LOOPBACK, mdns=False) as node:
            sub = node.subscribe("t", group="g")
            with pytest.raises(zmesh.ArgumentError, match="must be a number of seconds"):
                await sub.get(timeout=math.nan)  # (spun on the event loop before)
            assert await sub.get(timeout=0) is None
            await sub.close()

    asyncio.run(asyncio.wait_for(main(), 30))
