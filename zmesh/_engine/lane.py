"""Delivery state of one lane: the messages of one topic owed to one group.

A lane is pure state with the current time passed in: no sockets, no disk, no clock. The
engine feeds it publishes, membership changes, acks and ticks, and sends what ``take``
hands out. Every unsettled sequence is in exactly one state:

- READY: waiting in its partition's heap, most urgent (lowest priority number) first;
- DELAYED: waiting for ``not_before`` (a schedule, a nack delay or a retry backoff);
- IN_FLIGHT: sent to a member, waiting for its ack until ``deadline``.
"""

from __future__ import annotations

import heapq
import random
from bisect import insort
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .routing import rendezvous

READY = 0
DELAYED = 1
IN_FLIGHT = 2

# A ready heap holds one int per message: priority above the sequence, so the smallest
# is the most urgent, oldest one (an int costs a third of a (priority, seq) tuple).
SEQ_BITS = 56
SEQ_MASK = (1 << SEQ_BITS) - 1


class Entry:
    """One unsettled message of a lane."""

    __slots__ = ("seq", "partition", "priority", "attempt", "state", "member", "deadline",
                 "not_before", "expires_at")

    def __init__(self, seq: int, partition: int, priority: int, attempt: int,
                 not_before: float, expires_at: float) -> None:
        self.seq = seq
        self.partition = partition
        self.priority = priority
        self.attempt = attempt
        self.state = READY
        self.member: bytes | None = None
        self.deadline = 0.0
        self.not_before = not_before
        self.expires_at = expires_at  # 0.0: never


@dataclass(slots=True)
class Member:
    """A live member of the lane's group and its credit."""

    max_in_flight: int
    batch_size: int
    in_flight: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Timing:
    """Retry timing of a lane (from the topic's config)."""

    ack_timeout_s: float = 30.0
    retry_backoff_s: float = 0.5
    max_retry_backoff_s: float = 30.0
    max_attempts: int = 0  # 0: unlimited


@dataclass(slots=True)
class TickResult:
    """What a tick settled or moved."""

    timed_out: int = 0
    expired: list[int] = field(default_factory=list)
    exhausted: list[Entry] = field(default_factory=list)


class Lane:
    """Unsettled messages of (topic, lane) at this producer, and who gets them next."""

    def __init__(
        self, topic: str, name: str, *, producer: bytes, partitions: int, timing: Timing,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.topic = topic
        self.name = name
        self.producer = producer
        self.timing = timing
        self._rng = rng
        self.entries: dict[int, Entry] = {}
        self.members: dict[bytes, Member] = {}
        self._partitions = partitions
        self._ready: list[list[int]] = [[] for _ in range(partitions)]
        self._bulk = False  # loading: append to the heaps, heapify once at the end
        self._ready_count = 0
        self._delayed: list[tuple[float, int]] = []
        # One record per take(): (deadline, serial, seqs handed out then).
        self._deadlines: list[tuple[float, int, list[int]]] = []
        self._serial = 0
        self._expiring: list[tuple[float, int]] = []
        self._order: deque[int] = deque()
        self._next_floor = 0
        self._owners: list[bytes | None] | None = None
        self.counts: Counter[str] = Counter()  # per-lane event counts, shown in status

    # -- content --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, seq: int) -> bool:
        return seq in self.entries

    def add(self, seq: int, partition: int, priority: int = 0, attempt: int = 0, *,
            now: float, not_before: float = 0.0, expires_at: float = 0.0) -> None:
        """Owe ``seq`` to this lane's group."""
        entries = self.entries
        if seq in entries:
            return
        if partition >= self._partitions:
            partition = self._grow(partition)
        entry = Entry(seq, partition, priority, attempt, not_before, expires_at)
        entries[seq] = entry
        order = self._order
        if order and seq < order[-1]:
            insort(order, seq)  # rare: a replayed old message
        else:
            order.append(seq)
        if seq >= self._next_floor:
            self._next_floor = seq + 1
        if expires_at:
            heapq.heappush(self._expiring, (expires_at, seq))
        if not_before > now or self._bulk:
            self._schedule(entry, not_before, now)
        else:  # ready now: what _schedule does for a new entry, inline (the common case)
            entry.not_before = 0.0
            heapq.heappush(self._ready[partition], (priority << SEQ_BITS) | seq)
            self._ready_count += 1

    def _grow(self, partition: int) -> int:
        # Messages stored under a larger partition count (topic reconfigured) keep theirs.
        while partition >= self._partitions:
            self._ready.append([])
            self._partitions += 1
            self._owners = None
        return partition

    def _schedule(self, entry: Entry, not_before: float, now: float) -> None:
        entry.member = None
        if entry.expires_at and entry.expires_at <= now and entry.state == IN_FLIGHT:
            # Its expiry passed while it was in flight (tick skipped it): due again now.
            heapq.heappush(self._expiring, (entry.expires_at, entry.seq))
        if not_before > now:
            entry.state = DELAYED
            entry.not_before = not_before
            heapq.heappush(self._delayed, (not_before, entry.seq))
        else:
            entry.state = READY
            entry.not_before = 0.0
            key = (entry.priority << SEQ_BITS) | entry.seq
            if self._bulk:
                self._ready[entry.partition].append(key)
            else:
                heapq.heappush(self._ready[entry.partition], key)
            self._ready_count += 1

    def _remove(self, seq: int) -> Entry | None:
        entry = self.entries.pop(seq, None)
        if entry is None:
            return None
        if entry.state == IN_FLIGHT and entry.member is not None:
            member = self.members.get(entry.member)
            if member is not None:
                member.in_flight.discard(seq)
        elif entry.state == READY:
            self._ready_count -= 1  # its heap record goes stale and is skipped later
        return entry

    def floor(self) -> int:
        """Every sequence of this lane below the floor is settled."""
        order, entries = self._order, self.entries
        while order and order[0] not in entries:
            order.popleft()
        return order[0] if order else self._next_floor

    @property
    def ready_count(self) -> int:
        return self._ready_count

    def in_flight_count(self) -> int:
        return sum(len(m.in_flight) for m in self.members.values())

    # -- membership -----------------------------------------------------------------------

    def set_member(self, member: bytes, max_in_flight: int, batch_size: int) -> bool:
        """Add or update a live member; True when it is new."""
        current = self.members.get(member)
        if current is not None:
            current.max_in_flight, current.batch_size = max_in_flight, batch_size
            return False
        self.members[member] = Member(max_in_flight, batch_size)
        self._owners = None
        return True

    def remove_member(self, member: bytes, now: float) -> int:
        """A member left or died: its in-flight messages are ready again at once."""
        gone = self.members.pop(member, None)
        if gone is None:
            return 0
        self._owners = None
        for seq in gone.in_flight:
            entry = self.entries.get(seq)
            if entry is not None and entry.state == IN_FLIGHT:
                self._schedule(entry, 0.0, now)
        return len(gone.in_flight)

    def owner(self, partition: int) -> bytes | None:
        """The live member that receives this partition."""
        if self._owners is None:
            members = sorted(self.members)
            self._owners = [rendezvous(members, self.producer, p)
                            for p in range(self._partitions)]
        return self._owners[partition]

    # -- delivery -------------------------------------------------------------------------

    def _head(self, partition: int) -> int | None:
        """The valid top of a partition's heap, dropping stale records on the way."""
        heap = self._ready[partition]
        entries = self.entries
        while heap:
            entry = entries.get(heap[0] & SEQ_MASK)
            if entry is not None and entry.state == READY:
                return heap[0]
            heapq.heappop(heap)
        return None

    def begin_bulk(self) -> None:
        """Many adds follow (a restart): defer heap ordering to ``end_bulk``."""
        self._bulk = True

    def end_bulk(self) -> None:
        self._bulk = False
        for heap in self._ready:
            heapq.heapify(heap)

    def take(self, now: float, limit: int = 10_000) -> tuple[dict[bytes, list[Entry]], list[int]]:
        """Hand out ready messages to their owners within their credit.

        Across all partitions a member owns, the most urgent message (lowest priority, then
        lowest sequence) goes first. Returns (member -> entries now in flight) and the
        sequences found expired on the way (already removed).
        """
        out: dict[bytes, list[Entry]] = {}
        expired: list[int] = []
        if not self._ready_count or not self.members:
            return out, expired
        if self._owners is None:
            self.owner(0)  # builds the owner table
        owners = self._owners
        assert owners is not None
        members, ready, entries = self.members, self._ready, self.entries
        heads: list[tuple[int, int]] = []  # (heap key, partition)
        for partition in range(self._partitions):
            owner = owners[partition]
            if owner is None:
                continue
            member = members[owner]
            if len(member.in_flight) >= member.max_in_flight:
                continue
            head = self._head(partition)
            if head is not None:
                heads.append((head, partition))
        heapq.heapify(heads)
        heappop, heappush = heapq.heappop, heapq.heappush
        deadline = now + self.timing.ack_timeout_s
        taken = 0
        sent: list[int] = []
        while heads and taken < limit:
            key, partition = heappop(heads)
            seq = key & SEQ_MASK
            owner = owners[partition]
            assert owner is not None
            member = members[owner]
            in_flight = member.in_flight
            if len(in_flight) >= member.max_in_flight:
                continue  # this member is full: its partitions wait for acks
            heap = ready[partition]
            heappop(heap)
            entry = entries[seq]
            if entry.expires_at and entry.expires_at <= now:
                self._remove(seq)
                expired.append(seq)
            else:
                self._ready_count -= 1
                entry.state = IN_FLIGHT
                entry.member = owner
                entry.deadline = deadline
                entry.attempt += 1
                in_flight.add(seq)
                sent.append(seq)
                batch = out.get(owner)
                if batch is None:
                    batch = out[owner] = []
                batch.append(entry)
                taken += 1
            while heap:  # the partition's next valid head (``_head``, inline)
                top = heap[0]
                nxt = entries.get(top & SEQ_MASK)
                if nxt is not None and nxt.state == READY:
                    heappush(heads, (top, partition))
                    break
                heappop(heap)
        if sent:
            self._serial += 1
            heapq.heappush(self._deadlines, (deadline, self._serial, sent))
        return out, expired

    def unsend(self, entries: Iterable[Entry], now: float) -> None:
        """Sending failed before the message left: make it ready again, attempt undone."""
        for entry in entries:
            if self.entries.get(entry.seq) is entry and entry.state == IN_FLIGHT:
                member = self.members.get(entry.member) if entry.member else None
                if member is not None:
                    member.in_flight.discard(entry.seq)
                entry.attempt -= 1
                self._schedule(entry, 0.0, now)

    def ack(self, seqs: Iterable[int]) -> list[int]:
        """Settle acked sequences; returns those that were still owed."""
        settled = []
        pop, members = self.entries.pop, self.members
        for seq in seqs:
            entry = pop(seq, None)
            if entry is None:
                continue
            settled.append(seq)
            if entry.state == IN_FLIGHT:  # what ``_remove`` does, inline (the common case)
                member = members.get(entry.member) if entry.member is not None else None
                if member is not None:
                    member.in_flight.discard(seq)
            elif entry.state == READY:
                self._ready_count -= 1
        return settled

    def nack(self, seqs: Iterable[int], delay_s: float | None, now: float) -> list[Entry]:
        """Redeliver after ``delay_s`` (None: the lane's backoff for the attempt).

        Returns entries that ran out of attempts (already removed): park them.
        """
        exhausted = []
        for seq in seqs:
            entry = self.entries.get(seq)
            if entry is None or entry.state != IN_FLIGHT:
                continue
            if self._out_of_attempts(entry):
                self._remove(seq)
                exhausted.append(entry)
                continue
            self._release(entry)
            delay = self.backoff(entry.attempt) if delay_s is None else max(0.0, delay_s)
            self._schedule(entry, now + delay if delay > 0 else 0.0, now)
        return exhausted

    def fail(self, seq: int) -> Entry | None:
        """Take ``seq`` out of delivery to be parked; None when it is not owed."""
        return self._remove(seq)

    def _release(self, entry: Entry) -> None:
        member = self.members.get(entry.member) if entry.member else None
        if member is not None:
            member.in_flight.discard(entry.seq)

    def _out_of_attempts(self, entry: Entry) -> bool:
        return bool(self.timing.max_attempts) and entry.attempt >= self.timing.max_attempts

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter (0.5x to 1.5x) for a retry after ``attempt``."""
        t = self.timing
        base = min(t.max_retry_backoff_s, t.retry_backoff_s * (2 ** max(0, attempt - 1)))
        return base * (0.5 + self._rng())

    # -- time -----------------------------------------------------------------------------

    def tick(self, now: float) -> TickResult:
        """Move due delayed messages to ready, time out acks, expire old messages."""
        result = TickResult()
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            t, seq = heapq.heappop(delayed)
            entry = self.entries.get(seq)
            if entry is not None and entry.state == DELAYED and entry.not_before == t:
                self._schedule(entry, 0.0, now)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            t, _, seqs = heapq.heappop(deadlines)
            for seq in seqs:
                entry = self.entries.get(seq)
                if entry is None or entry.state != IN_FLIGHT or entry.deadline != t:
                    continue  # acked, or sent again since with a later deadline
                result.timed_out += 1
                if entry.expires_at and entry.expires_at <= now:
                    self._remove(seq)
                    result.expired.append(seq)
                elif self._out_of_attempts(entry):
                    self._remove(seq)
                    result.exhausted.append(entry)
                else:
                    self._release(entry)
                    self._schedule(entry, now + self.backoff(entry.attempt), now)
        expiring = self._expiring
        while expiring and expiring[0][0] <= now:
            _, seq = heapq.heappop(expiring)
            entry = self.entries.get(seq)
            if entry is not None and entry.state != IN_FLIGHT:
                self._remove(seq)
                result.expired.append(seq)
        return result

    def next_wakeup(self) -> float | None:
        """The earliest time ``tick`` has work, or None."""
        times = [h[0][0] for h in (self._delayed, self._deadlines, self._expiring) if h]
        return min(times) if times else None
