"""What a lane does when delivery does not succeed: ack timeouts, nacks, failures, expiry
and the backoff between attempts. A part of ``Lane`` (lane.py), kept apart from the path
every message takes; pure state with the current time passed in, like the rest of it.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .delivery import DELAYED, IN_FLIGHT, Entry, Member, TickResult, Timing
from .seqqueue import SentWindow


class Retries:
    """Redelivery of a lane's messages; ``Lane`` holds the state these methods use."""

    timing: Timing
    members: dict[bytes, Member]
    entries: dict[int, Entry]
    _sent: SentWindow
    _rng: Callable[[], float]
    _delayed: list[tuple[float, int]]
    _deadlines: list[tuple[float, int, array[int] | range]]
    _expiring: list[tuple[float, int]]
    _wake_at: float
    _serial: int
    on_timer: Callable[[Any, float], None]

    if TYPE_CHECKING:

        def entry(self, seq: int) -> Entry | None: ...
        def state(self, seq: int) -> int | None: ...
        def _schedule(self, entry: Entry, not_before: float, now: float) -> None: ...
        def _remove(self, seq: int) -> Entry | None: ...

    def unsend(self, seqs: Iterable[int], now: float) -> None:
        """Sending failed before the messages left: ready again, attempt undone."""
        for seq in seqs:
            if seq not in self._sent:
                entry = self.entries.get(seq)
                if entry is None or entry.state != IN_FLIGHT:
                    continue  # settled (or handed out again) meanwhile
            entry = self.entry(seq)
            assert entry is not None
            self._release(entry)
            entry.attempt -= 1
            self._schedule(entry, 0.0, now)
        for member in self.members.values():
            member.full = False  # (a take undone says nothing of how fast a member acks)

    def nack(self, seqs: Iterable[int], delay_s: float | None, now: float) -> list[Entry]:
        """Redeliver after ``delay_s`` (None: the lane's backoff for the attempt).

        Returns entries that ran out of attempts (already removed): park them.
        """
        exhausted = []
        for seq in seqs:
            if self.state(seq) != IN_FLIGHT:
                continue
            entry = self.entry(seq)
            assert entry is not None
            if self._out_of_attempts(entry):
                self._remove(seq)
                exhausted.append(entry)
                continue
            self._release(entry)
            delay = self.backoff(entry.attempt) if delay_s is None else max(0.0, delay_s)
            self._schedule(entry, now + delay if delay > 0 else 0.0, now)
        return exhausted

    def touch(self, seqs: Iterable[int], member: bytes, now: float) -> int:
        """``member`` still works on ``seqs``: those it holds in flight get a new ack
        deadline, a whole ack timeout from ``now``. Returns how many."""
        deadline = now + self.timing.ack_timeout_s
        touched = array("q")
        for seq in seqs:
            if self.state(seq) != IN_FLIGHT:
                continue
            entry = self.entry(seq)
            assert entry is not None
            if entry.member != member:
                continue  # (handed to another member since)
            entry.deadline = deadline  # (the record of the old one is skipped when due)
            touched.append(seq)
        if touched:
            self._serial += 1
            heapq.heappush(self._deadlines, (deadline, self._serial, touched))
            self._timer(deadline)
        return len(touched)

    def fail(self, seq: int) -> Entry | None:
        """Take ``seq`` out of delivery to be parked; None when it is not owed."""
        if self.entry(seq) is None:
            return None
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
        # (a float doubling: 2 ** 1024 as an int is past a float, and an attempt may
        # get there; past 2 ** 1023 the product is inf, which the cap takes)
        doubling = 2.0 ** min(max(0, attempt - 1), 1023)
        base = min(t.max_retry_backoff_s, t.retry_backoff_s * doubling)
        return base * (0.5 + self._rng())

    def tick(self, now: float) -> TickResult:
        """Move due delayed messages to ready, time out acks, expire old messages; then
        tell the producer of the next timer left (``on_timer``)."""
        self._wake_at = math.inf  # what it was told of is due: tell again what is left
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
                entry = self.entry(seq) if seq in self._sent else self.entries.get(seq)
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
        nxt = self.next_wakeup()
        if nxt is not None:
            self._timer(nxt)
        return result

    def _timer(self, at: float) -> None:
        """A timer set at ``at``: tell the producer when it is earlier than any it was told
        of and has not ticked yet."""
        if at < self._wake_at:
            self._wake_at = at
            self.on_timer(self, at)

    def next_wakeup(self) -> float | None:
        """The earliest time ``tick`` has work, or None."""
        times = [h[0][0] for h in (self._delayed, self._deadlines, self._expiring) if h]
        return min(times) if times else None
