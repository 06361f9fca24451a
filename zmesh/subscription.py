"""Subscriptions and the messages they deliver.

This module is long because Message and Subscription are the public surface of
consuming, documented where they are defined; the delivery bookkeeping is in
_engine/inbox."""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain, groupby, islice, repeat
from operator import attrgetter, length_hint
from threading import TIMEOUT_MAX
from typing import Any, Protocol

from ._engine.commands import Extend, Respond, Settle
from ._engine.inbox.origin import STATES, Origin, Queue, settled_error
from ._engine.limits import EPHEMERAL_QUEUE_BYTES
from ._handlers import serving
from ._receipt import MessageId
from ._requests import DELIVERY_HEADER, REPLY_MAX_HEADER
from ._seqs import consecutive
from ._waits import check_timeout
from .config import (
    NodeConfig,
    SubscriptionConfig,
    check_delay,
    check_max_messages,
    checked_headers,
    payload_bytes,
)
from .errors import (
    ArgumentError,
    MessageStateError,
    NodeClosedError,
    NodeStateError,
    ZMeshError,
)

__all__ = ["Message", "Subscription"]

log = logging.getLogger(__name__)

_origin_of, _place_of = attrgetter("_origin"), attrgetter("_i")
# How a message was settled, as its origin's ``state`` keeps it: one byte per message.
_CODES = {how: code for code, how in enumerate(STATES)}
_ACKED = _CODES["acked"]
_OPEN = (0, _CODES["transacted"])
_ACKED_RUN = bytes((_ACKED,))


def _check_each(messages: list[Message]) -> None:
    """Mark each of ``messages`` acked, one at a time; if one was settled already (or is
    there twice), leave them all as they were and raise MessageStateError."""
    for n, msg in enumerate(messages):
        if msg._settled is not None:
            error = _settled_already(msg)
            for m in messages[:n]:
                m._settled = None
            raise error
        msg._settled = "acked"


def _settled_already(msg: Message) -> MessageStateError:
    return settled_error(msg.id, msg._settled)


# MessageId's own __new__ is a Python function; the tuple constructor builds the same value.
_message_id = tuple.__new__


class Message:
    """One delivered message; settle it exactly once with ack, nack or fail.

    ``index``: the message's place in its partition at its producer (0, 1, 2, ... per
    topic and partition), the position ``Node.replay`` starts from. A message from a
    replay reader has ``group`` None and ``attempt`` 0; settling it does nothing (readers
    do not ack).
    """

    __slots__ = ("_origin", "_i", "key", "payload", "_headers")

    def __init__(self, origin: Origin, i: int, key: str | None, payload: bytes) -> None:
        # (``i``: its place in the batch, whose columns ``origin`` holds, its sequence
        # among them and its settlement state; the id and the headers dict are made when
        # asked for: most messages are acked without either)
        self._origin = origin
        self._i = i
        self.key = key
        self.payload = payload

    @property
    def _settled(self) -> str | None:
        """How it was settled (None: not yet), as its origin keeps it."""
        return STATES[self._origin.state[self._i]]

    @_settled.setter
    def _settled(self, how: str | None) -> None:
        self._origin.state[self._i] = _CODES[how]

    _headers: dict[str, Any]  # (a slot, set when first asked for)

    @property
    def attempt(self) -> int:
        """1 on the first delivery, one more on each redelivery (0 from a replay reader)."""
        return self._origin.attempts[self._i]

    @property
    def partition(self) -> int:
        return self._origin.partitions[self._i]

    @property
    def published_at(self) -> float:
        """When it was published, in seconds since the epoch (the producer's clock): the
        time of its ``publish()`` call, or of the first of the plain calls staged with it
        (one loop of the producer's IO thread), or of its ``publish_many``."""
        return self._origin.published_ats[self._i]

    @property
    def index(self) -> int | None:
        return self._origin.indexes[self._i]

    @property
    def topic(self) -> str:
        return self._origin.topic

    @property
    def group(self) -> str | None:
        """The consumer group it was delivered to (None from a replay reader)."""
        return self._origin.group

    @property
    def id(self) -> MessageId:
        """(producer id in hex, sequence): unique in the mesh, the same on redelivery."""
        origin = self._origin
        return _message_id(MessageId, (origin.producer, origin.seqs[self._i]))

    @property
    def headers(self) -> dict[str, Any]:
        try:
            return self._headers
        except AttributeError:  # (first asked: the batch's, or a dict of its own)
            headers = self._headers = self._origin.headers[self._i] or {}
            return headers

    def _settle(self, how: str, arg: Any) -> None:
        """Nack or fail: one command each."""
        if self._settled is not None:
            raise _settled_already(self)
        self._settled = how
        queue = self._origin.queue
        if queue is not None:
            queue.submit(Settle(self, how, arg))

    def ack(self) -> None:
        """Done with it: the group will not get it again."""
        origin, i = self._origin, self._i
        state = origin.state
        if state[i]:
            raise _settled_already(self)
        state[i] = _ACKED
        queue = origin.queue
        if queue is not None:  # (a replay reader's message: nothing to settle)
            if i == origin.next:  # (only the thread acking the message at ``next`` sets it)
                origin.next = i + 1
            else:
                origin.acks.append(origin.seqs[i])
            if not origin.queued:  # the batch's first ack since the IO thread took them
                origin.queued = True
                queue.submit(origin)
            elif queue.state != "running":  # (what submit would say)
                queue.check_running()

    def nack(self, delay: float | None = None) -> None:
        """Redeliver after ``delay`` seconds (None: the topic's retry backoff; at most ten
        years)."""
        if delay is not None:
            check_delay("nack delay", delay)
        self._settle("nacked", delay)

    def fail(self, reason: str = "") -> None:
        """Park it in the group's dead letters at the producer; no redelivery until replayed.

        The dead letter keeps the first 4,096 characters of ``reason``; a character UTF-8
        cannot carry (a lone surrogate, as ``os.fsdecode`` makes of a bad file name) is
        kept as its escape."""
        reason = str(reason)
        if not reason.isascii():
            reason = reason.encode("utf-8", "backslashreplace").decode("utf-8")
        self._settle("failed", reason)

    def in_progress(self) -> None:
        """Still working on it: its ack deadline (the topic's ``ack_timeout_s``) starts
        again at the producer, so it is not delivered again meanwhile. Call it from a
        handler that may take longer than the ack timeout, well within each timeout."""
        if self._settled not in (None, "transacted"):
            raise _settled_already(self)
        queue = self._origin.queue
        if queue is not None:
            queue.submit(Extend(self))

    @property
    def settled(self) -> bool:
        """Acked, nacked, failed or released (not: held by a transaction not committed)."""
        return self._origin.state[self._i] not in _OPEN

    def reply(
        self,
        payload: bytes | bytearray | memoryview | str,
        *,
        headers: Mapping[str, Any] | None = None,
        ok: bool = True,
    ) -> None:
        """Answer the request this message is (``Node.request``): sent at once to the
        node that published it, at most once (a requester that gave up, or is gone,
        misses it); ``ok`` False makes it an error reply (``Reply.ok``, as when a
        ``serve`` function raises). Settle the message as usual too (``Node.serve``
        does both). MessageStateError when the message is no request, or was replied
        to already."""
        sub = self._origin.sub  # (a replay reader's or Node.last's message has none)
        submitter = sub._submitter if isinstance(sub, Subscription) else None
        if submitter is None or DELIVERY_HEADER not in self.headers:
            raise MessageStateError(f"message {self.id} is no request: nothing waits for a reply")
        payload = payload_bytes(payload, "a reply")
        limit, whose = submitter.config.max_message_bytes, ""
        theirs = self.headers.get(REPLY_MAX_HEADER)
        if type(theirs) is int and 0 < theirs < limit:
            limit, whose = theirs, "the requester's "
        if len(payload) > limit:
            raise ArgumentError(
                f"a reply of {len(payload)} bytes is past {whose}max_message_bytes {limit}"
            )
        if headers is not None:
            headers = checked_headers(headers)
        origin = self._origin
        replied = origin.replied
        if replied is None:
            replied = origin.replied = set()
        if self._i in replied:
            raise MessageStateError(f"message {self.id} was replied to already: one reply each")
        replied.add(self._i)
        submitter.submit(Respond(origin, origin.seqs[self._i], payload, headers, ok))

    def __repr__(self) -> str:
        return (
            f"<Message {self.id} topic={self.topic!r} key={self.key!r} "
            f"attempt={self.attempt} {len(self.payload)}B>"
        )


class _Subscriber(Queue, Protocol):
    """What a subscription uses of its node's command queue (the engine's ``Submitter``)."""

    node_id: bytes
    config: NodeConfig

    def ephemeral_name(self) -> str: ...

    def unsubscribe(self, sub: Subscription, wait: bool = True) -> None: ...

    def ended(self, detail: str) -> NodeStateError: ...


class Subscription:
    """Messages of one topic for one group, in arrival order.

    Iterate it (``for msg in sub``), or pull with ``get`` / ``fetch``. Each message must
    be settled with ack, nack or fail; the number of unsettled messages is bounded by
    ``max_in_flight`` per producer. Once the subscription is closed (``close()``), ``get``
    returns None, ``fetch`` an empty list and iteration ends; once its node closes,
    each of them (waiting or called later) raises NodeClosedError (NodeStateError in a
    process forked from the node's, which gets none of its messages).
    """

    # The queue holds delivered batches, each as an iterator that makes the batch's
    # ``Message`` objects in its order as they are taken, with the iterator of their places
    # (which knows how many are left). A message made when taken and dropped once settled
    # is freed before Python's cyclic collector ever sees it; made on delivery, the
    # thousands a queue holds at a time would be carried through its older generations,
    # and into whole-heap collections (a fifth of a consumer's CPU). Any thread may take
    # from the iterator at the head (each step hands one message to one caller); the one
    # that finds it exhausted removes it, under the lock.

    def __init__(
        self,
        submitter: _Subscriber,
        topic: str,
        config: SubscriptionConfig,
        handler: Callable[[Message], Any] | None = None,
    ) -> None:
        self.topic = topic
        self.config = config
        self.group = config.group  # (None: ephemeral)
        self.mode = config.mode
        self._submitter = submitter  # (this node's command queue)
        self._name = submitter.ephemeral_name() if config.group is None else config.group
        # Queued batches: their messages as made when taken, the places not taken yet
        # (the iterator the messages are made from), and their origin.
        self._queue: deque[tuple[Iterator[Message], Iterator[int], Origin]] = deque()
        # The list ``fetch`` returned last (a copy, as it was) and the runs of batches it
        # is, for ``ack_many`` to know it by when it is given back whole.
        self._fetched: tuple[list[Message], list[tuple[Origin, Sequence[int], bool]]] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._own_close = False  # closed by close(), not by its node's close
        self._listeners: list[Callable[[], None]] = []
        self._handler = handler
        self._workers: list[threading.Thread] = []
        self.delivered = 0
        self.handled = 0
        self.handler_errors = 0

    @property
    def lane(self) -> str:
        """The producer-side lane this subscription consumes (an ephemeral one's name:
        producers keep no lane for it)."""
        if self.mode == "broadcast":
            return f"{self.group}/{self._submitter.node_id.hex()}"
        return self._name if self.group is None else self.group

    @property
    def closed(self) -> bool:
        return self._closed

    def _start_handlers(self, name: str) -> None:
        if self._handler is None:
            return
        for i in range(self.config.concurrency):
            t = threading.Thread(
                target=self._handle_loop, daemon=True, name=f"zmesh-handler-{name}-{self.topic}-{i}"
            )
            try:
                t.start()
            except RuntimeError as exc:  # "can't start new thread": out of threads or memory
                self.close()  # (the workers started see it closed and return)
                raise ZMeshError(
                    f"subscription {self.topic}/{self.group} started {i} of its "
                    f"concurrency={self.config.concurrency} handler threads and no more "
                    f"({exc}); lower concurrency"
                ) from exc
            self._workers.append(t)

    def _handle_loop(self) -> None:
        handler = self._handler
        assert handler is not None
        while True:
            try:
                msg = self.get()
            except NodeClosedError:
                return
            if msg is None:
                return
            try:
                result = handler(msg)
                if result is not None and inspect.isawaitable(result):
                    _discard(result)
                    raise ArgumentError(
                        "the handler returned an awaitable, which zmesh.Node does not "
                        "await: give coroutine handlers to zmesh.aio.Node"
                    )
            except BaseException:  # (SystemExit too: it would end this worker for good)
                self.handler_errors += 1
                log.exception(
                    "handler for %s/%s raised on %s; nacking it", self.topic, self.group, msg.id
                )
                if not msg.settled:
                    msg.nack()
                continue
            self.handled += 1
            if not msg.settled:
                msg.ack()

    def _deliver(
        self, origin: Origin, keys: Sequence[str | None], payloads: Sequence[bytes]
    ) -> bool:
        """Queue a batch's messages, all of ``origin``'s places (IO thread); False, and
        nothing queued, when an ephemeral subscription has no room for them, or when it
        is closed (its unsubscribe, on its way, releases them with the rest)."""
        if self.mode == "ephemeral" and not self._admits(len(payloads), sum(map(len, payloads))):
            return False
        places = iter(range(len(payloads)))
        origin.sub, origin.places = self, places
        with self._cond:
            if self._closed:
                return False
            self._queue.append(
                (map(Message, repeat(origin), places, keys, payloads), places, origin)
            )
            self.delivered += len(payloads)
            self._cond.notify_all()
        for listener in self._listeners:
            listener()
        return True

    def _take(self) -> Message | None:
        """The next queued message; None when none is queued."""
        queue = self._queue
        while queue:
            try:
                head = queue[0]
            except IndexError:  # another thread took the last batch meanwhile
                return None
            msg = next(head[0], None)
            if msg is not None:
                return msg
            self._exhausted(head)
        return None

    def _exhausted(self, head: tuple[Iterator[Message], Iterator[int], Origin]) -> None:
        """``head``, found with no message left, leaves the queue (unless another thread
        removed it already)."""
        with self._cond:
            queue = self._queue
            if queue and queue[0] is head:
                queue.popleft()

    def _admits(self, count: int, nbytes: int) -> bool:
        """Whether a batch of ``count`` messages (``nbytes`` of payloads) for this
        ephemeral subscription fits in its queue: at most ``max_in_flight`` messages and
        ``EPHEMERAL_QUEUE_BYTES`` (at the batch's mean size) queued, or none (IO thread)."""
        queued = self._queued()
        total = queued + count
        return not queued or (
            total <= self.config.max_in_flight and total * nbytes <= EPHEMERAL_QUEUE_BYTES * count
        )

    def _queued(self) -> int:
        """How many messages wait in the queue."""
        with self._cond:
            return sum(length_hint(places) for _msgs, places, _origin in self._queue)

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message; None on timeout or once the subscription is closed;
        NodeClosedError once its node closed."""
        msg = self._take()
        if msg is not None:
            return msg
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (msg := self._take()) is None:
                if self._closed:
                    if self._own_close:
                        return None
                    raise self._submitter.ended(
                        f"subscription {self.topic}/{self.group} ended with it"
                    )
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(None if remaining is None else min(remaining, TIMEOUT_MAX))
            return msg

    def fetch(self, max_messages: int = 100, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout`` for the first one."""
        check_max_messages(max_messages)
        first = self.get(timeout)
        if first is None:
            return []
        out = [first]
        stretches = [(first._origin, first._i, first._i, 1)]
        queue = self._queue
        while len(out) < max_messages and queue:
            try:
                head = queue[0]
            except IndexError:
                break
            want = max_messages - len(out)
            before = len(out)
            out.extend(islice(head[0], want))  # (no Python step per message)
            got = len(out) - before
            if got:
                stretches.append((out[before]._origin, out[before]._i, out[-1]._i, got))
            if got < want:
                self._exhausted(head)
        runs = _fetched_runs(stretches)
        self._fetched = None if runs is None else (out[:], runs)
        return out

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Ack a batch of messages with one command to the IO thread per batch of theirs
        (one in all, mostly). Either all are acked or, if one was settled already (or is
        in ``messages`` twice), none is and MessageStateError says which."""
        runs: list[tuple[Origin, Sequence[int], bool]]
        if type(messages) is not list:
            messages = list(messages)  # (a generator is gone once grouped)
        fetched = self._fetched
        if fetched is not None and messages == fetched[0]:
            # The list ``fetch`` returned last, as it was (the usual batch loop): known by
            # one comparison at C speed (a message equals only itself), its runs with it.
            self._fetched = None
            runs = fetched[1]
        else:  # each batch's messages and their places in it, at C speed
            if not set(map(type, messages)) <= {Message}:
                bad = next(m for m in messages if type(m) is not Message)
                raise ArgumentError(f"ack_many takes messages, got a {type(bad).__name__}")
            runs = [
                (origin, places, consecutive(places))
                for origin, places in (
                    (origin, list(map(_place_of, group)))
                    for origin, group in groupby(messages, _origin_of)
                )
            ]
        submitter = self._submitter
        for origin, places, _ in runs:
            if origin.queue is not submitter and origin.queue is not None:
                seq = origin.seqs[places[0]]
                raise ArgumentError(
                    f"message {_message_id(MessageId, (origin.producer, seq))} was not "
                    "received by this subscription's node: ack it with its own"
                )
        # The usual case is checked with no Python step per message: each batch's messages
        # consecutive (a message is the only one of its place), none of them settled, and
        # no batch in two runs.
        if not all(
            in_order and origin.state.count(0, places[0], places[-1] + 1) == len(places)
            for origin, places, in_order in runs
        ) or len({id(run[0]) for run in runs}) < len(runs):
            _check_each(messages)  # (raises, or marks each acked)
        for origin, places, in_order in runs:
            if origin.queue is None:  # (an ephemeral or a replay reader's: nothing to send)
                if in_order:
                    origin.state[places[0] : places[0] + len(places)] = _ACKED_RUN * len(places)
                continue
            if in_order:
                first, n = places[0], len(places)
                origin.state[first : first + n] = _ACKED_RUN * n
                if first == origin.next:
                    origin.next = first + n  # (a slice of its sequences)
                else:
                    origin.acks.extend(origin.seqs[first : first + n])
            else:
                origin.acks.extend(map(origin.seqs.__getitem__, places))
            if not origin.queued:
                origin.queued = True
                submitter.submit(origin)

    def __iter__(self) -> Iterator[Message]:
        # (chained at C speed: no step of a Python generator per message)
        return chain.from_iterable(self._batches())

    def _batches(self) -> Iterator[Iterable[Message]]:
        """The queued batches' messages, batch by batch (the head batch's iterator, taken
        from until it is exhausted, also by other threads), waiting when none is queued."""
        queue = self._queue
        while True:
            if queue:
                try:
                    head = queue[0]
                except IndexError:  # another thread took the last batch meanwhile
                    continue
                yield head[0]
                self._exhausted(head)
            else:
                msg = self.get()
                if msg is None:
                    return
                yield (msg,)

    def _add_listener(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def _forked(self) -> None:
        """In a process forked from its node's (``Submitter.forked``): ended, holding
        nothing (the node's process delivers what it held), with a lock of its own (the
        one copied may have been held by a thread that did not come along)."""
        self._cond = threading.Condition()
        self._queue.clear()
        self._fetched = None
        self._closed = True
        self._workers = []

    def _drain_unsettled(self) -> None:
        """Closed: nothing more is taken (the IO thread releases what was not settled)."""
        with self._cond:
            self._closed = True
            for _msgs, places, origin in self._queue:
                # An iterator already handed out (``for msg in sub``) makes no more of the
                # batch: its places run out here. The origin keeps which were not taken.
                untaken = length_hint(places)
                origin.places = iter(range(len(origin.seqs) - untaken, len(origin.seqs)))
                deque(places, maxlen=0)
            self._queue.clear()
            self._fetched = None  # (what the application holds is its own)
            self._cond.notify_all()
        for listener in self._listeners:
            listener()

    def close(self) -> None:
        """Stop consuming: every message delivered to it and not settled, queued or taken
        by the application, goes back to its producer at once, for other members (settling
        one afterwards raises MessageStateError: it was released). Threads waiting in
        ``get``, ``fetch`` or iteration get None (its end).

        With a handler, waits for the calls running on its worker threads to return (and
        their messages to be settled)."""
        if self._closed:
            return
        self._own_close = True
        self._end()

    def _handles_on(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is one of its handler threads (which its close joins)."""
        return thread in self._workers

    def _end(self, wait: bool = True) -> None:
        """``close()``, as its node's close does it (waiters get NodeClosedError; no
        ``wait`` for the IO thread's release: the node's close releases all at once)."""
        if self._closed:
            return
        # Nothing more is taken; the handler calls running end and settle theirs; then
        # the IO thread releases what is left unsettled (by the time this returns).
        self._drain_unsettled()
        waiting = (threading.current_thread(), serving.get())  # (for this call to end)
        for t in self._workers:
            if t not in waiting:
                t.join()
        # (NodeStateError: the node closed, its IO thread released what it held as it ended)
        with contextlib.suppress(NodeStateError):
            self._submitter.unsubscribe(self, wait)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<Subscription {self.topic}/{self.group} {self.mode} "
            f"queued={self._queued()}{' closed' if self._closed else ''}>"
        )


def _discard(awaitable: Any) -> None:
    """Close a coroutine that will never run (no "never awaited" warning for it)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


def _fetched_runs(
    stretches: list[tuple[Origin, int, int, int]],
) -> list[tuple[Origin, Sequence[int], bool]] | None:
    """The runs ``ack_many`` would find in a list ``fetch`` took as ``stretches`` (each
    from one batch: its origin, first and last place, and count), joined where one goes
    on where the one before ended; None unless every stretch is of consecutive places
    (another thread taking from the same batch meanwhile leaves gaps: a batch's places are
    taken in ascending order) and no batch is in two runs."""
    runs: list[tuple[Origin, Sequence[int], bool]] = []
    for origin, lo, hi, n in stretches:
        if hi - lo + 1 != n:
            return None
        if runs and runs[-1][0] is origin and runs[-1][1][-1] + 1 == lo:
            runs[-1] = (origin, range(runs[-1][1][0], hi + 1), True)
        else:
            runs.append((origin, range(lo, hi + 1), True))
    return runs if len({id(run[0]) for run in runs}) == len(runs) else None
