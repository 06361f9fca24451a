"""Waiting on an event loop for what a node's threads notify, with no thread per await
(zmesh.aio's waits): the IO thread's notifications, or a subscription's deliveries, each
schedule one callback on the loop while something awaits them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from ._waits import check_timeout
from .errors import OutboxFullError, StoreFullError, ZMeshError

T = TypeVar("T")


def forwarded(name: str) -> Any:
    """A read-only attribute that is the wrapped sync object's (``self.sync``) own."""
    return property(lambda self: getattr(self.sync, name), doc=f"The sync object's ``{name}``.")


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Wakes:
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


async def with_room(
    wakes: Wakes, publish: Callable[[], T], timeout: float | None, default_s: float
) -> T:
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
        raise StoreFullError(
            exc.path or "", exc.map_size_bytes, waited, disk=exc.disk, free_bytes=exc.free_bytes
        ) from None
    raise OutboxFullError(exc.depth, exc.limit, waited) from None
