"""What a lane hands around: the states of an unsettled message and its ``Entry``, what
one ``take`` gives a member (``Taken``), a member's credit (``Member``), retry timing
(``Timing``) and what a tick settled (``TickResult``). lane.py holds the lane itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

READY = 0
DELAYED = 1
IN_FLIGHT = 2

# A ready heap holds one int per message: priority above the sequence, so the smallest
# is the most urgent, oldest one (an int costs a third of a (priority, seq) tuple).
SEQ_BITS = 56
SEQ_MASK = (1 << SEQ_BITS) - 1


class Entry:
    """One unsettled message of a lane."""

    __slots__ = (
        "seq",
        "partition",
        "priority",
        "attempt",
        "state",
        "member",
        "deadline",
        "not_before",
        "expires_at",
    )

    def __init__(
        self,
        seq: int,
        partition: int,
        priority: int,
        attempt: int,
        not_before: float,
        expires_at: float,
    ) -> None:
        self.seq = seq
        self.partition = partition
        self.priority = priority
        self.attempt = attempt
        self.state = READY
        self.member: bytes | None = None
        self.deadline = 0.0
        self.not_before = not_before
        self.expires_at = expires_at  # 0.0: never


class Taken:
    """What one ``take`` hands a member, as columns in send order. ``seqs`` is a ``range``
    when the take was a consecutive front of the lane's window (see ``SeqWindow.front``);
    ``partitions`` and ``attempts`` are ``bytes`` (a byte each) when it was such a front
    for one member, as the batch packs them."""

    __slots__ = ("seqs", "partitions", "attempts")

    def __init__(self) -> None:
        self.seqs: list[int] | range = []
        self.partitions: Sequence[int] = []
        self.attempts: Sequence[int] = []

    def __len__(self) -> int:
        return len(self.seqs)


def out_columns(out: dict[bytes, Taken], member: bytes) -> tuple[list[int], list[int], list[int]]:
    """The columns of ``out[member]`` (made empty if absent) as lists to append to."""
    taken = out.get(member)
    if taken is None:
        taken = out[member] = Taken()
    seqs, partitions, attempts = taken.seqs, taken.partitions, taken.attempts
    if not isinstance(seqs, list):  # (a front taken before, as a range and bytes)
        seqs = taken.seqs = list(seqs)
    if not isinstance(partitions, list):
        partitions = taken.partitions = list(partitions)
    if not isinstance(attempts, list):
        attempts = taken.attempts = list(attempts)
    return seqs, partitions, attempts


NO_SIZE_LIMIT = 1 << 62  # a member that did not say how large a payload it accepts


# A member's window is sized again at most this often, and once it has acked this many
# messages since (or a whole queue time has passed): a rate needs a few acks to mean
# anything. One that acked none for WINDOW_IDLE_S (at most a queue time) while it held a
# full window may hold twice as many.
WINDOW_EVERY_S = 0.1
WINDOW_MIN_ACKS = 32
WINDOW_IDLE_S = 1.0
# The share of a lane's ack timeout a member's window holds of its work (``queue_s``): a
# message waits that long at most behind the others sent with it, far from timing out.
QUEUE_SHARE = 0.25
# About the most a member's window holds in bytes on the wire, by the lane's recent bytes
# per message (``Lane.note_sent``): large payloads make for a window of fewer messages.
WINDOW_MAX_BYTES = 16 << 20
FRAME_MAX_BYTES = 1 << 20  # about the most payload bytes one data frame carries (``frame_size``)


@dataclass(slots=True)
class Member:
    """A live member of the lane's group and its credit.

    It is sent at most ``window`` unacked messages, a number between 1 and its
    ``max_in_flight`` sized by how fast it acks: while it holds a full window, the window
    becomes what it acks in ``queue_s`` (``Member.resize``), so a member that handles
    messages slowly holds that long a queue of them at most, whatever its
    ``max_in_flight``, and one that acks fast gets its whole ``max_in_flight`` (enough to
    keep frames on their way while earlier ones are acked). It starts at two frames. The
    lane also bounds it by bytes: at most about ``WINDOW_MAX_BYTES`` of what it sends."""

    max_in_flight: int
    batch_size: int
    max_message_bytes: int = NO_SIZE_LIMIT  # the largest payload it accepts
    # What it holds unacked: ``sent`` plain messages (counted only: the lane's sent map
    # knows which) and the sequences of ``Entry`` messages in ``in_flight``.
    in_flight: set[int] = field(default_factory=set)
    sent: int = 0
    window: int = 0  # (``start``)
    acked: int = 0  # since ``since``
    since: float | None = None  # (None: from the first ``resize``)
    full: bool = False  # it held a whole window after some take since ``since``

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        """A window of two frames (at most ``max_in_flight``), measured from the next take."""
        self.window = min(2 * self.batch_size, self.max_in_flight)
        self.acked = 0
        self.since = None
        self.full = False

    def holds(self) -> int:
        return self.sent + len(self.in_flight)

    def resize(self, now: float, queue_s: float, cap: int) -> None:
        """Size the window again from the member's acks (before a take) once enough time
        and acks have passed: if it held a full window after some take since (``full``),
        the window is what it acked in ``queue_s``, bounded by 1 and ``max_in_flight``,
        or twice what it was if it acked none for ``WINDOW_IDLE_S`` (a member may hold
        what it was sent until it has a batch of it to handle: up to ``max_in_flight``, as
        it asked; a handler that takes longer than that per message is too slow for any
        window of two frames and the default ack timeout); else the
        window is kept (a member sent less than it could take says nothing of its speed by
        its acks). ``cap``: the most messages the lane's bytes per message allow, applied
        at once."""
        limit = max(1, min(self.max_in_flight, cap))
        if self.window > limit:
            self.window = limit
        if self.since is None:
            self.since = now
        span = now - self.since
        if self.acked:
            if span < WINDOW_EVERY_S or self.acked < WINDOW_MIN_ACKS and span < queue_s:
                return
            if self.full:  # (queue_s is infinite for a lane whose acks never time out)
                self.window = max(1, int(min(limit, self.acked * queue_s / span)))
        else:
            if span < min(WINDOW_IDLE_S, queue_s):
                return
            if self.full:  # it may be gathering what it holds into a batch to handle
                self.window = min(limit, 2 * self.window)
        self.acked = 0
        self.since = now
        self.full = False


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
