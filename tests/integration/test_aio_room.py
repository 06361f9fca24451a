"""zmesh.aio publishes waiting for outbox room: many at once, each tried in its turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import zmesh
import zmesh.aio
from tests.integration.test_aio import members, pair, run


def test_many_publishes_waiting_for_room_go_in_in_order_each_tried_in_its_turn(tmp_path, mesh_name):
    # Every notification of the IO thread (an ack, a store) woke every publish waiting
    # for room and each tried again: with thousands waiting, the loop spent its time on
    # refusals (quadratic), its consumers starved, and publishes ran out of time with
    # OutboxFullError while the outbox drained; those that got in did so in any order.
    count = 1000

    async def main() -> tuple[list[bytes], int]:
        async with pair(
            tmp_path,
            mesh_name,
            topics={"t": zmesh.TopicConfig(groups=("g",), partitions=1)},
            max_outbox_messages=10,
        ) as (prod, cons):
            sub = cons.subscribe("t", group="g")
            await members(prod, "t", "g")
            tries = 0
            publish = prod.sync.publish

            def counted(*args: Any, **kw: Any) -> zmesh.Receipt:
                nonlocal tries
                tries += 1
                return publish(*args, **kw)

            prod.sync.publish = counted  # type: ignore[method-assign]
            got: list[bytes] = []

            async def consume() -> None:
                async for msg in sub:
                    got.append(msg.payload)
                    msg.ack()
                    if len(got) == count:
                        return

            consuming = asyncio.create_task(consume())
            receipts = await asyncio.gather(
                *(prod.publish("t", b"%d" % i, timeout=60) for i in range(count))
            )
            await asyncio.wait_for(consuming, 60)
            for r in receipts:
                await r.wait_acked(10)
            await sub.close()
            return got, tries

    got, tries = run(main(), timeout=120)
    assert got == [b"%d" % i for i in range(count)]  # (one partition: in publish order)
    assert tries < 5 * count, f"{tries} tries for {count} publishes"


def test_a_publish_leaving_the_line_passes_its_turn_on(tmp_path, mesh_name):
    async def main() -> list[bytes]:
        async with pair(
            tmp_path,
            mesh_name,
            topics={"t": zmesh.TopicConfig(groups=("g",), partitions=1)},
            max_outbox_messages=1,
        ) as (prod, cons):
            await (await prod.publish("t", b"first")).wait_stored(5)
            head = asyncio.create_task(prod.publish("t", b"cancelled", timeout=60))
            second = asyncio.create_task(prod.publish("t", b"timed out", timeout=0.2))
            third = asyncio.create_task(prod.publish("t", b"last", timeout=60))
            await asyncio.sleep(0)  # (each queued in the line, in that order)
            head.cancel()
            with pytest.raises(zmesh.OutboxFullError, match="within 0.2s"):
                await second
            assert not third.done()
            sub = cons.subscribe("t", group="g")
            got = []
            for _ in range(2):
                msg = await sub.get(timeout=10)
                assert msg is not None
                got.append(msg.payload)
                msg.ack()
            await (await asyncio.wait_for(third, 10)).wait_acked(10)
            assert head.cancelled()
            await sub.close()
            return got

    assert run(main()) == [b"first", b"last"]
