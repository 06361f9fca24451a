"""Containers of sequence numbers that cost the garbage collector nothing and little memory.

A lane keeps every sequence it owes in such containers. A ``deque`` of ints would do for a
FIFO, but the collector walks every item of a deque at each full collection, and a backlog
of millions made those collections take tens of milliseconds each. An ``array`` holds plain
values, no objects, and is never walked.

``SeqWindow`` maps the sequences of a lane's ready plain messages to their partitions. A
dict costs about 75 bytes per entry (its slot and the int object of the key); the window
costs 2 bytes per sequence of the span it covers, so a backlog of 2,000,000 messages takes
4 MB instead of 150 MB. ``SentWindow`` does the same for the messages a lane has sent and
waits to hear about, with their members and deadlines: a take and an ack of consecutive
sequences are a few slice operations, with no dict entry made or removed per message.

This module is long because its containers share one representation (arrays of
sequences, holes skipped lazily) and the helpers over it; apart, they would reach into
each other's arrays.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right, insort
from collections.abc import Iterator, Mapping, Sequence
from itertools import compress, islice
from operator import or_
from typing import Any

from ..._numbers import LITTLE

COMPACT_AFTER = 4096  # popped slots kept before they are dropped (at most half the array)
_NONE: dict[int, object] = {}  # (first_in: owned by the window alone)


class SeqQueue:
    """Sequences in ascending order: appended at the end, taken from the front."""

    __slots__ = ("_a", "_head")

    def __init__(self) -> None:
        self._a = array("q")
        self._head = 0

    def __len__(self) -> int:
        return len(self._a) - self._head

    def append(self, seq: int) -> bool:
        """Put ``seq`` at the end; False, and nothing done, when it is not above the last."""
        a = self._a
        if len(a) > self._head and seq <= a[-1]:
            return False
        a.append(seq)
        return True

    def extend(self, seqs: array[int]) -> None:
        """Put ascending ``seqs``, all above the last, at the end."""
        self._a.extend(seqs)

    def insort(self, seq: int) -> None:
        """Put ``seq`` in its place (rare: an old sequence owed again)."""
        insort(self._a, seq, lo=self._head)

    def drop_through(self, seq: int) -> None:
        """Drop every sequence up to ``seq`` (they were taken together)."""
        self._set_head(bisect_right(self._a, seq, self._head))

    def first_in(self, owned: SeqWindow) -> int | None:
        """The first sequence in ``owned``, dropping those before it; None if none."""
        a, head = self._a, self._head
        if head < len(a):  # the common case: the first one is owned
            i = a[head] - owned._base
            if 0 <= i < len(owned._w) and owned._w[i]:
                return a[head]
        return self.first_owed(owned, _NOT_SENT, _NONE)

    def first_owed(
        self, plain: SeqWindow, sent: SentWindow, entries: Mapping[int, object]
    ) -> int | None:
        """The first sequence in ``plain``, ``sent`` or ``entries`` (what a lane owes),
        dropping those before it; None if none."""
        a, head = self._a, self._head
        end = len(a)
        w, base, old = plain._w, plain._base, plain._old
        sw, sbase, sold = sent._w, sent._base, sent._old
        span, sspan = len(w), len(sw)
        skip = not entries and not old and not sold  # (the usual case: only windows owe)
        while head < end:
            seq = a[head]
            if (
                (0 <= (i := seq - sbase) < sspan and sw[i])
                or (0 <= (i := seq - base) < span and w[i])
                or seq in entries
                or (old and seq in old)
                or (sold and seq in sold)
            ):
                break
            head += 1
            if skip:  # the front is settled: pass what follows it at C speed, once
                head = _past_empty(a, head, end, w, base, sw, sbase)
                skip = False
        head = self._set_head(head)
        return a[head] if head < len(a) else None

    def drop_front(self, seqs: Sequence[int], consecutive: bool = False) -> None:
        """``seqs`` were just settled: when they are the front of the queue, in its order
        (what one member acked, mostly), drop them at once instead of one by one later.
        ``consecutive``: ``seqs`` are known to be consecutive and ascending, so matching
        the front's ends is enough (the queue never descends)."""
        a, head = self._a, self._head
        n = len(seqs)
        if (
            n
            and head + n <= len(a)
            and a[head] == seqs[0]
            and a[head + n - 1] == seqs[-1]
            and (consecutive or a[head : head + n].tolist() == seqs)
        ):
            self._set_head(head + n)

    def popleft(self) -> None:
        """Drop the first sequence."""
        head = self._head + 1
        if head < COMPACT_AFTER:
            self._head = head
        else:
            self._set_head(head)

    def _set_head(self, head: int) -> int:
        """Move the front to ``head`` (dropping the popped slots now and then); the new
        index of the front."""
        if head >= COMPACT_AFTER and head * 2 >= len(self._a):
            del self._a[:head]
            head = 0
        self._head = head
        return head


# 0, 1, 2, ... and 1, 1, 1, ... as little-endian int64s in one big int each, for a few
# lengths (``consecutive_array``), the longest last.
_CUTS = tuple(
    (
        n,
        int.from_bytes(b"".join(k.to_bytes(8, "little") for k in range(n)), "little"),
        int.from_bytes(b"\1\0\0\0\0\0\0\0" * n, "little"),
    )
    for n in (256, 512, 1024, 2048, 4096)
)


def consecutive_array(seqs: range) -> array[int]:
    """``array("q", seqs)`` of a range of step 1 with no int made per sequence: the
    bytes of ``n`` consecutive int64s from ``first`` are those of one big int, ``first``
    times n ones plus 0, 1, 2, ... (``_CUTS``), made in C, 4,096 at a time at most.
    ``array("q", seqs)`` makes an int per sequence: five times slower for 2,000."""
    n, first = len(seqs), seqs.start
    if n < _CUTS[0][0] or seqs.step != 1 or first < 0 or first + n > 1 << 63:
        return array("q", seqs)
    out = array("q")
    end = first + n
    while first < end:
        left = end - first
        size, steps, ones = next((cut for cut in _CUTS if cut[0] >= left), _CUTS[-1])
        take = min(size, left)
        raw = (steps + first * ones).to_bytes(8 * size, "little")
        out.frombytes(raw if take == size else raw[: 8 * take])
        first += take
    if not LITTLE:
        out.byteswap()
    return out


_LOW = 0 if LITTLE else 1  # where a slot's low byte is in its bytes
_DOWN = bytes((b - 1) % 256 for b in range(256))  # a byte less one


STRETCH = 4096  # sequences of a queue whose slots ``_past_empty`` looks at together, at most


def _past_empty(
    a: array[int], head: int, end: int, w: array[int], base: int, sw: array[int], sbase: int
) -> int:
    """The place in ``a`` from ``head`` of the first sequence with a filled slot in window
    ``w`` (its slot ``seq - base``) or ``sw``, found a stretch of consecutive sequences at a
    time with no step per sequence (what a lane settled out of order, as its members' acks
    of scattered partitions leave it, is passed at C speed). Stops at the first stretch
    that is not consecutive: the caller goes on one by one from there."""
    step = 16  # (doubled up to STRETCH: what is looked at stays near what is passed)
    while head < end:
        n = min(end - head, step)
        first = a[head]
        if a[head + n - 1] - first != n - 1:  # (ascending: consecutive exactly then)
            return head
        found = min(_first_filled(w, first - base, n), _first_filled(sw, first - sbase, n))
        if found < n:
            return head + found
        head += n
        step = min(2 * step, STRETCH)
    return head


def _first_filled(slots: array[int], lo: int, n: int) -> int:
    """The first ``j`` below ``n`` whose slot ``lo + j`` is filled (slots outside the array
    are empty); ``n`` when there is none."""
    start, stop = max(lo, 0), min(lo + n, len(slots))
    if start >= stop:
        return n
    data = slots[start:stop].tobytes()
    left = len(data.lstrip(b"\0"))  # (the first filled slot holds the first nonzero byte)
    return n if not left else start - lo + (len(data) - left) // slots.itemsize


def _has_empty(slots: array[int]) -> bool:
    """Whether ``slots`` ("H") hold a 0, found at C speed: an empty slot is two zero bytes
    in place, so their absence proves none. (Two zero bytes astride two slots, the high
    byte of one below 256 and the low byte of a multiple of 256, answer yes wrongly: the
    caller then takes its slower way.)"""
    return b"\0\0" in slots.tobytes() or not slots


def slot_partitions(slots: array[int]) -> bytes | list[int]:
    """The partitions of filled window slots (``slot - 1``): as bytes, made at C speed,
    when every slot is below 256 (a byte each, less one), else a list made one by one."""
    raw = slots.tobytes()
    if not raw[1 - _LOW :: 2].strip(b"\0"):
        return raw[_LOW::2].translate(_DOWN)
    return [v - 1 for v in slots]


def _slots(window: Window, first: int, n: int) -> array[int]:
    """The slots of ``window`` for the ``n`` sequences from ``first`` (0 outside it)."""
    w, lo = window._w, first - window._base
    if lo >= 0 and lo + n <= len(w):
        return w[lo : lo + n]
    out = array("H", bytes(2 * n))
    start, end = max(lo, 0), min(lo + n, len(w))
    if start < end:
        out[start - lo : end - lo] = w[start:end]
    return out


WINDOW_MIN = 1 << 16  # slots a window may span whatever it holds
SPARSE = 8  # ... and beyond that, at most this many slots per sequence it holds


class Window:
    """What ``SeqWindow`` and ``SentWindow`` share: slots over a span of sequences, slot
    ``seq - base`` of ``_w`` ("H") non-zero where ``seq`` is present, and a dict of the
    entries the span left behind, below its base."""

    __slots__ = ("_w", "_base", "_n", "_old", "_front")

    def __init__(self) -> None:
        self._w = array("H")
        self._base = 0
        self._n = 0  # entries in the window (not in ``_old``)
        self._old: dict[int, Any] = {}  # entries below the window's base (values: subclass's)
        self._front = 0  # every slot below this one is empty

    def __len__(self) -> int:
        return self._n + len(self._old)

    def __bool__(self) -> bool:
        return bool(self._n or self._old)

    def __contains__(self, seq: int) -> bool:
        i = seq - self._base
        if 0 <= i < len(self._w):
            return bool(self._w[i])
        return bool(self._old) and seq in self._old

    def __iter__(self) -> Iterator[int]:
        yield from list(self._old)
        yield from compress(range(self._base, self._base + len(self._w)), self._w)

    def _aside(self, i: int) -> object:
        """The dict's value for the entry in slot ``i``."""
        raise NotImplementedError

    def _drop(self, front: int) -> None:
        """Drop the first ``front`` slots (empty)."""
        del self._w[:front]
        self._base += front
        self._front = max(0, self._front - front)

    def _shrink(self) -> None:
        """Drop the empty front of the span; while it is still sparse, move its oldest
        entries to the dict."""
        w = self._w
        raw = w.tobytes()
        front = (len(raw) - len(raw.lstrip(b"\0"))) // 2  # first non-empty slot
        while len(w) - front >= max(WINDOW_MIN, SPARSE * self._n):
            end = front + (len(w) - front) // 2
            for i in range(front, end):
                if w[i]:
                    self._old[self._base + i] = self._aside(i)
                    self._n -= 1
            front = end
        self._drop(front)


class SeqWindow(Window):
    """A mapping of sequence -> partition (0..65534) kept as an array over a span.

    Slot ``seq - base`` holds ``partition + 1``, or 0 where the sequence is absent. The
    front of the span moves up as its sequences leave. When the window would grow sparse
    (a few old sequences far below many new ones, or a quiet topic on a busy node) its
    oldest entries move to a dict, so it never costs much more than a dict would.
    """

    __slots__ = ()
    _old: dict[int, int]

    def _aside(self, i: int) -> int:
        return self._w[i] - 1

    def owed_among(
        self, seqs: Sequence[int], sent: SentWindow, entries: Mapping[int, object]
    ) -> list[int]:
        """Those of ``seqs`` in this window, ``sent`` or ``entries`` (what a lane owes), in
        one pass with no call per sequence (a settlement asks this of every other lane)."""
        w, base, old = self._w, self._base, self._old
        span = len(w)
        sw, sbase, sold = sent._w, sent._base, sent._old
        sspan = len(sw)
        return [
            s
            for s in seqs
            if (0 <= (i := s - sbase) < sspan and sw[i])
            or (0 <= (i := s - base) < span and w[i])
            or s in entries
            or (old and s in old)
            or (sold and s in sold)
        ]

    def owed_in(
        self, first: int, n: int, sent: SentWindow, entries: Mapping[int, object]
    ) -> list[int]:
        """``owed_among`` of the ``n`` consecutive sequences from ``first`` (a run's): the
        two windows' slots over them or-ed at C speed, when no dict holds any."""
        if entries or self._old or sent._old:
            return self.owed_among(list(range(first, first + n)), sent, entries)
        return list(
            compress(
                range(first, first + n), map(or_, _slots(self, first, n), _slots(sent, first, n))
            )
        )

    def put(self, seq: int, partition: int) -> None:
        """Map ``seq`` to ``partition`` (``seq`` must be absent)."""
        w = self._w
        i = seq - self._base
        if i == len(w) and self._n:  # the next slot: the common case
            w.append(partition + 1)
            self._n += 1
            if i >= WINDOW_MIN and i >= SPARSE * self._n:
                self._shrink()
            return
        if not self._n and i >= 0:  # empty: start again at ``seq`` (the dict's entries
            del w[:]  # all stay below the base, where lookups go to the dict)
            self._base = seq
            self._front = i = 0
        if i < 0:
            self._old[seq] = partition
            return
        if i < self._front:
            self._front = i
        span = len(w)
        if i < span:
            w[i] = partition + 1
        else:
            w.frombytes(bytes(2 * (i - span)))
            w.append(partition + 1)
        self._n += 1
        if i >= WINDOW_MIN and i >= SPARSE * self._n:
            self._shrink()

    def put_run(self, seqs: Sequence[int], partitions: Sequence[int], slots: array[int]) -> None:
        """``put`` of ascending sequences (``slots``: their partitions + 1, as the window
        holds them); consecutive ones that continue the window (or start it again, when it
        is empty) are appended in one call."""
        w = self._w
        first = seqs[0]
        if seqs[-1] - first == len(seqs) - 1:  # (ascending, so consecutive)
            if not self._n and first >= self._base:  # empty: start again at ``first``,
                del w[:]  # as ``put`` does
                self._base, self._front = first, 0
            if first - self._base == len(w):
                w.extend(slots)
                self._n += len(seqs)
                i = len(w) - 1
                if i >= WINDOW_MIN and i >= SPARSE * self._n:
                    self._shrink()
                return
        for seq, partition in zip(seqs, partitions, strict=True):
            self.put(seq, partition)

    def pop(self, seq: int) -> int | None:
        """Remove ``seq``; its partition, or None when it was absent."""
        i = seq - self._base
        w = self._w
        if 0 <= i < len(w):
            v = w[i]
            if not v:
                return None
            w[i] = 0
            self._n -= 1
            return v - 1
        if self._old:
            return self._old.pop(seq, None)
        return None

    def front(self, n: int) -> tuple[list[int] | range, Sequence[int], array[int] | None]:
        """The ``n`` lowest sequences of the window (the dict aside must be empty) and
        their partitions (bytes when ``slot_partitions`` makes them), left in place, with
        no call per sequence; and, when they are consecutive, their slots (partitions + 1,
        as ``SentWindow.put_run`` takes them) and the sequences as a ``range`` (what takes
        them after knows they are consecutive and ascending without a look at each)."""
        w, base, front = self._w, self._base, self._front
        end = min(front + n, len(w))
        slots = w[front:end]
        if not _has_empty(slots):  # (the usual front: consecutive, every slot filled)
            return range(base + front, base + end), slot_partitions(slots), slots
        with memoryview(w) as view:  # (a view from the front, not an iteration up to it)
            seqs = list(islice(compress(range(base + front, base + len(w)), view[front:]), n))
        if not seqs:
            return seqs, [], None
        return seqs, [v - 1 for v in w[front : seqs[-1] - base + 1] if v], None

    def take_front(self, n: int) -> tuple[list[int] | range, Sequence[int], array[int] | None]:
        """Remove the ``n`` lowest sequences of the window (the dict aside must be empty):
        ``front`` of them, with no call per sequence."""
        seqs, partitions, slots = self.front(n)
        if not seqs:
            return seqs, partitions, slots
        w, base, front = self._w, self._base, self._front
        end = seqs[-1] - base + 1
        w[front:end] = array("H", bytes(2 * (end - front)))
        self._n -= len(seqs)
        if end >= COMPACT_AFTER and end * 2 >= len(w):
            del w[:end]
            self._base = base + end
            end = 0
        self._front = end
        return seqs, partitions, slots


SentState = tuple[int, bytes, float]  # (partition, member, deadline)


class SentWindow(Window):
    """A lane's sent plain messages: sequence -> (partition, member, ack deadline), kept
    as columns over a span of sequences, the way ``SeqWindow`` keeps ready ones.

    Slot ``seq - base`` of ``_w`` holds ``partition + 1`` (0: absent), of ``_m`` the index
    of its member in ``_who``, of ``_d`` its deadline. A take of consecutive sequences
    (``put_run``) extends the three arrays, an ack of consecutive sequences (``pop_run``)
    clears a slice: no dict entry made or removed per message. Like ``SeqWindow``, the
    window moves its oldest entries to a dict when it would grow sparse (an old message
    still in flight far below many new ones)."""

    __slots__ = ("_m", "_d", "_who", "_index")
    _old: dict[int, SentState]

    def __init__(self) -> None:
        super().__init__()
        self._m = array("I")
        self._d = array("d")
        self._who: list[bytes] = []  # every member messages were sent to, by index
        self._index: dict[bytes, int] = {}

    def _aside(self, i: int) -> SentState:
        return (self._w[i] - 1, self._who[self._m[i]], self._d[i])

    def _members(self, members: list[bytes]) -> array[int]:
        """The column of member indexes (into ``_who``) for ``members``."""
        n = len(members)
        if n and members.count(members[0]) == n:  # (one member, mostly: no step each)
            return array("I", (self._index_of(members[0]),)) * n
        index = {member: self._index_of(member) for member in set(members)}
        return array("I", map(index.__getitem__, members))

    def _index_of(self, member: bytes) -> int:
        index = self._index.get(member)
        if index is None:
            index = self._index[member] = len(self._who)
            self._who.append(member)
        return index

    def get(self, seq: int) -> SentState | None:
        i = seq - self._base
        if 0 <= i < len(self._w):
            return self._aside(i) if self._w[i] else None
        return self._old.get(seq) if self._old else None

    def pop(self, seq: int) -> SentState | None:
        """Remove ``seq``; its state, or None when it was absent."""
        state = self.get(seq)
        if state is not None:
            i = seq - self._base
            if 0 <= i < len(self._w):
                self._w[i] = 0
                self._n -= 1
                if not self._n:
                    self._empty()
            else:
                del self._old[seq]
        return state

    def pop_many(
        self, seqs: list[int]
    ) -> tuple[list[SentState | None] | list[int], dict[bytes, int]]:
        """Remove those of ``seqs`` that are here: for each, whether it was, and how many
        were sent to each member (acks of sequences that are not consecutive: one
        member's of the partitions it owns, mostly)."""
        w, m, base = self._w, self._m, self._base
        span = len(w)
        if not seqs or min(seqs) < base or max(seqs) - base >= span:
            states = list(map(self.pop, seqs))
            by: dict[bytes, int] = {}
            for state in filter(None, states):
                by[state[1]] = by.get(state[1], 0) + 1
            return states, by
        found = []
        counts: dict[int, int] = {}
        for seq in seqs:  # (a loop: an array's methods cost more through map than this)
            i = seq - base
            v = w[i]
            found.append(v)
            if v:
                w[i] = 0
                k = m[i]
                counts[k] = counts.get(k, 0) + 1
        gone = sum(counts.values())
        if gone:
            self._n -= gone
            if not self._n:
                self._empty()
        who = self._who
        return found, {who[k]: n for k, n in counts.items()}

    def to(self, member: bytes) -> set[int]:
        """The sequences sent to ``member`` (a scan: rare uses)."""
        held = {seq for seq, state in self._old.items() if state[1] == member}
        index = self._index.get(member)
        if index is not None:
            base = self._base
            held.update(
                base + i
                for i, (v, m) in enumerate(zip(self._w, self._m, strict=True))
                if v and m == index
            )
        return held

    def put_many(
        self, seqs: Sequence[int], partitions: Sequence[int], members: list[bytes], deadline: float
    ) -> None:
        """Map ``seqs`` (absent, in any order) to their partitions and members, with one
        deadline: the columns grown once, the slots set in one loop; one below the
        window's base goes to the dict."""
        if not seqs:
            return
        low = min(seqs)
        if not self._n and low >= self._base:  # empty: start again (see SeqWindow.put)
            self._empty()
            self._base = low
        base, w, m, d = self._base, self._w, self._m, self._d
        end = max(seqs) - base + 1
        if end > len(w):
            self._pad(end - len(w))
        who = self._who
        for seq, partition, k in zip(seqs, partitions, self._members(members), strict=True):
            i = seq - base
            if i < 0:
                self._old[seq] = (partition, who[k], deadline)
                continue
            w[i] = partition + 1
            m[i] = k
            d[i] = deadline
            self._n += 1
        self._front = min(self._front, max(low - base, 0))
        if end - 1 >= WINDOW_MIN and end - 1 >= SPARSE * self._n:
            self._shrink()

    def put_run(self, first: int, slots: array[int], members: list[bytes], deadline: float) -> bool:
        """Put the consecutive sequences from ``first`` (``slots``: their partitions + 1,
        as the ready window holds them) with one deadline, when they all lie above what
        the window holds; else False, and nothing done."""
        i = first - self._base
        if not self._n and i >= 0:
            self._empty()
            self._base, i = first, 0
        span = len(self._w)
        if i < span:
            return False
        self._pad(i - span)
        self._w.extend(slots)
        self._m.extend(self._members(members))
        self._d.extend(array("d", (deadline,)) * len(slots))
        self._n += len(slots)
        i = len(self._w) - 1
        if i >= WINDOW_MIN and i >= SPARSE * self._n:
            self._shrink()
        return True

    def pop_run(self, first: int, n: int) -> bool:
        """Remove the consecutive sequences from ``first`` when all ``n`` of them are in
        the window; else False, and nothing done."""
        lo = first - self._base
        hi = lo + n
        w = self._w
        if lo < 0 or hi > len(w) or _has_empty(w[lo:hi]):
            return False
        w[lo:hi] = array("H", bytes(2 * n))
        self._n -= n
        if not self._n:
            self._empty()
        elif lo <= self._front < hi:
            self._front = hi
            if hi >= COMPACT_AFTER and hi * 2 >= len(w):
                self._drop(hi)
        return True

    def pop_run_of(self, first: int, n: int) -> bytes | None:
        """``pop_run`` of consecutive sequences all sent to one member (a member of a shared
        group acking a keyless batch): that member; else None, and nothing done."""
        lo = first - self._base
        m = self._m
        if lo < 0 or lo + n > len(m):
            return None
        k = m[lo]
        if m[lo : lo + n].tobytes() != (array("I", (k,)) * n).tobytes():
            return None
        return self._who[k] if self.pop_run(first, n) else None

    def _pad(self, gap: int) -> None:
        if gap:
            self._w.frombytes(bytes(2 * gap))
            self._m.frombytes(bytes(4 * gap))
            self._d.frombytes(bytes(8 * gap))

    def _empty(self) -> None:
        """Nothing in the window: its columns go (the dict's entries stay below base)."""
        del self._w[:], self._m[:], self._d[:]
        self._front = 0

    def _drop(self, front: int) -> None:
        del self._m[:front], self._d[:front]
        super()._drop(front)


_NOT_SENT = SentWindow()  # (first_in: nothing sent; never filled)
