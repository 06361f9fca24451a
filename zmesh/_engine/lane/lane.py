"""Delivery state of one lane: the messages of one topic owed to one group.

A lane is pure state with the current time passed in: no sockets, no disk, no clock. The
engine feeds it publishes, membership changes, acks and ticks, and sends what ``take``
hands out. Every unsettled sequence is in exactly one state:

- READY: waiting in its partition's heap, most urgent (lowest priority number) first;
- DELAYED: waiting for ``not_before`` (a schedule, a nack delay or a retry backoff);
- IN_FLIGHT: sent to a member, waiting for its ack until ``deadline``.

Most messages are plain: priority 0, no schedule, no expiry, first attempt. A plain
message costs no ``Entry``: while ready it is a sequence in its partition's FIFO and a
``_plain`` slot (seq -> partition); once sent, a ``_sent`` slot (seq -> (partition, member,
deadline)) until its ack. It becomes an ``Entry`` only when something unusual happens to
it (a timeout, a nack, its member leaving, a failed send, a failure to park): that keeps
the common path, and the memory of a large backlog, small (the FIFOs and ``_plain`` are
arrays: about 18 bytes per ready message, none of them objects; ``_sent`` is a window of
arrays too, so a take and an ack of consecutive sequences cost no step per message).

This module is long because a lane's states and the moves between them keep one
invariant (every sequence in exactly one state) that reads best in one place; retries,
delivery records, the queues and plain runs are modules of their own.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from typing import cast

from ..._seqs import consecutive
from .assignment import Assignment
from .blocks import Blocks, blocks, cut
from .delivery import (
    DELAYED,
    FRAME_MAX_BYTES,
    IN_FLIGHT,
    NO_SIZE_LIMIT,
    QUEUE_SHARE,
    READY,
    SEQ_BITS,
    SEQ_MASK,
    WINDOW_MAX_BYTES,
    Entry,
    Member,
    Taken,
    Timing,
    out_columns,
)
from .plain import HeldRuns, PlainRun, compact
from .retries import Retries
from .seqqueue import SentWindow, SeqQueue, SeqWindow

_FIRST_ATTEMPT = b"\x01"  # (an attempt column of ones, a byte each: what a batch carries)


def _distinct(values: Sequence[int], below: int) -> Iterable[int]:
    """The distinct ``values`` (each below ``below``): of ``bytes`` longer than ``below``,
    found by a search for each value they may hold, at C speed, not a step per value."""
    if type(values) is bytes and len(values) > below:
        return [v for v in range(min(below, 256)) if v in values]
    return set(values)


def _no_timer(_lane: Lane, _at: float) -> None:
    pass


def _not_ready(_lane: Lane) -> None:
    pass


class Lane(Retries):
    """Unsettled messages of (topic, lane) at this producer, and who gets them next."""

    def __init__(
        self,
        topic: str,
        name: str,
        *,
        producer: bytes,
        partitions: int,
        timing: Timing,
        rng: Callable[[], float] = random.random,
        lane_id: int = 0,
        group: str = "",
        mode: str = "shared",
    ) -> None:
        self.topic = topic
        self.name = name
        self.id = lane_id  # its key prefix in the store (pend, pruns, dead)
        self.group = group
        self.mode = mode  # "shared", "broadcast" (a member's own copy), or "unclaimed"
        self.producer = producer
        self.timing = timing
        self._rng = rng
        self.entries: dict[int, Entry] = {}  # messages that are not plain (or no longer)
        self._plain = SeqWindow()  # ready plain messages: seq -> partition
        self._sent = SentWindow()  # sent plain messages: seq -> (partition, member, deadline)
        self.members: dict[bytes, Member] = {}
        self._partitions = partitions
        self._ready: list[list[int]] = [[] for _ in range(partitions)]
        self._fresh: list[SeqQueue] = [SeqQueue() for _ in range(partitions)]
        self._bulk = False  # loading: append to the heaps, heapify once at the end
        self._ready_count = 0
        self._delayed: list[tuple[float, int]] = []
        # One record per take(): (deadline, serial, seqs handed out then). It stays until its
        # deadline, acked or not, so the sequences are an array: no int objects kept alive.
        # (deadline, serial, the sequences handed out with it: an array, or a range)
        self._deadlines: list[tuple[float, int, array[int] | range]] = []
        self._serial = 0
        self._expiring: list[tuple[float, int]] = []
        self._order = SeqQueue()  # every owed sequence (and some settled ones), ascending
        self._next_floor = 0
        # New plain runs owed while the lane has no member, not yet in the arrays above:
        # above every sequence in them, they join them (``_load``) before anything looks
        # at a sequence or a member is added.
        self._unloaded = HeldRuns()
        self.assignment = Assignment(producer, partitions, self.members, self._held)
        self.counts: Counter[str] = Counter()  # per-lane event counts, shown in status
        self.message_bytes = 0.0  # bytes per message on the wire, of recent sends
        # What tells the producer which lanes have work, so its loop visits those alone:
        # ``on_timer(lane, at)`` when a timer earlier than ``_wake_at`` (the earliest it
        # was told of and has not ticked yet) is set; ``on_ready(lane)`` when the lane
        # gets ready messages or a member while it has some. (No-ops on a lane of its own.)
        self._wake_at = math.inf
        self.on_timer: Callable[[Lane, float], None] = _no_timer
        self.on_ready: Callable[[Lane], None] = _not_ready

    # -- content --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.entries) + len(self._plain) + len(self._sent) + len(self._unloaded)

    def __contains__(self, seq: int) -> bool:
        if self._unloaded:
            self._load()
        return seq in self._sent or seq in self._plain or seq in self.entries

    def owed_among(self, seqs: Sequence[int]) -> list[int]:
        """Those of ``seqs`` this lane owes (one pass, no call per sequence; a ``range``
        of consecutive ones read from the windows' slots at C speed)."""
        if self._unloaded:
            self._load()
        if type(seqs) is range and seqs.step == 1:
            if seqs.stop <= self.floor():  # (a lane ahead: it settled all of them)
                return []
            return self._plain.owed_in(seqs.start, len(seqs), self._sent, self.entries)
        if max(seqs) < self.floor():
            return []
        return self._plain.owed_among(seqs, self._sent, self.entries)

    def seqs(self) -> list[int]:
        """Every sequence this lane owes, in no particular order."""
        if self._unloaded:
            self._load()
        return [*self.entries, *self._plain, *self._sent]

    def attempt(self, seq: int) -> int:
        """How many times ``seq`` was handed out (0 when it is not owed)."""
        if self._unloaded:
            self._load()
        if seq in self._sent:
            return 1
        entry = self.entries.get(seq)
        return 0 if entry is None else entry.attempt

    def state(self, seq: int) -> int | None:
        """READY, DELAYED or IN_FLIGHT; None when ``seq`` is not owed."""
        if self._unloaded:
            self._load()
        if seq in self._plain:
            return READY
        if seq in self._sent:
            return IN_FLIGHT
        entry = self.entries.get(seq)
        return None if entry is None else entry.state

    def entry(self, seq: int) -> Entry | None:
        """The ``Entry`` of ``seq`` (made now for a plain message); None when not owed."""
        if self._unloaded:
            self._load()
        partition = self._plain.pop(seq)
        if partition is not None:  # its FIFO slot goes stale and is skipped later
            entry = Entry(seq, partition, 0, 0, 0.0, 0.0)
            self.entries[seq] = entry
            key = seq  # priority 0
            if self._bulk:
                self._ready[partition].append(key)
            else:
                heapq.heappush(self._ready[partition], key)
            return entry
        sent = self._sent.pop(seq)
        if sent is not None:
            entry = Entry(seq, sent[0], 0, 1, 0.0, 0.0)
            entry.state = IN_FLIGHT
            entry.member, entry.deadline = sent[1], sent[2]
            self.entries[seq] = entry
            member = self.members.get(sent[1])
            if member is not None:  # (counted as sent, now held as an entry)
                member.sent -= 1
                member.in_flight.add(seq)
            return entry
        return self.entries.get(seq)

    def add(
        self,
        seq: int,
        partition: int,
        priority: int = 0,
        attempt: int = 0,
        *,
        now: float,
        not_before: float = 0.0,
        expires_at: float = 0.0,
    ) -> None:
        """Owe ``seq`` to this lane's group."""
        if self._unloaded:
            self._load()
        if seq < self._next_floor and seq in self:  # (a new highest sequence is not owed)
            return
        if partition >= self._partitions:
            partition = self._grow(partition)
        if not self._order.append(seq):
            self._order.insort(seq)  # rare: a replayed old message
        if seq >= self._next_floor:
            self._next_floor = seq + 1
        plain = not (priority or attempt or expires_at or not_before > now)
        if plain and self._fresh[partition].append(seq):  # (FIFOs stay in sequence order)
            self._plain.put(seq, partition)
            if not self._ready_count:
                self.on_ready(self)
            self._ready_count += 1
            return
        entry = Entry(seq, partition, priority, attempt, not_before, expires_at)
        self.entries[seq] = entry
        if expires_at:
            heapq.heappush(self._expiring, (expires_at, seq))
            self._timer(expires_at)
        self._schedule(entry, not_before, now)

    def add_plain(self, run: PlainRun) -> None:
        """``add`` of new plain messages (no priority, schedule or expiry)."""
        seqs = run.seqs
        if not self.members and type(seqs) is range and seqs.start >= self._next_floor:
            self._hold(seqs, run.held())
            return
        if self._unloaded:
            self._load()
        self._add_plain(run)

    def add_stored(self, seqs: range, partitions: bytes | list[int]) -> None:
        """``add_plain`` of consecutive plain messages read back from a stored run (a
        restart): held as they are while the lane has no member, so none of their
        arrays is made twice."""
        if not self.members and seqs.start >= self._next_floor:
            self._hold(seqs, compact(partitions))
            return
        self.add_plain(PlainRun(seqs, partitions))

    def _hold(self, seqs: range, partitions: Blocks | bytes | array[int]) -> None:
        """Owe ``seqs`` as a run until a member comes (``_load``)."""
        self._unloaded.hold(seqs, partitions)
        self._next_floor = seqs.stop
        if not self._ready_count:
            self.on_ready(self)
        self._ready_count += len(seqs)

    def _load(self) -> None:
        """The runs held while the lane had no member join its arrays, in order."""
        held = self._unloaded
        self._ready_count -= len(held)  # (counted again as they join)
        self._next_floor = held.first  # (each run then joins above the last)
        for run in held.release():
            self._add_plain(run)

    def _add_plain(self, run: PlainRun) -> None:
        seqs = run.seqs
        if seqs[0] < self._next_floor or not run.ascending or len(run.split) > self._partitions:
            for seq, partition in zip(seqs, run.partitions, strict=True):
                self.add(seq, partition, now=0.0)
            return
        # Above every sequence added before: each goes at the end of its FIFO and of the
        # ordered sequences.
        self._order.extend(run.order)
        self._next_floor = seqs[-1] + 1
        for fifo, part in zip(self._fresh, run.split, strict=False):
            if part:
                fifo.extend(part)
        self._plain.put_run(seqs, run.partitions, run.slots)
        if not self._ready_count:
            self.on_ready(self)
        self._ready_count += len(seqs)

    def note_sent(self, count: int, nbytes: int) -> None:
        """``count`` messages were sent in frames of ``nbytes``: the bytes per message that
        bound the members' windows follow it (a quarter of the way per batch)."""
        each = nbytes / count
        self.message_bytes = (3 * self.message_bytes + each) / 4 if self.message_bytes else each

    def frame_size(self, batch_size: int) -> int:
        """Messages per data frame: a member's ``batch_size``, fewer of large payloads (about
        ``FRAME_MAX_BYTES`` a frame, by the lane's bytes per message), so a window holds
        several frames on their way and a consumer acks as they come."""
        if self.message_bytes * batch_size <= FRAME_MAX_BYTES:
            return batch_size
        return max(1, int(FRAME_MAX_BYTES / self.message_bytes))

    def expect_bytes(self, each: float) -> None:
        """Until a send measures them (``note_sent``), take the bytes per message to be
        ``each`` (a staged message's payload): a first take of large payloads is bounded by
        bytes like any other."""
        if not self.message_bytes:
            self.message_bytes = each

    def _grow(self, partition: int) -> int:
        # Messages stored under a larger partition count (topic reconfigured) keep theirs.
        while partition >= self._partitions:
            self._ready.append([])
            self._fresh.append(SeqQueue())
            self._partitions += 1
        self.assignment.grow(self._partitions)
        return partition

    def _schedule(self, entry: Entry, not_before: float, now: float) -> None:
        entry.member = None
        if entry.expires_at and entry.expires_at <= now and entry.state == IN_FLIGHT:
            # Its expiry passed while it was in flight (tick skipped it): due again now.
            heapq.heappush(self._expiring, (entry.expires_at, entry.seq))
            self._timer(entry.expires_at)
        if not_before > now:
            entry.state = DELAYED
            entry.not_before = not_before
            heapq.heappush(self._delayed, (not_before, entry.seq))
            self._timer(not_before)
        else:
            entry.state = READY
            entry.not_before = 0.0
            key = (entry.priority << SEQ_BITS) | entry.seq
            if self._bulk:
                self._ready[entry.partition].append(key)
            else:
                heapq.heappush(self._ready[entry.partition], key)
            if not self._ready_count:
                self.on_ready(self)
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
        first = self._order.first_owed(self._plain, self._sent, self.entries)
        if first is None:
            return self._unloaded.first if self._unloaded else self._next_floor
        return first

    @property
    def ready_count(self) -> int:
        return self._ready_count

    def in_flight_count(self) -> int:
        return sum(m.holds() for m in self.members.values())

    def in_flight_to(self, member: bytes) -> set[int]:
        """The sequences in flight to ``member`` (a scan of the sent map: rare uses)."""
        held = self.members.get(member)
        plain = self._sent.to(member)
        return plain | held.in_flight if held is not None else plain

    # -- membership -----------------------------------------------------------------------

    def set_member(
        self,
        member: bytes,
        max_in_flight: int,
        batch_size: int,
        max_message_bytes: int = NO_SIZE_LIMIT,
    ) -> bool:
        """Add or update a live member; True when it is new."""
        if self._unloaded:
            self._load()
        current = self.members.get(member)
        if current is not None:
            if (current.max_in_flight, current.batch_size) != (max_in_flight, batch_size):
                current.max_in_flight, current.batch_size = max_in_flight, batch_size
                current.start()  # (new credit: its window starts again)
            current.max_message_bytes = max_message_bytes
            return False
        self.members[member] = Member(max_in_flight, batch_size, max_message_bytes)
        self.assignment.change()
        if self._ready_count:
            self.on_ready(self)
        return True

    def remove_member(self, member: bytes, now: float) -> int:
        """A member left or died: its in-flight messages are ready again at once."""
        if member not in self.members:
            return 0
        held = self.in_flight_to(member)
        del self.members[member]
        for seq in held:
            entry = self.entry(seq)
            if entry is not None and entry.state == IN_FLIGHT:
                self._schedule(entry, 0.0, now)
        self.assignment.leave(member)
        return len(held)

    def owner(self, partition: int) -> bytes | None:
        """The live member that receives this partition's messages now (None: nobody,
        while the member it moved from still holds some in flight)."""
        return self.assignment.table()[partition]

    def _held(self, member: bytes) -> list[tuple[int, int]]:
        """(sequence, partition) of the messages in flight to ``member``."""
        sent, entries = self._sent, self.entries
        out = []
        for seq in self.in_flight_to(member):
            state = sent.get(seq)
            out.append((seq, state[0] if state is not None else entries[seq].partition))
        return out

    def _in_flight(self, seq: int) -> bool:
        if seq in self._sent:
            return True
        entry = self.entries.get(seq)
        return entry is not None and entry.state == IN_FLIGHT

    # -- delivery -------------------------------------------------------------------------

    def _head(self, partition: int) -> int | None:
        """The partition's most urgent ready key, dropping stale records on the way."""
        heap = self._ready[partition]
        entries = self.entries
        top = None
        while heap:
            entry = entries.get(heap[0] & SEQ_MASK)
            if entry is not None and entry.state == READY:
                top = heap[0]
                break
            heapq.heappop(heap)
        first = self._fresh[partition].first_in(self._plain)
        if first is not None and (top is None or first < top):
            return first  # a plain message's key is its sequence (priority 0)
        return top

    def begin_bulk(self) -> None:
        """Many adds follow (a restart): defer heap ordering to ``end_bulk``."""
        self._bulk = True

    def end_bulk(self) -> None:
        self._bulk = False
        for heap in self._ready:
            heapq.heapify(heap)

    def take(self, now: float, limit: int = 10_000) -> tuple[dict[bytes, Taken], list[int]]:
        """Hand out ready messages to their owners within their credit.

        Across all partitions a member owns, the most urgent message (lowest priority, then
        lowest sequence) goes first. Returns (member -> what is now in flight to it) and
        the sequences found expired on the way (already removed).
        """
        out: dict[bytes, Taken] = {}
        expired: list[int] = []
        if not self._ready_count or not self.members:
            return out, expired
        assignment = self.assignment
        if assignment.fenced:
            assignment.release(self._in_flight)
        owners = assignment.table()
        queue_s = self.timing.ack_timeout_s * QUEUE_SHARE
        # (the bytes of a message not known until one is sent: as if a byte each)
        cap = int(WINDOW_MAX_BYTES / self.message_bytes) if self.message_bytes else WINDOW_MAX_BYTES
        for its in self.members.values():
            its.resize(now, queue_s, cap)
        self._take(owners, now, limit, out, expired)
        for its in self.members.values():
            if its.holds() >= its.window:
                its.full = True
        return out, expired

    def _take(
        self,
        owners: list[bytes | None],
        now: float,
        limit: int,
        out: dict[bytes, Taken],
        expired: list[int],
    ) -> None:
        """``take`` within the members' windows, into ``out`` and ``expired``."""
        if (
            self._ready_count == len(self._plain)
            and not self._plain._old
            and not self._bulk
            and not self.assignment.fenced
        ):
            # Only plain messages are ready: in the order below they go lowest sequence
            # first, which is the window's order.
            # (with a member and no fence, every partition has an owner)
            front, stopped = self._take_front(cast("list[bytes]", owners), now, limit, out)
            if not stopped:
                return
            limit -= front  # a member's credit ran out: the rest goes the heap's way
        members, entries, plain, sent = self.members, self.entries, self._plain, self._sent
        ready, fifos = self._ready, self._fresh
        heads: list[tuple[int, int]] = []  # (key, partition)
        for partition in range(self._partitions):
            owner = owners[partition]
            if owner is None or not (ready[partition] or fifos[partition]):
                continue
            member = members[owner]
            if member.sent + len(member.in_flight) >= member.window:
                continue
            head = self._head(partition)
            if head is not None:
                heads.append((head, partition))
        heapq.heapify(heads)
        heappop, heappush = heapq.heappop, heapq.heappush
        deadline = now + self.timing.ack_timeout_s
        taken = 0
        handed = array("q")
        sent_seqs: list[int] = []  # (put in the sent window together, after the loop)
        sent_partitions: list[int] = []
        sent_to: list[bytes] = []
        grown: dict[bytes, tuple[list[int], list[int], list[int]]] = {}  # out's, by owner
        while heads and taken < limit:
            key, partition = heappop(heads)
            seq = key & SEQ_MASK
            owner = owners[partition]
            assert owner is not None
            member = members[owner]
            in_flight = member.in_flight
            if member.sent + len(in_flight) >= member.window:
                continue  # this member is full: its partitions wait for acks
            cols = grown.get(owner)
            if cols is None:
                cols = grown[owner] = out_columns(out, owner)
            if plain.pop(seq) is not None:
                fifos[partition].popleft()
                sent_seqs.append(seq)
                sent_partitions.append(partition)
                sent_to.append(owner)
                member.sent += 1
                attempt = 1
            else:
                heappop(ready[partition])
                entry = entries[seq]
                if entry.expires_at and entry.expires_at <= now:
                    self._remove(seq)
                    expired.append(seq)
                    attempt = 0
                else:
                    entry.state = IN_FLIGHT
                    entry.member = owner
                    entry.deadline = deadline
                    entry.attempt += 1
                    attempt = entry.attempt
                    in_flight.add(seq)
            if attempt:
                self._ready_count -= 1
                cols[0].append(seq)
                cols[1].append(partition)
                cols[2].append(attempt)
                handed.append(seq)
                taken += 1
            # (only plain messages in the partition: its FIFO alone says what is next)
            head = self._head(partition) if ready[partition] else fifos[partition].first_in(plain)
            if head is not None:
                heappush(heads, (head, partition))
        if sent_seqs:
            sent.put_many(sent_seqs, sent_partitions, sent_to, deadline)
        if taken:
            self._serial += 1
            heapq.heappush(self._deadlines, (deadline, self._serial, handed))
            self._timer(deadline)
        for owner in [m for m, t in out.items() if not t.seqs]:
            del out[owner]  # only expired messages were met for it

    def _take_front(
        self, owners: list[bytes], now: float, limit: int, out: dict[bytes, Taken]
    ) -> tuple[int, bool]:
        """``take`` when only plain messages are ready: the lowest sequences, a front of
        the window, each to the owner of its partition, with no heap (and, for one member,
        no Python step per message). Stops before the first sequence whose owner has no
        credit left; returns how many it took and whether it stopped so (the rest then
        goes the heap's way)."""
        members = self.members
        sent = self._sent
        stopped = False
        if len(members) == 1:  # it owns every partition (the usual lane: kept lean)
            [(only, its)] = members.items()
            room = min(limit, its.window - its.sent - len(its.in_flight))
            if room <= 0:  # (its credit may have been lowered below what it holds)
                return 0, False
            seqs, partitions, slots = self._plain.take_front(room)
            if not seqs:
                return 0, False
            owner_of = [only] * len(seqs)
        else:
            credit = {m: its.window - its.sent - len(its.in_flight) for m, its in members.items()}
            room = min(limit, sum(c for c in credit.values() if c > 0))
            if room <= 0:
                return 0, False
            seqs, partitions, slots = self._plain.front(room)
            if not seqs:
                return 0, False
            owner_of = list(map(owners.__getitem__, partitions))
            found = blocks(partitions)  # (keyless batches: a few blocks of one partition)
            if any(n > credit[m] for m, n in Counter(owner_of).items()):
                upto = _credit_cut(owner_of, dict(credit), found, owners)
                seqs, partitions, owner_of = seqs[:upto], partitions[:upto], owner_of[:upto]
                slots = slots[:upto] if slots is not None else None
                found = None if found is None else cut(found, 0, upto)
                stopped = True
                if not seqs:
                    return 0, True
            self._plain.take_front(len(seqs))  # (the same sequences)
        last = seqs[-1]
        deadline = now + self.timing.ack_timeout_s
        fresh = self._fresh
        for p in _distinct(partitions, len(fresh)):  # their taken sequences are the front
            fresh[p].drop_through(last)  # of each FIFO (the others' stale slots below it
            #                              go when next taken)
        if slots is None or not sent.put_run(seqs[0], slots, owner_of, deadline):
            sent.put_many(seqs, partitions, owner_of, deadline)
        self._ready_count -= len(seqs)
        self._serial += 1
        heapq.heappush(
            self._deadlines,
            (deadline, self._serial, seqs if type(seqs) is range else array("q", seqs)),
        )
        self._timer(deadline)
        if len(members) == 1:
            taken = Taken()
            taken.seqs, taken.partitions, taken.attempts = (
                seqs,
                partitions,
                _FIRST_ATTEMPT * len(seqs),
            )
            out[only] = taken
        else:
            if found is not None:  # a block at a time (keyless batches, whole to a member)
                spans: dict[bytes, list[tuple[int, int]]] = {}
                for p, start, end in found:
                    spans.setdefault(owners[p], []).append((start, end))
                for m, places in spans.items():
                    out[m] = _taken(seqs, partitions, places)
            else:
                grown: dict[bytes, tuple[list[int], list[int], list[int]]] = {}
                for seq, partition, m in zip(seqs, partitions, owner_of, strict=True):
                    cols = grown.get(m)
                    if cols is None:
                        cols = grown[m] = out_columns(out, m)
                    cols[0].append(seq)
                    cols[1].append(partition)
                for batch in out.values():
                    batch.attempts = [1] * len(batch.seqs)
        for m, batch in out.items():
            members[m].sent += len(batch.seqs)
        return len(seqs), stopped

    def ack(self, seqs: Iterable[int]) -> Sequence[int]:
        """Settle acked sequences; returns those that were still owed (``seqs`` itself
        when a member acked consecutive ones it was sent: a ``range``, as an ACK of
        consecutive sequences decodes, stays one)."""
        if self._unloaded:
            self._load()
        members = self.members
        self.floor()  # (the front of ``_order`` is owed: a front acked can go at once below)
        acked: list[int] | range = seqs if type(seqs) is range else list(seqs)
        n = len(acked)
        if consecutive(acked):
            # The common case: a member acked consecutive sequences it was sent (one
            # member's, or a member's of a shared group's keyless batches).
            if len(members) == 1:
                to = next(iter(members)) if self._sent.pop_run(acked[0], n) else None
            else:
                to = self._sent.pop_run_of(acked[0], n)
            if to is not None:
                member = members.get(to)
                if member is not None:
                    member.sent -= n
                    member.acked += n
                self._order.drop_front(acked, consecutive=True)
                return acked
        seqs = acked if isinstance(acked, list) else list(acked)
        sent, by_member = self._sent.pop_many(seqs)
        settled = list(compress(seqs, sent))
        for to, count in by_member.items():
            member = members.get(to)
            if member is not None:
                member.sent -= count
                member.acked += count
        if len(settled) < len(seqs):  # acks of ready messages and of entries
            for seq, was_sent in zip(seqs, sent, strict=True):
                if was_sent:
                    continue
                if self._plain.pop(seq) is not None:
                    self._ready_count -= 1  # its FIFO slot goes stale and is skipped later
                    settled.append(seq)
                elif (entry := self._remove(seq)) is not None:
                    settled.append(seq)
                    member = members.get(entry.member) if entry.member is not None else None
                    if member is not None and entry.state == IN_FLIGHT:
                        member.acked += 1
        self._order.drop_front(settled)
        return settled


def _credit_cut(
    owner_of: list[bytes],
    left: dict[bytes, int],
    found: Blocks | None,
    owners: list[bytes],
) -> int:
    """How many of a front ``_take_front`` may take: up to the first sequence whose owner
    has no credit ``left``; a block of one partition at a time when ``found``."""
    if found is not None:
        for p, start, end in found:
            m = owners[p]
            room = left[m]
            if room < end - start:
                return start + max(room, 0)
            left[m] = room - (end - start)
        return found[-1][2] if found else 0
    n = 0
    for m in owner_of:
        if left[m] <= 0:
            break
        left[m] -= 1
        n += 1
    return n


def _taken(
    seqs: list[int] | range, partitions: Sequence[int], spans: list[tuple[int, int]]
) -> Taken:
    """What a member is handed of a front: its ``spans`` (places of blocks) of ``seqs``
    and ``partitions``, as they are (a range and bytes) when it is one block."""
    taken = Taken()
    if len(spans) == 1:
        start, end = spans[0]
        taken.seqs, taken.partitions = seqs[start:end], partitions[start:end]
    else:
        taken_seqs: list[int] = []
        taken_partitions: list[int] = []
        for start, end in spans:
            taken_seqs.extend(seqs[start:end])
            taken_partitions.extend(partitions[start:end])
        taken.seqs, taken.partitions = taken_seqs, taken_partitions
    taken.attempts = _FIRST_ATTEMPT * len(taken.seqs)
    return taken
