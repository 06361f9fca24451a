"""The consumer half of a node: incoming batches, dedupe, and settlements going back.

Runs only on the IO thread. A redelivered message that this node already acked is acked
again without reaching a handler (the ``acked`` window in LMDB); one still held by a local
subscription is dropped. An ack is written to ``acked`` in the loop's transaction and sent
to the producer only after that commit.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING

from .._protocol.codec import MAX_REASON_CHARS
from .._protocol.frames import Ack, Batch, Fail, Nack
from .._store.store import Store, WriteBatch
from ..subscription import Message, Origin
from .stats import Counters

if TYPE_CHECKING:
    from ..subscription import Subscription
    from .engine import Engine

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 1.0
_source_of, _seq_of = attrgetter("_origin.source"), attrgetter("_seq")
_NONE_SEEN: frozenset[int] = frozenset()


class Consumer:
    """Local subscriptions and the dedupe window."""

    def __init__(self, engine: Engine, store: Store, counters: Counters) -> None:
        self.engine = engine
        self.store = store
        self.counters = counters
        self.subs: dict[tuple[str, str], list[Subscription]] = {}
        self._rr: dict[tuple[str, str], int] = defaultdict(int)
        # Sequences held by local subscriptions, per (producer, topic, lane).
        self._held: dict[tuple[bytes, str, str], set[int]] = {}
        self._floors: dict[tuple[bytes, str], int] = {}
        self._pruned: dict[tuple[bytes, str], tuple[int, float]] = {}
        # Acked in this loop iteration, per (producer, topic, lane); the same lists are in
        # the write batch (its ``seen_put``) and go to the producers after its commit.
        self._acks: dict[tuple[bytes, str, str], list[int]] = {}
        # The highest sequence this node acked per (producer, lane): every dedupe key in
        # the store is at or below it, so a message above it needs no lookup.
        self._tops = store.seen_tops()
        self._nacks: list[Nack] = []
        self._fails: list[Fail] = []
        self._outgoing: list[tuple[bytes, Ack | Nack | Fail]] = []

    # -- subscriptions --------------------------------------------------------------------

    def add(self, sub: Subscription) -> None:
        self.subs.setdefault((sub.topic, sub.lane), []).append(sub)

    def remove(self, sub: Subscription, left: list[Message]) -> None:
        key = (sub.topic, sub.lane)
        subs = self.subs.get(key, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self.subs.pop(key, None)
        for msg in left:
            msg._settled = "released"
            self.settle(msg, "nacked", 0.0)

    # -- incoming -------------------------------------------------------------------------

    def on_batch(self, batch: Batch, wb: WriteBatch, now: float) -> None:
        producer, topic, lane = batch.node_id, batch.topic, batch.lane
        subs = self.subs.get((topic, lane))
        seqs = batch.seqs
        if not subs:
            # Our hello without this lane is on its way; give the messages back.
            self.counters.add("released_no_subscription", len(seqs))
            self._outgoing.append((producer, Nack(self.engine.node_id, topic, lane, seqs,
                                                  0.0)))
            return
        self._note_floor(producer, lane, batch.floor, wb, now)
        top = self._tops.get((producer, lane), -1)
        seen: AbstractSet[int] = _NONE_SEEN  # (new messages are above it: no lookup)
        if seqs and (seqs[0] if type(seqs) is range else min(seqs)) <= top:
            seen = self.store.seen_filter(producer, lane.encode(), [s for s in seqs if s <= top])
        source = (producer, topic, lane)
        held = self._held.get(source)
        if held is None:
            held = self._held[source] = set()
        fresh: list[Message] = []
        reack: list[int] = []
        origin = Origin(self.engine, source, subs[0].group, batch.headers, batch.attempts,
                        batch.partitions, batch.published_ats, batch.indexes)
        duplicates = 0
        if not seen and held.isdisjoint(seqs):  # all new (the common case): no test each
            held.update(seqs)
            fresh = list(map(Message, repeat(origin, len(seqs)), range(len(seqs)), seqs,
                             batch.keys, batch.payloads))
        else:
            for i, (seq, key, payload) in enumerate(zip(seqs, batch.keys, batch.payloads,
                                                        strict=True)):
                if seq in seen:
                    reack.append(seq)
                    continue
                if seq in held:
                    duplicates += 1
                    continue
                held.add(seq)
                fresh.append(Message(origin, i, seq, key, payload))
        if duplicates:
            self.counters.add("duplicates_held", duplicates)
        if reack:
            self.counters.add("duplicates_dropped", len(reack))
            self._outgoing.append((producer, Ack(self.engine.node_id, topic, lane,
                                                 tuple(reack))))
        if fresh:
            self.counters.add("received", len(fresh))
            if len(subs) == 1:
                subs[0]._deliver(fresh)
            else:
                i = self._rr[(topic, lane)] = (self._rr[(topic, lane)] + 1) % len(subs)
                subs[i]._deliver(fresh)

    def release(self, batch: Batch) -> None:
        """Give a batch back to its producer without delivering it."""
        self._outgoing.append((batch.node_id, Nack(self.engine.node_id, batch.topic,
                                                   batch.lane, batch.seqs, 0.0)))

    def _note_floor(self, producer: bytes, lane: str, floor: int, wb: WriteBatch,
                    now: float) -> None:
        key = (producer, lane)
        last = self._pruned.get(key)
        if last is None or (floor > last[0] and now - last[1] >= PRUNE_INTERVAL_S):
            if floor > 0:
                wb.seen_prune.append((producer, floor, lane.encode()))
            self._pruned[key] = (floor, now)

    # -- settling -------------------------------------------------------------------------

    def acked(self, msgs: list[Message], wb: WriteBatch) -> None:
        """Messages acked by the application: written to the dedupe window in ``wb``, sent
        to their producers after its commit."""
        if not msgs:
            return
        sources = list(map(_source_of, msgs))
        seqs = list(map(_seq_of, msgs))
        if sources.count(sources[0]) == len(sources):  # from one source (mostly): at once
            self.acked_seqs(sources[0], seqs, wb)
            return
        by_source: dict[tuple[bytes, str, str], list[int]] = {}
        for source, seq in zip(sources, seqs, strict=True):
            by_source.setdefault(source, []).append(seq)
        for source, part in by_source.items():
            self.acked_seqs(source, part, wb)

    def acked_seqs(self, source: tuple[bytes, str, str], seqs: list[int],
                   wb: WriteBatch) -> None:
        """``acked`` for sequences of one source (a batch's acks, ``Origin.take_acks``)."""
        if not seqs:
            return
        held = self._held.get(source)
        if held is not None:
            held.difference_update(seqs)
        acks = self._acks.get(source)
        if acks is None:
            acks = self._acks[source] = []
            wb.seen_put.append((source[0], source[2].encode(), acks))
        acks.extend(seqs)

    def settle(self, msg: Message, how: str, arg: object) -> None:
        """A message nacked or failed: sent to its producer after the loop's commit."""
        source, seq = msg._origin.source, msg._seq
        producer, _topic, lane = source
        held = self._held.get(source)
        if held is not None:
            held.discard(seq)
        if how == "nacked":
            delay = -1.0 if arg is None else float(arg)  # type: ignore[arg-type]
            self._outgoing.append((producer, Nack(self.engine.node_id, msg.topic, lane,
                                                  (seq,), delay)))
        elif how == "failed":
            reason = str(arg)
            if len(reason) > MAX_REASON_CHARS:  # (what a FAIL carries: the start of it)
                reason = reason[:MAX_REASON_CHARS - 1] + "…"
            self._outgoing.append((producer, Fail(self.engine.node_id, msg.topic, lane, seq,
                                                  reason)))

    def rollback(self) -> None:
        """The commit holding the staged acks failed: forget them, and the messages too, so
        a redelivery reaches the application again."""
        for source, seqs in self._acks.items():
            self._held.get(source, set()).difference_update(seqs)
        self.counters.add("acks_rolled_back", sum(len(v) for v in self._acks.values()))
        self._acks.clear()

    def flush(self, send: Callable[[bytes, Ack | Nack | Fail], None]) -> None:
        """After commit: send acks (grouped per producer and lane), nacks and fails."""
        me = self.engine.node_id
        self.counters.add("acked_local", sum(map(len, self._acks.values())))
        tops = self._tops
        for (producer, topic, lane), seqs in self._acks.items():
            top = max(seqs)
            if top > tops.get((producer, lane), -1):
                tops[(producer, lane)] = top
            for i in range(0, len(seqs), 5000):
                send(producer, Ack(me, topic, lane, seqs[i:i + 5000]))
        self._acks.clear()
        out, self._outgoing = self._outgoing, []
        for producer, msg in out:
            send(producer, msg)
