"""Request/reply over the mesh: the requests a node waits on, and the replies to them.

A request is a message published to its topic like any other (stored in the requester's
outbox, owed to the topic's groups, delivered by their lanes), with two headers: how it
may be delivered, and when its requester stops waiting. It carries the ttl of its
timeout, so a lane drops it once nobody waits for it. A responder (``Node.serve``, or a
handler that calls ``msg.reply``) answers with a REPLY control frame to the requester's
node, named by the message's id; the requester's IO thread hands it to the ``Pending``
request of that sequence. When no lane of the topic has a live member the request is not
published at all: ``NoRespondersError``, at once.

At most once (the default): a request delivered again (its first member died, timed out,
or gave it back) is dropped by ``serve`` without calling its function: it may have run
already. At least once (``delivery="at_least_once"``): it is handled again, and answered
again; the function must then be idempotent by ``msg.id``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._receipt import MessageId
from .config import checked_headers
from .errors import ArgumentError, MessageStateError, NodeClosedError, ReplyError, TimeoutError

if TYPE_CHECKING:
    from ._engine.stats import Counters
    from ._protocol import frames
    from .subscription import Message

log = logging.getLogger(__name__)

# The headers of a request (the ``zmesh-`` prefix is zmesh's own).
DELIVERY_HEADER = "zmesh-request"  # "at_most_once" | "at_least_once"
REPLY_BY_HEADER = "zmesh-reply-by"  # wall-clock time its requester stops waiting
REPLY_MAX_HEADER = "zmesh-reply-max"  # the largest reply its requester takes (bytes)
MAX_REASON_BYTES = 4096  # an error reply's text at most (what the function raised)
Delivery = Literal["at_most_once", "at_least_once"]
DELIVERIES = ("at_most_once", "at_least_once")


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer to a request (``Node.request``, ``Node.request_many``).

    ``responder``: the id (hex) of the node that answered; ``request``: the request's
    message id; ``ok``: False when the responder's function raised (``payload`` then
    says what it raised)."""

    topic: str
    payload: bytes
    headers: dict[str, Any]
    responder: str
    request: MessageId
    ok: bool = True


@dataclass(frozen=True, slots=True)
class Ask:
    """A request to publish: what ``request`` and ``request_many`` were given, checked
    (``count``: how many replies to wait for; None: ``Pending.expected``)."""

    topic: str
    payload: bytes | bytearray | memoryview | str
    key: str | None
    headers: dict[str, Any]
    timeout_s: float
    count: int | None
    started: float = field(default_factory=time.monotonic)

    def room_s(self, publish_timeout_s: float) -> float:
        """How long the request may wait for room in the outbox: the node's
        publish_timeout_s, never past its own timeout."""
        return min(self.timeout_s, publish_timeout_s)

    def left_s(self) -> float:
        """What is left of its timeout (the wait for room in the outbox took the rest)."""
        return self.timeout_s - (time.monotonic() - self.started)

    @classmethod
    def of(
        cls,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        key: str | None,
        headers: Mapping[str, Any] | None,
        delivery: str,
        timeout: object,
        max_reply: int,
        count: object = 1,
    ) -> Ask:
        """The request's arguments checked, its headers made: the caller's, and zmesh's
        own (``max_reply``: the requester's max_message_bytes)."""
        timeout_s = check_timeout_s(timeout)
        if delivery not in DELIVERIES:
            raise ArgumentError(f"delivery must be one of {DELIVERIES}, got {delivery!r}")
        own = {
            DELIVERY_HEADER: delivery,
            REPLY_BY_HEADER: time.time() + timeout_s,
            REPLY_MAX_HEADER: max_reply,
        }
        all_headers = own if headers is None else {**checked_headers(headers), **own}
        return cls(topic, payload, key, all_headers, timeout_s, check_count(count))

    def reply(self, replies: list[Reply]) -> Reply:
        """What ``request`` returns of the replies that came: the first one; a
        TimeoutError when none came, a ReplyError when it says the responder's function
        failed."""
        if not replies:
            raise TimeoutError(
                f"no reply to the request on {self.topic!r} within {self.timeout_s:g}s"
            )
        reply = replies[0]
        if not reply.ok:
            reason = reply.payload.decode(errors="replace")
            raise ReplyError(reply.topic, reply.responder, reason, reply)
        return reply


def check_timeout_s(timeout: object) -> float:
    """A request's timeout: a finite number of seconds > 0."""
    if isinstance(timeout, int | float) and not isinstance(timeout, bool):
        try:
            seconds = float(timeout)
        except OverflowError:  # (an int past any float)
            seconds = float("inf")
        if 0 < seconds < float("inf"):
            return seconds
    raise ArgumentError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


def check_count(count: object) -> int | None:
    """``request_many``'s count: None, or an int >= 1."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ArgumentError(f"count must be an int >= 1 (or None), got {count!r}")
    return count


@dataclass(slots=True, eq=False)
class Pending:
    """A request its node waits on: the replies that came, or why none will.

    ``expected``: one reply per lane with a live member when it was published (the IO
    thread sets it, with ``accepted``), what ``request_many`` waits for by default."""

    topic: str
    seq: int
    node: str  # (the requester's name, for NodeClosedError)
    replies: list[Reply] = field(default_factory=list)
    accepted: bool = False
    expected: int = 0
    error: BaseException | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    listeners: list[Callable[[], None]] = field(default_factory=list)
    requests: Requests | None = None  # (the node's, which it leaves at close())

    def _changed(self) -> None:
        self.cond.notify_all()
        for listener in self.listeners:
            listener()

    def close(self) -> None:
        """No longer waited on: a reply that comes later is counted unclaimed."""
        if self.requests is not None:
            self.requests.close(self)

    def accept(self, expected: int) -> None:
        """Published: ``expected`` lanes have a member (IO thread)."""
        with self.cond:
            self.accepted = True
            self.expected = expected
            self._changed()

    def fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = error
            self._changed()

    def add(self, reply: Reply) -> None:
        with self.cond:
            self.replies.append(reply)
            self._changed()

    def done(self, count: int | None) -> bool:
        """Whether ``count`` replies came (None: ``expected``), or none will."""
        if self.error is not None:
            return True
        want = self.expected if count is None else count
        return self.accepted and len(self.replies) >= max(1, want)

    def wait(self, count: int | None, timeout_s: float) -> list[Reply]:
        """The replies once ``count`` came (None: ``expected``) or ``timeout_s`` passed;
        the error when the request cannot be answered."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not self.done(count):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, threading.TIMEOUT_MAX))
            return self.outcome(count)

    def outcome(self, count: int | None = None) -> list[Reply]:
        """The replies so far (the first ``count`` of them), or the error that ended the
        wait."""
        if self.error is not None:
            raise self.error
        return self.replies[:count]


class Requests:
    """The requests of one node that wait for replies, by sequence (any thread)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._open: dict[int, Pending] = {}
        self._lock = threading.Lock()

    def open(self, topic: str, seq: int, node: str) -> Pending:
        pending = Pending(topic, seq, node, requests=self)
        with self._lock:
            self._open[seq] = pending
        return pending

    def close(self, pending: Pending) -> None:
        with self._lock:
            self._open.pop(pending.seq, None)

    def deliver(self, reply: frames.Reply, producer: str) -> None:
        """A REPLY came (IO thread): to the request it answers, if it is still waited on."""
        pending = self._open.get(reply.seq)
        if pending is None or pending.topic != reply.topic:
            self.counters.add("replies_unclaimed", 1)  # (late: its requester gave up)
            return
        self.counters.add("replies_received", 1)
        pending.add(
            Reply(
                reply.topic,
                reply.payload,
                reply.headers or {},
                reply.node_id.hex(),
                MessageId(producer, reply.seq),
                reply.ok,
            )
        )

    def end_all(self) -> None:
        """The node closed: every wait ends with NodeClosedError."""
        with self._lock:
            pending, self._open = list(self._open.values()), {}
        for p in pending:
            p.fail(NodeClosedError(p.node, f"a request on {p.topic} was waiting for replies"))


def serving(fn: Callable[[Message], Any], counters: Counters) -> Callable[[Message], None]:
    """``Node.serve``'s handler: ``fn(msg)``'s return value (bytes, str or None) is the
    reply; what it raises, or returns that no reply can be, is replied as an error. A
    message that is not a request is handed to ``fn`` and answered by nobody; an
    at-most-once request delivered again, or one its requester no longer waits for, is
    acked without calling ``fn``."""

    def handle(msg: Message) -> None:
        headers = msg.headers
        delivery = headers.get(DELIVERY_HEADER)
        if delivery is None:
            fn(msg)
            return
        if delivery != "at_least_once" and msg.attempt > 1:
            counters.add("requests_dropped_redelivered", 1)  # (it may have run already)
            return
        reply_by = headers.get(REPLY_BY_HEADER)
        if isinstance(reply_by, int | float) and time.time() > reply_by:
            counters.add("requests_dropped_late", 1)
            return
        try:
            result = fn(msg)
        except BaseException as exc:  # (SystemExit too: its requester hears it, not a timeout)
            _failed(msg, exc)
            return
        try:
            msg.reply(b"" if result is None else result)
        except ArgumentError as exc:  # (no reply can carry it: its requester hears why)
            _failed(msg, exc)
        except MessageStateError:  # (fn answered with msg.reply: that reply stands)
            if result is not None:
                log.warning(
                    "request %s on %s: the function replied with msg.reply and returned "
                    "a reply too; only the first was sent",
                    msg.id,
                    msg.topic,
                )

    return handle


def _failed(msg: Message, exc: BaseException) -> None:
    """A request ``serve``'s function failed on (it raised, or returned what no reply can
    be): replied as an error, unless it replied already."""
    name = type(exc).__name__
    try:
        text = f"{name}: {exc}"
    except Exception:  # (its __str__ raised)
        text = name
    reason = text.encode(errors="backslashreplace")
    if len(reason) > MAX_REASON_BYTES:  # (a payload quoted in it: the log has it whole)
        reason = reason[: MAX_REASON_BYTES - 3] + b"..."
    try:
        try:
            msg.reply(reason, ok=False)
        except ArgumentError:  # (past a max_message_bytes smaller still)
            msg.reply(b"", ok=False)
    except MessageStateError:  # (it replied before it raised: that reply stands)
        log.warning("request %s on %s failed after its reply: %r", msg.id, msg.topic, exc)
        return
    log.warning("request %s on %s failed: %s; replied as an error", msg.id, msg.topic, text)
