"""The asyncio twin of zmesh: ``async with zmesh.aio.Node(...)``, ``async for msg in sub``.

The node itself still runs its IO thread; these wrappers only make waiting awaitable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from ._receipt import MessageId, Receipt
from ._waits import check_timeout
from .config import TopicConfig
from .errors import OutboxFullError
from .node import Node as _SyncNode
from .replay import ReplayReader as _SyncReplayReader
from .subscription import Message, _check_max_messages
from .subscription import Subscription as _SyncSubscription

__all__ = ["Node", "Receipt", "ReplayReader", "Subscription"]


class AsyncReceipt:
    """Awaitable view of a publish receipt."""

    def __init__(self, receipt: Receipt) -> None:
        self._receipt = receipt

    @property
    def id(self) -> MessageId:
        return self._receipt.id

    @property
    def stored(self) -> bool:
        return self._receipt.stored

    @property
    def acked(self) -> bool:
        return self._receipt.acked

    async def wait_stored(self, timeout: float | None = None) -> None:
        if not self._receipt.stored:
            await asyncio.to_thread(self._receipt.wait_stored, timeout)

    async def wait_acked(self, timeout: float | None = None) -> None:
        if not self._receipt.acked:
            await asyncio.to_thread(self._receipt.wait_acked, timeout)


class Subscription:
    """Async iteration over a subscription; messages are the same Message objects."""

    def __init__(self, sub: _SyncSubscription) -> None:
        self._sub = sub
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        sub._add_listener(self._wake)

    def _wake(self) -> None:
        self._loop.call_soon_threadsafe(self._event.set)

    @property
    def topic(self) -> str:
        return self._sub.topic

    @property
    def group(self) -> str | None:
        return self._sub.group

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message; None on timeout or once closed."""
        loop = asyncio.get_running_loop()
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            self._event.clear()
            msg = self._sub.get(timeout=0)
            if msg is not None or self._sub.closed:
                return msg
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except TimeoutError:
                return None

    async def fetch(self, max_messages: int = 100, timeout: float | None = None) -> list[Message]:
        _check_max_messages(max_messages)
        first = await self.get(timeout)
        if first is None:
            return []
        return [first, *self._sub.fetch(max_messages - 1, timeout=0)] if max_messages > 1 \
            else [first]

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            msg = await self.get()
            if msg is None:
                return
            yield msg

    async def close(self) -> None:
        await asyncio.to_thread(self._sub.close)


def _next_or_none(reader: _SyncReplayReader) -> Message | None:
    return next(reader, None)


class ReplayReader:
    """``async for msg in reader``: a replay reader whose waits do not block the loop."""

    def __init__(self, reader: _SyncReplayReader) -> None:
        self._reader = reader

    @property
    def gaps(self) -> int:
        return self._reader.gaps

    @property
    def gap_ranges(self) -> list[tuple[str, int, int, int]]:
        return self._reader.gap_ranges

    @property
    def closed(self) -> bool:
        return self._reader.closed

    def __aiter__(self) -> ReplayReader:
        return self

    async def __anext__(self) -> Message:
        msg = await asyncio.to_thread(_next_or_none, self._reader)
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def close(self) -> None:
        await asyncio.to_thread(self._reader.close)

    async def __aenter__(self) -> ReplayReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Node:
    """``async with zmesh.aio.Node("name", mesh=..., data_dir=...) as node:``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._node = _SyncNode(*args, **kwargs)

    @property
    def sync(self) -> _SyncNode:
        """The underlying synchronous node."""
        return self._node

    @property
    def id(self) -> str:
        return self._node.id

    @property
    def control_address(self) -> str:
        return self._node.control_address

    async def start(self) -> Node:
        await asyncio.to_thread(self._node.start)
        return self

    async def close(self) -> None:
        await asyncio.to_thread(self._node.close)

    async def __aenter__(self) -> Node:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def topic(self, name: str, config: TopicConfig | None = None, **options: Any) -> TopicConfig:
        """Like ``zmesh.Node.topic``."""
        return self._node.topic(name, config, **options)

    async def publish(self, topic: str, payload: bytes | str, **kwargs: Any) -> AsyncReceipt:
        """Publish without blocking the event loop, even when the outbox is full."""
        timeout = kwargs.pop("timeout", None)
        try:
            receipt = self._node.publish(topic, payload, timeout=0, **kwargs)
        except OutboxFullError:
            receipt = await asyncio.to_thread(self._node.publish, topic, payload,
                                              timeout=timeout, **kwargs)
        return AsyncReceipt(receipt)

    def subscribe(self, topic: str, group: str | None = None, *,
                  handler: Callable[[Message], Any] | None = None,
                  **kwargs: Any) -> Subscription:
        return Subscription(self._node.subscribe(topic, group, handler=handler, **kwargs))

    async def replay(self, topic: str, from_index: int = 0, **kwargs: Any) -> ReplayReader:
        """Like ``zmesh.Node.replay``; iterate the reader with ``async for``."""
        reader = await asyncio.to_thread(self._node.replay, topic, from_index, **kwargs)
        return ReplayReader(reader)

    async def status(self) -> dict:
        return await asyncio.to_thread(self._node.status)
