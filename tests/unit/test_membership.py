"""Membership (SWIM with Lifeguard's suspicion), driven with explicit times: meshes of
``Membership``s joined by a simulated network that delivers, delays or drops each frame,
with no sockets and no clock."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from zmesh._engine.limits import FORGET_DEAD_AFTER_S, RUMORS_PER_FRAME
from zmesh._engine.membership import Change, Membership, Timing
from zmesh._engine.news import ALIVE, DEAD, SUSPECT, Fact

TIMING = Timing(period_s=1.0, suspicion_max_s=5.0)


def node(i: int) -> bytes:
    return i.to_bytes(16, "big")


@dataclass
class Port:
    """One node's ``Wire``: what it sends goes into the network's queue."""

    net: Net
    me: bytes
    sent: Counter[str] = field(default_factory=Counter)

    def _send(self, to: bytes, kind: str, *args: object) -> None:
        self.sent[kind] += 1
        member = self.net.members[self.me]
        self.net.send(self.me, to, kind, member.me(), member.rumors(RUMORS_PER_FRAME, to), args)

    def ping(self, to: bytes, seq: int, target: bytes) -> None:
        self._send(to, "ping", seq, target)

    def ping_req(self, to: bytes, seq: int, target: bytes) -> None:
        self._send(to, "ping_req", seq, target)

    def pong(self, to: bytes, seq: int, about: bytes) -> None:
        self._send(to, "pong", seq, about)

    def gossip(self, to: bytes) -> None:
        self._send(to, "gossip")


class Net:
    """Nodes 0..n-1 and the frames between them (``delay`` seconds each way)."""

    def __init__(self, n: int, seed: int = 1, delay: float = 0.002) -> None:
        self.now = 0.0
        self.delay = delay
        self.slow: dict[bytes, float] = {}  # extra delay of what a node sends
        self.down: set[bytes] = set()  # nodes that are gone: nothing in or out
        self.cut: set[frozenset[bytes]] = set()  # links that drop everything
        self.queue: list[tuple[float, int, bytes, bytes, str, Fact, list[Fact], tuple]] = []
        self._order = itertools.count()
        self.ports: dict[bytes, Port] = {}
        self.members: dict[bytes, Membership] = {}
        self.changes: list[tuple[float, bytes, Change]] = []  # (when, observer, change)
        self.counts: Counter[str] = Counter()
        for i in range(n):
            self.add(node(i), 1, seed * 1000 + i)

    def add(self, node_id: bytes, incarnation: int, seed: int) -> Membership:
        port = self.ports[node_id] = Port(self, node_id)
        member = Membership(
            node_id,
            incarnation,
            TIMING,
            port,
            random.Random(seed),
            lambda name, k: self.counts.update({name: k}),
        )
        member.start(self.now)
        self.members[node_id] = member
        return member

    def send(self, frm: bytes, to: bytes, kind: str, me: Fact, rumors: list[Fact], args: tuple):
        if frm in self.down or to in self.down or frozenset((frm, to)) in self.cut:
            return
        at = self.now + self.delay + self.slow.get(frm, 0.0)
        heapq.heappush(self.queue, (at, next(self._order), frm, to, kind, me, rumors, args))

    def introduce_all(self) -> None:
        """Every node says hello to every other (what mDNS and hellos do)."""
        for a, b in itertools.permutations(self.members, 2):
            self.note(a, self.members[a].add(b, self.members[b].incarnation, self.now))

    def note(self, observer: bytes, changes: list[Change]) -> None:
        self.changes.extend((self.now, observer, c) for c in changes)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            wake = min(
                (m.next_wakeup(), i)
                for i, (nid, m) in enumerate(self.members.items())
                if nid not in self.down
            )
            at = min(wake[0], self.queue[0][0] if self.queue else math.inf)
            if at > end:
                self.now = end
                return
            self.now = max(self.now, at)
            if self.queue and self.queue[0][0] <= at:
                _at, _n, frm, to, kind, me, rumors, args = heapq.heappop(self.queue)
                self.deliver(frm, to, kind, me, rumors, args)
            else:
                nid = list(self.members)[wake[1]]
                self.note(nid, self.members[nid].tick(self.now))

    def deliver(self, frm, to, kind, me, rumors, args) -> None:
        if to in self.down:
            return
        m = self.members[to]
        self.note(to, m.heard(me, self.now))
        for fact in rumors:
            self.note(to, m.learn(fact, self.now))
        if kind == "ping":
            m.on_ping(frm, *args)
        elif kind == "ping_req":
            m.on_ping_req(frm, *args, self.now)
        elif kind == "pong":
            m.on_pong(frm, *args)

    def view(self, observer: bytes) -> dict[bytes, int]:
        return {nid: mem.state for nid, mem in self.members[observer].members.items()}

    def alive_everywhere(self) -> bool:
        """Every live node sees every other live node alive."""
        live = [n for n in self.members if n not in self.down]
        return all(self.members[a].state(b) == ALIVE for a in live for b in live if b != a)

    def states_of(self, target: bytes) -> Counter[int | None]:
        return Counter(
            self.members[o].state(target)
            for o in self.members
            if o != target and o not in self.down
        )

    def went(self, target: bytes, state: int, since: float = 0.0) -> list[tuple[float, bytes]]:
        return [
            (t, o)
            for t, o, c in self.changes
            if c.node_id == target and c.new == state and t >= since
        ]


# -- a quiet mesh ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 48])
def test_a_quiet_mesh_holds_with_no_suspicion_and_constant_work_per_node(n: int) -> None:
    net = Net(n)
    net.introduce_all()
    net.run(600.0)
    assert net.alive_everywhere()
    assert net.counts["peers_suspected"] == 0 and net.counts["peers_dead"] == 0
    # One probe per period each, answered: four frames a period per node on average,
    # whatever the mesh's size (gossip of the joins aside, in the first seconds).
    for port in net.ports.values():
        assert 600 <= port.sent["ping"] <= 602
        assert port.sent["ping_req"] == 0
    per_node = sum(sum(p.sent.values()) for p in net.ports.values()) / n
    assert per_node < 600 * 2 + 200


def test_every_member_is_probed_once_a_round() -> None:
    net = Net(10)
    net.introduce_all()
    pinged: Counter[tuple[bytes, bytes]] = Counter()
    orig = Net.send

    def send(self, frm, to, kind, me, rumors, args):
        if kind == "ping":
            pinged[frm, to] += 1
        orig(self, frm, to, kind, me, rumors, args)

    Net.send = send  # type: ignore[method-assign]
    try:
        net.run(90.0)  # ten rounds of nine
    finally:
        Net.send = orig  # type: ignore[method-assign]
    for a, b in itertools.permutations(net.members, 2):
        assert 9 <= pinged[a, b] <= 11


def test_a_node_learns_the_whole_mesh_from_one_seed_by_gossip() -> None:
    net = Net(32)
    ids = list(net.members)
    seed = ids[0]
    for other in ids[1:]:  # each knows the seed, the seed knows each (hellos)
        net.note(other, net.members[other].add(seed, 1, 0.0))
        net.note(seed, net.members[seed].add(other, 1, 0.0))
    net.run(10.0)
    assert all(len(net.members[i].live()) == 31 for i in ids)
    assert net.alive_everywhere()


def test_a_fact_goes_to_each_member_once_and_not_to_the_node_it_says_is_alive() -> None:
    """Counted whoever got them, frames to random members would leave a member of a small
    mesh untold now and then: a node's joining, which each member must hear of to say
    hello to it. None is spent on a member told already, or on the node itself (that it
    is alive is no news to it); the fact is done once every live member was told. What
    is said against a node still goes on every frame to it."""
    net = Net(4)
    net.introduce_all()
    net.run(5.0)  # (their meeting told everywhere: no news left)
    m, new = net.members[node(0)], node(9)
    m.learn(Fact(new, 1, 0, ALIVE), net.now)

    def carries(to: bytes) -> bool:
        return new in {f.node_id for f in m.rumors(RUMORS_PER_FRAME, to)}

    assert not carries(new)
    assert carries(node(1)) and not carries(node(1))
    assert not carries(new) and carries(node(2))
    assert carries(node(3))
    assert not any(carries(to) for to in (node(1), node(2), node(3), new))
    m.learn(Fact(new, 1, 0, SUSPECT, node(1)), net.now)  # (news to it: it refutes)
    sent = [rumors for *_, to, _kind, _me, rumors, _args in net.queue if to == new]
    assert any(f.node_id == new and f.state == SUSPECT for rumors in sent for f in rumors)
    assert carries(new) and carries(new)  # (named in every frame to it)


# -- failures ---------------------------------------------------------------------------------


def test_a_node_that_is_gone_is_suspected_then_dead_everywhere() -> None:
    net = Net(16)
    net.introduce_all()
    net.run(20.0)
    victim = node(7)
    net.down.add(victim)
    gone_at = net.now
    net.run(30.0)
    assert net.states_of(victim) == Counter({DEAD: 15})
    first_dead = min(t for t, _o in net.went(victim, DEAD, gone_at))
    last_dead = max(t for t, _o in net.went(victim, DEAD, gone_at))
    # found by some probe within a round, dead after the suspicion, then news to all
    assert first_dead - gone_at <= 16 * TIMING.period_s + TIMING.suspicion_max_s + 1
    assert last_dead - first_dead < 2.0
    others = {n for n in net.members if n != victim}
    assert all(net.members[o].state(p) == ALIVE for o in others for p in others if p != o)


def test_a_closed_connection_gets_a_dead_node_found_in_the_shortest_suspicion() -> None:
    net = Net(16)
    net.introduce_all()
    net.run(20.0)
    victim = node(3)
    net.down.add(victim)
    gone_at = net.now
    for o in net.members:  # every node's connection from it closes
        if o != victim:
            net.note(o, net.members[o].disconnected(victim, net.now))
    net.run(10.0)
    dead = [t for t, _o in net.went(victim, DEAD, gone_at)]
    assert len(dead) == 15
    # confirmed by the others at once: the shortest suspicion, not dead_after_s
    assert max(dead) - gone_at <= TIMING.suspicion_min_s + 0.1


def test_a_live_node_refutes_a_suspicion_and_stays_alive() -> None:
    net = Net(8)
    net.introduce_all()
    net.run(10.0)
    target = node(2)
    net.note(node(0), net.members[node(0)].disconnected(target, net.now))  # a false alarm
    assert net.members[node(0)].state(target) == SUSPECT
    net.run(20.0)
    assert net.alive_everywhere()
    assert net.members[target].refuted == 1
    assert not net.went(target, DEAD)
    assert net.counts["refuted"] == 1


def test_a_cut_link_is_bridged_by_indirect_probes() -> None:
    net = Net(8)
    net.introduce_all()
    net.run(5.0)
    net.cut.add(frozenset((node(0), node(1))))
    net.run(120.0)
    assert net.alive_everywhere()
    assert not net.went(node(1), SUSPECT) and not net.went(node(0), SUSPECT)
    assert net.ports[node(0)].sent["ping_req"] > 0


def test_a_slow_node_is_not_declared_dead() -> None:
    """Its answers come late (past the probe timeout, within the period) from every node:
    the indirect probes' answers come in time."""
    net = Net(8)
    net.introduce_all()
    net.run(5.0)
    net.slow[node(4)] = 0.7 * TIMING.period_s
    net.run(300.0)
    assert not net.went(node(4), DEAD)
    assert net.states_of(node(4)) == Counter({ALIVE: 7})


def test_a_closed_connection_s_suspicion_is_cut_short_by_confirmations() -> None:
    net = Net(8)
    net.introduce_all()
    m = net.members[node(0)]
    target = node(5)
    m.disconnected(target, 0.0)
    member = m.members[target]
    assert member.deadline == pytest.approx(TIMING.suspicion_max_s)  # alone: dead_after_s
    m.learn(Fact(target, 1, 0, SUSPECT, node(1)), 0.0)
    one = member.deadline
    m.learn(Fact(target, 1, 0, SUSPECT, node(2)), 0.0)
    two = member.deadline
    m.learn(Fact(target, 1, 0, SUSPECT, node(2)), 0.0)  # (the same one again: no change)
    assert member.deadline == two
    m.learn(Fact(target, 1, 0, SUSPECT, node(3)), 0.0)
    assert TIMING.suspicion_max_s > one > two > member.deadline
    assert member.deadline == pytest.approx(TIMING.suspicion_min_s)


def test_unanswered_probes_alone_wait_dead_after_s_whatever_the_confirmations() -> None:
    """Many members missing a slow member's answers at once (a loaded machine) are not
    independent evidence: their suspicion waits the whole dead_after_s."""
    net = Net(8)
    net.introduce_all()
    m = net.members[node(0)]
    target = node(5)
    m.learn(Fact(target, 1, 0, SUSPECT, node(1)), 0.0)
    for i in (2, 3, 4, 6):
        m.learn(Fact(target, 1, 0, SUSPECT, node(i)), 0.0)
    assert m.members[target].deadline == pytest.approx(TIMING.suspicion_max_s)
    m.disconnected(target, 0.5)  # our own connection from it closes: now it counts
    assert m.members[target].deadline == pytest.approx(TIMING.suspicion_min_s)


def test_a_starved_node_is_suspected_but_refutes_within_dead_after_s() -> None:
    net = Net(16)
    net.introduce_all()
    net.run(5.0)
    slow = node(6)
    net.slow[slow] = 3.0  # everything it says arrives 3 s late, for 20 s
    net.run(20.0)
    net.slow.clear()
    net.run(20.0)
    assert net.went(slow, SUSPECT) and not net.went(slow, DEAD)
    assert net.alive_everywhere()


def test_a_node_late_for_its_period_judges_no_probe() -> None:
    """Its own loop starved: the answer may be waiting unread, so nobody is suspected."""
    net = Net(4)
    net.introduce_all()
    m = net.members[node(0)]
    m.tick(0.0)  # a probe goes out; its answer is never delivered
    changes = m.tick(1.0 + TIMING.probe_timeout_s + 0.3)  # the period's end, late
    assert changes == []
    assert net.counts["probes_unjudged"] == 1


def test_a_partition_heals_in_the_same_lives() -> None:
    net = Net(8)
    net.introduce_all()
    net.run(5.0)
    left, right = set(list(net.members)[:4]), set(list(net.members)[4:])
    for a in left:
        for b in right:
            net.cut.add(frozenset((a, b)))
    net.run(60.0)
    for a in left:
        assert all(net.members[a].state(b) == DEAD for b in right)
    net.cut.clear()
    healed = net.now
    net.run(60.0)
    assert net.alive_everywhere()
    back = [c for t, _o, c in net.changes if t >= healed and c.new == ALIVE and c.old == DEAD]
    assert len(back) == 2 * 4 * 4 and not any(c.life for c in back)
    assert all(m.incarnation == 1 for m in net.members.values())


def test_a_restarted_node_is_a_new_life_that_replaces_the_dead_one() -> None:
    net = Net(6)
    net.introduce_all()
    net.run(5.0)
    victim = node(1)
    net.down.add(victim)
    net.run(30.0)
    assert net.states_of(victim) == Counter({DEAD: 5})
    net.down.discard(victim)
    del net.members[victim]
    net.add(victim, 2, 99)
    restarted = net.now
    for o in net.members:  # its hellos at start (known peers), and theirs
        if o != victim:
            net.note(o, net.members[o].add(victim, 2, net.now))
            net.note(victim, net.members[victim].add(o, 1, net.now))
    net.run(2.0)
    lives = [c for t, _o, c in net.changes if t >= restarted and c.node_id == victim]
    assert len(lives) == 5 and all(c.life and c.new == ALIVE for c in lives)
    assert net.alive_everywhere()


def test_a_goodbye_is_a_death_everyone_learns_by_gossip() -> None:
    net = Net(12)
    net.introduce_all()
    net.run(5.0)
    leaver = node(9)
    net.note(node(0), net.members[node(0)].left(leaver, 1, net.now))
    net.down.add(leaver)
    said = net.now
    net.run(3.0)
    dead = net.went(leaver, DEAD, said)
    assert len(dead) == 11 and max(t for t, _o in dead) - said < 2.0


def test_news_of_a_stranger_s_death_is_ignored_and_old_news_loses() -> None:
    m = Net(0).add(node(0), 1, 0)
    assert m.learn(Fact(node(1), 1, 0, DEAD), 0.0) == []
    assert m.learn(Fact(node(1), 3, 2, ALIVE), 0.0) == [Change(node(1), None, ALIVE)]
    assert m.learn(Fact(node(1), 3, 1, DEAD), 0.0) == []  # an earlier state of the life
    assert m.learn(Fact(node(1), 2, 9, SUSPECT), 0.0) == []  # an earlier life
    assert m.learn(Fact(node(1), 3, 2, DEAD), 0.0) == [Change(node(1), ALIVE, DEAD)]
    assert m.learn(Fact(node(1), 3, 2, ALIVE), 0.0) == []  # dead stays dead in its state
    assert m.learn(Fact(node(1), 3, 3, ALIVE), 0.0) == [Change(node(1), DEAD, ALIVE)]


def test_time_a_node_was_starved_does_not_count_against_its_suspects() -> None:
    """Its loop did not run: it could not hear the refutation either."""
    net = Net(4)
    net.introduce_all()
    net.run(2.0)
    m = net.members[node(0)]
    target = node(1)
    m.learn(Fact(target, 1, 0, SUSPECT, node(2)), net.now)
    deadline = m.members[target].deadline
    changes = m.tick(deadline + 0.5)  # the first tick in more than five seconds
    assert m.state(target) == SUSPECT and not any(c.new == DEAD for c in changes)
    assert m.members[target].deadline > deadline + 0.5
    assert net.counts["starved_ticks"] == 1


def test_a_node_behind_on_its_frames_declares_nobody_dead() -> None:
    net = Net(4)
    net.introduce_all()
    m = net.members[node(0)]
    target = node(1)
    for t in range(6):  # (its loop runs: no starvation)
        m.tick(float(t))
    m.learn(Fact(target, 1, 0, SUSPECT, node(2)), 5.0)
    deadline = m.members[target].deadline
    for t in (6.0, 7.0, 8.0, 9.0, deadline + 0.1):
        assert [c for c in m.tick(t, behind=True) if c.new == DEAD] == []
    assert m.state(target) == SUSPECT
    assert [c.new for c in m.tick(deadline + 0.2) if c.node_id == target] == [DEAD]


def test_a_suspicion_of_a_later_state_starts_anew() -> None:
    m = Net(0).add(node(0), 1, 0)
    m.learn(Fact(node(1), 1, 0, ALIVE), 0.0)
    assert [c.new for c in m.learn(Fact(node(1), 1, 0, SUSPECT, node(2)), 1.0)] == [SUSPECT]
    first = m.members[node(1)].deadline
    # it refuted (we missed that) and is suspected again: a new suspicion, a new deadline
    changes = m.learn(Fact(node(1), 1, 1, SUSPECT, node(3)), 3.0)
    assert [(c.old, c.new) for c in changes] == [(SUSPECT, ALIVE), (ALIVE, SUSPECT)]
    assert m.members[node(1)].deadline == first + 2.0
    assert m.learn(Fact(node(1), 1, 1, DEAD, node(3)), 4.0) == [Change(node(1), SUSPECT, DEAD)]
    assert m.learn(Fact(node(1), 1, 1, SUSPECT, node(4)), 4.0) == []  # dead stays dead
    assert m.learn(Fact(node(1), 2, 0, DEAD, node(4)), 5.0) == []  # a later life, dead too
    assert m.members[node(1)].incarnation == 2


def test_a_member_that_left_is_forgotten_after_a_while() -> None:
    net = Net(3)
    net.introduce_all()
    net.run(2.0)
    m = net.members[node(0)]
    m.left(node(2), 1, net.now)
    net.down.add(node(2))
    net.run(FORGET_DEAD_AFTER_S - 10.0)
    assert m.state(node(2)) == DEAD  # (a late rumor of its life brings nothing back)
    assert m.learn(Fact(node(2), 1, 0, ALIVE), net.now) == []
    net.run(20.0)
    assert m.state(node(2)) is None


def test_a_member_back_in_a_new_life_after_its_goodbye_is_not_forgotten() -> None:
    """Restarted after a goodbye (a clean restart), its new life was still marked as one
    that left, and dropped from membership FORGET_DEAD_AFTER_S after the goodbye, alive or
    not: a death about then was never declared (the mesh kept the peer alive for good)."""
    net = Net(3)
    net.introduce_all()
    net.run(2.0)
    leaver = node(2)
    for o in (node(0), node(1)):
        net.note(o, net.members[o].left(leaver, 1, net.now))
    net.down.add(leaver)
    net.run(2.0)
    net.down.discard(leaver)
    del net.members[leaver]
    net.add(leaver, 2, 99)
    for o in (node(0), node(1)):  # its hellos at start, and theirs
        net.note(o, net.members[o].add(leaver, 2, net.now))
        net.note(leaver, net.members[leaver].add(o, 1, net.now))
    net.run(FORGET_DEAD_AFTER_S - 6.0)
    assert net.states_of(leaver) == Counter({ALIVE: 2})
    net.down.add(leaver)  # (killed: no goodbye this time)
    killed = net.now
    net.run(30.0)
    assert net.states_of(leaver) == Counter({DEAD: 2})
    assert len(net.went(leaver, DEAD, killed)) == 2
