"""NATS JetStream, the worker side (nats-py, asyncio): what a user would write instead.

One stream with file storage and interest retention (a message is kept until the
declared consumer acked it, as zmesh keeps it until each declared group did) and one
durable pull consumer, the group. Both roles declare them (idempotent), so either may
start first, and the group exists before anything is published.

- ``nats_producer``: ``js.publish_async`` per message (its acknowledgements awaited in the
  background, at most 4,000 outstanding: nats-py's default), then every acknowledgement
  awaited. JetStream has no batch publish here; the batch scenario differs on the consumer.
- ``nats_consumer``: ``fetch`` of up to ``batch`` messages, each acked with ``msg.ack()``
  (``api`` "each", explicit acks) or the batch's last one acking all (``api`` "batch", the
  consumer's ack policy ``all``); paced (latency) runs fetch one at a time, since a fetch
  of many waits for the rest of its batch. The end is confirmed with a flush (a PING the
  server answers after every ack before it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._peerio import RETRY_S, Tally, check, pace
from ._wio import Commands, cpu_s, emit, payload, rss_mb, stamped

STREAM, SUBJECT, DURABLE = "BENCH", "bench", "g"
FETCH_TIMEOUT_S = 0.5  # a fetch that finds nothing returns to check for a stop
T = TypeVar("T")


async def _retrying(
    attempt: Callable[[], Awaitable[T]], retry: bool, deadline: float, cmds: Commands
) -> T:
    while True:
        try:
            return await attempt()
        except Exception:
            if not retry:
                raise
        check(cmds, deadline, "reaching the NATS server")
        await asyncio.sleep(RETRY_S)


async def _declare(js: Any, api: str) -> None:
    from nats.js.api import (
        AckPolicy,
        ConsumerConfig,
        RetentionPolicy,
        StorageType,
        StreamConfig,
    )

    await js.add_stream(
        StreamConfig(
            name=STREAM,
            subjects=[SUBJECT],
            storage=StorageType.FILE,
            retention=RetentionPolicy.INTEREST,
        )
    )
    ack = AckPolicy.ALL if api == "batch" else AckPolicy.EXPLICIT
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=DURABLE, ack_policy=ack))


async def _connect(p: dict[str, Any], cmds: Commands, deadline: float) -> Any:
    """A connection; with ``retry``, once the server listens (nats-py's own connect waits
    its reconnect delay, 2 s, after a refused attempt: the port is tried first)."""
    import nats

    host, port = p["url"].rsplit("/", 1)[1].split(":")

    async def listening() -> None:
        _, writer = await asyncio.open_connection(host, int(port))
        writer.close()
        await writer.wait_closed()

    async def attempt() -> Any:
        return await nats.connect(p["url"], allow_reconnect=False, connect_timeout=1)

    retry = p.get("retry", False)
    if retry:
        await _retrying(listening, retry, deadline, cmds)
    return await _retrying(attempt, retry, deadline, cmds)


async def _publish(js: Any, count: int, rate: float, deadline: float, cmds: Commands) -> None:
    body, publish = payload(), js.publish_async
    if rate:
        wait = pace(rate)
        for _ in range(count):
            check(cmds, deadline, "paced publishing")
            await asyncio.sleep(wait())
            await publish(SUBJECT, stamped())
        return
    for i in range(count):
        if not i % 1024:
            check(cmds, deadline, "publishing")
        await publish(SUBJECT, body)


async def _confirmed(js: Any, deadline: float) -> None:
    """Every publish acknowledged by the server (stored)."""
    await asyncio.wait_for(js.publish_async_completed(), max(0.001, deadline - time.monotonic()))


async def _producer(p: dict[str, Any], cmds: Commands) -> None:
    deadline = time.monotonic() + p["deadline_s"]
    nc = await _connect(p, cmds, deadline)
    try:
        js = nc.jetstream()
        await _declare(js, p["api"])
        emit("ready")
        rate = p.get("rate", 0.0)
        if p["warmup"]:
            await _publish(js, p["warmup"], rate, deadline, cmds)
            await _confirmed(js, deadline)
            emit("warmed")
            await asyncio.to_thread(cmds.wait, "go", p["deadline_s"])
        t0, cpu0 = time.monotonic(), cpu_s()
        await _publish(js, p["count"], rate, deadline, cmds)
        t_published = time.monotonic()
        await _confirmed(js, deadline)
        emit(
            "sent",
            t0=t0,
            t_published=t_published,
            t_confirmed=time.monotonic(),
            rss_mb=rss_mb(),
            cpu_s=cpu_s() - cpu0,
        )
        await asyncio.to_thread(cmds.wait_stop, p["deadline_s"])
    finally:
        await nc.close()


async def _consumer(p: dict[str, Any], cmds: Commands) -> None:
    import nats.errors

    t_start = time.monotonic()
    deadline = t_start + p["deadline_s"]
    emit("started", t=t_start)
    nc = await _connect(p, cmds, deadline)
    try:
        js = nc.jetstream()

        async def bind() -> Any:
            await _declare(js, p["api"])
            return await js.pull_subscribe(SUBJECT, durable=DURABLE, stream=STREAM)

        sub = await _retrying(bind, p.get("retry", False), deadline, cmds)
        emit("ready", t_subscribed=time.monotonic())
        tally = Tally(p)
        batch = 1 if tally.latency else p["batch"]
        each = p["api"] != "batch"
        while not tally.finished and not cmds.stopping:
            check(cmds, deadline, "consuming")
            try:
                msgs = await sub.fetch(tally.wanted(batch), timeout=FETCH_TIMEOUT_S)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            tally.took(m.data for m in msgs)
            if each:
                for m in msgs:
                    await m.ack()
            else:
                await msgs[-1].ack()
            if tally.confirms(len(msgs)):
                await nc.flush(timeout=30)
            tally.acked(len(msgs))
        tally.result(start_s=time.monotonic() - t_start)
        await asyncio.to_thread(cmds.wait_stop, p["deadline_s"])
    finally:
        await nc.close()


def nats_producer(p: dict[str, Any], cmds: Commands) -> None:
    asyncio.run(_producer(p, cmds))


def nats_consumer(p: dict[str, Any], cmds: Commands) -> None:
    asyncio.run(_consumer(p, cmds))


ROLES = {"nats_producer": nats_producer, "nats_consumer": nats_consumer}
