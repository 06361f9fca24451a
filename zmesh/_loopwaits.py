"""Waiting on an event loop for what a node's threads notify, with no thread per await
(zmesh.aio's waits): the IO thread's notifications, or a subscription's deliveries, each
schedule one callback on the loop while something awaits them."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
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
    await asks its condition again after every notification (those with a ``ready``
    question once it says yes), with no thread of its own."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # Each pending await's future, with what ``_fire`` asks before it wakes it.
        self._waiting: dict[asyncio.Future[None], Callable[[], bool] | None] = {}
        self._scheduled = False  # a callback is on its way to the loop
        # Publishes waiting for outbox room, in order (with_room): each a future that
        # the one before it resolves as it leaves, when it is this one's turn.
        self.line: deque[asyncio.Future[None]] = deque()

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
        for fut, ready in self._waiting.items():
            if ready is None or _says_yes(ready):
                _resolve(fut)

    async def until(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        ready: Callable[[], bool] | None = None,
    ) -> bool:
        """Await ``done()`` (asked on the loop, after each notification): True once it is,
        False when ``timeout`` seconds (None: no end) pass first. ``ready``, a question
        with no side effect, is asked first on each notification (by ``_fire``): the
        await is resumed only when it says yes (or raises). Receipts' waits, thousands
        at once, each woken for every notification would cost the loop a step each."""
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
            self._waiting[fut] = ready
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
                del self._waiting[fut]


def _says_yes(ready: Callable[[], bool]) -> bool:
    try:
        return ready()
    except Exception:  # (its await asks ``done``, which raises it)
        return True


async def made_in_thread(make: Callable[[], T], close: Callable[[T], object]) -> T:
    """``make()`` on a thread (as ``asyncio.to_thread`` runs it). Cancelled while it
    runs, what it goes on to make is closed (``close``, on a thread too) before the
    cancellation goes on: its caller never gets it to close (a cancelled ``async with``
    calls no ``__aexit__``)."""
    made = asyncio.ensure_future(asyncio.to_thread(make))
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:
        closing = asyncio.ensure_future(_closed(made, close))
        while not closing.done():  # (cancelled again meanwhile: it is cancelled already)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([closing])
        closing.result()
        raise


async def _closed(made: asyncio.Future[T], close: Callable[[T], object]) -> None:
    try:
        thing = await made
    except Exception:  # (nothing made: what failed closed what it had made)
        return
    await asyncio.to_thread(close, thing)


async def with_room(
    wakes: Wakes, publish: Callable[[], T], timeout: float | None, default_s: float
) -> T:
    """``publish()`` (which waits for nothing: made with timeout=0) once the outbox has
    room for it, up to ``timeout`` (None: ``default_s``, the node's publish_timeout_s);
    then the last refusal, with the wait. Publishes that find others waiting for room
    queue behind them (``Wakes.line``) and are tried in turn, the first after each
    notification: all of them tried after each would cost the loop a refusal per
    waiter per notification, and let them in in any order."""
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
    line = wakes.line
    if not line and attempt():  # (nobody waits for room: the usual publish)
        return done[0]
    loop = asyncio.get_running_loop()
    if line and line[0].get_loop() is not loop:
        raise ZMeshError("a zmesh.aio object is awaited from two event loops at once")
    deadline = None if wait is None else loop.time() + wait
    turn: asyncio.Future[None] = loop.create_future()  # (resolved by the one before it)
    line.append(turn)
    try:
        if line[0] is not turn:
            await asyncio.wait([turn], timeout=None if deadline is None else deadline - loop.time())
        if line[0] is turn:
            left = None if deadline is None else deadline - loop.time()
            if await wakes.until(attempt, left):
                return done[0]
        elif attempt():  # (out of time in the line: a last try, to say why if refused)
            return done[0]
    finally:
        first = line[0] is turn
        line.remove(turn)
        if first and line:
            _resolve(line[0])  # the next one's turn
    exc = full[0]
    waited = float("inf") if wait is None else wait
    if isinstance(exc, StoreFullError):
        raise StoreFullError(
            exc.path or "", exc.map_size_bytes, waited, disk=exc.disk, free_bytes=exc.free_bytes
        ) from None
    raise OutboxFullError(exc.depth, exc.limit, waited) from None
