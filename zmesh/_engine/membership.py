"""Who is alive in the mesh: SWIM's failure detector, with Lifeguard's suspicion.

Pure state with the time and the randomness passed in: no sockets, no clock. The mesh
(liveness.py) feeds it what arrives and sends what it asks for through a ``Wire``.

Each node's work per period is constant, whatever the mesh's size (a heartbeat to every
other node made it grow with the mesh, and the mesh's with its square):

- **Probing.** Each period (``heartbeat_interval_s``) a node pings one member, in a
  shuffled round of all of them. Unanswered after half a period, it asks
  ``INDIRECT_PROBES`` others to ping it too (a bad link is not a dead node); unanswered at
  the period's end, the member is *suspect*.
- **Suspicion** is refutable. Each suspicion is named in every frame sent to the suspect,
  which refutes it by raising its ``refuted`` count: ``(incarnation, refuted)`` orders a
  node's states (the incarnation is bumped at every start), and news of a higher one
  wins. Unrefuted, a suspicion becomes a death after ``dead_after_s``.
- **A closed connection.** A member whose connection to this node closed (a process that
  ends closes them all) is suspected at once, and that suspicion ends sooner as other
  members suspect the same on their own (Lifeguard: down to ``SUSPICION_MIN_PERIODS``
  periods with ``SUSPICION_CONFIRMATIONS`` of them).
- **Gossip.** Joins, suspicions, refutations and deaths ride on pings and pongs and go
  to a few random members several times a second while there is news, each piece a
  bounded number of times: they reach everyone in about log(N) rounds.
- A member declared dead that speaks again is told so, refutes, and is alive again in
  the same incarnation (its sockets kept); a new incarnation is a new life.

This module is long because SWIM's and Lifeguard's rules are one state machine over the
members; the retelling of news is in news.py and the wire in liveness.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .._protocol.checks import U63
from .limits import (
    DEAD_PROBE_PERIODS,
    FORGET_DEAD_AFTER_S,
    GOSSIP_FANOUT,
    GOSSIP_SHARE,
    INDIRECT_PROBES,
    PROBE_TIMEOUT_SHARE,
    STARVED_PERIODS,
    SUSPICION_CONFIRMATIONS,
    SUSPICION_MIN_PERIODS,
)
from .news import ALIVE, DEAD, SUSPECT, Fact, News


class Change(NamedTuple):
    """A member's state changed here (``old`` None: it was not known; ``life``: a new
    incarnation of a known node, which replaces the old one)."""

    node_id: bytes
    old: int | None
    new: int
    life: bool = False


class Wire(Protocol):
    """How membership reaches other nodes; every frame carries news (``rumors``)."""

    def ping(self, to: bytes, seq: int, target: bytes) -> None: ...
    def ping_req(self, to: bytes, seq: int, target: bytes) -> None: ...
    def pong(self, to: bytes, seq: int, about: bytes) -> None: ...
    def gossip(self, to: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Timing:
    period_s: float  # heartbeat_interval_s
    suspicion_max_s: float  # dead_after_s

    @property
    def probe_timeout_s(self) -> float:
        return self.period_s * PROBE_TIMEOUT_SHARE

    @property
    def suspicion_min_s(self) -> float:
        return min(self.suspicion_max_s, self.period_s * SUSPICION_MIN_PERIODS)


@dataclass(slots=True)
class Member:
    node_id: bytes
    incarnation: int
    refuted: int
    state: int
    # a suspicion: when it began, who suspect it on their own, the confirmations expected
    suspected_at: float = 0.0
    suspectors: set[bytes] = field(default_factory=set)
    expected: int = 0
    deadline: float = math.inf
    closed: bool = False  # our connection from it closed during the suspicion
    told_at: float = -math.inf  # when it was last told of its suspicion or death
    left: bool = False  # it said goodbye (not probed once dead)
    died_at: float = 0.0

    @property
    def key(self) -> tuple[int, int]:
        return (self.incarnation, self.refuted)

    def fact(self) -> Fact:
        by = next(iter(self.suspectors), b"") if self.state != ALIVE else b""
        return Fact(self.node_id, self.incarnation, self.refuted, self.state, by)


@dataclass(slots=True)
class Probe:
    target: bytes
    relay_at: float  # when other members are asked to probe it too
    ends: float  # when it is suspected, unanswered
    answered: bool = False


class Membership:
    """This node's view of the other members, and its part in probing and gossip."""

    def __init__(
        self,
        node_id: bytes,
        incarnation: int,
        timing: Timing,
        wire: Wire,
        rng: random.Random | None = None,
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.refuted = 0
        self.timing = timing
        self.wire = wire
        self.rng = rng or random.Random()
        self.members: dict[bytes, Member] = {}
        self._count_to = count
        self._news = News()
        self._round: list[bytes] = []  # this round's probe order
        self._dead_turn = 0
        self._seq = 0
        self._probes: dict[int, Probe] = {}
        # the probes this node makes for others: our seq -> (asker, its seq, until)
        self._relays: dict[int, tuple[bytes, int, float]] = {}
        self._next_period = 0.0
        self._next_gossip = math.inf
        self._periods = 0
        self._last_tick = 0.0

    # -- reading ------------------------------------------------------------------------

    def me(self) -> Fact:
        return Fact(self.node_id, self.incarnation, self.refuted, ALIVE)

    def state(self, node_id: bytes) -> int | None:
        member = self.members.get(node_id)
        return None if member is None else member.state

    def live(self) -> list[bytes]:
        return [m.node_id for m in self.members.values() if m.state != DEAD]

    def next_wakeup(self) -> float:
        wake = min(self._next_period, self._next_gossip)
        for probe in self._probes.values():
            if not probe.answered:
                wake = min(wake, probe.relay_at)
        for member in self.members.values():
            if member.state == SUSPECT:
                wake = min(wake, member.deadline)
        return wake

    def rumors(self, limit: int, about: bytes | None = None) -> list[Fact]:
        """News to put on a frame (to ``about``: what is said of it first, and nothing
        it was told already)."""
        if not self._news:
            return []
        return self._news.take(limit, about, len(self.members), set(self.live()))

    # -- what arrives ---------------------------------------------------------------------

    def add(self, node_id: bytes, incarnation: int, now: float) -> list[Change]:
        """A node spoke to us directly (a hello) in life ``incarnation``."""
        member = self.members.get(node_id)
        if member is None or incarnation > member.incarnation:
            return self.learn(Fact(node_id, incarnation, 0, ALIVE), now)
        if incarnation == member.incarnation and member.state != ALIVE:
            self._tell(member, now)  # (it cannot be taken back from here: it refutes)
        return []

    def retell(self, node_id: bytes) -> None:
        """Spread what is known of ``node_id`` anew: the news of it was taken for frames
        that could not name it yet (the mesh names only nodes that said hello to it)."""
        member = self.members.get(node_id)
        if member is not None:
            self._spread(member.fact())

    def heard(self, fact: Fact, now: float) -> list[Change]:
        """A frame came from ``fact.node_id`` itself, with its own state."""
        changes = self.learn(fact, now)
        member = self.members.get(fact.node_id)
        if member is not None and member.state != ALIVE and member.key >= fact[1:3]:
            self._tell(member, now)  # it lives: it refutes once told
        return changes

    def learn(self, fact: Fact, now: float) -> list[Change]:
        """News of a node (gossip, or from itself); what it changed here."""
        if fact.node_id == self.node_id:
            self._about_me(fact)
            return []
        member = self.members.get(fact.node_id)
        key = (fact.incarnation, fact.refuted)
        if member is None:
            if fact.state == DEAD:
                return []  # (a stranger's death: nothing to forget)
            member = self.members[fact.node_id] = Member(
                fact.node_id, fact.incarnation, fact.refuted, ALIVE
            )
            self._enter_round(fact.node_id)
            self._spread(member.fact())
            changes = [Change(fact.node_id, None, ALIVE)]
            if fact.state == SUSPECT:
                changes += self._suspect(member, fact.by, now)
            return changes
        if key < member.key:
            return []
        life = fact.incarnation > member.incarnation
        if life:
            member.left = False  # (a goodbye is of the life that said it)
        old = member.state
        if fact.state == ALIVE:
            if key == member.key:
                return []
            member.incarnation, member.refuted = fact.incarnation, fact.refuted
            self._set(member, ALIVE)
            self._spread(member.fact())
            return [Change(fact.node_id, old, ALIVE, life)]
        if fact.state == SUSPECT:
            if key == member.key and old != ALIVE:
                if old == SUSPECT:
                    self._confirm(member, fact.by, now)
                return []  # (dead stays dead in the state it died in)
            member.incarnation, member.refuted = fact.incarnation, fact.refuted
            changes = []
            if old != ALIVE:  # a later state of it, suspected anew: alive until judged
                self._set(member, ALIVE)
                changes.append(Change(fact.node_id, old, ALIVE, life))
            return changes + self._suspect(member, fact.by, now)
        member.incarnation, member.refuted = fact.incarnation, fact.refuted
        if old == DEAD:
            return []
        return self._die(member, fact.by, now, life)

    def disconnected(self, node_id: bytes, now: float) -> list[Change]:
        """Our connection from ``node_id`` closed: a process that ended closes them all.
        It is suspect at once, and its suspicion may be cut short by confirmations."""
        member = self.members.get(node_id)
        if member is None or member.state == DEAD:
            return []
        if member.state == ALIVE:
            changes = self._suspect(member, self.node_id, now)
        else:
            changes = []
            self._confirm(member, self.node_id, now)
        member.closed = True
        member.deadline = member.suspected_at + self._suspicion_s(member)
        self._ping(node_id, now)  # (it refutes at once if it lives)
        return changes

    def left(self, node_id: bytes, incarnation: int, now: float) -> list[Change]:
        """``node_id`` said goodbye."""
        member = self.members.get(node_id)
        if member is None or member.incarnation != incarnation or member.state == DEAD:
            return []
        member.left = True
        return self._die(member, node_id, now)

    def forget(self, node_id: bytes) -> None:
        self.members.pop(node_id, None)
        self._news.drop(node_id)

    def on_ping(self, sender: bytes, seq: int, target: bytes) -> None:
        if target == self.node_id:
            self.wire.pong(sender, seq, self.node_id)

    def on_ping_req(self, sender: bytes, seq: int, target: bytes, now: float) -> None:
        """Probe ``target`` for ``sender``; its answer goes back to ``sender``."""
        if target in self.members and target != sender:
            ours = self._next_seq()
            self._relays[ours] = (sender, seq, now + self.timing.period_s)
            self.wire.ping(target, ours, target)

    def on_pong(self, sender: bytes, seq: int, about: bytes) -> None:
        probe = self._probes.get(seq)
        if probe is not None:
            if probe.target == about:
                probe.answered = True
            return
        relay = self._relays.pop(seq, None)
        if relay is not None and about == sender:
            self.wire.pong(relay[0], relay[1], about)

    # -- time -----------------------------------------------------------------------------

    def tick(self, now: float, behind: bool = False) -> list[Change]:
        """Probe, judge, gossip: whatever is due at ``now``. ``behind``: frames are
        waiting unread (a refutation may be among them): nobody is judged now."""
        changes: list[Change] = []
        gap, self._last_tick = now - self._last_tick, now
        if gap > self.timing.period_s * STARVED_PERIODS:
            # This node's loop was starved: it heard nothing meanwhile, and that time does
            # not count against the members it suspects.
            self._count("starved_ticks")
            for member in self.members.values():
                if member.state == SUSPECT:
                    member.deadline += gap
        for member in list(self.members.values()):
            if member.state == SUSPECT and now >= member.deadline and not behind:
                changes += self._die(member, self.node_id, now)
        for seq, probe in list(self._probes.items()):
            if not probe.answered and now >= probe.relay_at:
                probe.relay_at = math.inf
                self._relay(seq, probe.target)
        if now >= self._next_period:
            late = now - self._next_period
            judged = late <= self.timing.probe_timeout_s and not behind
            changes += self._end_period(now, judged)
            self._next_period = (
                self._next_period + self.timing.period_s
                if late < self.timing.period_s
                else now + self.timing.period_s
            )
            self._start_period(now)
        if now >= self._next_gossip:
            self._gossip(now)
        for seq, (_asker, _their, until) in list(self._relays.items()):
            if now >= until:
                del self._relays[seq]
        return changes

    def _end_period(self, now: float, judged: bool) -> list[Change]:
        """The period's probes end; an unanswered one makes its target suspect, unless
        this node was itself too late to tell (its loop starved: the answer may wait
        unread)."""
        changes: list[Change] = []
        for seq, probe in list(self._probes.items()):
            if now < probe.ends:
                continue
            del self._probes[seq]
            if probe.answered:
                continue
            member = self.members.get(probe.target)
            if member is None or member.state != ALIVE:
                continue
            if judged:
                changes += self._suspect(member, self.node_id, now)
            else:
                self._count("probes_unjudged")
        return changes

    def _start_period(self, now: float) -> None:
        self._periods += 1
        for member in [m for m in self.members.values() if m.left]:
            if now - member.died_at > FORGET_DEAD_AFTER_S:
                self.forget(member.node_id)  # (the mesh forgot its peer when it left)
        target = self._next_target()
        if target is not None:
            self._ping(target, now)
        if self._periods % DEAD_PROBE_PERIODS == 0:
            dead = [m for m in self.members.values() if m.state == DEAD and not m.left]
            if dead:
                self._dead_turn = (self._dead_turn + 1) % len(dead)
                # (no probe of ours: its answer tells us it lives, and we tell it of its death)
                node_id = dead[self._dead_turn].node_id
                self.wire.ping(node_id, self._next_seq(), node_id)

    def _next_target(self) -> bytes | None:
        while True:
            if not self._round:
                self._round = self.live()
                if not self._round:
                    return None
                self.rng.shuffle(self._round)
            target = self._round.pop()
            member = self.members.get(target)
            if member is not None and member.state != DEAD:
                return target

    def _enter_round(self, node_id: bytes) -> None:
        """A new member joins the current round at a random place (probed this round)."""
        self._round.insert(self.rng.randrange(len(self._round) + 1), node_id)

    def _ping(self, target: bytes, now: float) -> None:
        seq = self._next_seq()
        t = self.timing
        self._probes[seq] = Probe(target, now + t.probe_timeout_s, now + t.period_s)
        self._count("probes")
        self.wire.ping(target, seq, target)

    def _relay(self, seq: int, target: bytes) -> None:
        others = [m for m in self.live() if m != target and self.members[m].state == ALIVE]
        for helper in self.rng.sample(others, min(INDIRECT_PROBES, len(others))):
            self.wire.ping_req(helper, seq, target)

    def _gossip(self, now: float) -> None:
        if not self._news:
            self._next_gossip = math.inf
            return
        others = self.live()
        for to in self.rng.sample(others, min(GOSSIP_FANOUT, len(others))):
            self.wire.gossip(to)
        self._next_gossip = now + self.timing.period_s * GOSSIP_SHARE if self._news else math.inf

    # -- state changes ----------------------------------------------------------------------

    def _set(self, member: Member, state: int) -> None:
        member.state = state
        if state != SUSPECT:
            member.suspectors = set()
            member.deadline = math.inf
            member.closed = False

    def _suspect(self, member: Member, by: bytes, now: float) -> list[Change]:
        if member.state != ALIVE:
            return []
        old = member.state
        self._set(member, SUSPECT)
        member.suspected_at = now
        member.suspectors = {by or self.node_id}
        alive = sum(1 for m in self.members.values() if m.state != DEAD)
        member.expected = max(0, min(SUSPICION_CONFIRMATIONS, alive - 1))
        member.deadline = now + self._suspicion_s(member)
        self._count("peers_suspected")
        self._spread(member.fact())
        self._tell(member, now)
        return [Change(member.node_id, old, SUSPECT)]

    def _confirm(self, member: Member, by: bytes, now: float) -> None:
        if not by or by in member.suspectors or len(member.suspectors) > member.expected:
            return  # (past the confirmations expected the deadline is the shortest already)
        member.suspectors.add(by)
        member.deadline = member.suspected_at + self._suspicion_s(member)
        self._spread(Fact(member.node_id, member.incarnation, member.refuted, SUSPECT, by))

    def _suspicion_s(self, member: Member) -> float:
        """``dead_after_s``; when our connection from it closed, down to the minimum as
        others confirm the suspicion (Lifeguard). Unanswered probes alone never cut it
        short: on a loaded machine many members miss the answers of a slow one at once,
        and their confirmations are not independent evidence."""
        low, high = self.timing.suspicion_min_s, self.timing.suspicion_max_s
        if not member.closed:
            return high
        if member.expected < 1:
            return low
        share = math.log(len(member.suspectors)) / math.log(member.expected + 1)
        return max(low, high - (high - low) * share)

    def _die(self, member: Member, by: bytes, now: float, life: bool = False) -> list[Change]:
        old = member.state
        self._set(member, DEAD)
        member.died_at = now
        self._count("peers_dead")
        self._spread(Fact(member.node_id, member.incarnation, member.refuted, DEAD, by))
        return [Change(member.node_id, old, DEAD, life)]

    def _about_me(self, fact: Fact) -> None:
        """News of this node: a suspicion or a death of it (in this life, not an earlier
        state of it) is refuted at once."""
        if fact.state == ALIVE or fact.incarnation != self.incarnation:
            return
        if fact.refuted < self.refuted or self.refuted == U63:
            return
        # (no further than the wire carries: one forged suspicion at the largest count
        # would make every frame of ours undecodable, and its peers drop our connections)
        self.refuted = min(fact.refuted + 1, U63)
        self._count("refuted")
        self._spread(self.me())

    def _tell(self, member: Member, now: float) -> None:
        """Make sure ``member`` hears what is said of it (so it can refute): at most once
        a period, a frame of news to it directly."""
        if now - member.told_at >= self.timing.period_s:
            member.told_at = now
            self._spread(member.fact())
            self.wire.gossip(member.node_id)

    def _spread(self, fact: Fact) -> None:
        self._news.put(fact)
        if self._next_gossip == math.inf:
            self._next_gossip = -math.inf  # (at the next tick)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _count(self, name: str, n: int = 1) -> None:
        if self._count_to is not None:
            self._count_to(name, n)

    def start(self, now: float) -> None:
        self._next_period = self._last_tick = now
