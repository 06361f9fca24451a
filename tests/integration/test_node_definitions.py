"""Node definitions: subscriptions with handlers from TOML, and the metrics endpoint."""

from __future__ import annotations

import asyncio
import pathlib
import textwrap
import urllib.request

import pytest

import zmesh
import zmesh.aio
from tests.conftest import wait_members, wait_until

RECEIVED: list[bytes] = []


def record(msg: zmesh.Message) -> None:
    """A handler named in a node definition."""
    RECEIVED.append(msg.payload)


def _handled_by(tmp_path, mesh_name, handler: str, node: str = "", sub: str = "") -> pathlib.Path:
    """A worker's definition: a subscription to orders in group billing, by ``handler``
    (``node``, ``sub``: more lines of its [node] table and of the subscription's)."""
    path = tmp_path / "worker.toml"
    path.write_text(
        textwrap.dedent(f"""
        [node]
        name = "worker"
        mesh = "{mesh_name}"
        data_dir = "{tmp_path / "worker"}"
        interfaces = ["127.0.0.1"]
        mdns = false
        {node}

        [subscriptions.orders]
        topic = "orders"
        group = "billing"
        handler = "{handler}"
        {sub}
    """)
    )
    return path


def test_toml_subscription_with_handler_and_metrics(tmp_path, mesh_name, make_node):
    RECEIVED.clear()
    path = _handled_by(
        tmp_path,
        mesh_name,
        "tests.integration.test_node_definitions:record",
        node='metrics_address = "127.0.0.1:0"',
        sub="concurrency = 2",
    )
    prod = make_node("prod")
    worker = zmesh.Node.from_toml(path)
    worker.start()
    try:
        prod_seeded = make_node("prod2", seeds=[worker.control_address])
        wait_members(prod_seeded, "orders", "billing", 1)
        rs = [prod_seeded.publish("orders", f"o{i}".encode()) for i in range(20)]
        for r in rs:
            r.wait_acked(10)
        assert sorted(RECEIVED) == sorted(f"o{i}".encode() for i in range(20))
        body = (
            urllib.request.urlopen(f"http://{worker.metrics_address}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert 'zmesh_events_total{event="acked_local",mesh="' in body
        assert "zmesh_peers" in body and 'node="worker"' in body
    finally:
        worker.close()
    assert prod.peers() == []  # never seeded: only prod2 met the worker


@pytest.mark.parametrize(
    "table, match",
    [
        ('[subscriptions.x]\ntopic = "t"\ngroup = "g"\n', "needs handler"),
        ('[subscriptions.x]\ntopic = "t"\ngroup = "g"\nhandler = "nocolon"\n', "module:function"),
        (
            '[subscriptions.x]\ntopic = "t"\ngroup = "g"\nhandler = "no.such.mod:f"\n',
            "cannot import",
        ),
    ],
)
def test_bad_subscription_definitions(tmp_path, table, match):
    path = tmp_path / "n.toml"
    path.write_text(
        f'[node]\nname = "n"\ndata_dir = "{tmp_path / "n"}"\n'
        'interfaces = ["127.0.0.1"]\nmdns = false\n' + table
    )
    with pytest.raises(zmesh.ConfigError, match=match) as err:
        node = zmesh.Node.from_toml(path).start()
        node.start()
        node.close()  # (only if it started after all: it is not left running)
    if match != "cannot import":
        assert str(path) in str(err.value) and "subscriptions.x" in str(err.value)
    # A failed start leaves the data dir free for the next try.
    zmesh.Node("n2", data_dir=str(tmp_path / "n"), mdns=False).close()


async def record_later(msg: zmesh.Message) -> None:
    """A coroutine handler named in a node definition."""
    await asyncio.sleep(0)
    RECEIVED.append(msg.payload)


def test_a_coroutine_handler_in_a_definition_runs_on_the_aio_nodes_loop(
    tmp_path, mesh_name, make_node
):
    # Called in a handler thread, its coroutine was dropped and the message acked unseen.
    RECEIVED.clear()
    path = _handled_by(tmp_path, mesh_name, "tests.integration.test_node_definitions:record_later")

    async def main() -> None:
        async with zmesh.aio.Node.from_toml(path) as worker:
            prod = make_node("prod", seeds=[worker.control_address])
            wait_members(prod, "orders", "billing", 1)
            receipts = [prod.publish("orders", f"o{i}".encode()) for i in range(5)]
            for r in receipts:
                await asyncio.to_thread(r.wait_acked, 10)

    asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(RECEIVED) == [f"o{i}".encode() for i in range(5)]


def test_a_sync_node_refuses_a_coroutine_handler(tmp_path, mesh_name):
    path = _handled_by(tmp_path, mesh_name, "tests.integration.test_node_definitions:record_later")
    with pytest.raises(zmesh.ConfigError, match="does not await: use zmesh.aio.Node"):
        zmesh.Node.from_toml(path).start()
    node = zmesh.Node("n", data_dir=str(tmp_path / "worker"), mdns=False)  # (left free)
    try:

        class Later:
            async def __call__(self, msg: zmesh.Message) -> None: ...

        for handler in (record_later, Later()):
            with pytest.raises(zmesh.ArgumentError, match="does not await"):
                node.subscribe("t", group="g", handler=handler)
            with pytest.raises(zmesh.ArgumentError, match="does not await"):
                node.serve("q", "g", handler)
    finally:
        node.close()


def test_a_handler_that_returns_a_coroutine_is_nacked_not_acked(make_node):
    # Not a coroutine function by its definition, so only what it returns tells.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",), max_attempts=1)})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", handler=lambda m: record_later(m))
    wait_members(prod, "t", "g", 1)
    r = prod.publish("t", b"x")
    r.wait_acked(10)
    assert r.outcomes == {"g": zmesh.Outcome.DEAD_LETTERED}
    assert sub.handler_errors == 1 and sub.handled == 0


COUNTER = iter(range(1_000_000))


def reading() -> bytes:
    """A producer's source named in a node definition."""
    return b"%d" % next(COUNTER)


def ignore(msg: zmesh.Message) -> None:
    """A handler named in a node definition: acks."""


def test_a_relay_gets_every_message_a_producer_of_its_node_publishes(tmp_path, mesh_name):
    # The producer's first message comes at once, with another group of its topic known
    # (so it is not held for the first group to come): the relay's group is owed it too.
    RECEIVED.clear()
    me = "tests.integration.test_node_definitions"
    for run in range(5):  # (fresh data dirs: each first message is a first)
        path = tmp_path / f"sensor-{run}.toml"
        path.write_text(
            textwrap.dedent(f"""
            [node]
            name = "sensor-{run}"
            mesh = "{mesh_name}-{run}"
            data_dir = "{tmp_path / f"sensor-{run}"}"
            interfaces = ["127.0.0.1"]
            mdns = false

            [producers.sensor]
            topic = "readings"
            source = "{me}:reading"
            interval_s = 0.01
            count = 3

            [relays.clean]
            from_topic = "readings"
            to_topic = "readings.clean"
            group = "relay"

            [subscriptions.raw]
            topic = "readings"
            group = "raw"
            handler = "{me}:ignore"

            [subscriptions.clean]
            topic = "readings.clean"
            group = "cleaned"
            handler = "{me}:record"
        """)
        )
        node = zmesh.Node.from_toml(path).start()
        try:
            want = 3 * (run + 1)
            wait_until(lambda want=want: len(RECEIVED) == want, what=f"run {run}'s messages")
        finally:
            node.close()
    assert len(set(RECEIVED)) == 15
