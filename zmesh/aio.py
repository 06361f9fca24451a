"""The asyncio twin of zmesh: ``async with zmesh.aio.Node(...)``, ``async for msg in sub``.

The node still runs its IO thread; this module makes its waits awaitable without a thread
per await. The IO thread's notifications (a receipt stored or acked, room in the outbox, a
batch delivered, the node closed) each schedule one callback on the event loop
(``call_soon_threadsafe``: one write to the loop's self-pipe) while something awaits
them, and every pending await looks again. So an await holds no thread, cancelling it
leaves nothing behind, and a message is taken from a subscription only in the step that
returns it. Calls that end on their own within milliseconds (start, close, status, dead
letters, a transaction's commit, a snapshot) run on the loop's default executor. A
replay reader fetches on a thread of its own, from its first ``async for`` step until it
(or its node) closes. As in the sync API, every wait ends with NodeClosedError once the
node closes (a subscription closed on its own ends with None instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ._receipt import MessageId
from ._receipt import Receipt as _SyncReceipt
from ._waits import check_timeout
from .config import NodeConfig, SubscriptionConfig, TopicConfig
from .deadletters import DeadLetter
from .errors import OutboxFullError, StoreFullError, ZMeshError
from .node import Node as _SyncNode
from .replay import ReplayReader as _SyncReplayReader
from .subscription import Message
from .subscription import Subscription as _SyncSubscription
from .transaction import Transaction as _SyncTransaction

__all__ = ["Node", "Receipt", "ReplayReader", "Subscription", "Transaction"]

T = TypeVar("T")
REPLAY_BATCH = 500  # messages a replay reader's thread fetches per step


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Wakes:
    """Awaits on an event loop for what another thread notifies (``wake``): each pending
    await asks its condition again after every notification, with no thread of its own."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: set[asyncio.Future[None]] = set()
        self._scheduled = False  # a callback is on its way to the loop

    def wake(self) -> None:
        """From any thread: wake the pending awaits (one callback until they ran)."""
        if self._waiting and not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._fire)  # type: ignore[union-attr]
            except RuntimeError:  # its loop is closed: nobody is left to wake
                self._scheduled = False

    def _fire(self) -> None:
        self._scheduled = False  # (first: a notification from now on schedules again)
        for fut in self._waiting:
            _resolve(fut)

    async def until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Await ``done()`` (asked on the loop, after each notification): True once it is,
        False when ``timeout`` seconds (None: no end) pass first."""
        if done():
            return True
        loop = asyncio.get_running_loop()
        if not self._waiting:
            self._loop = loop
        elif loop is not self._loop:
            raise ZMeshError("a zmesh.aio object is awaited from two event loops at once")
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            # Registered before ``done()`` is asked: a notification after the question
            # wakes this future (the callback runs on this loop, after this step).
            fut = loop.create_future()
            self._waiting.add(fut)
            try:
                if done():
                    return True
                if deadline is None:
                    await fut
                    continue
                if loop.time() >= deadline:
                    return False
                timer = loop.call_at(deadline, _resolve, fut)
                try:
                    await fut
                finally:
                    timer.cancel()
            finally:
                self._waiting.discard(fut)


class Receipt:
    """Awaitable view of a publish receipt (``zmesh.Receipt``)."""

    __slots__ = ("_receipt", "_wakes")

    def __init__(self, receipt: _SyncReceipt, wakes: _Wakes) -> None:
        self._receipt = receipt
        self._wakes = wakes

    @property
    def sync(self) -> _SyncReceipt:
        """The underlying receipt."""
        return self._receipt

    @property
    def id(self) -> MessageId:
        return self._receipt.id

    @property
    def ids(self) -> list[MessageId]:
        return self._receipt.ids

    @property
    def count(self) -> int:
        return self._receipt.count

    @property
    def topic(self) -> str:
        return self._receipt.topic

    @property
    def stored(self) -> bool:
        return self._receipt.stored

    @property
    def acked(self) -> bool:
        return self._receipt.acked

    async def wait_stored(self, timeout: float | None = None) -> None:
        """Like ``zmesh.Receipt.wait_stored``."""
        timeout = check_timeout(timeout)
        await self._wait(False, timeout, timeout)

    async def wait_acked(self, timeout: float | None = None) -> None:
        """Like ``zmesh.Receipt.wait_acked``."""
        timeout = check_timeout(timeout)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self._wait(False, timeout, timeout)  # (acks are tracked once it is stored)
        if not self._receipt.acked:
            left = None if timeout is None else timeout - (loop.time() - start)
            await self._wait(True, left, timeout)

    async def _wait(self, acked: bool, left: float | None, timeout: float | None) -> None:
        receipt = self._receipt
        if not await self._wakes.until(functools.partial(receipt._done, acked), left):
            raise receipt._late(acked, timeout)

    def __repr__(self) -> str:
        return f"<zmesh.aio.{repr(self._receipt)[1:]}"


async def _with_room(wakes: _Wakes, publish: Callable[[], T], timeout: float | None,
                     default_s: float) -> T:
    """``publish()`` (which waits for nothing: made with timeout=0) once the outbox has
    room for it, tried again after each notification up to ``timeout`` (None:
    ``default_s``, the node's publish_timeout_s); then the last refusal, with the wait."""
    done: list[T] = []
    full: list[OutboxFullError | StoreFullError] = []

    def attempt() -> bool:
        try:
            done.append(publish())
        except (OutboxFullError, StoreFullError) as exc:
            full[:] = [exc]
            return False
        return True

    wait = check_timeout(default_s if timeout is None else timeout)
    if await wakes.until(attempt, wait):
        return done[0]
    exc = full[0]
    waited = float("inf") if wait is None else wait
    if isinstance(exc, StoreFullError):
        raise StoreFullError(exc.path or "", exc.map_size_bytes, waited) from None
    raise OutboxFullError(exc.depth, exc.limit, waited) from None


class Subscription:
    """A subscription awaited on the loop; messages are the same ``zmesh.Message``
    objects, settled with the same (non-blocking) ``ack``, ``nack``, ``fail``.

    ``get`` returns None (and ``async for`` ends) once the subscription is closed; once
    its node closes they raise NodeClosedError, as the sync ones do."""

    def __init__(self, sub: _SyncSubscription) -> None:
        self._sub = sub
        self._wakes = _Wakes()
        sub._add_listener(self._wakes.wake)

    @property
    def sync(self) -> _SyncSubscription:
        """The underlying subscription."""
        return self._sub

    @property
    def topic(self) -> str:
        return self._sub.topic

    @property
    def group(self) -> str:
        return self._sub.group

    @property
    def mode(self) -> str:
        return self._sub.mode

    @property
    def config(self) -> SubscriptionConfig:
        return self._sub.config

    @property
    def lane(self) -> str:
        return self._sub.lane

    @property
    def closed(self) -> bool:
        return self._sub.closed

    @property
    def delivered(self) -> int:
        return self._sub.delivered

    @property
    def handled(self) -> int:
        return self._sub.handled

    @property
    def handler_errors(self) -> int:
        return self._sub.handler_errors

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message; None on timeout or once the subscription is closed."""
        sub = self._sub
        got: list[Message] = []

        def ready() -> bool:
            msg = sub.get(timeout=0)
            if msg is None:
                return sub.closed
            got.append(msg)
            return True

        await self._wakes.until(ready, check_timeout(timeout))
        return got[0] if got else None

    async def fetch(self, max_messages: int = 100, timeout: float | None = None
                    ) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout`` for the first one."""
        sub = self._sub
        got: list[list[Message]] = []

        def ready() -> bool:
            msgs = sub.fetch(max_messages, timeout=0)
            if not msgs:
                return sub.closed
            got.append(msgs)
            return True

        await self._wakes.until(ready, check_timeout(timeout))
        return got[0] if got else []

    def ack_many(self, messages: list[Message]) -> None:
        """Like ``zmesh.Subscription.ack_many`` (it never waits)."""
        self._sub.ack_many(messages)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        msg = await self.get()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def close(self) -> None:
        """Like ``zmesh.Subscription.close`` (which waits for running handler calls)."""
        await asyncio.to_thread(self._sub.close)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<zmesh.aio.{repr(self._sub)[1:]}"


class Transaction:
    """``async with node.transaction() as tx: await tx.publish(...); tx.ack(msg)``:
    committed when the block ends without an exception, aborted otherwise.

    A commit that was submitted is not undone by cancelling its await."""

    def __init__(self, tx: _SyncTransaction, node: Node) -> None:
        self._tx = tx
        self._node = node

    @property
    def sync(self) -> _SyncTransaction:
        """The underlying transaction."""
        return self._tx

    async def publish(self, topic: str, payload: bytes | str, *,
                      timeout: float | None = None, **options: Any) -> Receipt:
        """Like ``zmesh.Transaction.publish``; waits for outbox room on the loop."""
        node = self._node
        receipt = await _with_room(
            node._wakes, functools.partial(self._tx.publish, topic, payload, timeout=0,
                                           **options),
            timeout, node.config.publish_timeout_s)
        return Receipt(receipt, node._wakes)

    def ack(self, msg: Message) -> None:
        self._tx.ack(msg)

    async def commit(self) -> None:
        await asyncio.to_thread(self._tx.commit)

    def abort(self) -> None:
        self._tx.abort()

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            await self.commit()
        else:
            self.abort()


class ReplayReader:
    """``async for msg in reader``: a replay reader (``zmesh.ReplayReader``) whose
    fetching runs on a thread of its own, started by the first step and ended by
    ``close()`` or the node's; cancelling a step loses no message (the next one gets
    it)."""

    def __init__(self, reader: _SyncReplayReader) -> None:
        self._reader = reader
        self._wakes = _Wakes()
        self._buffer: deque[Message] = deque()
        self._want = threading.Event()  # the loop asks the thread for more
        self._ended = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def sync(self) -> _SyncReplayReader:
        """The underlying reader."""
        return self._reader

    @property
    def topic(self) -> str:
        return self._reader.topic

    @property
    def from_index(self) -> int:
        return self._reader.from_index

    @property
    def follow(self) -> bool:
        return self._reader.follow

    @property
    def gaps(self) -> int:
        return self._reader.gaps

    @property
    def gap_ranges(self) -> list[tuple[str, int, int, int]]:
        return self._reader.gap_ranges

    @property
    def unreachable(self) -> set[str]:
        return self._reader.unreachable

    @property
    def closed(self) -> bool:
        return self._reader.closed

    def _fetch(self, loop: asyncio.AbstractEventLoop) -> None:
        """The reader's thread: a batch each time the loop asks, until the end."""
        reader, want = self._reader, self._want
        error: BaseException | None = None
        try:
            while not reader.closed or want.is_set():  # (closed by its node: nobody asks)
                if not want.wait(1.0):
                    continue
                want.clear()
                msgs = reader.read(REPLAY_BATCH)
                if not msgs:
                    break
                loop.call_soon_threadsafe(self._arrived, msgs, None)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # (its loop is closed: nobody reads on)
            loop.call_soon_threadsafe(self._arrived, [], error)

    def _arrived(self, msgs: list[Message], error: BaseException | None) -> None:
        if msgs:
            self._buffer.extend(msgs)
        else:
            self._ended, self._error = True, error
        self._wakes.wake()

    def _ready(self) -> bool:
        if self._buffer or self._ended:
            return True
        self._want.set()
        return False

    async def __anext__(self) -> Message:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._fetch, args=(asyncio.get_running_loop(),), daemon=True,
                name=f"zmesh-aio-replay-{self._reader.topic}")
            self._thread.start()
        await self._wakes.until(self._ready, None)
        if self._buffer:
            msg = self._buffer.popleft()
            if not self._buffer and not self._ended:
                self._want.set()  # the next batch on its way while this one is handled
            return msg
        if self._error is not None:
            raise self._error
        raise StopAsyncIteration

    def __aiter__(self) -> ReplayReader:
        return self

    async def read(self, max_messages: int = 1000) -> list[Message]:
        """Up to ``max_messages`` messages (fewer at the end of a reader that does not
        follow; a following reader waits for at least one)."""
        try:
            out = [await self.__anext__()]
        except StopAsyncIteration:
            return []
        while self._buffer and len(out) < max_messages:
            out.append(self._buffer.popleft())
        return out

    def _close(self) -> None:
        self._reader.close()
        self._want.set()  # (its thread reads the end at once)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    async def __aenter__(self) -> ReplayReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<zmesh.aio.{repr(self._reader)[1:]}"


def _on_loop(handler: Callable[[Message], Any], loop: asyncio.AbstractEventLoop
             ) -> Callable[[Message], Any]:
    """A coroutine handler as the sync handler threads call it: run on ``loop``, each
    thread waiting for its call (acked when it returns, nacked when it raises)."""

    def call(msg: Message) -> Any:
        return asyncio.run_coroutine_threadsafe(handler(msg), loop).result()

    return call


class Node:
    """``async with zmesh.aio.Node("name", mesh=..., data_dir=...) as node:``, taking what
    ``zmesh.Node`` takes; every method that may wait is a coroutine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._node = _SyncNode(*args, **kwargs)
        self._wakes = _Wakes()  # receipts and publishes waiting for room
        cond = self._node._engine.cond
        cond.wakers = (*cond.wakers, self._wakes.wake)
        self._readers: weakref.WeakSet[ReplayReader] = weakref.WeakSet()

    @classmethod
    def from_toml(cls, path: str | Path) -> Node:
        """A node from a TOML definition (see NodeConfig.from_toml)."""
        return cls(config=NodeConfig.from_toml(path))

    @property
    def sync(self) -> _SyncNode:
        """The underlying synchronous node."""
        return self._node

    @property
    def id(self) -> str:
        return self._node.id

    @property
    def name(self) -> str:
        return self._node.name

    @property
    def config(self) -> NodeConfig:
        return self._node.config

    @property
    def control_address(self) -> str:
        return self._node.control_address

    @property
    def metrics_address(self) -> str | None:
        return self._node.metrics_address

    async def start(self) -> Node:
        await asyncio.to_thread(self._node.start)
        return self

    async def close(self) -> None:
        """Close the readers, subscriptions and the node (every wait on it ends)."""
        readers = list(self._readers)

        def close() -> None:
            for reader in readers:
                reader._close()
            self._node.close()

        await asyncio.to_thread(close)

    async def __aenter__(self) -> Node:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def topic(self, name: str, config: TopicConfig | None = None, **options: Any) -> TopicConfig:
        """Like ``zmesh.Node.topic`` (it never waits)."""
        return self._node.topic(name, config, **options)

    async def publish(self, topic: str, payload: bytes | bytearray | memoryview | str, *,
                      key: str | None = None, headers: Mapping[str, Any] | None = None,
                      priority: int = 0, ttl: float | None = None,
                      deliver_at: Any = None, delay: float | None = None,
                      msg_id: str | None = None, timeout: float | None = None) -> Receipt:
        """Like ``zmesh.Node.publish``; a full outbox is waited for on the loop."""
        receipt = await _with_room(self._wakes, functools.partial(
            self._node.publish, topic, payload, key=key, headers=headers, priority=priority,
            ttl=ttl, deliver_at=deliver_at, delay=delay, msg_id=msg_id, timeout=0),
            timeout, self.config.publish_timeout_s)
        return Receipt(receipt, self._wakes)

    async def publish_many(self, topic: str,
                           payloads: Sequence[bytes | bytearray | memoryview | str], *,
                           keys: Sequence[str | None] | None = None,
                           headers: Mapping[str, Any] | None = None, priority: int = 0,
                           ttl: float | None = None, timeout: float | None = None) -> Receipt:
        """Like ``zmesh.Node.publish_many``; a full outbox is waited for on the loop."""
        receipt = await _with_room(self._wakes, functools.partial(
            self._node.publish_many, topic, payloads, keys=keys, headers=headers,
            priority=priority, ttl=ttl, timeout=0), timeout, self.config.publish_timeout_s)
        return Receipt(receipt, self._wakes)

    def transaction(self, timeout: float | None = None) -> Transaction:
        """``async with node.transaction() as tx:`` (see zmesh.Node.transaction)."""
        return Transaction(self._node.transaction(timeout), self)

    def subscribe(self, topic: str, group: str | None = None, *,
                  handler: Callable[[Message], Any] | None = None,
                  **options: Any) -> Subscription:
        """Like ``zmesh.Node.subscribe``; ``handler`` may be a coroutine function, run on
        this loop (call it from the loop then)."""
        if handler is not None and inspect.iscoroutinefunction(handler):
            handler = _on_loop(handler, asyncio.get_running_loop())
        return Subscription(self._node.subscribe(topic, group, handler=handler, **options))

    async def replay(self, topic: str, from_index: int = 0, **options: Any) -> ReplayReader:
        """Like ``zmesh.Node.replay``; iterate the reader with ``async for``."""
        reader = ReplayReader(await asyncio.to_thread(self._node.replay, topic, from_index,
                                                      **options))
        self._readers.add(reader)
        return reader

    async def status(self) -> dict:
        return await asyncio.to_thread(self._node.status)

    async def peers(self) -> list[dict]:
        return await asyncio.to_thread(self._node.peers)

    def stats(self) -> dict[str, int]:
        """Like ``zmesh.Node.stats`` (it never waits)."""
        return self._node.stats()

    async def snapshot(self, dest: str | Path) -> Path:
        return await asyncio.to_thread(self._node.snapshot, dest)

    async def dead_letters(self, topic: str, group: str, *, limit: int = 1000
                           ) -> list[DeadLetter]:
        return await asyncio.to_thread(self._node.dead_letters, topic, group, limit=limit)

    async def replay_dead_letters(self, topic: str, group: str,
                                  ids: Iterable[MessageId | int] | None = None) -> int:
        return await asyncio.to_thread(self._node.replay_dead_letters, topic, group, ids)

    async def purge_dead_letters(self, topic: str, group: str,
                                 ids: Iterable[MessageId | int] | None = None) -> int:
        return await asyncio.to_thread(self._node.purge_dead_letters, topic, group, ids)

    def __repr__(self) -> str:
        return f"<zmesh.aio.Node {self.name} mesh={self.config.mesh} id={self.id[:12]}>"
