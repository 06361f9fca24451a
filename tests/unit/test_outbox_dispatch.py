"""Handing ready messages to live members (outbox/dispatch.py) with a send function that
records what it is given, no sockets: which columns a member gets, where each record
comes from, and what becomes of a record that is damaged, missing or too large. A real
LMDB store in a temp dir; the time is passed in."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit import stored
from tests.unit.engine_parts import A, B, Producer, one_group, opened, owes
from zmesh._engine.lane.delivery import IN_FLIGHT, READY
from zmesh._engine.outbox.outcomes import Outcome
from zmesh._store.store import Store, WriteBatch, pack, u64
from zmesh.config import TopicConfig


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield from opened(tmp_path / "p")


def _write(producer: Producer, **puts: list[tuple[bytes, bytes]]) -> None:
    """Change records behind the outbox's back (a damaged disk, another writer)."""
    wb = WriteBatch()
    for name, items in puts.items():
        getattr(wb, name).extend(items)
    producer.store.commit(wb)


def test_a_take_of_runs_is_sent_as_their_columns(store: Store) -> None:
    producer, lane = one_group(store, partitions=2)
    keys: list[str | None] = [f"k{i}" for i in range(6)]
    pm = producer.publish_many(
        "t", [b"p%d" % i for i in range(6)], keys, headers={"h": "v"}, published_at=5.0
    )
    producer.commit(pm)
    producer.outbox.records.decoded.forget_runs([pm.seq])  # (read back from LMDB)
    [(member, name, taken, columns)] = producer.dispatch(0.0)
    assert (member, name) == (A, "g")
    assert list(taken.seqs) == list(pm.seqs) and list(taken.attempts) == [1] * 6
    assert list(columns.payloads) == pm.payloads and list(columns.keys) == keys
    assert list(columns.headers) == [{"h": "v"}] * 6
    assert columns.published_ats == array("d", [5.0] * 6)
    indexes = {p: iter(range(6)) for p in range(2)}
    assert list(columns.indexes) == [next(indexes[p]) for p in taken.partitions]
    assert [lane.state(s) for s in pm.seqs] == [IN_FLIGHT] * 6


@pytest.mark.parametrize("durability", ["process", "memory"])
def test_a_lone_message_between_runs_goes_in_their_columns(store: Store, durability: str) -> None:
    """A publish the IO thread found alone is stored on its own, between runs: a take
    across them is still one batch of columns, the lone message's its own fields (key,
    headers, publish time, index) in its place."""
    producer, lane = one_group(store, partitions=1, durability=durability)
    before = producer.publish_many("t", [b"a0", b"a1", b"a2"], headers={"h": "run"})
    alone = producer.publish("t", b"lone", "k", headers={"h": "own"}, published_at=7.0)
    after = producer.publish_many("t", [b"b0", b"b1"])
    for p in (before, alone, after):  # (each its own iteration: three stages)
        producer.commit(p)
    if durability == "process":  # (a run read back from LMDB joins them just the same)
        producer.outbox.records.decoded.forget_runs([after.seq])
    [(_m, _n, taken, columns)] = producer.dispatch(0.0)
    assert list(taken.seqs) == [*before.seqs, alone.seq, *after.seqs]
    assert list(columns.payloads) == [b"a0", b"a1", b"a2", b"lone", b"b0", b"b1"]
    assert list(columns.keys) == [None, None, None, "k", None, None]
    assert list(columns.headers) == [{"h": "run"}] * 3 + [{"h": "own"}, None, None]
    assert columns.published_ats == array("d", [1000.0] * 3 + [7.0] + [1000.0] * 2)
    assert list(columns.indexes) == list(range(6)) and columns.inline
    assert producer.outbox.records.run_columns(taken.seqs, 1 << 20) is not None


def test_a_lone_message_not_kept_sends_the_take_message_by_message(store: Store) -> None:
    """The lone message's record is not in RAM (staged while no member was there): the
    take is sent from each message's record, read from LMDB, in the same order."""
    producer, lane = one_group(store, False, partitions=1)
    alone = producer.publish("t", b"lone")
    producer.commit(alone)
    lane.set_member(A, 100, 100)
    run = producer.publish_many("t", [b"r0", b"r1"])
    producer.commit(run)
    assert producer.outbox.records.run_columns(range(alone.seq, run.seq + 2), 1 << 20) is None
    [(_m, _n, taken, columns)] = producer.dispatch(0.0)
    assert list(taken.seqs) == [alone.seq, *run.seqs]
    assert list(columns.payloads) == [b"lone", b"r0", b"r1"]


@pytest.mark.parametrize("keyed", [True, False])
def test_two_members_each_get_the_columns_of_their_partitions(store: Store, keyed: bool) -> None:
    # 64 partitions: each member owns some, whatever the producer's (random) id. Keyed,
    # each message goes by its key; keyless, each batch whole to its partition's owner.
    producer, lane = one_group(store, partitions=64)
    lane.set_member(B, 100, 100)
    if keyed:
        pms = [
            producer.publish_many("t", [b"%d" % i for i in range(64)], [f"k{i}" for i in range(64)])
        ]
    else:
        pms = [producer.publish_many("t", [b"%d" % i] * 2) for i in range(32)]
    for pm in pms:
        producer.commit(pm)
    sent = producer.dispatch(0.0)
    assert sorted(member for member, *_ in sent) == [A, B]
    payload = {s: p for pm in pms for s, p in zip(pm.seqs, pm.payloads, strict=True)}
    for member, _name, taken, columns in sent:
        assert {lane.owner(p) for p in taken.partitions} == {member}
        assert list(columns.payloads) == [payload[s] for s in taken.seqs]
    assert sorted(s for *_, taken, _c in sent for s in taken.seqs) == sorted(payload)
    if not keyed:  # each batch whole to one member
        to = {s: member for member, _n, taken, _c in sent for s in taken.seqs}
        assert all(len({to[s] for s in pm.seqs}) == 1 for pm in pms)


def test_a_memory_message_is_sent_from_ram(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1, durability="memory")
    p = producer.publish("t", b"in ram", "k")
    producer.commit(p)
    lane.set_member(A, 100, 100)
    [(_m, _n, taken, columns)] = producer.dispatch(0.0)
    assert list(taken.seqs) == [p.seq] and list(columns.payloads) == [b"in ram"]
    assert list(columns.keys) == ["k"] and stored.msgs(store) == {} and stored.pend(store) == {}


def test_a_record_staged_while_a_member_was_there_is_sent_as_kept(store: Store) -> None:
    """Kept decoded from staging: what LMDB holds now is not read."""
    producer, lane = one_group(store, partitions=1)
    p = producer.publish("t", b"as staged")
    producer.commit(p)
    _write(producer, msgs_put=[(u64(p.seq), b"\xc1 damaged since")])
    [(_m, _n, _taken, columns)] = producer.dispatch(0.0)
    assert list(columns.payloads) == [b"as staged"]
    assert producer.counters.get("corrupt_records") == 0


def test_a_record_staged_with_no_member_is_read_from_lmdb(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    p = producer.publish("t", b"as staged")
    producer.commit(p)
    assert p.seq not in producer.outbox.records.decoded.fields
    _write(
        producer,
        msgs_put=[(u64(p.seq), pack(["t", 0, None, None, 0, 1000.0, None, None, b"as stored", 0]))],
    )
    lane.set_member(A, 100, 100)
    [(_m, _n, _taken, columns)] = producer.dispatch(0.0)
    assert list(columns.payloads) == [b"as stored"]


def test_a_damaged_record_is_set_aside_and_settled_as_lost_for_every_lane(store: Store) -> None:
    producer = Producer(store, t=TopicConfig(partitions=1))
    g1, g2 = producer.group("t", "g"), producer.group("t", "g2")
    bad, good = producer.publish("t", b"bad"), producer.publish("t", b"good")
    producer.commit(bad, good)
    _write(producer, msgs_put=[(u64(bad.seq), b"\xc1")])
    g1.set_member(A, 100, 100)
    sent = producer.dispatch(0.0)
    assert [list(taken.seqs) for *_, taken, _c in sent] == [[good.seq]]
    assert stored.db_keys(store, "bad") == [b"msgs\0" + u64(bad.seq)]
    assert stored.msgs(store).keys() == {good.seq}
    assert stored.pend(store).keys() == {(g1.id, good.seq), (g2.id, good.seq)}
    assert owes(g1) == owes(g2) == [good.seq] and producer.depth == 1
    assert producer.outcome(bad.seq) == producer.outcome(bad.seq, "g2") == Outcome.LOST
    assert producer.counters.get("corrupt_records") == 1
    assert producer.counters.get("lost_records") == 0  # (damaged, not missing)


def test_a_missing_record_is_settled_as_lost(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    gone = producer.publish("t", b"gone")
    producer.commit(gone)
    _write(producer, msgs_del=[u64(gone.seq)])
    lane.set_member(A, 100, 100)
    assert producer.dispatch(0.0) == []
    assert owes(lane) == [] and stored.pend(store) == {} and producer.depth == 0
    assert producer.outcome(gone.seq) == Outcome.LOST
    assert producer.counters.get("lost_records") == 1


def test_a_damaged_run_is_set_aside_and_its_messages_settled_as_lost(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    pm = producer.publish_many("t", [b"a", b"b", b"c"])
    producer.commit(pm)
    _write(producer, runs_put=[(u64(pm.seq), b"\xc1")])
    lane.set_member(A, 100, 100)
    assert producer.dispatch(0.0) == []
    assert stored.db_keys(store, "bad") == [b"runs\0" + u64(pm.seq)]
    assert stored.runs(store) == {} and stored.pruns(store) == {} and owes(lane) == []
    assert producer.depth == 0 and producer.counters.get("corrupt_records") == 1
    assert {producer.outcome(seq) for seq in pm.seqs} == {Outcome.LOST}


@pytest.mark.parametrize("as_run", [False, True], ids=["singles", "a run"])
def test_a_payload_larger_than_a_member_accepts_is_parked(store: Store, as_run: bool) -> None:
    producer, lane = one_group(store, False, partitions=1)
    lane.set_member(A, 100, 100, max_message_bytes=100)
    payloads = [b"s" * 50, b"L" * 500, b"t" * 100]
    if as_run:
        pm = producer.publish_many("t", payloads)
        producer.commit(pm)
        seqs = list(pm.seqs)
    else:
        pubs = [producer.publish("t", payload) for payload in payloads]
        producer.commit(*pubs)
        seqs = [p.seq for p in pubs]
    sent = producer.dispatch(0.0)
    assert [(list(t.seqs), list(c.payloads)) for *_, t, c in sent] == [
        ([seqs[0], seqs[2]], [payloads[0], payloads[2]])
    ]
    dead = store.get_dead(lane.id, seqs[1])
    assert dead is not None
    assert "payload of 500 bytes is larger than the max_message_bytes (100)" in dead[1]
    assert producer.outcome(seqs[1]) == Outcome.DEAD_LETTERED
    assert producer.counters.get("refused_oversized") == 1
    assert owes(lane) == [seqs[0], seqs[2]] and producer.depth == 2


def test_what_send_did_not_take_is_ready_again_as_if_never_sent(store: Store) -> None:
    producer, lane = one_group(store, partitions=1)
    pm = producer.publish_many("t", [b"%d" % i for i in range(5)])
    producer.commit(pm)
    first = producer.dispatch(0.0, keep=lambda taken: 2)
    assert [list(t.seqs) for *_, t, _c in first] == [list(pm.seqs)]
    assert [lane.state(s) for s in pm.seqs] == [IN_FLIGHT] * 2 + [READY] * 3
    assert lane.ready_count == 3 and lane in producer.outbox.lanes.ready
    again = producer.dispatch(1.0)
    assert [(list(t.seqs), list(t.attempts)) for *_, t, _c in again] == [
        (list(pm.seqs)[2:], [1, 1, 1])
    ]  # (the attempt undone)


def test_a_message_found_expired_when_taken_is_settled_as_expired(store: Store) -> None:
    producer, lane = one_group(store, False, partitions=1)
    now = time.monotonic()
    p = producer.publish("t", b"x", expires_at=time.time() + 10.0)
    producer.commit(p, now=now)
    lane.set_member(A, 100, 100)
    assert producer.dispatch(now + 11.0) == []
    assert owes(lane) == [] and stored.msgs(store) == {} and producer.depth == 0
    assert producer.outcome(p.seq) == Outcome.EXPIRED


def test_lanes_without_members_or_unclaimed_leave_the_ready_set(store: Store) -> None:
    producer = Producer(store, t=TopicConfig(partitions=1), u=TopicConfig(partitions=1))
    lane = producer.group("t", "g")
    producer.commit(producer.publish("t", b"x"), producer.publish("u", b"y"))
    ready = producer.outbox.lanes.ready
    assert set(ready) == {lane, producer.outbox.lanes.get("u", "")}
    assert producer.dispatch(0.0) == [] and ready == {}
    lane.set_member(A, 100, 100)  # (back with a member)
    assert list(ready) == [lane] and len(producer.dispatch(0.0)) == 1
