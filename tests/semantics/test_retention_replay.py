"""Retention and replay: message indexes, readers from an index, reclamation, restarts."""

from __future__ import annotations

import subprocess
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

import zmesh
from tests.conftest import LOOPBACK, kill_9_when, spawn, wait_members, wait_until
from tests.integration.test_delivery import drain

KEYS = [f"key-{i}" for i in range(10)]


def by_partition(msgs: list[zmesh.Message]) -> dict[tuple[str, int], list[zmesh.Message]]:
    out: dict[tuple[str, int], list[zmesh.Message]] = defaultdict(list)
    for m in msgs:
        out[(m.id.producer, m.partition)].append(m)
    return out


def consume_all(prod: zmesh.Node, cons: zmesh.Node, topic: str, n: int) -> list[zmesh.Message]:
    """Receive and ack ``n`` messages as group g, and wait until prod settled them."""
    sub = cons.subscribe(topic, group="g")
    msgs = drain(sub, n)
    wait_until(lambda: prod.status()["outbox"] == 0, what="every message acked")
    return msgs


def live_peers(node: zmesh.Node, count: int) -> None:
    wait_until(
        lambda: sum(p["alive"] for p in node.peers()) >= count,
        what=f"{count} live peers of {node.name}",
    )


def test_replay_from_zero_returns_acked_messages_in_order_from_every_producer(make_node):
    topics = {"t": zmesh.TopicConfig(partitions=4, retention_s=600, groups=("g",))}
    p1 = make_node("p1", topics=topics)
    p2 = make_node("p2", topics=topics)
    cons = make_node("cons", seeds=[p1.control_address, p2.control_address])
    receipts = [
        prod.publish_many(
            "t", [f"{prod.name}-{i}" for i in range(40)], keys=[KEYS[i % 10] for i in range(40)]
        )
        for prod in (p1, p2)
    ]
    sub = cons.subscribe("t", group="g")
    received = drain(sub, 80)  # acked
    for receipt in receipts:
        receipt.wait_acked(10)
    assert p1.status()["outbox"] == 0 and p2.status()["outbox"] == 0
    # Consumers see the index too: per producer and partition 0, 1, 2, ...
    for msgs in by_partition(received).values():
        assert sorted(m.index for m in msgs) == list(range(len(msgs)))

    live_peers(cons, 2)
    with cons.replay("t", follow=False) as reader:
        replayed = list(reader)
    assert reader.gaps == 0 and reader.closed
    assert len(replayed) == 80
    assert {m.id for m in replayed} == {m.id for m in received}
    for (_producer, partition), msgs in by_partition(replayed).items():
        assert [m.index for m in msgs] == list(range(len(msgs)))
        # Index order is publish order within a partition.
        assert [m.id.seq for m in msgs] == sorted(m.id.seq for m in msgs)
        assert all(m.topic == "t" and m.group is None and m.partition == partition for m in msgs)
        assert all(m.payload.decode().startswith(("p1-", "p2-")) for m in msgs)
    assert {m.key for m in replayed} == set(KEYS)
    # Readers do not ack and do not touch groups: ack a replayed message of each producer,
    # then one new message each through the group. Acks to a producer travel in order, so
    # once the new ones are settled anything the replayed acks sent was handled first.
    acked_before = {p.name: p.stats()["acked"] for p in (p1, p2)}
    local_before = cons.stats().get("acked_local", 0)
    for prod in (p1, p2):
        next(m for m in replayed if m.id.producer == prod.id).ack()
    fresh = [prod.publish("t", f"{prod.name}-new".encode()) for prod in (p1, p2)]
    assert sorted(m.payload for m in drain(sub, 2)) == [b"p1-new", b"p2-new"]
    for receipt in fresh:
        receipt.wait_acked(10)
    assert {p.name: p.stats()["acked"] - acked_before[p.name] for p in (p1, p2)} == {
        "p1": 1,
        "p2": 1,
    }
    assert cons.stats().get("acked_local", 0) - local_before == 2
    assert sub.fetch(10, timeout=0) == []


def test_replay_from_a_middle_index_and_of_some_partitions(make_node):
    topics = {"t": zmesh.TopicConfig(partitions=2, retention_s=600, groups=("g",))}
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    prod.publish_many("t", [str(i) for i in range(30)], keys=[KEYS[i % 10] for i in range(30)])
    received = consume_all(prod, cons, "t", 30)
    counts = {p: len(ms) for (_, p), ms in by_partition(received).items()}
    assert set(counts) == {0, 1}

    with prod.replay("t", 4, follow=False) as reader:
        replayed = list(reader)
    assert reader.gaps == 0
    parts = by_partition(replayed)
    for (_, partition), msgs in parts.items():
        assert [m.index for m in msgs] == list(range(4, counts[partition]))
    assert len(replayed) == sum(n - 4 for n in counts.values())

    with prod.replay("t", 1, follow=False, partitions=[1]) as reader:
        only = list(reader)
    assert {m.partition for m in only} == {1}
    assert [m.index for m in only] == list(range(1, counts[1]))

    with prod.replay("t", 10_000, follow=False) as reader:
        assert list(reader) == []


def test_follow_sees_history_then_messages_published_later(make_node):
    topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=600, groups=("g",))}
    prod = make_node("prod", topics=topics)
    reader_node = make_node("reader", seeds=[prod.control_address])
    cons = make_node("cons", seeds=[prod.control_address])
    prod.publish_many("t", [f"old-{i}" for i in range(5)])
    consume_all(prod, cons, "t", 5)
    live_peers(reader_node, 1)

    with reader_node.replay("t", 0, batch_size=2) as reader:
        history = [next(reader) for _ in range(5)]
        assert [m.payload for m in history] == [f"old-{i}".encode() for i in range(5)]
        prod.publish_many("t", [f"new-{i}" for i in range(5)])
        later = [next(reader) for _ in range(5)]
    assert [m.payload for m in later] == [f"new-{i}".encode() for i in range(5)]
    assert [m.index for m in history + later] == list(range(10))
    assert reader.closed and list(reader) == []


def test_a_following_reader_goes_on_after_its_producer_restarts(make_node, tmp_path: Path):
    topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=600)}
    prod = make_node("prod", topics=topics)
    reader_node = make_node("reader", seeds=[prod.control_address])
    prod.publish_many("t", ["a", "b"]).wait_stored(5)
    live_peers(reader_node, 1)
    with reader_node.replay("t") as reader:
        assert [next(reader).payload for _ in range(2)] == [b"a", b"b"]
        prod.close()
        # Restarted on new ephemeral ports: the reader finds it again through its node.
        prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
        prod.publish_many("t", ["c", "d"]).wait_stored(5)
        later = [next(reader) for _ in range(2)]
    assert [(m.index, m.payload) for m in later] == [(2, b"c"), (3, b"d")]
    assert reader.gaps == 0


def test_without_retention_nothing_is_kept_for_replay_and_the_gap_is_reported(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(partitions=1, groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    prod.publish_many("t", [f"acked-{i}" for i in range(3)])
    sub_msgs = consume_all(prod, cons, "t", 3)
    cons.close()  # the group has no member now: what follows stays owed
    prod.publish_many("t", ["owed-0", "owed-1"]).wait_stored(5)
    with prod.replay("t", follow=False) as reader:
        replayed = list(reader)
    assert replayed == []
    assert reader.gaps == 5
    assert reader.gap_ranges == [(prod.id, 0, 0, 5)]
    assert [m.index for m in sub_msgs] == [0, 1, 2]
    assert prod.stats().get("retention_reclaimed", 0) == 0


def test_a_reader_gets_no_payload_larger_than_it_accepts_and_the_gap_is_reported(make_node):
    # The reader's node accepts 64 KiB: the producer leaves the larger message out of its
    # fetch reply and the reader counts its index as a gap. (Sent, a reply this large is
    # past the frames the reader takes: its connection was reset and the producer taken
    # for unreachable.)
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(partitions=1, retention_s=600)})
    reader_node = make_node("reader", seeds=[prod.control_address], max_message_bytes=64 << 10)
    prod.publish_many("t", [b"a", b"L" * (3 << 20), b"c"]).wait_stored(5)
    live_peers(reader_node, 1)
    with reader_node.replay("t", follow=False) as reader:
        replayed = list(reader)
    assert [m.payload for m in replayed] == [b"a", b"c"]
    assert [m.index for m in replayed] == [0, 2]
    assert reader.gaps == 1 and reader.gap_ranges == [(prod.id, 0, 1, 2)]
    assert reader.unreachable == set()
    assert prod.stats()["refused_oversized"] == 1


def test_retention_by_time_reclaims_and_a_replay_reports_the_gap(make_node):
    topics = {"t": zmesh.TopicConfig(partitions=1, retention_s=0.5, groups=("g",))}
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    prod.publish_many("t", [f"early-{i}" for i in range(5)])
    consume_all(prod, cons, "t", 5)
    wait_until(
        lambda: prod.stats().get("retention_reclaimed", 0) == 5,
        what="5 messages reclaimed after their retention",
    )
    cons.close()  # what follows stays owed, so retention cannot reclaim it
    prod.publish_many("t", [f"late-{i}" for i in range(3)]).wait_stored(5)
    with prod.replay("t", 0, follow=False) as reader:
        replayed = list(reader)
    assert [m.payload for m in replayed] == [f"late-{i}".encode() for i in range(3)]
    assert [m.index for m in replayed] == [5, 6, 7]
    assert reader.gaps == 5 and reader.gap_ranges == [(prod.id, 0, 0, 5)]


def test_retention_bytes_keeps_only_the_newest(make_node):
    cap = 1000
    topics = {"t": zmesh.TopicConfig(partitions=1, retention_bytes=cap, groups=("g",))}
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    payloads = [bytes([65 + i]) * 200 for i in range(20)]
    prod.publish_many("t", payloads)
    consume_all(prod, cons, "t", 20)
    # Each stored record is the 200-byte payload plus its metadata: at most 4 fit.
    wait_until(
        lambda: prod.stats().get("retention_reclaimed", 0) >= 16,
        what="the size cap pushing the oldest out",
    )
    with prod.replay("t", follow=False) as reader:
        replayed = list(reader)
    kept = len(replayed)
    assert 1 <= kept <= 4
    assert prod.stats()["retention_reclaimed"] == 20 - kept
    assert [m.index for m in replayed] == list(range(20 - kept, 20))
    assert [m.payload for m in replayed] == payloads[20 - kept :]
    assert reader.gaps == 20 - kept


def test_memory_topics_retain_in_memory(make_node):
    topics = {
        "t": zmesh.TopicConfig(durability="memory", partitions=1, retention_s=600, groups=("g",))
    }
    prod = make_node("prod", topics=topics)
    cons = make_node("cons", seeds=[prod.control_address])
    prod.publish_many("t", [f"m-{i}" for i in range(5)])
    consume_all(prod, cons, "t", 5)
    with prod.replay("t", follow=False) as reader:
        assert [(m.index, m.payload) for m in reader] == [(i, f"m-{i}".encode()) for i in range(5)]


def test_replay_arguments_and_a_topic_nobody_produces(make_node):
    node = make_node("solo")
    for bad in (
        {"from_index": -1},
        {"from_index": 1.5},
        {"batch_size": 0},
        {"partitions": [4096]},
        {"producers": "solo"},
    ):
        with pytest.raises(zmesh.ArgumentError):
            node.replay("t", **bad)
    with pytest.raises(zmesh.ConfigError):
        node.replay("bad topic")
    with node.replay("nothing-here", follow=False) as reader:
        assert list(reader) == [] and reader.gaps == 0
    follower = node.replay("nothing-here")
    node.close()  # closes its readers too
    assert follower.closed and list(follower) == []


def test_a_read_count_that_is_no_int_of_one_or_more_is_refused_taking_nothing(make_node):
    """read(0) and read(-1) took a message; read("2") and read(None) took one and then
    raised TypeError, the message lost to the reader."""
    node = make_node("solo", topics={"t": zmesh.TopicConfig(partitions=1, retention_s=600)})
    node.publish_many("t", [b"a", b"b", b"c"]).wait_stored(5)
    with node.replay("t", follow=False) as reader:
        for bad in (0, -1, "2", None, 1.5, True):
            with pytest.raises(zmesh.ArgumentError, match="max_messages must be an int >= 1"):
                reader.read(bad)  # type: ignore[arg-type]
        assert [m.payload for m in reader.read(10)] == [b"a", b"b", b"c"]


CHILD = textwrap.dedent("""
    import sys, zmesh
    mesh, data_dir, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    node = zmesh.Node("prod", mesh=mesh, data_dir=data_dir, interfaces=["127.0.0.1"],
                      mdns=False, heartbeat_interval_s=0.2, dead_after_s=1.5,
                      topics={"t": zmesh.TopicConfig(partitions=2, retention_s=3600,
                                                     groups=("g",))})
    node.start()
    sub = node.subscribe("t", group="g")
    receipt = node.publish_many("t", [f"before-{i}" for i in range(count)],
                                keys=[f"k{i % 7}" for i in range(count)])
    got = 0
    while got < count:
        msgs = sub.fetch(count, timeout=10)
        for m in msgs:
            m.ack()
        got += len(msgs)
    receipt.wait_acked(30)
    # Unacked ones too: these stay in the outbox and must survive the kill as well.
    sub.close()
    node.publish_many("t", ["owed-0", "owed-1"], keys=["k0", "k1"]).wait_stored(10)
    print("ready", flush=True)
    sys.stdin.read()  # until killed, or until the test's end closes the pipe
""")


def test_indexes_continue_and_retained_messages_survive_kill_9(
    make_node, tmp_path: Path, mesh_name: str
):
    data_dir = tmp_path / "prod"
    kill_9_when(
        spawn(
            ["-c", CHILD, mesh_name, str(data_dir), "30"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        ),
        b"ready",
    )

    topics = {"t": zmesh.TopicConfig(partitions=2, retention_s=3600, groups=("g",))}
    prod = make_node("prod", data_dir=str(data_dir), topics=topics)
    assert prod.status()["outbox"] == 2  # retained messages are not the outbox
    prod.publish_many(
        "t", [f"after-{i}" for i in range(10)], keys=[f"k{i % 7}" for i in range(10)]
    ).wait_stored(10)
    with prod.replay("t", follow=False) as reader:
        replayed = list(reader)
    assert reader.gaps == 0
    assert len(replayed) == 42
    payloads = [m.payload.decode() for m in replayed]
    assert sum(p.startswith("before-") for p in payloads) == 30
    assert sum(p.startswith("owed-") for p in payloads) == 2
    for msgs in by_partition(replayed).values():
        # No index reused: every index once, in order, the old ones before the new ones.
        assert [m.index for m in msgs] == list(range(len(msgs)))
        kinds = [m.payload.decode().split("-")[0] for m in msgs]
        assert kinds == sorted(kinds, key=["before", "owed", "after"].index)

    # The owed messages still reach their group after the restart, with their indexes.
    cons = make_node("cons", seeds=[prod.control_address], interfaces=LOOPBACK)
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    got = drain(sub, 12)
    owed = {m.payload: m.index for m in got if m.payload.startswith(b"owed-")}
    replayed_owed = {m.payload: m.index for m in replayed if m.payload.startswith(b"owed-")}
    assert owed == replayed_owed
