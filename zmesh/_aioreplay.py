"""zmesh.aio's replay reader: fetching on a thread of its own, awaited on the loop."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from ._loopwaits import Wakes, forwarded
from .config import check_max_messages
from .replay import ReplayReader as _SyncReplayReader
from .subscription import Message

__all__ = ["ReplayReader"]

REPLAY_BATCH = 500  # messages a replay reader's thread fetches per step


class ReplayReader:
    """``async for msg in reader``: a replay reader (``zmesh.ReplayReader``) whose
    fetching runs on a thread of its own, started by the first step and ended by
    ``close()`` or the node's; cancelling a step loses no message (the next one gets
    it)."""

    def __init__(self, reader: _SyncReplayReader) -> None:
        self._reader = reader
        self._wakes = Wakes()
        self._buffer: deque[Message] = deque()
        self._want = threading.Event()  # the loop asks the thread for more
        self._ended = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def sync(self) -> _SyncReplayReader:
        """The underlying reader."""
        return self._reader

    topic = forwarded("topic")
    from_index = forwarded("from_index")
    follow = forwarded("follow")
    gaps = forwarded("gaps")
    gap_ranges = forwarded("gap_ranges")
    unreachable = forwarded("unreachable")
    closed = forwarded("closed")

    def _fetch(self) -> None:
        """The reader's thread: a batch each time the loop asks, until the end. It hands
        them over through the buffer and ``Wakes``, which wakes whichever loop awaits the
        reader then (one ``asyncio.run`` after another, each its own)."""
        reader, want = self._reader, self._want
        try:
            while not reader.closed or want.is_set():  # (closed by its node: nobody asks)
                if not want.wait(1.0):
                    continue
                want.clear()
                msgs = reader.read(REPLAY_BATCH)
                if not msgs:
                    break
                self._buffer.extend(msgs)
                self._wakes.wake()
        except BaseException as exc:
            self._error = exc
        self._ended = True
        self._wakes.wake()

    def _ready(self) -> bool:
        if self._buffer or self._ended:
            return True
        self._want.set()
        return False

    async def __anext__(self) -> Message:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._fetch,
                daemon=True,
                name=f"zmesh-aio-replay-{self._reader.topic}",
            )
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
        """Up to ``max_messages`` (an int >= 1) messages (fewer at the end of a reader
        that does not follow; a following reader waits for at least one)."""
        check_max_messages(max_messages)
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
