"""The consumer half of a node: incoming batches, dedupe, and settlements going back.

Runs only on the IO thread. A redelivered message that this node already acked is acked
again without reaching a handler (the ``acked`` window in LMDB); one still held by a local
subscription is dropped (the origins of the batches it holds say which). An ack is
written to ``acked`` in the loop's transaction and sent to the producer only after that
commit. A subscription to a pattern takes the batches of every topic it matches, of its
lane (found once per topic and lane, then cached).

Acks a full store cannot take the dedupe bits of, even in pieces, are sent all the same,
their bits kept in memory until it can (``unwritten``; _store/unwritten.py says why); a
failed transaction's acks are rolled back with it. This module is long because what
dedupes a batch (the window, the copies held, the acks not committed yet) is one state
that every batch and every settlement reads or changes.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..._protocol.codec import MAX_REASON_CHARS
from ..._protocol.frames import Ack, Batch, Fail, Nack, Touch
from ..._seqs import span
from ..._store.store import Store, WriteBatch
from ..._store.unwritten import UnwrittenAcks
from ..._subjects import SubjectTrie, is_pattern
from ...subscription import Message
from ..limits import RECEIVERS_KEPT
from ..stats import Counters
from .heard import ProducersHeard
from .origin import ACKED, RELEASED, TRANSACTED, Origin, Queue

if TYPE_CHECKING:
    from ...subscription import Subscription

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 1.0
_origin_of, _place_of = attrgetter("_origin"), attrgetter("_i")
_NONE: frozenset[int] = frozenset()
_NOTHING_HELD: dict[Origin, None] = {}  # (read only: a source holding none)


class Consumer:
    """Local subscriptions and the dedupe window."""

    def __init__(self, node_id: bytes, queue: Queue, store: Store, counters: Counters) -> None:
        self.node_id = node_id
        self.queue = queue  # (where the settlements of the messages it delivers go)
        self.store = store
        self.counters = counters
        # Subscriptions by (topic or pattern, lane), and by pattern per lane; what a
        # batch of (topic, lane) goes to, found once (until subscriptions change).
        self.subs: dict[tuple[str, str], list[Subscription]] = {}
        self._patterns: dict[str, SubjectTrie[Subscription]] = {}
        self._receivers: dict[tuple[str, str], list[Subscription]] = {}
        self._rr: dict[tuple[str, str], int] = defaultdict(int)
        # The origins of batches local subscriptions hold messages of, per (producer,
        # topic, lane): those with a message the IO thread has not seen settled (a source
        # holding none has no entry: topics and producers come and go).
        self._holding: dict[tuple[bytes, str, str], dict[Origin, None]] = {}
        self._pruned: dict[tuple[bytes, str], tuple[int, float]] = {}
        # Acked in this loop iteration, per (producer, topic, lane), as taken (mostly a
        # range per batch); each is in the write batch too (its ``seen_put``), and goes to
        # the producer after its commit.
        self._acks: dict[tuple[bytes, str, str], list[Sequence[int]]] = {}
        self._tx_acks: list[Sequence[int]] = []  # (those of a transaction, in both)
        self.unwritten = UnwrittenAcks()  # acks sent that a full store has no bits of
        # The highest sequence this node acked per (producer, lane): every dedupe key in
        # the store is at or below it, so a message above it needs no lookup.
        window = store.window_state()
        self._tops = window.tops
        self.producers = ProducersHeard(window.heard, (p for p, _lane in self._tops))
        self._nacks: list[Nack] = []
        self._fails: list[Fail] = []
        self._outgoing: list[tuple[bytes, Ack | Nack | Fail | Touch]] = []
        self._touches: dict[tuple[bytes, str, str], list[int]] = {}

    # -- subscriptions --------------------------------------------------------------------

    def add(self, sub: Subscription) -> None:
        self.subs.setdefault((sub.topic, sub.lane), []).append(sub)
        if is_pattern(sub.topic):
            self._patterns.setdefault(sub.lane, SubjectTrie()).add(sub.topic, sub)
        self._receivers.clear()

    def remove(self, sub: Subscription) -> None:
        """``sub`` closed: what it was delivered and the application did not settle
        (queued, or taken) goes back to its producers at once, for other members."""
        key = (sub.topic, sub.lane)
        subs = self.subs.get(key, [])
        if sub in subs:
            subs.remove(sub)
            trie = self._patterns.get(sub.lane)
            if trie is not None and trie.remove(sub.topic, sub) and not len(trie):
                del self._patterns[sub.lane]
            self._receivers.clear()
        if not subs:
            self.subs.pop(key, None)
        released = 0
        for source, holding in list(self._holding.items()):
            for origin in [o for o in holding if o.sub is sub]:
                places = origin.unsettled()
                for i in places:
                    origin.state[i] = RELEASED
                seqs = _pick(origin.seqs, places)
                origin.settled_apart(seqs)
                if origin.left <= 0:
                    self._unhold(source, origin)
                if seqs:
                    released += len(seqs)
                    self._outgoing.append(
                        (source[0], Nack(self.node_id, source[1], source[2], tuple(seqs), 0.0))
                    )
        if released:
            self.counters.add("released_on_close", released)

    def touch(self, msg: Message) -> None:
        """The application still works on ``msg``: its producer restarts its ack deadline
        (sent after the loop's commit, with the others of its lane)."""
        origin = msg._origin
        seq = origin.seqs[msg._i]
        touches = self._touches.get(origin.source)
        if touches is None:
            self._touches[origin.source] = [seq]
        else:
            touches.append(seq)

    # -- incoming -------------------------------------------------------------------------

    def receivers(self, topic: str, lane: str) -> list[Subscription]:
        """The subscriptions a batch of ``topic`` in ``lane`` goes to: those of the topic
        itself and those of the patterns that match it."""
        subs = self._receivers.get((topic, lane))
        if subs is None:
            if is_pattern(topic):  # (no producer sends one: not a topic)
                return []
            subs = list(self.subs.get((topic, lane), ()))
            trie = self._patterns.get(lane)
            if trie is not None:
                subs.extend(trie.match(topic))
            if subs:  # (none: not kept, whatever topics strangers send)
                if len(self._receivers) >= RECEIVERS_KEPT:  # (topics come and go)
                    self._receivers.clear()
                    self._rr.clear()
                self._receivers[(topic, lane)] = subs
        return subs

    def on_batch(self, batch: Batch, wb: WriteBatch, now: float) -> None:
        producer, topic, lane = batch.node_id, batch.topic, batch.lane
        subs = self.receivers(topic, lane)
        seqs = batch.seqs
        if not seqs:
            return
        if not subs:
            # Our hello without this lane is on its way; give the messages back.
            self.counters.add("released_no_subscription", len(seqs))
            self._outgoing.append((producer, Nack(self.node_id, topic, lane, seqs, 0.0)))
            return
        if subs[0].mode == "ephemeral":  # at most once: nothing to dedupe, hold or ack
            self.counters.add("received_ephemeral", len(seqs))
            delivered = subs[0]._deliver(
                Origin(
                    None,
                    (producer, topic, lane),
                    None,
                    seqs,
                    batch.headers,
                    batch.attempts,
                    batch.partitions,
                    batch.published_ats,
                    batch.indexes,
                ),
                batch.keys,
                batch.payloads,
            )
            if not delivered:  # (its queue is full: the application does not keep up)
                self.counters.add("ephemeral_dropped", len(seqs))
            return
        self._note_floor(producer, lane, batch.floor, wb, now)
        self.producers.heard(producer)
        first, last = span(seqs)
        top = self._tops.get((producer, lane), -1)
        seen: AbstractSet[int] = _NONE  # (new messages are above it: no lookup)
        if first <= top:
            seen = self.store.seen_filter(producer, lane.encode(), [s for s in seqs if s <= top])
        source = (producer, topic, lane)
        acked_now = self._acks.get(source)  # (acked in this iteration: not in the store yet)
        if acked_now:
            seen = _with_acked(seen, acked_now, first, last)
        if self.unwritten.count and first <= top:
            seen = self.unwritten.seen(producer, lane, seqs, top) | seen
        holding = self._holding.get(source, _NOTHING_HELD)
        # What local subscriptions hold of this lane: sequence -> (origin, place).
        held: dict[int, tuple[Origin, int]] = {}
        for o in holding:
            if o.lo <= last and o.hi >= first:
                held.update((seq, (o, i)) for seq, i in o.held().items())
        group = subs[0].group
        origin = None
        keys: Sequence[str | None] = batch.keys
        payloads: Sequence[bytes] = batch.payloads
        reack: list[int] = []
        duplicates = leased = 0
        # All new (the common case): no test each (``isdisjoint`` walks ``seqs`` whole).
        if not seen and (not held or held.keys().isdisjoint(seqs)):
            origin = Origin(
                self.queue,
                source,
                group,
                seqs,
                batch.headers,
                batch.attempts,
                batch.partitions,
                batch.published_ats,
                batch.indexes,
            )
        else:
            attempts = batch.attempts
            places: list[int] = []
            chosen: set[int] = set()  # (a sequence twice in one batch is delivered once)
            for i, seq in enumerate(seqs):
                if seq in seen:
                    reack.append(seq)
                    continue
                copy = held.get(seq)
                if seq in chosen:
                    duplicates += 1
                    continue
                if copy is not None:
                    o, place = copy
                    # Sent again with a higher attempt: its lease ran out at the producer
                    # while the application had it unsettled (a handler still at work
                    # calls in_progress). Delivered again; the first copy's ack still
                    # counts. A copy still queued, or one sent again after a reconnect
                    # (the same attempt), is dropped: the application will see the first.
                    if (
                        attempts[i] <= o.attempts[place]
                        or o.state[place]
                        or not o.taken_by_application(place)
                    ):
                        duplicates += 1
                        continue
                    o.settled_apart((seq,))
                    leased += 1
                places.append(i)
                chosen.add(seq)
            if places:  # an origin of their own: its places are theirs
                origin = Origin(
                    self.queue,
                    source,
                    group,
                    _pick(seqs, places),
                    _pick(batch.headers, places),
                    _pick(batch.attempts, places),
                    _pick(batch.partitions, places),
                    _pick(batch.published_ats, places),
                    _pick(batch.indexes, places),
                )
                keys, payloads = _pick(keys, places), _pick(payloads, places)
        if duplicates:
            self.counters.add("duplicates_held", duplicates)
        if leased:
            self.counters.add("redelivered_lease_expired", leased)
        if reack:
            self.counters.add("duplicates_dropped", len(reack))
            self._outgoing.append((producer, Ack(self.node_id, topic, lane, tuple(reack))))
        if origin is not None:
            if holding is _NOTHING_HELD:
                holding = self._holding[source] = {}
            holding[origin] = None
            self.counters.add("received", len(payloads))
            if len(subs) == 1:
                subs[0]._deliver(origin, keys, payloads)
            else:
                i = self._rr[(topic, lane)] = (self._rr[(topic, lane)] + 1) % len(subs)
                subs[i]._deliver(origin, keys, payloads)

    def release(self, batch: Batch) -> None:
        """Give a batch back to its producer without delivering it."""
        self._outgoing.append(
            (batch.node_id, Nack(self.node_id, batch.topic, batch.lane, batch.seqs, 0.0))
        )

    def _note_floor(
        self, producer: bytes, lane: str, floor: int, wb: WriteBatch, now: float
    ) -> None:
        key = (producer, lane)
        last = self._pruned.get(key)
        if last is None or (floor > last[0] and now - last[1] >= PRUNE_INTERVAL_S):
            if floor > 0:
                wb.seen_prune.append((producer, floor, lane.encode()))
                if self.unwritten.count:
                    self.unwritten.forget_below(producer, lane.encode(), floor)
            self._pruned[key] = (floor, now)

    def forget_silent(self, observed: float, window_s: float, wb: WriteBatch) -> None:
        """Forget the dedupe window of every producer not heard from for ``window_s``
        (inbox/heard.py says why)."""
        gone = self.producers.sweep(observed, window_s, wb)
        if not gone:
            return
        forgotten = set(gone)
        self._tops = {k: v for k, v in self._tops.items() if k[0] not in forgotten}
        self._pruned = {k: v for k, v in self._pruned.items() if k[0] not in forgotten}
        for producer in gone:
            self.unwritten.forget(producer)
        self.counters.add("producers_forgotten", len(gone))
        log.info(
            "dedupe window of %d producer(s) silent for %.0fs forgotten: %s",
            len(gone),
            window_s,
            ", ".join(p.hex()[:12] for p in gone[:8]) + (" ..." if len(gone) > 8 else ""),
        )

    # -- settling -------------------------------------------------------------------------

    def acked(self, msgs: list[Message], wb: WriteBatch) -> Message | None:
        """Messages acked in a transaction: marked acked, written to the dedupe window in
        ``wb``, sent to their producers after its commit. If one was released meanwhile
        (its subscription closed: it went back to its producer for other members), nothing
        is done and that message is returned."""
        places = list(zip(map(_origin_of, msgs), map(_place_of, msgs), strict=True))
        for n, (origin, i) in enumerate(places):
            if origin.state[i] != TRANSACTED:
                return msgs[n]
        by_origin: dict[Origin, list[int]] = {}
        for origin, i in places:
            origin.state[i] = ACKED
            by_origin.setdefault(origin, []).append(origin.seqs[i])
        for origin, seqs in by_origin.items():
            origin.settled_apart(seqs)
            self.acked_seqs(origin, seqs, wb)
            self._tx_acks.append(seqs)
        return None

    def acked_seqs(self, origin: Origin, seqs: Sequence[int], wb: WriteBatch) -> None:
        """``acked`` for sequences of one origin, settled on it already (what its
        ``take_acks`` returned)."""
        source = origin.source
        if origin.left <= 0:
            self._unhold(source, origin)
        if not seqs:
            return
        wb.seen_put.append((source[0], source[2].encode(), seqs))
        acks = self._acks.get(source)
        if acks is None:
            self._acks[source] = [seqs]
        else:
            acks.append(seqs)

    def _unhold(self, source: tuple[bytes, str, str], origin: Origin) -> None:
        """``origin`` holds nothing any more; its source's entry goes with its last."""
        holding = self._holding.get(source)
        if holding is not None:
            holding.pop(origin, None)
            if not holding:
                del self._holding[source]

    def settle(self, msg: Message, how: str, arg: object) -> None:
        """A message nacked or failed: sent to its producer after the loop's commit."""
        origin = msg._origin
        seq = origin.seqs[msg._i]
        producer, _topic, lane = source = origin.source
        origin.settled_apart((seq,))
        if origin.left <= 0:
            self._unhold(source, origin)
        if how == "nacked":
            delay = -1.0 if arg is None else float(arg)  # type: ignore[arg-type]
            self._outgoing.append((producer, Nack(self.node_id, msg.topic, lane, (seq,), delay)))
        elif how == "failed":
            reason = str(arg)
            if len(reason) > MAX_REASON_CHARS:  # (what a FAIL carries: the start of it)
                reason = reason[: MAX_REASON_CHARS - 1] + "…"
            self._outgoing.append((producer, Fail(self.node_id, msg.topic, lane, seq, reason)))

    def rollback(self) -> None:
        """The commit holding the staged acks failed: forget them. Their messages are no
        longer held either, so a redelivery reaches the application again."""
        self.counters.add("acks_rolled_back", sum(map(len, chain(*self._acks.values()))))
        self._acks.clear()
        self._tx_acks.clear()

    def rollback_transactions(self, wb: WriteBatch) -> None:
        """The commit of this iteration's transactions failed: their acks are taken out
        of ``wb`` and not sent (their messages come again, as if they never happened)."""
        gone = {id(seqs) for seqs in self._tx_acks if seqs}
        if gone:
            wb.seen_put[:] = [e for e in wb.seen_put if id(e[2]) not in gone]
            for key, parts in list(self._acks.items()):
                self._acks[key] = [p for p in parts if id(p) not in gone]
            self.counters.add("acks_rolled_back", sum(map(len, self._tx_acks)))
        self._tx_acks.clear()

    def flush(self, send: Callable[[bytes, Ack | Nack | Fail | Touch], None]) -> None:
        """After commit: send acks (grouped per producer and lane), nacks, fails and
        touches."""
        me = self.node_id
        tops = self._tops
        joined = [(key, _joined(parts)) for key, parts in self._acks.items()]
        # Counted before they are sent: a producer that settles them (and a caller woken
        # by that) finds them counted here.
        self.counters.add("acked_local", sum(len(seqs) for _k, runs in joined for seqs in runs))
        heard = self.producers.heard  # (an ack of a message held longer than the window)
        for (producer, topic, lane), runs in joined:
            heard(producer)
            for seqs in runs:
                top = seqs[-1] if type(seqs) is range else max(seqs)
                if top > tops.get((producer, lane), -1):
                    tops[(producer, lane)] = top
                for i in range(0, len(seqs), 5000):
                    send(producer, Ack(me, topic, lane, seqs[i : i + 5000]))
        self._acks.clear()
        self._tx_acks.clear()
        out, self._outgoing = self._outgoing, []
        for (producer, topic, lane), seqs in self._touches.items():
            for i in range(0, len(seqs), 5000):
                out.append((producer, Touch(me, topic, lane, tuple(seqs[i : i + 5000]))))
        self._touches.clear()
        for producer, msg in out:
            send(producer, msg)


def _with_acked(
    seen: AbstractSet[int], acked: list[Sequence[int]], first: int, last: int
) -> AbstractSet[int]:
    """``seen`` and the sequences of ``acked`` (as taken, mostly ranges) from ``first`` to
    ``last``."""
    more: set[int] = set()
    for part in acked:
        if type(part) is range:
            more.update(range(max(part.start, first), min(part.stop, last + 1)))
        else:
            more.update(s for s in part if first <= s <= last)
    return more | seen if more else seen


def _joined(parts: list[Sequence[int]]) -> list[Sequence[int]]:
    """``parts`` with each range that continues the one before it joined to it."""
    out = parts[:1]
    for seqs in parts[1:]:
        last = out[-1]
        if (
            type(seqs) is range
            and type(last) is range
            and seqs.start == last.stop
            and seqs.step == last.step == 1
        ):
            out[-1] = range(last.start, seqs.stop)
        else:
            out.append(seqs)
    return out


def _pick(column: Sequence[Any], places: list[int]) -> list[Any]:
    """The elements of ``column`` at ``places``."""
    return [column[i] for i in places]
