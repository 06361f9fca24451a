"""Committing a loop iteration's batch (commit.py) on a real, small LMDB store: what a
full map does to publishes, transactions and the consumer's acks, and the map growing
when it may. No IO thread, no sockets; the time is passed in."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit import stored
from tests.unit.engine_parts import A, CommandQueue, Producer, owes
from zmesh._engine.commit import Committer
from zmesh._engine.held import Held
from zmesh._engine.inbox.consumer import Consumer
from zmesh._engine.inbox.origin import Origin
from zmesh._engine.outbox.publishes import AnyPublish
from zmesh._protocol.frames import Ack
from zmesh._store.store import Store, WriteBatch
from zmesh.config import TopicConfig
from zmesh.errors import StoreError, StoreFullError
from zmesh.subscription import Message

SMALL_MAP = 256 << 10
PAYLOAD = b"y" * 5000
PRODUCER = b"P" * 16  # of the messages the consumer acks


@dataclass
class Call:
    """A call or transaction waiting for its iteration's commit (``commit.Waiter``)."""

    tx: bool
    writes: bool
    error: BaseException | None = None


class Node:
    """A producer's outbox, a consumer, and the committer of their batches."""

    def __init__(self, store: Store, max_map_size_bytes: int = 0) -> None:
        self.producer = Producer(store, t=TopicConfig(partitions=1))
        self.lane = self.producer.group("t", "g")
        self.lane.set_member(A, 10_000, 10_000)
        self.consumer = Consumer(
            os.urandom(16), CommandQueue(b"C" * 16), store, self.producer.counters
        )
        self.commits = Committer(
            store,
            self.producer.outbox.staging,
            self.consumer,
            self.producer.counters,
            max_map_size_bytes,
            Held(),
        )

    def loop(
        self,
        pubs: list[AnyPublish],
        now: float = 0.0,
        calls: Sequence[Call] = (),
        wb: WriteBatch | None = None,
    ) -> list[int]:
        """One iteration's commit (of ``wb``, with ``pubs``); the sequences stored."""
        after = WriteBatch()
        _done, fresh = self.commits.store_pubs(wb or WriteBatch(), pubs, calls, now, after)
        self.commits.commit(after, [])
        return [seq for p in fresh for seq in p.seqs]

    def fill(self) -> AnyPublish:
        """Publish one message per iteration at time 0 until the map holds one back (its
        retry then waits for a deletion, or for RETRY_INTERVAL_S); returns it."""
        for _ in range(100):
            pub = self.producer.publish("t", PAYLOAD)
            if not self.loop([pub]):
                assert self.commits.held.pubs == [pub]
                return pub
        raise AssertionError("the map never filled")

    def sent(self) -> list[int]:
        """What dispatch hands the lane's member now."""
        return [s for *_, taken, _c in self.producer.dispatch(0.0) for s in taken.seqs]

    def acks(self, seqs: list[int], wb: WriteBatch) -> None:
        """The producer's lane settles ``seqs`` (acked by its consumer) in ``wb``."""
        self.producer.outbox.settler.on_ack("t", "g", seqs, wb)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    store = Store(str(tmp_path / "p"), SMALL_MAP)
    yield Node(store)
    store.close()


def test_a_full_map_holds_publishes_until_acks_delete_records(node: Node) -> None:
    producer, held = node.producer, node.commits.held
    first = node.fill()
    assert held.full and first.stage.error is None  # (held, not failed)
    assert producer.counters.get("store_full") == 1 and held.next_retry() == 1.0
    later = producer.publish("t", PAYLOAD)
    assert node.loop([later], 0.5) == []  # no retry due: it waits behind, not tried
    assert held.pubs == [first, later] and producer.counters.get("store_full") == 1
    assert not {first.seq, later.seq} & stored.msgs(producer.store).keys()
    assert first.seq not in node.lane and later.seq not in node.lane
    wb = WriteBatch()
    node.acks(node.sent(), wb)
    node.commits.commit(wb, [])
    assert held.next_retry() == 0.0  # (a commit deleted records: retry at once)
    assert node.loop([], 0.5) == [first.seq]  # (one: the chunk that last failed)
    assert node.loop([], 0.5) == [later.seq] and held.count == 0 and not held.full
    assert stored.msgs(producer.store).keys() == {first.seq, later.seq}
    assert owes(node.lane) == [first.seq, later.seq]


def test_the_rest_of_a_batch_is_committed_without_its_publishes(node: Node) -> None:
    producer = node.producer
    node.fill()
    sent = node.sent()
    wb = WriteBatch()
    node.acks(sent[:3], wb)  # settled in the iteration whose publishes do not fit
    big = producer.publish("t", b"z" * SMALL_MAP)
    assert node.loop([big], 1.0, wb=wb) == []  # (the held one is due, and tried too)
    assert not set(sent[:3]) & stored.msgs(producer.store).keys()  # (the acks were committed)
    assert node.commits.held.count == 2 and node.commits.held.next_retry() == 0.0


def test_a_transaction_fails_at_once_on_a_full_map(node: Node) -> None:
    producer, commits = node.producer, node.commits
    node.fill()
    tx_pub = producer.publish("t", b"z" * SMALL_MAP)
    plain = producer.publish("t", PAYLOAD)
    commits.tx_pubs.add(id(tx_pub))
    tx, other = Call(tx=True, writes=True), Call(tx=False, writes=True)
    wb = WriteBatch()
    wb.meta_put[b"other"] = b"x"  # what the other call wrote this iteration
    assert node.loop([tx_pub, plain], 0.5, [tx, other], wb) == []  # (tx_pub is tried)
    assert isinstance(tx.error, StoreFullError) and tx_pub.stage.error is tx.error
    assert plain.stage.error is None and commits.held.count == 2  # (held, not failed)
    assert other.error is None  # its writes were committed
    with producer.store.env.begin(db=producer.store.meta) as txn:
        assert txn.get(b"other") == b"x"
    assert tx_pub.seq not in stored.msgs(producer.store)


def _acked_origin(node: Node, n: int, first: int = 1) -> Origin:
    """A delivered batch of ``n`` messages, all acked in order by the application, as
    the IO thread takes it from the command queue."""
    origin = Origin(
        node.consumer.queue,
        (PRODUCER, "t", "g"),
        "g",
        range(first, first + n),
        [None] * n,
        [1] * n,
        [0] * n,
        [0.0] * n,
        list(range(n)),
    )
    origin.next = n
    return origin


def _fail_a_transaction(node: Node, wb: WriteBatch) -> list[object]:
    """Run a loop with ``wb`` and a transaction whose publish the map has no room for (it
    fails, and is not held); what the consumer sent after it."""
    big = node.producer.publish("t", b"z" * SMALL_MAP)
    node.commits.tx_pubs.add(id(big))
    tx = Call(tx=True, writes=True)
    assert node.loop([big], 0.0, [tx], wb=wb) == []
    assert isinstance(tx.error, StoreFullError)
    sent: list[object] = []
    node.consumer.flush(lambda _to, frame: sent.append(frame))
    return sent


def test_the_acks_of_a_commit_whose_publishes_do_not_fit_are_committed_and_sent(
    node: Node,
) -> None:
    """The map has no room for a transaction's publish: the transaction fails, and the
    acks of the iteration (not the transaction's) are committed without it and sent."""
    origin = _acked_origin(node, 3)
    wb = WriteBatch()
    node.consumer.acked_seqs(origin, origin.take_acks(), wb)
    sent = _fail_a_transaction(node, wb)
    assert sent == [Ack(node.consumer.node_id, "t", "g", range(1, 4))]
    assert node.producer.counters.get("acks_rolled_back") == 0
    assert node.producer.store.seen_filter(PRODUCER, b"g", [1, 2, 3]) == {1, 2, 3}


def test_a_failed_transaction_s_acks_are_rolled_back_with_it(node: Node) -> None:
    """Publishes and acks of a transaction commit together or not at all: its acks are
    neither written nor sent (their messages come again); the others' are."""
    other = _acked_origin(node, 3)
    mine = _acked_origin(node, 2, first=10)
    wb = WriteBatch()
    node.consumer.acked_seqs(other, other.take_acks(), wb)
    taken = [Message(mine, 0, None, b""), Message(mine, 1, None, b"")]
    for msg in taken:
        msg._settled = "transacted"  # (as Transaction.ack leaves it)
    assert node.consumer.acked(taken, wb) is None
    sent = _fail_a_transaction(node, wb)
    assert sent == [Ack(node.consumer.node_id, "t", "g", range(1, 4))]
    assert node.producer.counters.get("acks_rolled_back") == 2
    assert node.producer.store.seen_filter(PRODUCER, b"g", [1, 2, 3, 10, 11]) == {1, 2, 3}


def test_the_consumer_s_acks_of_a_commit_that_fails_otherwise_are_rolled_back(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a full store (an I/O error, damage): nothing says a smaller commit would do
    better, and the acks are rolled back, not sent; their messages come again."""
    origin = _acked_origin(node, 3)
    wb = WriteBatch()
    node.consumer.acked_seqs(origin, origin.take_acks(), wb)

    def failing(_batch: WriteBatch) -> None:
        raise StoreError("LMDB write failed: Input/output error", node.producer.store.path)

    monkeypatch.setattr(node.producer.store, "commit", failing)
    node.loop([], 0.0, wb=wb)
    sent: list[object] = []
    node.consumer.flush(lambda _to, frame: sent.append(frame))
    assert sent == [] and node.producer.counters.get("acks_rolled_back") == 3


def test_the_consumer_s_acks_of_a_commit_are_sent_after_it(node: Node) -> None:
    origin = _acked_origin(node, 3)
    wb = WriteBatch()
    node.consumer.acked_seqs(origin, origin.take_acks(), wb)
    node.loop([], 0.0, wb=wb)
    sent: list[object] = []
    node.consumer.flush(lambda _to, frame: sent.append(frame))
    assert sent == [Ack(node.consumer.node_id, "t", "g", range(1, 4))]
    assert node.producer.store.seen_filter(PRODUCER, b"g", [1, 2, 3]) == {1, 2, 3}


def test_a_map_allowed_to_grow_grows_instead_of_holding_publishes(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "p"), SMALL_MAP)
    try:
        node = Node(store, max_map_size_bytes=4 * SMALL_MAP)
        pubs = [node.producer.publish("t", PAYLOAD) for _ in range(100)]  # ~500 KB
        for i in range(0, 100, 4):
            assert node.loop(pubs[i : i + 4]) == [p.seq for p in pubs[i : i + 4]]
        assert store.map_size_bytes in (2 * SMALL_MAP, 4 * SMALL_MAP)
        assert node.producer.counters.get("map_grown") >= 1
        assert node.commits.held.count == 0 and node.producer.depth == 100
    finally:
        store.close()


def test_closing_with_held_publishes_fails_them(node: Node) -> None:
    waiting = node.fill()
    assert node.commits.fail_held("n") == (1, len(PAYLOAD))
    assert isinstance(waiting.stage.error, StoreFullError)
    assert node.producer.counters.get("publishes_failed_store_full") == 1
    assert node.commits.held.count == 0 and not node.commits.held.full


def test_the_duplicate_of_a_publish_held_back_is_held_with_it(node: Node) -> None:
    """Two publishes with one msg_id in one iteration, and the commit fails (the map is
    full): the duplicate shares its original's fate. It is held with it, not acked by
    following a message that was not stored, and failed with it at close."""
    producer = node.producer
    original = producer.publish("t", b"z" * SMALL_MAP, msg_id="order-7")
    dup = producer.publish("t", b"d", msg_id="order-7")
    assert node.loop([original, dup]) == []
    assert node.commits.held.pubs == [original, dup]
    assert dup.receipt not in producer.outbox.receipts.acked
    assert node.commits.fail_held("n")[0] == 2
    assert isinstance(dup.stage.error, StoreFullError)
