"""What a subscription's handler is: a plain function, or (zmesh.aio) one that awaits."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

__all__ = ["awaits", "serving"]

# The handler thread a coroutine serves (zmesh.aio runs an awaitable handler's coroutine
# on the event loop while its handler thread waits for it), set in that coroutine's
# context and so in the threads it hands work to (asyncio.to_thread): a close() made there
# does not wait for the thread that waits for it.
serving: ContextVar[threading.Thread | None] = ContextVar("zmesh_serving", default=None)


def awaits(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` returns an awaitable by its definition: a coroutine function, or an
    object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (the method's kind, not callability)
    )
