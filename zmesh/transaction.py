"""Transactions: publishes and acks committed together, or not at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ._engine.inbox.origin import settled_error
from ._receipt import Receipt
from .errors import ArgumentError, NodeStateError
from .subscription import Message

if TYPE_CHECKING:
    from ._engine.outbox.publishes import AnyPublish, Publish
    from ._engine.submit import Submitter

# How a node prepares publishes (checked, with sequences): ``Node._prepare``.
Prepare = Callable[..., list["AnyPublish"]]

__all__ = ["Transaction"]


class Transaction:
    """Collects publishes and acks; ``commit`` (or leaving the ``with`` block) stores the
    publishes and settles the acks in one LMDB transaction.

    Leaving the block with an exception, or calling ``abort``, discards everything: the
    messages to ack stay unsettled (nack them or let them be redelivered). A block that
    called ``commit`` or ``abort`` itself ends with nothing more done.
    """

    def __init__(self, prepare: Prepare, queue: Submitter, timeout_s: float) -> None:
        self._prepare = prepare
        self._queue = queue
        self._timeout_s = timeout_s
        self._pubs: list[Publish] = []
        self._acks: list[Message] = []
        self._unsettling: list[Message] = []  # acked, but nothing settles them
        self._done = False

    def publish(self, topic: str, payload: bytes | str, **kwargs: Any) -> Receipt:
        """Like Node.publish, but stored only when the transaction commits."""
        self._check_open()
        key = kwargs.pop("key", None)
        try:
            [pub] = self._prepare(topic, [payload], [key], paced=False, **kwargs)
        except TypeError as exc:
            raise ArgumentError(f"bad publish arguments: {exc}") from exc
        self._pubs.append(cast("Publish", pub))  # (one payload: never a PublishMany)
        assert pub.receipt is not None
        return pub.receipt

    def ack(self, msg: Message) -> None:
        """Ack ``msg`` when the transaction commits. Until it commits or aborts, the
        message cannot be settled otherwise (MessageStateError); if its subscription
        closes first, it is released and the commit fails. A message nothing settles (an
        ephemeral subscription's, a replay reader's) is marked acked at the commit, as
        ``msg.ack()`` marks it."""
        self._check_open()
        queue = msg._origin.queue
        if queue is not None and queue is not self._queue:
            raise ArgumentError(f"message {msg.id} was not received by this node")
        if msg._settled is not None:
            raise settled_error(msg.id, msg._settled)
        msg._settled = "transacted"
        (self._acks if queue is not None else self._unsettling).append(msg)

    def _check_open(self) -> None:
        if self._done:
            raise NodeStateError("this transaction has already committed or aborted")

    def commit(self) -> None:
        """Store and settle everything at once; raises (and nothing happened) on failure."""
        self._check_open()
        self._done = True
        if self._pubs or self._acks:
            try:
                self._queue.transact(self._pubs, self._acks, self._timeout_s)
            except BaseException:
                self._give_back()
                raise
        for msg in self._unsettling:
            msg._settled = "acked"

    def abort(self) -> None:
        """Discard the publishes; leave the messages unsettled."""
        if self._done:
            return
        self._done = True
        queue = self._queue
        queue.abandon(len(self._pubs), sum(len(p.payload) for p in self._pubs))
        with queue.cond:  # (their receipts' waits end with it)
            self._fail_receipts()
            queue.cond.notify_all()
        self._pubs.clear()
        self._give_back()

    def _give_back(self) -> None:
        """Its messages, not acked by it, unsettled again (but those released meanwhile)."""
        for msg in (*self._acks, *self._unsettling):
            if msg._settled in ("transacted", "acked"):  # (acked: a commit rolled back)
                msg._settled = None
        self._acks.clear()
        self._unsettling.clear()

    def _fail_receipts(self) -> None:
        error = NodeStateError("the transaction was aborted: its publishes were not stored")
        for pub in self._pubs:
            pub.stage.error = error

    def __del__(self) -> None:
        # Dropped without commit or abort (used without ``with``): its publishes hold
        # outbox room until given back. This runs wherever the last reference goes, maybe
        # inside a lock of the node's own, so it only queues that for the IO thread.
        if self._done:
            return
        self._give_back()
        if self._pubs:
            self._fail_receipts()
            self._queue.abandon_dropped(len(self._pubs), sum(len(p.payload) for p in self._pubs))

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self._done:  # (committed or aborted inside the block: nothing is left to do)
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()
