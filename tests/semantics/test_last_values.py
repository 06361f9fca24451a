"""Values kept per key (TopicConfig.keep_last): what is kept and reclaimed, across a
restart, with expiry, and what a last_per_key subscription and Node.last get."""

from __future__ import annotations

from pathlib import Path

import zmesh
from tests.conftest import LOOPBACK, fetched, wait_until
from tests.integration.test_delivery import drain
from tests.semantics.test_subjects import take


def payloads(msgs: list[zmesh.Message]) -> list[bytes]:
    return sorted(m.payload for m in msgs)


def keyed(prod: zmesh.Node, topic: str, rounds: int, keys: list[str | None]) -> None:
    """``rounds`` messages ``KEY:N`` of every key, stored."""
    for n in range(rounds):
        for key in keys:
            prod.publish(topic, f"{key}:{n}".encode(), key=key).wait_stored(5)


def test_the_latest_n_of_every_key_are_kept_and_the_rest_reclaimed(make_node) -> None:
    prod = make_node("prod", topics={"meters.>": zmesh.TopicConfig(keep_last=2)})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("meters.*", "g")
    wait_until(lambda: any(p["subscriptions"] for p in prod.peers()), what="the group")
    keyed(prod, "meters.a", 5, ["k0", "k1", None])  # (no key: one key of its own)
    drain(sub, 15)
    wait_until(lambda: prod.status()["outbox"] == 0, what="every message acked")
    kept = [b"k0:3", b"k0:4", b"k1:3", b"k1:4", b"None:3", b"None:4"]
    assert payloads(prod.last("meters.*")) == sorted(kept)
    assert payloads(cons.last("meters.a")) == sorted(kept)  # (from a peer, the same)
    # The others went once no group owed them.
    wait_until(lambda: prod.stats().get("retention_reclaimed") == 9, what="the older values")
    assert prod.last("other.>") == []
    msg = prod.last("meters.a")[0]
    assert (msg.topic, msg.attempt, msg.group) == ("meters.a", 0, None)
    msg.ack()  # (settles nothing)


def test_kept_values_survive_a_restart_and_go_on(make_node, tmp_path: Path, mesh_name: str):
    topics = {"meters.>": zmesh.TopicConfig(keep_last=1)}
    data = tmp_path / "prod"
    prod = make_node("prod", topics=topics, data_dir=str(data))
    keyed(prod, "meters.a", 3, ["k0", "k1"])
    prod.close()
    again = zmesh.Node(
        "prod", mesh=mesh_name, data_dir=str(data), interfaces=LOOPBACK, mdns=False, topics=topics
    ).start()
    try:
        assert payloads(again.last("meters.a")) == [b"k0:2", b"k1:2"]
        keyed(again, "meters.a", 1, ["k1"])
        assert payloads(again.last("meters.>")) == [b"k0:2", b"k1:0"]
    finally:
        again.close()


def test_expired_values_are_not_given(make_node) -> None:
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(keep_last=1)})
    prod.publish("t", b"short", key="a", ttl=0.2).wait_stored(5)
    prod.publish("t", b"long", key="b", ttl=600).wait_stored(5)
    wait_until(lambda: payloads(prod.last("t")) == [b"long"], what="the short one to expire")


def test_the_first_group_learned_gets_the_unclaimed_backlog_each_once(make_node) -> None:
    """Messages published before any group was known go to the first group learned; the
    kept values among them are owed once, not again as kept values."""
    prod = make_node("prod", topics={"prices.>": zmesh.TopicConfig(keep_last=1)})
    keyed(prod, "prices.eu", 4, [f"s{i}" for i in range(20)])
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    subs = [c.subscribe("prices.*", "board", deliver="last_per_key") for c in (c1, c2)]
    got = take(subs, 80)
    wait_until(lambda: prod.status()["outbox"] == 0, what="every message acked")
    assert len({m.id for m in got}) == len(got) == 80
    assert all(sub.get(timeout=0.2) is None for sub in subs)


def test_a_group_learned_later_gets_only_the_kept_values(make_node) -> None:
    prod = make_node("prod", topics={"prices.>": zmesh.TopicConfig(keep_last=1)})
    first = make_node("first", seeds=[prod.control_address])
    everything = first.subscribe("prices.>", "archive")
    wait_until(lambda: any(p["subscriptions"] for p in prod.peers()), what="the archive")
    keyed(prod, "prices.eu", 4, [f"s{i}" for i in range(10)])
    drain(everything, 40)
    late = make_node("late", seeds=[prod.control_address])
    board = late.subscribe("prices.*", "board", deliver="last_per_key")
    got = fetched(board, 10)
    assert payloads(got) == sorted(f"s{i}:3".encode() for i in range(10))
    for m in got:
        m.ack()
    prod.publish("prices.eu", b"s0:4", key="s0")
    [live] = fetched(board, 1)
    assert live.payload == b"s0:4"
    assert board.get(timeout=0.3) is None  # nothing more: no value twice


def test_a_page_of_values_counts_keys_and_headers_against_what_the_asker_takes(make_node) -> None:
    # A page was cut at 1 MiB of payloads only: 1,000 values with the largest keys and
    # headers a message may have made a reply past the 64 MiB the asker's socket takes,
    # dropped, and that producer's values were all left out.
    prod = make_node("prod", topics={"big.>": zmesh.TopicConfig(keep_last=1)})
    cons = make_node("cons", seeds=[prod.control_address])
    wait_until(lambda: cons.peers(), what="the producer known")
    headers = {"h": "x" * ((64 << 10) - 16)}
    receipts = [
        prod.publish("big.a", b"%d" % i, key=f"{i:04d}" + "k" * 4092, headers=headers)
        for i in range(1000)
    ]
    for r in receipts:
        r.wait_stored(30)
    got = cons.last("big.>", timeout=30)
    assert sorted(m.payload for m in got) == sorted(b"%d" % i for i in range(1000))
