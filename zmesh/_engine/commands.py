"""Commands from application threads to the IO thread: the ``Submitter`` queues them
(submit.py), the IO thread applies them (``Commands.drain``, drain.py).

The commands made most (a publish, a stretch of plain publishes, a list of publishes, the
``Origin`` of a batch whose messages were acked) are queued as themselves; the others are
small frozen records, one type each. What a command changes applies from the loop
iteration that drains it, to every publish that iteration stages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._discovery.base import Found
from ..config import TopicConfig
from .inbox.origin import Origin
from .outbox.publishes import AnyPublish, Publish, Stretch

if TYPE_CHECKING:
    from .._receipt import Receipt
    from .._requests import Pending
    from .._store.store import WriteBatch
    from ..subscription import Message, Subscription


class Call:
    """A function to run on the IO thread, and its result (a command of its own)."""

    __slots__ = ("fn", "done", "result", "error", "tx", "writes")

    def __init__(
        self, fn: Callable[[WriteBatch, float], Any], tx: bool = False, writes: bool = True
    ) -> None:
        self.fn = fn
        self.tx = tx  # a transaction: it fails with the commit of its publishes
        self.writes = writes  # False: it only reads, and no failed commit fails it
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Settle:
    """A message nacked (``arg``: its delay) or failed (``arg``: the reason)."""

    msg: Message
    how: str  # "nacked" | "failed"
    arg: object


@dataclass(frozen=True, slots=True)
class Extend:
    """A message still being handled: its lease starts again at its producer."""

    msg: Message


@dataclass(frozen=True, slots=True)
class Watch:
    """Someone waits for this receipt's acks."""

    receipt: Receipt


class Tx:
    """A transaction: its publishes and acks in one commit; ``done`` says how it went.

    Taken by the IO thread or withdrawn by the thread that submitted it, whichever comes
    first (``take`` and ``withdraw``): a transaction whose wait ran out is withdrawn, and
    nothing of it happens, unless its commit is already under way."""

    __slots__ = ("pubs", "acks", "done", "_lock", "_taken")

    def __init__(self, pubs: list[Publish], acks: list[Message], done: Call) -> None:
        self.pubs = pubs
        self.acks = acks
        self.done = done
        self._lock = threading.Lock()
        self._taken: bool | None = None  # (None: neither taken nor withdrawn yet)

    def take(self) -> bool:
        """The IO thread's claim: False when it was withdrawn (it does nothing then)."""
        with self._lock:
            if self._taken is None:
                self._taken = True
            return self._taken

    def withdraw(self) -> bool:
        """The submitter's claim: False when the IO thread took it already."""
        with self._lock:
            if self._taken is None:
                self._taken = False
            return not self._taken


@dataclass(frozen=True, slots=True)
class Contact:
    """A discovery found a control endpoint."""

    found: Found


@dataclass(frozen=True, slots=True)
class Subscribe:
    sub: Subscription


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    sub: Subscription


@dataclass(frozen=True, slots=True)
class SetTopic:
    topic: str
    config: TopicConfig


@dataclass(frozen=True, slots=True)
class Request:
    """A request to publish if its topic has responders (requests.py)."""

    pub: Publish
    pending: Pending


@dataclass(frozen=True, slots=True)
class Respond:
    """A reply to the request at ``origin``'s sequence ``seq`` (``ok`` False: an error)."""

    origin: Origin
    seq: int
    payload: bytes
    headers: dict[str, Any] | None
    ok: bool


@dataclass(frozen=True, slots=True)
class Abandon:
    """Publishes prepared for a transaction dropped without commit or abort."""

    count: int
    nbytes: int


class Stop:
    """The node closes: the IO thread stops after what was queued before."""


STOP = Stop()

Command = (
    AnyPublish
    | Stretch
    | list[AnyPublish]
    | Origin
    | Call
    | Settle
    | Extend
    | Watch
    | Tx
    | Contact
    | Subscribe
    | Unsubscribe
    | SetTopic
    | Request
    | Respond
    | Abandon
    | Stop
)
