"""Dead letters: messages a group failed, or that ran out of attempts, parked at the
producer until an operator replays or purges them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._receipt import MessageId

__all__ = ["DeadLetter"]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A parked message of one group, with why and how often it failed.

    ``history`` lists ``(failed_at, attempts, reason)`` for every time it was parked.
    """

    id: MessageId
    topic: str
    group: str
    lane: str
    key: str | None
    payload: bytes
    headers: dict[str, Any]
    reason: str
    attempts: int
    failed_at: float
    history: tuple[tuple[float, int, str], ...]
