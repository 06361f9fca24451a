"""The asyncio twin of request/reply and last values on real nodes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import zmesh
import zmesh.aio
from tests.integration.test_aio import COMMON, pair, run


async def serving(node: zmesh.aio.Node, topic: str, count: int = 1) -> None:
    """Wait until ``node`` sees ``count`` live peers subscribing ``topic``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        peers = await node.peers()
        if (
            sum(p["alive"] and any(s[0] == topic for s in p["subscriptions"]) for p in peers)
            >= count
        ):
            return
        await asyncio.sleep(0.02)  # (a poll interval, as tests.waiting.until's)
    pytest.fail(f"{count} subscribers of {topic} never came")


def test_async_request_reply_with_a_coroutine_server(tmp_path, mesh_name):
    async def main() -> None:
        async with pair(tmp_path, mesh_name, ("s", "c")) as (server, client):
            with pytest.raises(zmesh.NoRespondersError):
                await client.request("calib.l4", b"?")

            async def answer(msg: zmesh.Message) -> bytes:
                await asyncio.sleep(0)  # (it runs on the loop)
                return msg.payload.upper()

            sub = server.serve("calib.*", "svc", answer)
            await serving(client, "calib.*")
            replies = await asyncio.gather(
                *(client.request("calib.l4", f"q{i}") for i in range(20))
            )
            assert sorted(r.payload for r in replies) == sorted(f"Q{i}".encode() for i in range(20))
            assert [r.payload for r in await client.request_many("calib.l1", b"x")] == [b"X"]
            release = threading.Event()
            server.serve("slow", "svc", lambda msg: b"late" if release.wait(5) else None)
            await serving(client, "slow")
            start = time.monotonic()
            with pytest.raises(zmesh.TimeoutError):
                await client.request("slow", b"?", timeout=0.3)
            assert time.monotonic() - start < 2.0
            release.set()
            await sub.close()

    run(main())


def test_async_last_values(tmp_path, mesh_name):
    async def main() -> None:
        topics = {"m.>": zmesh.TopicConfig(keep_last=1)}
        async with zmesh.aio.Node(
            "p", mesh=mesh_name, data_dir=str(tmp_path / "p"), topics=topics, **COMMON
        ) as prod:
            for i in range(3):
                r = await prod.publish("m.a", f"v{i}".encode(), key="k")
                await r.wait_stored(5)
            [value] = await prod.last("m.*")
            assert (value.topic, value.key, value.payload) == ("m.a", "k", b"v2")

    run(main())
