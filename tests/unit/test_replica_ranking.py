"""Who holds a producer's replicas and who takes its lanes over: pure rules, the clock
passed in (replica/ranking.py)."""

from __future__ import annotations

import secrets

from hypothesis import given, settings
from hypothesis import strategies as st

from zmesh._engine.replica.ranking import (
    Candidate,
    Holder,
    outranks,
    replica_order,
    score,
    taker,
    takes_over,
)

P = b"\x01" * 16
ids = st.binary(min_size=16, max_size=16)


def _by_score(nodes: list[bytes]) -> list[bytes]:
    return sorted(nodes, key=lambda n: score(n, P), reverse=True)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(ids, min_size=1, max_size=8, unique=True))
def test_on_one_host_the_order_is_the_rendezvous_order(nodes: list[bytes]) -> None:
    order = replica_order([Candidate(n, "h") for n in nodes], P, ("p",))
    assert order == _by_score(nodes)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(ids, min_size=2, max_size=8, unique=True), st.data())
def test_a_candidate_leaving_moves_no_other(nodes: list[bytes], data: st.DataObject) -> None:
    # Every node ranks alike, and a replica that dies frees only its own place.
    gone = data.draw(st.sampled_from(nodes))
    full = replica_order([Candidate(n, "h") for n in nodes], P, ())
    rest = replica_order([Candidate(n, "h") for n in nodes if n != gone], P, ())
    assert rest == [n for n in full if n != gone]


def test_other_hosts_come_first_one_each_then_the_rest_by_weight() -> None:
    nodes = [secrets.token_bytes(16) for _ in range(6)]
    hosts = {nodes[0]: "10.0.0.1", nodes[1]: "10.0.0.1", nodes[2]: "10.0.0.2"}
    hosts.update({n: "10.0.0.9" for n in nodes[3:]})  # the producer's own host
    order = replica_order([Candidate(n, hosts[n]) for n in nodes], P, ("10.0.0.9",))
    first = order[:2]
    assert {hosts[n] for n in first} == {"10.0.0.1", "10.0.0.2"}
    assert first[0] == _by_score([n for n in nodes if hosts[n] != "10.0.0.9"])[0]
    # then everyone left, by weight: the second node of 10.0.0.1 and the producer's host
    assert order[2:] == _by_score([n for n in nodes if n not in first])


def test_the_taker_is_the_freshest_copy_then_the_rendezvous_order() -> None:
    a, b, c = (secrets.token_bytes(16) for _ in range(3))
    # the producer's latest incarnation first, whatever the weights
    assert taker([Holder(a, 1, 9), Holder(b, 2, 1), Holder(c, 1, 9)], P) == b
    # then its latest replica set: a copy it replaced (older version) only if alone
    assert taker([Holder(a, 2, 3), Holder(b, 2, 4)], P) == b
    assert taker([Holder(a, 2, 3)], P) == a
    # the same copy everywhere: rendezvous decides, the same for every node asked
    best = _by_score([a, b, c])[0]
    assert taker([Holder(n, 2, 4) for n in (a, b, c)], P) == best
    assert taker([Holder(n, 2, 4) for n in (c, a, b)], P) == best
    assert taker([], P) is None
    assert outranks(Holder(best, 2, 4), Holder(next(n for n in (a, b, c) if n != best), 2, 4), P)


def test_a_replica_takes_over_only_after_the_delay_unless_someone_serves() -> None:
    me, other = secrets.token_bytes(16), secrets.token_bytes(16)
    me_first = _by_score([me, other])[0] == me
    holders = [Holder(me, 3, 2), Holder(other, 3, 2)]
    silent_since, delay = 100.0, 15.0
    for now in (100.0, 110.0, 114.999):
        assert not takes_over(now, silent_since, delay, me, holders, P, served=False)
    assert takes_over(115.0, silent_since, delay, me, holders, P, served=False) is me_first
    assert takes_over(115.0, silent_since, delay, other, holders, P, served=False) is not me_first
    # a node that already serves the producer's lanes keeps them
    assert not takes_over(1e6, silent_since, delay, me, holders, P, served=True)
    # the other holder dead (not among the live holders): this node is the one
    assert takes_over(115.0, silent_since, delay, me, holders[:1], P, served=False)
    # a stale copy gives way to a fresh one, whatever the weights
    stale = [Holder(me, 3, 1), Holder(other, 3, 2)]
    assert not takes_over(1e6, silent_since, delay, me, stale, P, served=False)
    assert takes_over(1e6, silent_since, delay, other, stale, P, served=False)
