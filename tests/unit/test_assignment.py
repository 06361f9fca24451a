"""Partitions to members: balanced, sticky (routing.assign), and handed over in order
(lane/assignment.py, through a real Lane driven with explicit times)."""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from zmesh._engine.lane.delivery import Timing
from zmesh._engine.lane.lane import Lane
from zmesh._engine.routing import assign

PRODUCER = b"P" * 16
IDS = [bytes([i]) * 16 for i in range(1, 41)]


def counts(owners: list[bytes | None]) -> Counter[bytes | None]:
    return Counter(owners)


def make_lane(partitions: int) -> Lane:
    return Lane("t", "g", producer=PRODUCER, partitions=partitions, timing=Timing())


# -- routing.assign ---------------------------------------------------------------------------


def test_nobody_gets_nothing() -> None:
    assert assign([None] * 4, [], PRODUCER) == [None] * 4
    assert assign([IDS[0]] * 4, [], PRODUCER) == [None] * 4


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40))
def test_every_member_gets_its_fair_share_within_one(partitions: int, n: int) -> None:
    members = IDS[:n]
    owners = assign([None] * partitions, members, PRODUCER)
    got = counts(owners)
    assert None not in got
    base = partitions // n
    assert all(got[m] in (base, base + 1) for m in members)
    assert sum(got.values()) == partitions


def test_fifteen_members_of_sixteen_partitions_all_get_one() -> None:
    """The issue's case: rendezvous hashing alone left six of 15 members with nothing."""
    owners = assign([None] * 16, IDS[:15], PRODUCER)
    assert sorted(counts(owners).values()) == [1] * 14 + [2]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(1, 30), st.integers(0, 10_000))
def test_a_join_moves_only_what_the_newcomer_gets(partitions: int, n: int, salt: int) -> None:
    members = IDS[:n]
    before = assign([None] * partitions, members, salt.to_bytes(16, "big"))
    after = assign(before, [*members, IDS[n]], salt.to_bytes(16, "big"))
    moved = [p for p in range(partitions) if before[p] != after[p]]
    assert all(after[p] == IDS[n] for p in moved)
    base = partitions // (n + 1)
    assert len(moved) in (base, base + 1)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(2, 30), st.data())
def test_a_leave_moves_only_the_leavers_partitions(
    partitions: int, n: int, data: st.DataObject
) -> None:
    members = IDS[:n]
    before = assign([None] * partitions, members, PRODUCER)
    gone = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != gone]
    after = assign(before, rest, PRODUCER)
    for p in range(partitions):
        assert after[p] in rest
        if before[p] != gone:
            assert after[p] == before[p]
    base = partitions // len(rest)
    assert all(c in (base, base + 1) for c in counts(after).values())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 39)), min_size=1, max_size=40))
def test_balance_holds_through_any_joins_and_leaves(ops: list[tuple[bool, int]]) -> None:
    owners: list[bytes | None] = [None] * 64
    members: set[bytes] = set()
    for join, i in ops:
        (members.add if join else members.discard)(IDS[i])
        owners = assign(owners, members, PRODUCER)
        if members:
            base = 64 // len(members)
            got = counts(owners)
            assert all(got[m] in (base, base + 1) for m in members) and None not in got


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.integers(2, 12), st.data())
def test_members_back_after_an_absence_get_back_what_they_had(
    partitions: int, n: int, data: st.DataObject
) -> None:
    """Members gone (a producer cut off sees them all go) and back in any order, one at a
    time: each partition goes back to the member it had, so a message sent again reaches
    the member that may have handled it."""
    members = IDS[:n]
    lane = make_lane(partitions)
    for m in members:
        lane.set_member(m, 5, 5)
    before = list(lane.assignment.table())
    gone = data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True))
    for m in gone:
        lane.remove_member(m, 0.0)
        lane.assignment.table()
    for m in data.draw(st.permutations(gone)):
        lane.set_member(m, 5, 5)
        lane.assignment.table()
    assert lane.assignment.table() == before


def test_the_result_depends_only_on_its_inputs() -> None:
    current = assign([None] * 64, IDS[:5], PRODUCER)
    assert assign(current, IDS[:7], PRODUCER) == assign(list(current), IDS[6::-1], PRODUCER)


def test_extra_partitions_spread_over_producers() -> None:
    """Summed over producers, no member is far from the fair share: the ones that get
    one more differ from producer to producer."""
    members = IDS[:7]
    total: Counter[bytes | None] = Counter()
    producers = [os.urandom(16) for _ in range(70)]
    for producer in producers:
        total.update(assign([None] * 16, members, producer))
    fair = 70 * 16 / 7
    assert all(abs(total[m] - fair) < 70 / 4 for m in members), total


# -- through a lane: fences keep a key's order across a move ----------------------------------


def owned(lane: Lane, member: bytes) -> list[int]:
    return lane.assignment.owned_by(member)


def test_a_partition_moves_only_once_its_old_member_is_done_with_it() -> None:
    a, b = IDS[0], IDS[1]
    lane = make_lane(4)
    lane.set_member(a, 100, 100)
    for seq in range(8):
        lane.add(seq, seq % 4, now=0.0)
    out, _ = lane.take(0.0)
    assert sorted(out[a].seqs) == list(range(8))
    lane.set_member(b, 100, 100)
    moving = owned(lane, b)
    assert len(moving) == 2 and len(owned(lane, a)) == 2
    for seq in range(8, 16):
        lane.add(seq, seq % 4, now=1.0)
    out, _ = lane.take(1.0)
    # a goes on with its own; nobody gets the moving partitions while a holds some
    assert set(out) == {a}
    assert {p for p in out[a].partitions} == set(owned(lane, a))
    assert all(lane.owner(p) is None for p in moving)
    # a acks what it held of one moving partition: that one goes to b, in order
    first, second = moving
    lane.ack([s for s in range(8) if s % 4 == first])
    out, _ = lane.take(2.0)
    assert set(out) == {b}
    assert list(out[b].seqs) == [s for s in range(8, 16) if s % 4 == first]
    # a nacks the other's: they are ready again and go to b first, then the newer ones
    lane.nack([s for s in range(8) if s % 4 == second], 0.0, 3.0)
    out, _ = lane.take(3.0)
    assert sorted(out[b].seqs) == sorted(s for s in range(16) if s % 4 == second)
    assert lane.assignment.moved == 2


def test_a_member_that_leaves_leaves_no_fence() -> None:
    a, b = IDS[0], IDS[1]
    lane = make_lane(4)
    lane.set_member(a, 100, 100)
    lane.set_member(b, 100, 100)
    for seq in range(8):
        lane.add(seq, seq % 4, now=0.0)
    lane.take(0.0)
    theirs = owned(lane, a)
    lane.remove_member(a, 1.0)
    assert not lane.assignment.fenced
    out, _ = lane.take(1.0)
    # at once, with no ack of a's awaited: what a held goes to b
    assert set(out) == {b}
    assert sorted(out[b].seqs) == [s for s in range(8) if s % 4 in theirs]


def test_a_partition_that_moves_back_to_its_holder_is_not_held() -> None:
    a, b = IDS[0], IDS[1]
    lane = make_lane(2)
    lane.set_member(a, 100, 100)
    for seq in range(4):
        lane.add(seq, seq % 2, now=0.0)
    lane.take(0.0)
    lane.set_member(b, 100, 100)
    assert lane.assignment.fenced
    lane.remove_member(b, 1.0)
    assert not lane.assignment.fenced
    assert [lane.owner(p) for p in range(2)] == [a, a]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("pub"), st.integers(1, 20)),
            st.tuples(st.just("take"), st.just(0)),
            st.tuples(st.just("ack"), st.integers(0, 5)),
            st.tuples(st.just("nack"), st.integers(0, 5)),
            st.tuples(st.just("join"), st.integers(0, 5)),
            st.tuples(st.just("leave"), st.integers(0, 5)),
        ),
        max_size=60,
    )
)
def test_a_partition_is_never_in_flight_at_two_members(ops: list[tuple[str, int]]) -> None:
    """Whatever the joins, leaves, acks and nacks: a partition's messages are in flight at
    one member at a time, and each member is handed a partition's messages in order."""
    members = IDS[:6]
    lane = make_lane(8)
    seq, now = 0, 0.0
    held: dict[bytes, list[int]] = {m: [] for m in members}
    last: dict[tuple[bytes, int], int] = {}
    for op, arg in ops:
        now += 0.01
        if op == "pub":
            for _ in range(arg):
                lane.add(seq, (seq * 7) % 8, now=now)
                seq += 1
        elif op == "join":
            lane.set_member(members[arg], 5, 5)
        elif op == "leave":
            lane.remove_member(members[arg], now)
            held[members[arg]] = []
        elif op in ("ack", "nack"):
            who = members[arg]
            done, held[who] = held[who], []
            if op == "ack":
                lane.ack(done)
            else:
                lane.nack(done, 0.0, now)
        else:
            out, _ = lane.take(now)
            for member, batch in out.items():
                rows = zip(batch.seqs, batch.partitions, batch.attempts, strict=True)
                for s, p, attempt in rows:
                    if attempt == 1:
                        assert last.get((member, p), -1) < s, "out of order at one member"
                        last[member, p] = s
                    held[member].append(s)
        by_partition: dict[int, set[bytes]] = {}
        for member in members:
            for s in lane.in_flight_to(member):
                by_partition.setdefault((s * 7) % 8, set()).add(member)
        assert all(len(who) <= 1 for who in by_partition.values())
        if lane.members:
            base = 8 // len(lane.members)
            got = {m: len(lane.assignment.owned_by(m)) for m in lane.members}
            assert all(n in (base, base + 1) for n in got.values())
