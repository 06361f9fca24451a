"""Publish receipts: what a producer can wait on after publish()."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from threading import TIMEOUT_MAX
from typing import NamedTuple

from ._waits import check_timeout
from .errors import TimeoutError, ZMeshError

__all__ = ["MessageId", "Receipt"]


class MessageId(NamedTuple):
    """(producer node id in hex, sequence): unique across the mesh."""

    producer: str
    seq: int

    def __str__(self) -> str:
        return f"{self.producer}:{self.seq}"


class Receipt:
    """Tracks one published message: stored in the outbox, then acked by every group."""

    __slots__ = ("_producer", "_seq", "count", "topic", "_cond", "_stored", "_acked",
                 "_unacked", "_error", "_watch", "_watched")

    def __init__(self, producer: str, seq: int, cond: threading.Condition, count: int = 1,
                 topic: str = "", watch: Callable[[Receipt], None] | None = None) -> None:
        self._producer = producer  # the id is made when asked for: most are never looked at
        self._seq = seq
        self.count = count
        self.topic = topic
        self._watch = watch
        self._watched = False
        self._cond = cond
        self._stored = False
        self._acked = False
        self._unacked = count
        self._error: ZMeshError | None = None

    @property
    def id(self) -> MessageId:
        """The id of the (first) message."""
        return MessageId(self._producer, self._seq)

    @property
    def ids(self) -> list[MessageId]:
        """Every message this receipt covers (one, or a publish_many batch in order)."""
        return [MessageId(self._producer, self._seq + i) for i in range(self.count)]

    @property
    def stored(self) -> bool:
        """True once the message is in the outbox (per the topic's durability)."""
        return self._stored

    @property
    def acked(self) -> bool:
        """True once every group owed the message has acked it (or it was settled).

        Acks are tracked from the first time this is asked (or ``wait_acked`` is called),
        so the first answer may lag by one loop of the node.
        """
        self._start_watch()
        return self._acked

    def _start_watch(self) -> None:
        if not self._watched and self._watch is not None:
            self._watched = True
            self._watch(self)

    def _wait(self, attr: str, timeout: float | None, what: str) -> None:
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not getattr(self, attr):
                if self._error is not None:
                    raise self._error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"message {self.id} not {what} within {timeout:g}s")
                self._cond.wait(None if remaining is None else min(remaining, TIMEOUT_MAX))
        if self._error is not None and attr == "_stored":
            raise self._error

    def wait_stored(self, timeout: float | None = None) -> None:
        """Block until the message is in the outbox; raise TimeoutError or the store's error."""
        self._wait("_stored", timeout, "stored")

    def wait_acked(self, timeout: float | None = None) -> None:
        """Block until every group owed the message (each message of a batch) settled it."""
        self._start_watch()
        self._wait("_acked", timeout, "acknowledged")

    def __repr__(self) -> str:
        state = "acked" if self._acked else "stored" if self._stored else "staged"
        more = f" (+{self.count - 1})" if self.count > 1 else ""
        return f"<Receipt {self.id}{more} {state}>"
