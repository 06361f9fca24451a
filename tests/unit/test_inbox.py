"""The consumer half of a node (inbox/consumer.py, origin.py) with no engine: batches
handed to ``Consumer.on_batch``, subscriptions taking and settling their messages through
a command queue that records what they submit, and the frames ``flush`` sends back. A
real LMDB store (the dedupe window) in a temp dir; the time is passed in."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.unit.engine_parts import CommandQueue, opened
from zmesh._engine.commands import Extend, Settle, Unsubscribe
from zmesh._engine.inbox.consumer import Consumer
from zmesh._engine.inbox.origin import Origin
from zmesh._engine.stats import Counters
from zmesh._protocol.codec import MAX_REASON_CHARS
from zmesh._protocol.frames import Ack, Batch, Fail, Nack, Touch
from zmesh._store.store import Store, WriteBatch
from zmesh.config import SubscriptionConfig
from zmesh.errors import MessageStateError
from zmesh.subscription import Message, Subscription

ME, P, Q = b"C" * 16, b"P" * 16, b"Q" * 16  # this node, two producers


def _batch(
    seqs: Sequence[int], attempt: int = 1, lane: str = "g", producer: bytes = P, floor: int = 0
) -> Batch:
    n = len(seqs)
    return Batch(
        producer,
        1,
        "t",
        lane,
        floor,
        seqs,
        [s % 4 for s in seqs],
        [f"k{s}" for s in seqs],
        [{"h": str(s)} for s in seqs],
        [attempt] * n,
        [float(s) for s in seqs],
        list(seqs),
        [b"%d" % s for s in seqs],
    )


class Inbox:
    """A consumer and its command queue, stepped as the IO loop steps them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.queue = CommandQueue(ME)
        self.counters = Counters()
        self.consumer = Consumer(ME, self.queue, store, self.counters)

    def subscribe(self, group: str | None = "g") -> Subscription:
        """A subscription whose node is this inbox's command queue."""
        sub = Subscription(self.queue, "t", SubscriptionConfig(group=group))  # type: ignore[arg-type]
        self.consumer.add(sub)
        return sub

    def loop(self, *batches: Batch, now: float = 0.0) -> list[tuple[bytes, object]]:
        """One iteration: the commands queued, the batches, the commit, the flush.
        Returns what was sent, to whom."""
        wb = WriteBatch()
        consumer = self.consumer
        for cmd in self.queue.take_all():  # (as ``Commands.drain`` applies them)
            if isinstance(cmd, Origin):  # a batch's acks
                consumer.acked_seqs(cmd, cmd.take_acks(), wb)
            elif isinstance(cmd, Settle):
                consumer.settle(cmd.msg, cmd.how, cmd.arg)
            elif isinstance(cmd, Extend):
                consumer.touch(cmd.msg)
            else:
                assert isinstance(cmd, Unsubscribe)
                consumer.remove(cmd.sub)
        for batch in batches:
            consumer.on_batch(batch, wb, now)
        self.store.commit(wb)
        sent: list[tuple[bytes, object]] = []
        consumer.flush(lambda to, frame: sent.append((to, frame)))
        return sent


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield from opened(tmp_path / "c")


@pytest.fixture
def inbox(store: Store) -> Inbox:
    return Inbox(store)


def _acks(sent: list[tuple[bytes, object]]) -> list[list[int]]:
    return [list(f.seqs) for _to, f in sent if isinstance(f, Ack)]


def _fetch_seqs(sub: Subscription) -> list[tuple[int, int]]:
    return [(m.id.seq, m.attempt) for m in sub.fetch(1000, 0)]


def test_a_batch_is_delivered_and_its_acks_go_back_as_one_range(inbox: Inbox, store: Store) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(10, 20)))
    msgs = sub.fetch(100, 0)
    m = msgs[3]
    assert (
        m.id.seq,
        m.key,
        m.payload,
        m.headers,
        m.attempt,
        m.partition,
        m.published_at,
        m.index,
        m.group,
    ) == (13, "k13", b"13", {"h": "13"}, 1, 1, 13.0, 13, "g")
    for msg in msgs:
        msg.ack()
    assert len(inbox.queue.submitted) == 1  # (one command for the batch's acks)
    sent = inbox.loop()
    assert sent == [(P, Ack(ME, "t", "g", range(10, 20)))]
    assert store.seen_filter(P, b"g", [9, 10, 19, 20]) == {10, 19}
    assert inbox.counters.get("received") == 10 and inbox.counters.get("acked_local") == 10


def test_a_redelivery_of_acked_messages_is_acked_again_not_delivered(
    inbox: Inbox, store: Store
) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(10, 13)))
    sub.ack_many(sub.fetch(100, 0))
    inbox.loop()
    sent = inbox.loop(_batch((10, 11, 12, 13), attempt=2))  # (its acks were lost)
    assert _acks(sent) == [[10, 11, 12]] and _fetch_seqs(sub) == [(13, 2)]
    assert inbox.counters.get("duplicates_dropped") == 3
    # The window is in LMDB: a consumer started again drops them too.
    again = Inbox(store)
    sub = again.subscribe()
    assert _acks(again.loop(_batch((11, 14)))) == [[11]] and _fetch_seqs(sub) == [(14, 1)]


def test_the_floor_prunes_the_dedupe_window_at_most_once_a_second(
    inbox: Inbox, store: Store
) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(1, 4)))
    sub.ack_many(sub.fetch(100, 0))
    inbox.loop()
    consumer = inbox.consumer
    wb = WriteBatch()
    consumer.on_batch(_batch([5000], floor=2048), wb, 10.0)
    consumer.on_batch(_batch([5001], floor=4096), wb, 10.9)
    assert wb.seen_prune == [(P, 2048, b"g")]
    consumer.on_batch(_batch([5002], floor=4096), wb, 11.0)
    assert wb.seen_prune == [(P, 2048, b"g"), (P, 4096, b"g")]
    store.commit(wb)
    assert store.seen_filter(P, b"g", [1, 2, 3]) == set()


def test_a_copy_of_a_message_still_held_is_dropped(inbox: Inbox) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(1, 4)))
    [taken] = sub.fetch(1, 0)  # 1 taken by the application, 2 and 3 still queued
    sent = inbox.loop(_batch(range(1, 4)))  # the same attempt: sent again on a reconnect
    assert sent == [] and inbox.counters.get("duplicates_held") == 3
    assert _fetch_seqs(sub) == [(2, 1), (3, 1)]
    taken.ack()
    assert _acks(inbox.loop()) == [[1]]


def test_a_message_whose_lease_ran_out_is_delivered_again(inbox: Inbox) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(1, 4)))
    first = sub.fetch(2, 0)  # 1 and 2 taken, not settled; 3 queued
    inbox.loop(_batch(range(1, 4), attempt=2))
    assert inbox.counters.get("redelivered_lease_expired") == 2
    assert inbox.counters.get("duplicates_held") == 1  # (3: still queued)
    again = sub.fetch(10, 0)
    assert [(m.id.seq, m.attempt) for m in again] == [(3, 1), (1, 2), (2, 2)]
    first[0].ack()  # the first copy of 1, late: it still counts
    again[2].ack()  # the second copy of 2
    again[0].ack()
    assert sorted(s for seqs in _acks(inbox.loop()) for s in seqs) == [1, 2, 3]
    first[1].ack()  # the other copies: acked again, harmless
    again[1].ack()
    assert sorted(s for seqs in _acks(inbox.loop()) for s in seqs) == [1, 2]
    assert not any(inbox.consumer._holding.values())  # (nothing held any more)


def test_closing_a_subscription_releases_what_was_not_settled(inbox: Inbox) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(1, 6)))
    taken = sub.fetch(2, 0)
    taken[1].ack()
    sub.close()
    sent = inbox.loop()
    assert _acks(sent) == [[2]]
    assert [(to, f) for to, f in sent if isinstance(f, Nack)] == [
        (P, Nack(ME, "t", "g", (1, 3, 4, 5), 0.0))
    ]  # (at once: for other members)
    assert inbox.counters.get("released_on_close") == 4
    with pytest.raises(MessageStateError, match="released"):
        taken[0].ack()
    assert inbox.consumer.subs == {} and not any(inbox.consumer._holding.values())


def test_nacks_fails_and_touches_go_back_after_the_commit(inbox: Inbox) -> None:
    sub, other = inbox.subscribe(), inbox.subscribe("h")
    inbox.loop(_batch(range(1, 6)), _batch([7, 8], lane="h"), _batch([9], producer=Q))
    m1, m2, m3, m4, m5, m9 = sub.fetch(10, 0)
    m7, m8 = other.fetch(10, 0)
    m1.nack(2.5)
    m2.nack()
    m3.fail("x" * (MAX_REASON_CHARS + 10))
    for m in (m4, m5, m7, m8, m9):
        m.in_progress()
    sent = inbox.loop()
    reason = "x" * (MAX_REASON_CHARS - 1) + "…"
    assert sent == [
        (P, Nack(ME, "t", "g", (1,), 2.5)),
        (P, Nack(ME, "t", "g", (2,), -1.0)),  # (the lane's backoff)
        (P, Fail(ME, "t", "g", 3, reason)),
        (P, Touch(ME, "t", "g", (4, 5))),
        (P, Touch(ME, "t", "h", (7, 8))),
        (Q, Touch(ME, "t", "g", (9,))),
    ]
    m4.ack()
    m5.ack()
    assert _acks(inbox.loop()) == [[4, 5]]


def test_a_batch_for_no_subscription_goes_back_at_once(inbox: Inbox) -> None:
    assert inbox.loop(_batch([1, 2])) == [(P, Nack(ME, "t", "g", [1, 2], 0.0))]
    assert inbox.counters.get("released_no_subscription") == 2


def test_an_ephemeral_subscription_has_nothing_to_dedupe_or_settle(
    inbox: Inbox, store: Store
) -> None:
    sub = inbox.subscribe(group=None)
    lane = sub.lane
    inbox.loop(_batch([1, 2], lane=lane), _batch([1, 2], lane=lane))
    got = sub.fetch(10, 0)
    assert [m.id.seq for m in got] == [1, 2, 1, 2]  # (at most once per send: no window)
    for m in got:
        m.ack()
    assert inbox.queue.submitted == [] and inbox.loop() == []
    assert store.seen_filter(P, lane.encode(), [1, 2]) == set()
    assert inbox.counters.get("received_ephemeral") == 4


def test_acks_of_many_batches_are_sent_in_frames_of_at_most_5000(inbox: Inbox) -> None:
    sub = inbox.subscribe()
    inbox.loop(*[_batch(range(k, k + 1000)) for k in range(0, 12_000, 1000)])
    sub.ack_many(sub.fetch(12_000, 0))
    assert _acks(inbox.loop()) == [
        list(range(0, 5000)),
        list(range(5000, 10_000)),
        list(range(10_000, 12_000)),
    ]


def test_messages_acked_in_a_transaction_are_settled_on_their_origin(inbox: Inbox) -> None:
    sub = inbox.subscribe()
    inbox.loop(_batch(range(1, 4)))
    msgs: list[Message] = sub.fetch(10, 0)
    wb = WriteBatch()
    for msg in (msgs[2], msgs[0]):
        msg._settled = "transacted"  # (as Transaction.ack leaves it)
    assert inbox.consumer.acked([msgs[2], msgs[0]], wb) is None
    assert wb.seen_put == [(P, b"g", [3, 1])]
    assert (msgs[2]._settled, msgs[0]._settled) == ("acked", "acked")
    inbox.store.commit(wb)
    msgs[1].ack()
    assert sorted(map(sorted, _acks(inbox.loop()))) == [[1, 3], [2]]
    assert not any(inbox.consumer._holding.values())


def test_a_redelivery_in_the_iteration_of_its_ack_is_not_delivered_again(inbox: Inbox) -> None:
    """The application acks 1 while its producer, its ack timeout past, sends it again:
    the IO thread takes the ack and then the redelivery in one iteration. The ack is not
    in the store's dedupe window yet (it is committed at the end of the iteration) and
    the origin no longer holds 1, so ``on_batch`` counts this iteration's acks as seen:
    the message does not reach the application a second time."""
    sub = inbox.subscribe()
    inbox.loop(_batch([1, 2]))
    first, _second = sub.fetch(2, 0)
    first.ack()
    inbox.loop(_batch([1], attempt=2))
    assert _fetch_seqs(sub) == []
