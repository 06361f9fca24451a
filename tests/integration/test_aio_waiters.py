"""zmesh.aio with thousands of receipts awaited at once: each await is resumed when its
own receipt changed, not at every notification of the node."""

from __future__ import annotations

import asyncio
from typing import Any

import zmesh
import zmesh.aio
from tests.integration.test_aio import COMMON, run


def test_receipts_awaited_by_thousands_are_not_each_woken_by_every_notification(
    tmp_path, mesh_name
):
    # Every notification of the IO thread (each store, each ack) resumed every pending
    # receipt wait on the loop to ask again: with 2,000 acks awaited, each publish and
    # wait_stored of the same loop cost thousands of task steps (some 30 times slower).
    waiters = 2000

    async def main() -> tuple[int, int]:
        async with zmesh.aio.Node(
            "p",
            mesh=mesh_name,
            data_dir=str(tmp_path / "p"),
            topics={"t": zmesh.TopicConfig(groups=("g",))},  # (nobody acks: waits go on)
            **COMMON,
        ) as node:
            receipts = [await node.publish("t", b"%d" % i) for i in range(waiters)]
            await receipts[-1].wait_stored(10)
            waiting = [asyncio.create_task(r.wait_acked()) for r in receipts]
            await asyncio.sleep(0)  # (each reaches its await)
            loop = asyncio.get_running_loop()
            made = 0
            create_future = loop.create_future

            def counted() -> asyncio.Future[Any]:
                nonlocal made
                made += 1
                return create_future()

            loop.create_future = counted  # type: ignore[method-assign]
            rounds = 100
            try:
                for i in range(rounds):  # (each one notification at least: its store)
                    await (await node.publish("u", b"%d" % i)).wait_stored(10)
            finally:
                del loop.create_future
            assert not any(w.done() for w in waiting)
            for w in waiting:
                w.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            return made, rounds

    made, rounds = run(main())
    assert made < 10 * rounds, f"{made} futures made on the loop in {rounds} round trips"
