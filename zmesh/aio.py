"""The asyncio twin of zmesh: ``async with zmesh.aio.Node(...)``, ``async for msg in sub``.

The node still runs its IO thread; this module makes its waits awaitable without a thread
per await. The IO thread's notifications (a receipt stored or acked, room in the outbox, a
batch delivered, the node closed) each schedule one callback on the event loop
(``call_soon_threadsafe``: one write to the loop's self-pipe) while something awaits
them, and every pending await looks again. So an await holds no thread, cancelling it
leaves nothing behind, and a message is taken from a subscription only in the step that
returns it. Calls that end on their own within milliseconds (start, close, status, dead
letters, a transaction's commit, a snapshot) run on the loop's default executor; a start
or a replay cancelled meanwhile closes what it made. Publishes waiting for outbox room
queue, and are tried one at a time in their order. A replay reader fetches on a thread
of its own, from its first ``async for`` step until it (or its node) closes. As in the
sync API, every wait ends with NodeClosedError once the node closes (a subscription
closed on its own ends with None instead).

This module is long because it mirrors the whole public API, one awaitable per method,
each documented by the method it mirrors.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

from ._aioreplay import ReplayReader
from ._handlers import awaits, serving
from ._loopwaits import Wakes, forwarded, made_in_thread, with_room
from ._receipt import MessageId
from ._receipt import Receipt as _SyncReceipt
from ._requests import Ask, Delivery, Reply
from ._waits import check_timeout
from .config import NodeConfig, TopicConfig
from .deadletters import DeadLetter
from .errors import ArgumentError
from .node import Node as _SyncNode
from .node import PublishOptions
from .replay import ReplayReader as _SyncReplayReader
from .subscription import Message
from .subscription import Subscription as _SyncSubscription
from .transaction import Transaction as _SyncTransaction

__all__ = ["Node", "Receipt", "ReplayReader", "Subscription", "Transaction"]


class Receipt:
    """Awaitable view of a publish receipt (``zmesh.Receipt``)."""

    __slots__ = ("_receipt", "_wakes")

    def __init__(self, receipt: _SyncReceipt, wakes: Wakes) -> None:
        self._receipt = receipt
        self._wakes = wakes

    @property
    def sync(self) -> _SyncReceipt:
        """The underlying receipt."""
        return self._receipt

    id = forwarded("id")
    ids = forwarded("ids")
    count = forwarded("count")
    topic = forwarded("topic")
    stored = forwarded("stored")
    acked = forwarded("acked")
    outcomes = forwarded("outcomes")
    check_delivered = forwarded("check_delivered")

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

    async def wait_delivered(self, timeout: float | None = None) -> None:
        """Like ``zmesh.Receipt.wait_delivered``."""
        await self.wait_acked(timeout)
        self._receipt.check_delivered()

    async def _wait(self, acked: bool, left: float | None, timeout: float | None) -> None:
        receipt = self._receipt
        done = functools.partial(receipt._done, acked)  # (asks, changes nothing)
        if not await self._wakes.until(done, left, ready=done):
            raise receipt._late(acked, timeout)

    def __repr__(self) -> str:
        return f"<zmesh.aio.{repr(self._receipt)[1:]}"


class Subscription:
    """A subscription awaited on the loop; messages are the same ``zmesh.Message``
    objects, settled with the same (non-blocking) ``ack``, ``nack``, ``fail``.

    ``get`` returns None (and ``async for`` ends) once the subscription is closed; once
    its node closes they raise NodeClosedError, as the sync ones do."""

    def __init__(self, sub: _SyncSubscription) -> None:
        self._sub = sub
        self._wakes = Wakes()
        sub._add_listener(self._wakes.wake)

    @property
    def sync(self) -> _SyncSubscription:
        """The underlying subscription."""
        return self._sub

    topic = forwarded("topic")
    group = forwarded("group")
    mode = forwarded("mode")
    config = forwarded("config")
    lane = forwarded("lane")
    closed = forwarded("closed")
    delivered = forwarded("delivered")
    handled = forwarded("handled")
    handler_errors = forwarded("handler_errors")

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

    async def fetch(self, max_messages: int = 100, timeout: float | None = None) -> list[Message]:
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

    def ack_many(self, messages: Iterable[Message]) -> None:
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

    async def publish(
        self, topic: str, payload: bytes | str, *, timeout: float | None = None, **options: Any
    ) -> Receipt:
        """Like ``zmesh.Transaction.publish``; waits for outbox room on the loop."""
        node = self._node
        receipt = await with_room(
            node._wakes,
            functools.partial(self._tx.publish, topic, payload, timeout=0, **options),
            timeout,
            node.config.publish_timeout_s,
        )
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
        if self._tx._done:  # (committed or aborted inside the block)
            return
        if exc_type is None:
            await self.commit()
        else:
            self.abort()


def _on_loop(
    handler: Callable[[Message], Any], loop: asyncio.AbstractEventLoop
) -> Callable[[Message], Any]:
    """A handler as the sync handler threads call it: an awaitable it returns (a
    coroutine function's call, say) runs on ``loop``, the thread waiting for it (acked
    when it returns, nacked when it raises)."""

    def call(msg: Message) -> Any:
        result = handler(msg)
        if result is not None and inspect.isawaitable(result):
            served = _awaited(result, threading.current_thread())
            return asyncio.run_coroutine_threadsafe(served, loop).result()
        return result

    return call


async def _awaited(awaitable: Awaitable[Any], thread: threading.Thread) -> Any:
    serving.set(thread)  # (a close it makes does not wait for that thread: _handlers.py)
    return await awaitable


def _handler_on_loop(handler: Callable[[Message], Any]) -> Callable[[Message], Any]:
    """``handler`` for a subscription of this module's node, made where its loop runs."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # (called outside a coroutine: no loop to run an awaitable on)
        if awaits(handler):
            raise ArgumentError(
                "a coroutine handler runs on the event loop: subscribe from a coroutine"
            ) from None
        return handler
    return _on_loop(handler, loop)


class Node:
    """``async with zmesh.aio.Node("name", mesh=..., data_dir=...) as node:``, taking what
    ``zmesh.Node`` takes; every method that may wait is a coroutine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._node = _SyncNode(*args, **kwargs)
        self._wakes = Wakes()  # receipts and publishes waiting for room
        cond = self._node._queue.cond
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

    id = forwarded("id")
    name = forwarded("name")
    config = forwarded("config")
    control_address = forwarded("control_address")
    metrics_address = forwarded("metrics_address")
    http_address = forwarded("http_address")

    async def start(self) -> Node:
        # (handlers named in the config: what they return, if awaitable, runs on this loop)
        self._node._wrap_handler = functools.partial(_on_loop, loop=asyncio.get_running_loop())
        await made_in_thread(self._node.start, _SyncNode.close)  # (cancelled: closed again)
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

    async def publish(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        *,
        key: str | None = None,
        timeout: float | None = None,
        **options: Unpack[PublishOptions],
    ) -> Receipt:
        """Like ``zmesh.Node.publish``; a full outbox is waited for on the loop."""
        receipt = await with_room(
            self._wakes,
            functools.partial(self._node.publish, topic, payload, key=key, timeout=0, **options),
            timeout,
            self.config.publish_timeout_s,
        )
        return Receipt(receipt, self._wakes)

    async def publish_many(
        self,
        topic: str,
        payloads: Sequence[bytes | bytearray | memoryview | str],
        *,
        keys: Sequence[str | None] | None = None,
        headers: Mapping[str, Any] | None = None,
        priority: int = 0,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> Receipt:
        """Like ``zmesh.Node.publish_many``; a full outbox is waited for on the loop."""
        # (tried again after each refusal: an iterator would be used up by the first)
        if isinstance(payloads, Iterator):
            payloads = list(payloads)
        if isinstance(keys, Iterator):
            keys = list(keys)
        receipt = await with_room(
            self._wakes,
            functools.partial(
                self._node.publish_many,
                topic,
                payloads,
                keys=keys,
                headers=headers,
                priority=priority,
                ttl=ttl,
                timeout=0,
            ),
            timeout,
            self.config.publish_timeout_s,
        )
        return Receipt(receipt, self._wakes)

    def transaction(self, timeout: float | None = None) -> Transaction:
        """``async with node.transaction() as tx:`` (see zmesh.Node.transaction)."""
        return Transaction(self._node.transaction(timeout), self)

    def subscribe(
        self,
        topic: str,
        group: str | None = None,
        *,
        handler: Callable[[Message], Any] | None = None,
        **options: Any,
    ) -> Subscription:
        """Like ``zmesh.Node.subscribe``; ``handler`` may be a coroutine function, run on
        this loop (call it from the loop then)."""
        if handler is not None and callable(handler):
            handler = _handler_on_loop(handler)
        return Subscription(self._node.subscribe(topic, group, handler=handler, **options))

    async def request(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        *,
        timeout: float = 5.0,
        key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        delivery: Delivery = "at_most_once",
    ) -> Reply:
        """Like ``zmesh.Node.request``; the reply is awaited on the loop."""
        limit = self._node.config.max_message_bytes
        ask = Ask.of(topic, payload, key, headers, delivery, timeout, limit)
        return ask.reply(await self._ask(ask))

    async def request_many(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        *,
        count: int | None = None,
        timeout: float = 1.0,
        key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        delivery: Delivery = "at_most_once",
    ) -> list[Reply]:
        """Like ``zmesh.Node.request_many``; the replies are awaited on the loop."""
        limit = self._node.config.max_message_bytes
        return await self._ask(
            Ask.of(topic, payload, key, headers, delivery, timeout, limit, count)
        )

    async def _ask(self, ask: Ask) -> list[Reply]:
        node = self._node
        pending = await with_room(
            self._wakes,
            functools.partial(node._send_request, ask, 0),
            ask.room_s(self.config.publish_timeout_s),
            self.config.publish_timeout_s,
        )
        wakes = Wakes()
        pending.listeners.append(wakes.wake)
        try:
            await wakes.until(functools.partial(pending.done, ask.count), ask.left_s())
            return pending.outcome(ask.count)
        finally:
            pending.close()

    def serve(
        self,
        topic: str,
        group: str,
        fn: Callable[[Message], Any],
        **options: Any,
    ) -> Subscription:
        """Like ``zmesh.Node.serve``; ``fn`` may be a coroutine function, run on this loop
        (call it from the loop then)."""
        if callable(fn):
            fn = _handler_on_loop(fn)
        return Subscription(self._node.serve(topic, group, fn, **options))

    async def last(self, topic: str, *, timeout: float = 5.0) -> list[Message]:
        """Like ``zmesh.Node.last``."""
        return await asyncio.to_thread(self._node.last, topic, timeout=timeout)

    async def replay(self, topic: str, from_index: int = 0, **options: Any) -> ReplayReader:
        """Like ``zmesh.Node.replay``; iterate the reader with ``async for``."""
        reader = ReplayReader(
            await made_in_thread(
                functools.partial(self._node.replay, topic, from_index, **options),
                _SyncReplayReader.close,
            )
        )
        self._readers.add(reader)
        return reader

    async def status(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._node.status)

    async def peers(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._node.peers)

    def stats(self) -> dict[str, int]:
        """Like ``zmesh.Node.stats`` (it never waits)."""
        return self._node.stats()

    async def snapshot(self, dest: str | Path) -> Path:
        return await asyncio.to_thread(self._node.snapshot, dest)

    async def groups(self, topic: str | None = None) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._node.groups, topic)

    async def delete_group(self, topic: str, group: str) -> dict[str, int]:
        return await asyncio.to_thread(self._node.delete_group, topic, group)

    async def dead_letters(self, topic: str, group: str, *, limit: int = 1000) -> list[DeadLetter]:
        return await asyncio.to_thread(self._node.dead_letters, topic, group, limit=limit)

    async def replay_dead_letters(
        self, topic: str, group: str, ids: Iterable[MessageId | int] | None = None
    ) -> int:
        return await asyncio.to_thread(self._node.replay_dead_letters, topic, group, ids)

    async def purge_dead_letters(
        self, topic: str, group: str, ids: Iterable[MessageId | int] | None = None
    ) -> int:
        return await asyncio.to_thread(self._node.purge_dead_letters, topic, group, ids)

    def __repr__(self) -> str:
        return f"<zmesh.aio.Node {self.name} mesh={self.config.mesh} id={self.id[:12]}>"
