"""What a subscription's handler is: a plain function, or (zmesh.aio) one that awaits."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["awaits"]


def awaits(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` returns an awaitable by its definition: a coroutine function, or an
    object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (the method's kind, not callability)
    )
