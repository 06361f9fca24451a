"""Which receipts wait for acks, and what the next notification tells them (IO thread).

Nothing is kept per publish: a receipt is tracked only once someone asks whether it is
acked (``Receipt.acked``, ``wait_acked``); those settled already resolve at once. The
engine's notification after each loop iteration tells the application which stages were
stored, which receipts were acked, and the floor below which every stored message is
settled (receipts of those need no question).

A replicated topic's stage is stored only once its replicas hold it too: ``add_stored``
keeps it ``gated`` until the replicas' acks release it (replica/streams.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING

from .lanes import Lanes

if TYPE_CHECKING:
    from ..._receipt import Receipt, Stage
    from .publishes import AnyPublish

_stage_of = attrgetter("stage")


class Receipts:
    """The receipts of one producer someone waits on, and what to tell them next."""

    def __init__(self) -> None:
        self._waiting: dict[int, Receipt] = {}  # seq -> receipt someone waits to see acked
        self._followers: dict[int, list[Receipt]] = {}  # receipts of suppressed duplicates
        self.stored: list[Stage] = []  # stored since the last notification
        self.acked: list[Receipt] = []
        self.settled_floor: float | None = None  # set by watch(), told by the next one
        # Replicated topics (TopicConfig.replicas > 1): topic -> replicas; and the stages
        # of theirs stored here that wait for their replicas: (stage, replicas, messages).
        self.replicated: dict[str, int] = {}
        self.gated: list[tuple[Stage, int, int]] = []

    def replicate(self, topic: str, replicas: int) -> None:
        """``topic``'s messages are stored once ``replicas`` nodes hold them."""
        if replicas > 1:
            self.replicated[topic] = replicas
        else:
            self.replicated.pop(topic, None)

    def add_stored(self, pubs: list[AnyPublish]) -> None:
        """``pubs`` are committed here: stored, or (replicated) gated until their replicas
        hold them too."""
        replicated = self.replicated
        if not replicated:
            self.stored.extend(map(_stage_of, pubs))  # (a batch's stage once per message)
            return
        for p in pubs:
            k = replicated.get(p.topic)
            if k is None:
                self.stored.append(p.stage)
            else:
                self.gated.append((p.stage, k, p.count))

    def watch(self, receipts: list[Receipt], lanes: Lanes) -> None:
        """Track receipts whose acks someone waits for; those settled already resolve now,
        and ``settled_floor`` tells the application the floor below which every stored
        message is settled (see ``Receipt.acked``).

        Runs after the loop's publishes joined their lanes; a receipt asks only once its
        message is stored, so its message is owed or settled, never unknown.
        """
        for receipt in receipts:
            first = receipt._seq
            for seq in range(first, first + receipt.count):
                if lanes.owed(receipt.topic, seq):
                    # (receipts of one message, by msg_id: another is acked with the first)
                    if self._waiting.setdefault(seq, receipt) is not receipt:
                        self._followers.setdefault(seq, []).append(receipt)
                elif seq not in self._waiting:
                    self.acked.append(receipt)
        self.settled_floor = lanes.floor()

    def follow(self, original: int, receipt: Receipt, owed: bool, lanes: tuple[str, ...]) -> None:
        """``receipt``'s publish was a duplicate of ``original`` (by msg_id): it follows
        it, acked when ``original`` is (now, if nobody owes it any more), with the
        outcomes of ``lanes``."""
        receipt._stage.lanes = lanes
        if owed:
            self._followers.setdefault(original, []).append(receipt)
            k = self.replicated.get(receipt.topic)
            if k is None:
                self.stored.append(receipt._stage)
            else:  # (stored when what is stored with it is: the replicas' next ack)
                self.gated.append((receipt._stage, k, 1))
        else:
            self.acked.append(receipt)

    def settled(self, unowed: Sequence[int]) -> None:
        """``unowed`` left the outbox: their receipts (and followers) are acked."""
        if self._waiting:
            pop = self._waiting.pop
            self.acked.extend(r for r in map(pop, unowed, repeat(None)) if r is not None)
        if self._followers:
            for seq in unowed:
                self.acked.extend(self._followers.pop(seq, ()))

    def told(self) -> None:
        """The notification told the application what was stored and acked."""
        self.stored.clear()
        self.acked.clear()
        self.settled_floor = None
