"""The asyncio twin on real nodes: every method round-trips, waits ride the loop (no
thread per await), cancelled waits leave nothing behind, and close() ends every wait."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import zmesh
import zmesh.aio
from tests.conftest import LOOPBACK

COMMON = dict(interfaces=LOOPBACK, mdns=False, heartbeat_interval_s=0.2, dead_after_s=1.5)


def run(main: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(main, timeout))


async def members(prod: zmesh.aio.Node, topic: str, lane: str, count: int = 1) -> None:
    """Wait until ``prod`` sees ``count`` live members of ``topic``/``lane``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for ln in (await prod.status())["lanes"]:
            if ln["topic"] == topic and ln["lane"] == lane and len(ln["members"]) == count:
                return
        await asyncio.sleep(0.02)  # (a poll interval, as tests.waiting.until's)
    pytest.fail(f"{count} members of {topic}/{lane} never joined")


@contextlib.asynccontextmanager
async def pair(
    tmp_path: Path, mesh_name: str, names: tuple[str, str] = ("p", "c"), **producer: Any
) -> AsyncIterator[tuple[zmesh.aio.Node, zmesh.aio.Node]]:
    """A producer node (``producer``: its settings) and a consumer node seeded with it."""
    first, second = names
    async with (
        zmesh.aio.Node(
            first, mesh=mesh_name, data_dir=str(tmp_path / first), **COMMON, **producer
        ) as prod,
        zmesh.aio.Node(
            second,
            mesh=mesh_name,
            data_dir=str(tmp_path / second),
            seeds=[prod.control_address],
            **COMMON,
        ) as cons,
    ):
        yield prod, cons


def test_async_publish_subscribe_and_ack(tmp_path, mesh_name):
    async def main() -> list[bytes]:
        async with pair(tmp_path, mesh_name) as (prod, cons):
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

    got = run(main())
    assert sorted(int(p) for p in got) == list(range(50))


def test_the_issue_35_hang_returns_at_once(tmp_path, mesh_name):
    # A wait_acked that times out (a group is owed the message, nobody acks it) used to
    # leave a worker thread blocked in the sync wait, and asyncio.run never returned.
    async def main() -> None:
        async with zmesh.aio.Node(
            "p",
            mesh=mesh_name,
            data_dir=str(tmp_path / "p"),
            topics={"t": zmesh.TopicConfig(groups=("g",))},
            **COMMON,
        ) as node:
            r = await node.publish("t", b"x")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r.wait_acked(), 0.5)
            with pytest.raises(zmesh.TimeoutError, match="not acknowledged within 0.2s"):
                await r.wait_acked(0.2)

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 10  # (it hung for good before)


def test_cancelled_waits_hold_no_thread_and_take_nothing(tmp_path, mesh_name):
    async def main() -> tuple[int, int, zmesh.Message | None]:
        async with pair(
            tmp_path,
            mesh_name,
            topics={"t": zmesh.TopicConfig(groups=("g",))},
            max_outbox_messages=1,
        ) as (prod, cons):
            r = await prod.publish("t", b"unacked")  # fills the outbox: nobody consumes t
            await r.wait_stored(5)
            sub = cons.subscribe("u", group="g")
            threads_before = threading.active_count()
            tasks = [asyncio.create_task(r.wait_acked()) for _ in range(100)]
            tasks += [asyncio.create_task(sub.get()) for _ in range(100)]
            tasks += [asyncio.create_task(sub.fetch(10)) for _ in range(50)]
            tasks += [
                asyncio.create_task(prod.publish("t", b"no room", timeout=math.inf))
                for _ in range(50)
            ]
            await asyncio.sleep(0.2)  # (every task reaches its await)
            assert not any(t.done() for t in tasks)
            waiting_threads = threading.active_count() - threads_before
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            cancelled = sum(isinstance(x, asyncio.CancelledError) for x in results)
            # A message published now (by the consumer's node, to its own subscription)
            # reaches the one get left: no cancelled get or fetch took it.
            await members(cons, "u", "g")
            await cons.publish("u", b"after")
            msg = await sub.get(timeout=10)
            assert msg is not None
            msg.ack()
            return waiting_threads, cancelled, msg

    started = time.monotonic()
    waiting_threads, cancelled, msg = asyncio.run(main())
    assert time.monotonic() - started < 20
    assert waiting_threads == 0  # 300 pending awaits, no thread for any of them
    assert cancelled == 300
    assert msg is not None and msg.payload == b"after" and msg.attempt == 1


def test_a_full_outbox_is_waited_for_on_the_loop(tmp_path, mesh_name):
    async def main() -> None:
        async with pair(
            tmp_path,
            mesh_name,
            topics={"t": zmesh.TopicConfig(groups=("g",))},
            max_outbox_messages=1,
        ) as (prod, cons):
            await (await prod.publish("t", b"one")).wait_stored(5)
            with pytest.raises(zmesh.OutboxFullError, match="within 0.1s"):
                await prod.publish("t", b"two", timeout=0.1)
            waiting = asyncio.create_task(prod.publish("t", b"two", timeout=30))
            sub = cons.subscribe("t", group="g")
            first = await sub.get(timeout=10)
            assert first is not None and not waiting.done()
            first.ack()  # makes room: the waiting publish goes in
            second = await asyncio.wait_for(waiting, 10)
            msg = await sub.get(timeout=10)
            assert msg is not None and msg.payload == b"two"
            # A batch given as a generator waits too: tried again, it is still whole.
            many = asyncio.create_task(
                prod.publish_many("t", (b"gen%d" % i for i in range(2)), timeout=30)
            )
            await asyncio.sleep(0.1)  # (refused once at least: the outbox holds "two")
            assert not many.done()
            msg.ack()
            await (await asyncio.wait_for(many, 10)).wait_stored(10)
            got = [await sub.get(timeout=10) for _ in range(2)]
            assert [m.payload for m in got if m is not None] == [b"gen0", b"gen1"]
            sub.ack_many(m for m in got if m is not None)
            await second.wait_acked(10)

    run(main())


def test_close_ends_every_wait_with_node_closed_error(tmp_path, mesh_name):
    async def main() -> list[BaseException | None]:
        node = zmesh.aio.Node(
            "p",
            mesh=mesh_name,
            data_dir=str(tmp_path / "p"),
            topics={"t": zmesh.TopicConfig(groups=("g",))},
            **COMMON,
        )
        await node.start()
        r = await node.publish("t", b"x")
        sub = node.subscribe("u", group="g")

        async def iterate() -> None:
            async for _msg in sub:
                pass

        tasks = [
            asyncio.create_task(c) for c in (r.wait_acked(), sub.get(), sub.fetch(5), iterate())
        ]
        await asyncio.sleep(0.1)  # (every task reaches its await)
        await node.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(zmesh.NodeClosedError):
            await node.publish("t", b"y")
        return results

    for result in run(main()):
        assert isinstance(result, zmesh.NodeClosedError), result


def test_a_subscription_closed_on_its_own_ends_async_for(tmp_path, mesh_name):
    async def main() -> list[Any]:
        async with zmesh.aio.Node(
            "c", mesh=mesh_name, data_dir=str(tmp_path / "c"), **COMMON
        ) as node:
            async with node.subscribe("t", group="g") as sub:
                waiting = asyncio.create_task(sub.get())
                got: list[Any] = []

                async def iterate() -> None:
                    got.extend([m async for m in sub])

                iterating = asyncio.create_task(iterate())
                await asyncio.sleep(0.1)
            return [await waiting, await iterating, got, sub.closed]

    assert run(main()) == [None, None, [], True]


def test_every_method_round_trips(tmp_path, mesh_name):
    path = tmp_path / "c.toml"
    path.write_text(f"""
[node]
name = "c"
mesh = "{mesh_name}"
data_dir = "{tmp_path / "c"}"
interfaces = ["127.0.0.1"]
mdns = false
heartbeat_interval_s = 0.2
""")

    async def main() -> None:
        topics = {"t": zmesh.TopicConfig(retention_s=600, max_attempts=1, partitions=2)}
        async with zmesh.aio.Node(
            "p", mesh=mesh_name, data_dir=str(tmp_path / "p"), topics=topics, **COMMON
        ) as prod:
            defined = zmesh.aio.Node.from_toml(path)
            assert defined.name == "c" and defined.config.data_dir == str(tmp_path / "c")
            await defined.close()  # (never started: its store is let go)
            async with zmesh.aio.Node(
                "c2",
                mesh=mesh_name,
                data_dir=str(tmp_path / "c2"),
                seeds=[prod.control_address],
                **COMMON,
            ) as cons:
                assert cons.name == "c2" and cons.config.mesh == mesh_name
                assert len(cons.id) == 32 and cons.metrics_address is None
                assert cons.topic("out", partitions=4).partitions == 4
                sub = cons.subscribe("t", group="g")
                await members(prod, "t", "g")
                # publish with every option, publish_many
                r = await prod.publish(
                    "t", "text", key="k1", headers={"h": "v"}, priority=3, ttl=60, msg_id="once"
                )
                assert r.topic == "t" and r.count == 1 and r.ids == [r.id]
                await r.wait_stored(5)
                assert r.stored
                msg = await sub.get(timeout=10)
                assert msg is not None and (msg.payload, msg.key, msg.headers) == (
                    b"text",
                    "k1",
                    {"h": "v"},
                )
                msg.ack()
                await r.wait_acked(10)
                await r.wait_delivered(10)
                assert r.acked and "acked" in repr(r) and r.outcomes == {"g": "acked"}
                many = await prod.publish_many("t", [b"a", b"b", b"c"], keys=["x", "y", "z"])
                batch = await sub.fetch(3, timeout=10)
                while len(batch) < 3:
                    batch += await sub.fetch(3 - len(batch), timeout=10)
                sub.ack_many(batch)
                await many.wait_acked(10)
                # a transaction: publish and ack together
                late = await prod.publish("t", b"to relay", delay=0.05)
                msg = await sub.get(timeout=10)
                assert msg is not None and msg.payload == b"to relay"
                async with cons.transaction() as tx:
                    out = await tx.publish("out", b"relayed", key="k")
                    tx.ack(msg)
                await out.wait_stored(5)
                await late.wait_acked(10)
                # dead letters: fail one, list, replay, fail again, purge
                await prod.publish("t", b"bad")
                msg = await sub.get(timeout=10)
                assert msg is not None
                msg.fail("bad record")
                letters: list[zmesh.DeadLetter] = []
                for _ in range(100):
                    letters = await prod.dead_letters("t", "g")
                    if letters:
                        break
                    await asyncio.sleep(0.05)
                assert [d.payload for d in letters] == [b"bad"]
                assert await prod.replay_dead_letters("t", "g") == 1
                again = await sub.get(timeout=10)
                assert again is not None and again.payload == b"bad"
                again.fail("still bad")
                for _ in range(100):
                    if await prod.dead_letters("t", "g"):
                        break
                    await asyncio.sleep(0.05)
                assert await prod.purge_dead_letters("t", "g") == 1
                # replay of the retained history, in index order per partition
                async with await cons.replay("t", 0, follow=False) as reader:
                    got = [m.payload async for m in reader]
                    assert reader.gaps == 0 and reader.topic == "t"
                assert sorted(got) == sorted([b"text", b"a", b"b", b"c", b"to relay", b"bad"])
                async with await cons.replay("t", 0, follow=False) as reader:
                    first = await reader.read(2)
                    assert len(first) == 2
                # groups: listed, then deleted (its member starts again, empty)
                assert [g["group"] for g in await prod.groups("t")] == ["g"]
                assert (await prod.delete_group("t", "g"))["dropped"] == 0
                # inspection
                status = await prod.status()
                assert status["node"]["name"] == "p"
                assert [p["name"] for p in await prod.peers()] == ["c2"]
                assert prod.stats()["published"] >= 6
                copy = await prod.snapshot(tmp_path / "copy")
                assert (Path(copy) / "store").is_dir()
                # a coroutine handler runs on the loop: acked when it returns
                seen: list[bytes] = []

                async def handle(m: zmesh.Message) -> None:
                    assert threading.current_thread() is threading.main_thread()
                    seen.append(m.payload)

                cons.subscribe("h", group="g", handler=handle)
                await members(prod, "h", "g")
                await (await prod.publish("h", b"handled")).wait_acked(10)
                assert seen == [b"handled"]
                await sub.close()

    run(main(), timeout=120)


def test_async_get_refuses_a_timeout_that_is_not_a_number(tmp_path, mesh_name):
    async def main() -> None:
        async with zmesh.aio.Node(
            "c", data_dir=str(tmp_path / "c"), mesh=mesh_name, interfaces=LOOPBACK, mdns=False
        ) as node:
            sub = node.subscribe("t", group="g")
            with pytest.raises(zmesh.ArgumentError, match="must be a number of seconds"):
                await sub.get(timeout=math.nan)  # (spun on the event loop before)
            assert await sub.get(timeout=0) is None
            await sub.close()

    run(main())


PAIRS = [
    (zmesh.Node, zmesh.aio.Node),
    (zmesh.Receipt, zmesh.aio.Receipt),
    (zmesh.Subscription, zmesh.aio.Subscription),
    (zmesh.Transaction, zmesh.aio.Transaction),
    (zmesh.ReplayReader, zmesh.aio.ReplayReader),
]
# Sync methods that may wait (for the IO thread, the outbox, a peer or the disk): their
# twins are coroutines. The others (topic, subscribe, stats, ack, ack_many, abort, ...)
# only queue work and stay plain methods.
WAITING = {
    "start",
    "close",
    "publish",
    "publish_many",
    "replay",
    "status",
    "peers",
    "snapshot",
    "dead_letters",
    "replay_dead_letters",
    "purge_dead_letters",
    "wait_stored",
    "wait_acked",
    "wait_delivered",
    "get",
    "fetch",
    "commit",
    "read",
    "groups",
    "delete_group",
    "request",
    "request_many",
    "last",
}


@pytest.mark.parametrize(("sync", "twin"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_the_twin_covers_the_whole_sync_api(sync: type, twin: type) -> None:
    public = {n for n in dir(sync) if not n.startswith("_")}
    missing = sorted(public - set(dir(twin)))
    assert missing == [], f"zmesh.aio.{twin.__name__} lacks {missing}"
    for name in public:
        if callable(getattr(sync, name)) and not isinstance(getattr(sync, name), type):
            is_coroutine = inspect.iscoroutinefunction(getattr(twin, name))
            assert is_coroutine == (name in WAITING), name
    for dunder in ("__aenter__", "__aexit__"):
        if hasattr(sync, "__enter__"):
            assert hasattr(twin, dunder), f"zmesh.aio.{twin.__name__} has no {dunder}"
    if hasattr(sync, "__iter__"):
        assert hasattr(twin, "__aiter__") and hasattr(twin, "__anext__")


def test_async_replay_follows_new_messages_and_close_ends_its_thread(tmp_path, mesh_name):
    async def main() -> list[bytes]:
        topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=600)}
        async with zmesh.aio.Node(
            "p", mesh=mesh_name, data_dir=str(tmp_path / "p"), topics=topics, **COMMON
        ) as prod:
            await (await prod.publish("t", b"old")).wait_stored(5)
            reader = await prod.replay("t", 0)
            got = [(await reader.__anext__()).payload]
            step = asyncio.create_task(reader.__anext__())
            await asyncio.sleep(0.1)
            step.cancel()  # a cancelled step loses nothing: the next one gets the message
            with pytest.raises(asyncio.CancelledError):
                await step
            await prod.publish("t", b"new")
            got.append((await asyncio.wait_for(reader.__anext__(), 10)).payload)
            # (the node's close ends the reader and its thread)
        return got

    assert run(main()) == [b"old", b"new"]
    assert not [t for t in threading.enumerate() if t.name.startswith("zmesh-aio-replay")]


def test_async_replay_read_refuses_a_count_before_taking_a_message(tmp_path, mesh_name):
    async def main() -> list[bytes]:
        topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=600)}
        async with zmesh.aio.Node(
            "p", mesh=mesh_name, data_dir=str(tmp_path / "p"), topics=topics, **COMMON
        ) as prod:
            await (await prod.publish_many("t", [b"a", b"b"])).wait_stored(5)
            async with await prod.replay("t", 0, follow=False) as reader:
                for bad in (0, -1, "2", None):
                    with pytest.raises(zmesh.ArgumentError, match="max_messages must be an int"):
                        await reader.read(bad)  # type: ignore[arg-type]
                got = [m.payload for m in await reader.read(10)]
                return got + [m.payload async for m in reader]

    assert run(main()) == [b"a", b"b"]


def test_handlers_that_return_awaitables_are_awaited_on_the_loop(tmp_path, mesh_name):
    # An object with an async __call__, and a plain function that returns a coroutine,
    # are not coroutine functions: what they return is what tells.
    seen: list[bytes] = []

    async def record(m: zmesh.Message) -> None:
        assert threading.current_thread() is threading.main_thread()
        seen.append(m.payload)

    class Record:
        async def __call__(self, m: zmesh.Message) -> None:
            await record(m)

    async def main() -> None:
        async with pair(tmp_path, mesh_name) as (prod, cons):
            cons.subscribe("a", group="g", handler=Record())
            cons.subscribe("b", group="g", handler=lambda m: record(m))
            await members(prod, "a", "g")
            await members(prod, "b", "g")
            for topic in ("a", "b"):
                await (await prod.publish(topic, topic.encode())).wait_delivered(10)

    run(main())
    assert sorted(seen) == [b"a", b"b"]


def test_a_coroutine_handler_may_close_its_subscription_or_its_node(tmp_path, mesh_name):
    # Its handler thread waits for the coroutine, and close() waits for handler threads:
    # not for the one its own call is made for (as a plain handler's close does not).
    async def main() -> list[bytes]:
        seen: list[bytes] = []
        async with pair(tmp_path, mesh_name) as (prod, cons):
            holder: dict[str, zmesh.aio.Subscription] = {}
            done = asyncio.Event()

            async def close_sub(m: zmesh.Message) -> None:
                seen.append(m.payload)
                await holder["sub"].close()
                done.set()

            holder["sub"] = cons.subscribe("a", group="g", handler=close_sub)
            await members(prod, "a", "g")
            await prod.publish("a", b"sub")
            await asyncio.wait_for(done.wait(), 10)
            assert holder["sub"].closed
            done.clear()

            async def close_node(m: zmesh.Message) -> None:
                seen.append(m.payload)
                await cons.close()
                done.set()

            cons.subscribe("b", group="g", handler=close_node)
            await members(prod, "b", "g")
            await prod.publish("b", b"node")
            await asyncio.wait_for(done.wait(), 10)
        return seen

    assert run(main()) == [b"sub", b"node"]
