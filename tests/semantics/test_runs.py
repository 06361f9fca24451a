"""publish_many batches stored as runs: one outbox record and one pending entry per lane
for a whole batch, while each message is still owed, acked, retried and parked on its own,
also across a producer restart. Plain publish() calls staged in one loop iteration are
stored as runs too, each with its own publish time and receipt."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import zlib
from collections.abc import Iterator

import zmesh
from tests.conftest import wait_members, wait_until
from tests.integration.test_delivery import drain
from tests.waiting import until
from zmesh._engine.outbox.publishes import Stretch
from zmesh._store.damage import decode_run
from zmesh._store.store import Store, WriteBatch, pack, unpackb


def _entries(node: zmesh.Node) -> dict[str, int]:
    """Entries of the outbox's databases, read in a transaction of this thread."""
    store = node._engine.store
    with store.env.begin() as txn:
        return {
            name: txn.stat(getattr(store, name))["entries"]
            for name in ("msgs", "pend", "runs", "pruns")
        }


def _index(msg: zmesh.Message) -> int:
    return int(msg.payload)


def _receive(sub: zmesh.Subscription, count: int) -> dict[int, zmesh.Message]:
    """``count`` messages by index, not settled."""
    got: dict[int, zmesh.Message] = {}

    def more() -> bool:
        got.update((_index(m), m) for m in sub.fetch(1000, timeout=0.05))
        return len(got) >= count

    wait_until(more, what=f"{count} messages")
    return got


def test_a_batch_is_one_record_and_leaves_with_the_last_group_to_ack(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g1", "g2"))})
    r = prod.publish_many("t", [str(i).encode() for i in range(1000)])
    r.wait_stored(5)
    # runs of at most 512 messages: two records, an entry per run and group
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 2, "pruns": 4}
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    s1, s2 = c1.subscribe("t", group="g1"), c2.subscribe("t", group="g2")
    got1 = drain(s1, 1000)
    assert sorted(map(_index, got1)) == list(range(1000))
    # Without keys, one partition for the batch: the topic's first, in turn.
    assert {m.partition for m in got1} == {0}
    wait_until(lambda: _entries(prod)["pruns"] == 2, what="g1's entries of the runs deleted")
    assert _entries(prod)["runs"] == 2 and prod.status()["outbox"] == 1000
    got2 = drain(s2, 1000)
    assert sorted(map(_index, got2)) == list(range(1000))
    r.wait_acked(10)
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_large_batches_are_cut_into_runs_and_other_topics_store_messages_alone(make_node):
    topics = {
        "big": zmesh.TopicConfig(groups=("g",)),
        "kept": zmesh.TopicConfig(groups=("g",), retention_s=60),  # replay reads these
        "ram": zmesh.TopicConfig(groups=("g",), durability="memory"),
    }
    prod = make_node("prod", topics=topics)
    prod.publish_many("big", [bytes(100_000)] * 6).wait_stored(5)  # 600 kB: three runs
    prod.publish_many("kept", [b"a", b"b"]).wait_stored(5)
    prod.publish_many("ram", [b"a", b"b"]).wait_stored(5)
    prod.publish("big", b"alone").wait_stored(5)
    assert _entries(prod) == {"msgs": 3, "pend": 3, "runs": 3, "pruns": 3}


def _publish_held(
    prod: zmesh.Node, topic: str, count: int, extra: dict | None = None
) -> tuple[list[zmesh.Receipt], list[tuple]]:
    """``count`` plain publishes queued while the IO thread is held in a call, so they are
    staged together (``extra``: the keywords of one more publish after them); their
    receipts, and the time span of each publish() call."""
    receipts, spans = [], []
    with _io_held(prod):
        for i in range(count):
            before = time.time()
            receipts.append(prod.publish(topic, str(i).encode()))
            spans.append((before, time.time()))
            _clock_past(spans[-1][1])
        if extra is not None:
            prod.publish(topic, **extra)
    for r in receipts:
        r.wait_stored(5)
    return receipts, spans


def _clock_past(t: float) -> None:
    """Until the wall clock reads past ``t``: what is published next gets a later time."""
    assert until(lambda: time.time() > t, 1.0, 0.0)


@contextlib.contextmanager
def _io_held(prod: zmesh.Node) -> Iterator[None]:
    """The node's IO thread held in a call while the block runs: what the block publishes
    is staged together once it ends."""
    held, release = threading.Event(), threading.Event()

    def hold(_batch: object, _now: float) -> None:
        held.set()
        release.wait(10)

    caller = threading.Thread(target=prod._engine.queue.call, args=(hold,))
    caller.start()
    try:
        assert held.wait(5)
        yield
    finally:
        release.set()
        caller.join(10)


def _check_times(
    got: list[zmesh.Message], receipts: list[zmesh.Receipt], spans: list[tuple]
) -> None:
    """Publishes staged together (one stretch) carry the time of the first publish() call
    of them, never later than their own; each message its receipt's id."""
    first_before, first_after = spans[0]
    for msg in got:
        i = _index(msg)
        assert first_before <= msg.published_at <= first_after, (i, msg.published_at, spans)
        assert msg.published_at <= spans[i][1]
        assert msg.id == receipts[i].id


def test_publishes_of_one_loop_iteration_are_one_run_with_one_time(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g1", "g2"))})
    # The one with headers is not plain: stored alone.
    receipts, spans = _publish_held(prod, "t", 100, {"payload": b"headed", "headers": {"h": "x"}})
    assert _entries(prod) == {"msgs": 1, "pend": 2, "runs": 1, "pruns": 2}
    assert len({r.id for r in receipts}) == 100
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    s1, s2 = c1.subscribe("t", group="g1"), c2.subscribe("t", group="g2")
    for got in (drain(s1, 101), drain(s2, 101)):
        plain = [m for m in got if m.payload != b"headed"]
        assert sorted(map(_index, plain)) == list(range(100))
        _check_times(plain, receipts, spans)
    for r in receipts:
        r.wait_acked(10)
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_a_publish_staged_alone_carries_the_time_of_its_call(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    spans = []
    for i in range(3):  # (each one stored before the next: a stretch each)
        before = time.time()
        prod.publish("t", str(i).encode()).wait_stored(5)
        spans.append((before, time.time()))
        _clock_past(spans[-1][1])
    cons = make_node("cons", seeds=[prod.control_address])
    got = drain(cons.subscribe("t", group="g"), 3)
    for msg in got:
        before, after = spans[_index(msg)]
        assert before <= msg.published_at <= after
    assert len({m.published_at for m in got}) == 3


def test_batches_staged_together_are_joined_into_runs_and_keep_their_times(make_node):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g1", "g2"))})
    receipts, spans = [], []
    with _io_held(prod):
        for b in range(6):
            before = time.time()
            receipts.append(
                prod.publish_many("t", [str(i).encode() for i in range(b * 100, b * 100 + 100)])
            )
            spans.append((before, time.time()))
            _clock_past(spans[-1][1])
        # Not joined with the batches before: keys, then other headers.
        keyed = prod.publish_many("t", [b"600", b"601"], keys=["a", "b"])
        headed = prod.publish_many("t", [b"602", b"603"], headers={"h": "x"})
    for r in [*receipts, keyed, headed]:
        r.wait_stored(5)
    # Whole batches joined while they fit in one run (512 messages): 500, then the sixth
    # batch, then the keyed batch and the one with headers on their own.
    with prod._engine.store.env.begin() as txn:
        sizes = [
            len(decode_run(value)[5])  # type: ignore[index]
            for value in txn.cursor(db=prod._engine.store.runs).iternext(keys=False)
        ]
    assert sizes == [500, 100, 2, 2]
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 4, "pruns": 8}
    cons = make_node("cons", seeds=[prod.control_address])
    for group in ("g1", "g2"):
        got = drain(cons.subscribe("t", group=group), 604)
        assert sorted(map(_index, got)) == list(range(604))
        for msg in got:  # each message its own batch's time, id and partition
            i = _index(msg)
            if i < 600:
                before, after = spans[i // 100]
                assert before <= msg.published_at <= after
                assert msg.id == receipts[i // 100].ids[i % 100]
                assert msg.partition == i // 100  # (a batch's one, in turn)
        assert {m.headers.get("h") for m in got if _index(m) >= 602} == {"x"}
        assert all(not m.headers for m in got if _index(m) < 602)
        # One index per message of each partition, in publish order.
        for partition in range(16):
            mine = sorted((m.id.seq, m.index) for m in got if m.partition == partition)
            assert [index for _seq, index in mine] == list(range(len(mine)))
    for r in [*receipts, keyed, headed]:
        r.wait_acked(10)
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_publishes_stored_together_keep_their_time_and_acks_across_a_restart(make_node, tmp_path):
    topics = {"t": zmesh.TopicConfig(groups=("g",))}
    prod = make_node("prod", topics=topics)
    receipts, spans = _publish_held(prod, "t", 60)
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 1, "pruns": 1}
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=60)
    by_index = _receive(sub, 60)
    for i in range(0, 60, 2):
        by_index[i].ack()
    wait_until(lambda: prod.status()["outbox"] == 30, what="the acks settled")
    cons.close()
    prod.close()

    # Read back from LMDB: the run's entry owes the odd ones, its record has their time.
    prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
    assert prod.status()["outbox"] == 30
    other = make_node("other", seeds=[prod.control_address])
    sub = other.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    got = drain(sub, 30)
    assert sorted(map(_index, got)) == list(range(1, 60, 2))
    _check_times(got, receipts, spans)
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert sub.fetch(10, timeout=0.3) == []
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_a_restart_owes_what_was_not_acked_and_keeps_what_was_parked(make_node, tmp_path):
    # A second consumer node of the same group after the restart: anything the producer
    # sent again that was acked before would reach its handler (its dedupe window is new).
    topics = {"t": zmesh.TopicConfig(groups=("g",), retry_backoff_s=0.0)}
    prod = make_node("prod", topics=topics)
    first = prod.publish_many("t", [str(i).encode() for i in range(300)])
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=300)
    by_index = _receive(sub, 300)
    for i in range(0, 300, 3):
        by_index[i].ack()
    by_index[1].fail("bad record")
    for _ in range(2):  # message 2 nacked twice (attempts are persisted when nacked)
        by_index[2].nack(0.0)
        again = sub.get(timeout=5)
        assert again is not None and _index(again) == 2
        by_index[2] = again
    wait_until(lambda: prod.status()["outbox"] == 199, what="the acks and the fail settled")
    cons.close()
    prod.close()

    prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
    assert prod.status()["outbox"] == 199
    assert [d.id for d in prod.dead_letters("t", "g")] == [first.ids[1]]
    other = make_node("other", seeds=[prod.control_address])
    sub = other.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    got = drain(sub, 199)
    assert sorted(map(_index, got)) == [i for i in range(300) if i % 3 and i != 1]
    # Closing the subscription released what it held unsettled (a nack each, whose
    # attempt is persisted): message 2 was delivered three times, the others once.
    attempts = {_index(m): m.attempt for m in got}
    assert attempts[2] == 4 and set(attempts.values()) == {2, 4}
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert sub.fetch(10, timeout=0.3) == []
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_runs_of_a_topic_past_256_partitions_come_back_whole_after_a_restart(make_node, tmp_path):
    """Partitions past 255 (two bytes each in a run's record, a list in its entries) and
    each message's index read back after a restart as they were written: keyless
    batches a partition each in turn (joined, 260 of them, into runs of 256 blocks of one
    partition, then 4), keyed ones by their keys' hash, a partition's indexes 0, 1, ..."""
    topics = {"t": zmesh.TopicConfig(groups=("g",), partitions=300)}
    prod = make_node("prod", topics=topics)
    with _io_held(prod):  # (staged together: joined)
        keyless = [prod.publish_many("t", [b"%d" % i, b"%d" % (i + 1)]) for i in range(0, 520, 2)]
    keys = [f"key-{i}" for i in range(100)]
    keyed = prod.publish_many("t", [str(i).encode() for i in range(520, 620)], keys=keys)
    keyed.wait_stored(5)
    assert _entries(prod)["runs"] == 3  # (520 as 512 + 8, then the keyed 100)
    prod.close()

    prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
    assert prod.status()["outbox"] == 620
    cons = make_node("cons", seeds=[prod.control_address])
    by_index = {_index(m): m for m in drain(cons.subscribe("t", group="g"), 620)}
    assert sorted(by_index) == list(range(620))
    assert [by_index[i].id for i in range(520)] == [m for r in keyless for m in r.ids]
    assert [by_index[i].partition for i in range(520)] == [i // 2 for i in range(520)]
    assert [by_index[i].partition for i in range(520, 620)] == [
        zlib.crc32(key.encode()) % 300 for key in keys
    ]
    indexes: dict[int, list[int]] = {}
    for i in range(620):
        indexes.setdefault(by_index[i].partition, []).append(by_index[i].index)
    assert all(found == list(range(len(found))) for found in indexes.values())
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")


def test_runs_an_earlier_release_wrote_with_lists_are_delivered_after_an_upgrade(
    make_node, tmp_path
):
    """Records and entries written before runs kept their partitions, indexes and publish
    times as bytes (msgpack lists) are read as they were: a data dir carries over an
    upgrade."""
    topics = {"t": zmesh.TopicConfig(groups=("g", "h"))}
    prod = make_node("prod", topics=topics)
    with _io_held(prod):  # (five joined into a run with a time per message, then one)
        receipts = [
            prod.publish_many("t", [str(i).encode() for i in range(b, b + 100)])
            for b in range(0, 600, 100)
        ]
    for r in receipts:
        r.wait_stored(5)
    prod.close()
    store = Store(str(tmp_path / "prod"), 1 << 26)
    try:  # (each record and entry rewritten the way the earlier release wrote it)
        batch = WriteBatch()
        joined = 0
        with store.env.begin() as txn:
            for key, value in txn.cursor(db=store.runs):
                fields = decode_run(value)
                assert fields is not None
                fields[1], fields[6] = fields[1].tolist(), fields[6].tolist()
                if type(fields[4]) is not float:  # (one time for a lone batch's run)
                    fields[4] = fields[4].tolist()
                    joined += 1
                batch.runs_put.append((bytes(key), pack(fields)))
            for key, value in txn.cursor(db=store.pruns):
                parts, offsets, attempts = unpackb(value)
                assert type(parts) is bytes
                batch.prun_put.append((bytes(key), pack([list(parts), offsets, attempts])))
        assert len(batch.runs_put) == 2 and len(batch.prun_put) == 4 and joined == 1
        store.commit(batch)
    finally:
        store.close()

    prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
    assert prod.status()["outbox"] == 600
    cons = make_node("cons", seeds=[prod.control_address])
    for group in ("g", "h"):
        got = drain(cons.subscribe("t", group=group), 600)
        assert sorted(map(_index, got)) == list(range(600))
        ids = [msg_id for r in receipts for msg_id in r.ids]
        assert {(_index(m), m.id, m.partition) for m in got} == {
            (i, msg_id, i // 100)
            for i, msg_id in enumerate(ids)  # (a batch's one, in turn)
        }
        times = [{m.published_at for m in got if _index(m) // 100 == b} for b in range(6)]
        assert all(len(each) == 1 for each in times)  # (each batch's own time)
        assert [t for (t,) in times] == sorted(t for (t,) in times)
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_a_parked_message_of_a_batch_is_replayed_while_the_rest_is_owed(make_node, tmp_path):
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    r = prod.publish_many("t", [b"0", b"1", b"2", b"3", b"4"])
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = _receive(sub, 5)
    got[2].fail("later")
    for i in (0, 1, 3):
        got[i].ack()
    wait_until(lambda: prod.dead_letters("t", "g"), what="a dead letter")
    assert prod.status()["outbox"] == 1 and _entries(prod)["runs"] == 1
    assert prod.replay_dead_letters("t", "g") == 1
    replayed = sub.get(timeout=5)
    assert replayed is not None and replayed.id == r.ids[2] and replayed.payload == b"2"
    assert prod.status()["outbox"] == 2
    prod.close()  # the run's entry owes 2 and 4 again across a restart
    prod = make_node(
        "prod", data_dir=str(tmp_path / "prod"), topics={"t": zmesh.TopicConfig(groups=("g",))}
    )
    assert prod.status()["outbox"] == 2
    wait_members(prod, "t", "g", 1)
    replayed.ack()
    got[4].ack()
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}
    assert prod.dead_letters("t", "g") == []


def test_two_groups_acking_batches_out_of_order_across_restarts(make_node, tmp_path):
    # Batches that straddle runs (400 payloads of 1 kB: two runs, of 262 and 138), acked in
    # a shuffled order in slices by two groups, with producer restarts in between: what is
    # owed after each restart is exactly what was not acked, and nothing is left at the end.
    rng = random.Random(7)
    topics = {"t": zmesh.TopicConfig(groups=("g1", "g2"))}
    prod = make_node("prod", topics=topics)
    receipts = [
        prod.publish_many("t", [str(b * 400 + i).encode().ljust(1000) for i in range(400)])
        for b in range(3)
    ]
    receipts[-1].wait_stored(5)
    base = receipts[0].ids[0].seq  # message i is sequence base + i
    total = 1200
    assert _entries(prod)["runs"] == 6
    acked: dict[str, set[int]] = {"g1": set(), "g2": set()}
    for round_ in range(3):
        consumers = {g: make_node(f"{g}-{round_}", seeds=[prod.control_address]) for g in acked}
        for group, node in consumers.items():
            sub = node.subscribe("t", group=group, max_in_flight=total)
            wait_members(prod, "t", group, 1)
            got = _receive(sub, total - len(acked[group]))
            assert set(got) == set(range(total)) - acked[group]
            assert all(m.id.seq == base + i and m.index is not None for i, m in got.items())
            order = sorted(got)
            rng.shuffle(order)
            chosen = order[: len(order) // 2] if round_ < 2 else order
            sub.ack_many([got[i] for i in chosen])
            acked[group].update(chosen)
        owed = total - len(acked["g1"] & acked["g2"])
        wait_until(
            lambda node=prod, owed=owed: node.status()["outbox"] == owed, what=f"{owed} owed"
        )
        for node in consumers.values():
            node.close()
        prod.close()
        prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics=topics)
        assert prod.status()["outbox"] == owed
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def _mem(node: zmesh.Node) -> tuple[int, int]:
    """(runs held in RAM, bytes counted against the memory budget), read on the IO thread."""

    def read(_batch: object, _now: float) -> tuple[int, int]:
        records = node._engine.outbox.records
        return len(records.mem_runs), records.mem_bytes

    return node._engine.queue.call(read)


def _pending(node: zmesh.Node, group: str) -> int:
    return next(ln["pending"] for ln in node.status()["lanes"] if ln["lane"] == group)


def test_a_memory_topics_batch_is_a_run_held_in_ram_until_acked(make_node):
    prod = make_node(
        "prod", topics={"t": zmesh.TopicConfig(groups=("g1", "g2"), durability="memory")}
    )
    r = prod.publish_many("t", [str(i).encode() for i in range(600)])
    r.wait_stored(5)
    # two runs (at most 512 messages each), nothing of them in LMDB
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}
    runs, held_bytes = _mem(prod)
    assert runs == 2 and held_bytes >= sum(len(str(i)) for i in range(600))
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    s1, s2 = c1.subscribe("t", group="g1"), c2.subscribe("t", group="g2")
    assert sorted(map(_index, drain(s1, 600))) == list(range(600))
    wait_until(
        lambda: prod.status()["outbox"] == 600 and _mem(prod)[0] == 2,
        what="g1's acks settled, the runs still owed to g2",
    )
    assert sorted(map(_index, drain(s2, 600))) == list(range(600))
    r.wait_acked(10)
    wait_until(lambda: _mem(prod) == (0, 0), what="the runs gone from RAM")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}
    assert s1.fetch(10, timeout=0.3) == [] and s2.fetch(10, timeout=0.3) == []


def test_memory_runs_past_the_budget_spill_with_what_each_group_still_owes(make_node, tmp_path):
    topics = {"t": zmesh.TopicConfig(groups=("g1", "g2"), durability="memory")}
    prod = make_node("prod", memory_budget_bytes=100_000, topics=topics)
    prod.publish_many("t", [str(i).encode().ljust(500) for i in range(100)])
    c1 = make_node("c1", seeds=[prod.control_address])
    s1 = c1.subscribe("t", group="g1", max_in_flight=100)
    by_index = _receive(s1, 100)
    for i in range(0, 100, 2):  # g1 acks half of the first run before it spills
        by_index[i].ack()
    wait_until(lambda: _pending(prod, "g1") == 50, what="g1's acks settled")
    assert _entries(prod)["runs"] == 0
    c1.close()
    # 100 more runs of 100 x 500 bytes: far past the budget, the oldest spill
    for n in range(1, 101):
        prod.publish_many(
            "t", [str(n * 100 + i).encode().ljust(500) for i in range(100)]
        ).wait_stored(5)
    spilled = prod.stats()["spilled"]
    assert spilled >= 100 and spilled % 100 == 0  # (whole runs)
    entries = _entries(prod)
    assert entries["msgs"] == entries["pend"] == 0
    assert entries["runs"] == spilled // 100 and entries["pruns"] == 2 * entries["runs"]
    assert _mem(prod)[1] <= 100_000
    prod.close()

    # What spilled survives a restart (what did not is lost, as memory durability says):
    # g1 is owed the odd ones of the first run and all of the others, g2 all of them.
    prod = make_node(
        "prod", data_dir=str(tmp_path / "prod"), memory_budget_bytes=100_000, topics=topics
    )
    assert prod.status()["outbox"] == spilled
    c1 = make_node("c1b", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    s1, s2 = c1.subscribe("t", group="g1"), c2.subscribe("t", group="g2")
    wanted = set(range(spilled))
    got1 = drain(s1, spilled - 50)
    assert {_index(m) for m in got1} == {i for i in wanted if i >= 100 or i % 2}
    assert {_index(m) for m in drain(s2, spilled)} == wanted
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_publishers_on_several_threads_lose_nothing_and_keep_each_keys_order(make_node):
    # Four threads publish at once, each with its own key: their plain publishes queue
    # together, interleaved; each message arrives once and each key's in publish order.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g", max_in_flight=500)
    wait_members(prod, "t", "g", 1)
    count, threads = 1500, 4
    receipts: list[list[zmesh.Receipt]] = [[] for _ in range(threads)]

    def publish(t: int) -> None:
        for i in range(count):
            receipts[t].append(prod.publish("t", f"{t}:{i}".encode(), key=f"k{t}"))

    workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert not any(w.is_alive() for w in workers)
    got = drain(sub, count * threads)
    by_key: dict[str, list[int]] = {}
    for msg in got:
        t, i = msg.payload.decode().split(":")
        assert msg.key == f"k{t}"
        by_key.setdefault(t, []).append(int(i))
    assert by_key == {str(t): list(range(count)) for t in range(threads)}
    assert len({r.id for rs in receipts for r in rs}) == count * threads
    for rs in receipts:
        rs[-1].wait_acked(10)


def test_a_memory_message_spilled_as_it_is_staged_is_owed_after_a_restart(make_node, tmp_path):
    # One publish larger than the budget spills in the iteration that stages it,
    # before any lane owes it: its pending entries are written all the same.
    topics = {"t": zmesh.TopicConfig(groups=("g1", "g2"), durability="memory")}
    prod = make_node("prod", memory_budget_bytes=10_000, topics=topics)
    prod.publish("t", bytes(12_000), headers={"h": "1"}).wait_stored(5)
    assert prod.stats()["spilled"] == 1
    assert _entries(prod) == {"msgs": 1, "pend": 2, "runs": 0, "pruns": 0}
    prod.close()
    prod = make_node(
        "prod", data_dir=str(tmp_path / "prod"), memory_budget_bytes=10_000, topics=topics
    )
    assert prod.status()["outbox"] == 1
    c1 = make_node("c1", seeds=[prod.control_address])
    c2 = make_node("c2", seeds=[prod.control_address])
    for sub in (c1.subscribe("t", group="g1"), c2.subscribe("t", group="g2")):
        [msg] = drain(sub, 1)
        assert msg.headers == {"h": "1"} and len(msg.payload) == 12_000
    wait_until(lambda: prod.status()["outbox"] == 0, what="an empty outbox")
    assert _entries(prod) == {"msgs": 0, "pend": 0, "runs": 0, "pruns": 0}


def test_publishes_racing_close_are_stored_or_refused(make_node, tmp_path):
    # Threads publish while the node closes: each publish either returned a receipt that
    # says stored once close() returns, or raised NodeStateError. A restart finds exactly
    # the stored ones owed.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipts: list[list[zmesh.Receipt]] = [[] for _ in range(4)]
    refused = [0] * 4

    def publish(t: int) -> None:
        for i in range(50_000):
            try:
                receipts[t].append(prod.publish("t", b"%d:%d" % (t, i)))
            except zmesh.NodeStateError:
                refused[t] += 1
                return

    workers = [threading.Thread(target=publish, args=(t,)) for t in range(4)]
    for w in workers:
        w.start()
    wait_until(lambda: all(len(rs) > 500 for rs in receipts), what="publishes under way")
    prod.close()
    for w in workers:
        w.join(30)
    assert not any(w.is_alive() for w in workers)
    assert sum(refused) > 0  # (each thread ran until the node refused it)
    stored = sum(len(rs) for rs in receipts)
    assert all(r.stored for rs in receipts for r in rs)
    again = make_node(
        "prod2", data_dir=str(tmp_path / "prod"), topics={"t": zmesh.TopicConfig(groups=("g",))}
    )
    assert again.status()["outbox"] == stored


def test_kept_receipts_keep_no_payloads(make_node):
    # A stretch of publish() calls is its receipts' stage; once staged it hands its
    # columns on, so an application that keeps receipts does not keep the payloads.
    prod = make_node("prod", topics={"t": zmesh.TopicConfig(groups=("g",))})
    receipts = [prod.publish("t", bytes([i % 256]) * 1000) for i in range(3000)]
    receipts[-1].wait_stored(5)  # (stretches are staged in order: every one is)
    stages = {id(r._stage): r._stage for r in receipts}
    assert len(stages) < len(receipts)  # (stretches of several publishes)
    assert all(r.stored for r in receipts)
    assert all(type(stage) is Stretch for stage in stages.values())
    assert all(stage.payloads == [] and stage.keys == [] for stage in stages.values())
