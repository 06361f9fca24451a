"""Publishes held back because the LMDB map is full (IO thread, except ``full``).

A publish the store has no room for is neither dropped nor failed: it stays here, in
order, and its commit is tried again once a commit deleted records (acks, expiry) or a
while has passed. Meanwhile ``full`` makes ``Engine.prepare`` block new publishes, which
give up with StoreFullError after their timeout, like a full outbox. A chunk that did not
fit is halved and tried again at once (room for a few messages lets a few through instead
of waiting for room for all of them); only when a single publish does not fit does the
retry wait for a deletion or RETRY_INTERVAL_S. Each chunk stored doubles the next one.
"""

from __future__ import annotations

from .outbox.publishes import AnyPublish, message_count, payload_bytes

RETRY_INTERVAL_S = 1.0  # also retry without a deletion seen: space may come from elsewhere


class Held:
    """The publishes a full map holds back, and when to try them again."""

    def __init__(self) -> None:
        self.pubs: list[AnyPublish] = []
        self.full = False  # read by application threads in prepare()
        self._chunk = 0  # how many to retry next; 0 means all
        self._retry_at = 0.0
        self._freed = False
        self._retrying = 0  # how many of the publishes being committed came from here

    @property
    def count(self) -> int:
        """Messages held (a ``PublishMany`` holds several)."""
        return message_count(self.pubs) if self.pubs else 0

    @property
    def bytes(self) -> int:
        """Payload bytes held (they still count as running ahead of the IO thread)."""
        return payload_bytes(self.pubs) if self.pubs else 0

    def admit(self, pubs: list[AnyPublish], tx: set[int], now: float) -> list[AnyPublish]:
        """The publishes to stage this iteration: the held ones due for a retry first.

        While a retry is not due, new publishes queue behind the held ones (order is
        kept); transaction publishes always try, since their caller waits for the result.
        """
        self._retrying = 0
        if not self.pubs:
            return pubs
        if not (self._freed or now >= self._retry_at):
            self.pubs.extend(p for p in pubs if id(p) not in tx)
            return [p for p in pubs if id(p) in tx]
        self._freed = False
        self.pubs.extend(p for p in pubs if id(p) not in tx)
        n = self._chunk or len(self.pubs)
        # Never split one stage (a publish_many batch): it resolves once, when stored.
        while n < len(self.pubs) and self.pubs[n].stage is self.pubs[n - 1].stage:
            n += 1
        due, self.pubs = self.pubs[:n], self.pubs[n:]
        self._retrying = n
        return due + [p for p in pubs if id(p) in tx]

    def hold(self, pubs: list[AnyPublish], now: float) -> bool:
        """The commit found the map full: keep ``pubs`` (in front: they are older).

        True when the map has just become full (it was not before).
        """
        began = not self.full
        tried = self._retrying or len(pubs)
        self.pubs[:0] = pubs
        self.full = True
        self._chunk = max(1, tried // 2)
        self._retrying = 0
        self._retry_at = now if tried > 1 else now + RETRY_INTERVAL_S
        return began

    def freed(self) -> None:
        """A commit deleted records: there may be room now."""
        if self.pubs:
            self._freed = True

    def stored(self) -> bool:
        """The publishes of a commit were stored; True when none is held any more."""
        if self._retrying and self.pubs:
            self._chunk = max(self._chunk, 1) * 2
            self._retry_at = 0.0  # the next chunk may fit too: try it at once
        self._retrying = 0
        if self.pubs or not self.full:
            return False
        self.full = False
        self._chunk = 0
        return True

    def next_retry(self) -> float | None:
        if not self.pubs:
            return None
        return 0.0 if self._freed else self._retry_at

    def take_all(self) -> list[AnyPublish]:
        out, self.pubs = self.pubs, []
        self.full = False
        return out
