"""Transactions: acks of messages nothing settles (an ephemeral subscription's, a replay
reader's), large transactions, commit or abort inside the ``with`` block."""

from __future__ import annotations

import asyncio

import pytest

import zmesh
import zmesh.aio
from tests.conftest import LOOPBACK, fetched, wait_until


def test_a_transaction_acks_an_ephemeral_subscriptions_message(make_node):
    """tx.ack said "message ... was not received by this node" (ArgumentError) of a
    message this node's own ephemeral subscription had just received."""
    src = make_node("src")
    xf = make_node("xf", seeds=[src.control_address])
    sub = xf.subscribe("a")  # no group: ephemeral
    wait_until(lambda: any(p["subscriptions"] for p in src.peers()), what="the subscription")
    src.publish("a", b"in")
    [msg] = fetched(sub, 1)
    with pytest.raises(RuntimeError), xf.transaction() as tx:
        tx.ack(msg)
        raise RuntimeError("transform failed")
    assert not msg.settled  # (aborted: still the application's)
    with xf.transaction() as tx:
        receipt = tx.publish("b", b"out")
        tx.ack(msg)
        assert not msg.settled
    assert msg.settled
    receipt.wait_stored(5)
    with pytest.raises(zmesh.MessageStateError):
        msg.ack()


def test_a_transaction_acks_a_replay_readers_message(make_node):
    node = make_node("solo", topics={"t": zmesh.TopicConfig(partitions=1, retention_s=600)})
    node.publish("t", b"old").wait_stored(5)
    with node.replay("t", follow=False) as reader:
        [msg] = list(reader)
    tx = node.transaction()
    tx.ack(msg)
    with pytest.raises(zmesh.MessageStateError, match="transaction"):
        msg.ack()
    tx.commit()  # (nothing else in it: nothing to store)
    assert msg.settled


def test_a_transaction_of_more_payload_bytes_than_publishers_may_run_ahead_commits(make_node):
    """Each tx.publish reserved its bytes against what publishers may run ahead of the IO
    thread (4 MiB), and a transaction's publishes reach the IO thread only when it
    commits: the second of two 3 MiB publishes waited for room its own first one held,
    then raised OutboxFullError ("outbox holds 1 unacknowledged messages (limit
    1000000)")."""
    node = make_node("tx", publish_timeout_s=2.0, topics={"t": zmesh.TopicConfig(groups=("g",))})
    with node.transaction(timeout=10) as tx:
        receipts = [tx.publish("t", bytes([65 + i]) * (3 << 20)) for i in range(3)]
    receipts[-1].wait_stored(5)
    assert node.status()["outbox"] == 3
    node.publish("t", b"after").wait_stored(5)  # (its room was given back at the commit)


def test_a_transaction_committed_or_aborted_inside_its_with_block_ends_quietly(make_node):
    """Leaving the block committed again: a block that had committed (and stored all of
    it) raised NodeStateError "already committed or aborted", so a caller that retries
    what raised stored everything twice; one that had aborted raised the same."""
    node = make_node("tx", topics={"t": zmesh.TopicConfig(groups=("g",))})
    with node.transaction() as tx:
        receipt = tx.publish("t", b"committed")
        tx.commit()
    receipt.wait_stored(5)
    with node.transaction() as tx:
        aborted = tx.publish("t", b"aborted")
        tx.abort()
    with pytest.raises(zmesh.NodeStateError, match="aborted"):
        aborted.wait_stored(5)
    with pytest.raises(zmesh.NodeStateError, match="already committed"):
        tx.commit()  # (called again outside the block: still refused)
    assert node.status()["outbox"] == 1


def test_an_async_transaction_committed_inside_its_block_ends_quietly(tmp_path, mesh_name):
    async def main() -> None:
        async with zmesh.aio.Node(
            "tx",
            mesh=mesh_name,
            data_dir=str(tmp_path / "tx"),
            interfaces=LOOPBACK,
            mdns=False,
            topics={"t": zmesh.TopicConfig(groups=("g",))},
        ) as node:
            async with node.transaction() as tx:
                receipt = await tx.publish("t", b"committed")
                await tx.commit()
            await receipt.wait_stored(5)
            async with node.transaction() as tx:
                await tx.publish("t", b"aborted")
                tx.abort()
            assert (await node.status())["outbox"] == 1

    asyncio.run(asyncio.wait_for(main(), 60))
