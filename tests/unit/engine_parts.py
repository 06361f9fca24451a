"""What the unit tests of the engine's parts share (no tests here): a producer's
``Outbox`` on a real LMDB store, publishes built as ``Submitter.prepare`` builds them, the
IO loop's steps in its order with the time passed in (no IO thread, no sockets), and a
command queue that records what it is given. (stored.py reads back what LMDB holds.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from zmesh._engine.commands import Unsubscribe
from zmesh._engine.lane.delivery import Taken
from zmesh._engine.lane.lane import Lane
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.outcomes import Outcome, Outcomes
from zmesh._engine.outbox.publishes import AnyPublish, Publish, PublishMany
from zmesh._engine.outbox.record import Columns
from zmesh._engine.routing import partition_for
from zmesh._engine.stats import Counters
from zmesh._receipt import Publisher, Receipt, Signal, Stage
from zmesh._store.store import Store, WriteBatch
from zmesh.config import TopicConfig
from zmesh.subscription import Subscription

A, B = b"A" * 16, b"B" * 16  # consumer members
T = TypeVar("T")


def opened(path: Path, map_size_bytes: int = 1 << 24) -> Iterator[Store]:
    """A store in ``path``, for a fixture to yield from: closed after the test."""
    store = Store(str(path), map_size_bytes)
    yield store
    store.close()


class CommandQueue:
    """A node's command queue as the consumer side sees it (``inbox.origin.Queue``), and
    as a ``Subscription`` uses it: it records what is submitted, for a test to hand to
    the IO thread's parts in the loop's order."""

    state = "running"

    def __init__(self, node_id: bytes) -> None:
        self.node_id = node_id
        self.submitted: list[Any] = []
        self._ephemeral = 0

    def submit(self, cmd: Any) -> None:
        self.submitted.append(cmd)

    def check_running(self) -> None:
        pass

    def ephemeral_name(self) -> str:
        self._ephemeral += 1
        return f"~{self._ephemeral}"

    def unsubscribe(self, sub: Subscription, wait: bool = True) -> None:
        sub._drain_unsettled()  # (as the node's does: nothing more is taken from it)
        self.submit(Unsubscribe(sub))  # (``wait``: the test runs the IO side itself)

    def take_all(self) -> list[Any]:
        out, self.submitted = self.submitted, []
        return out


class Producer:
    """One producer's outbox on ``store``, driven step by step as its IO loop would."""

    def __init__(
        self,
        store: Store,
        memory_budget_bytes: int = 1 << 20,
        max_message_bytes: int = 1 << 20,
        **topics: TopicConfig,
    ) -> None:
        node_id, _incarnation, next_seq, next_lane = store.open_identity()
        self.store = store
        self.counters = Counters()
        self.outcomes = Outcomes()
        self.outbox = Outbox(
            store,
            node_id,
            next_seq,
            next_lane,
            dict(topics),
            memory_budget_bytes,
            max_message_bytes,
            self.counters,
            self.outcomes,
        )
        self.publisher = Publisher(node_id.hex(), Signal(), outcomes=self.outcomes)
        self.next_seq = next_seq

    # -- what application threads hand over -----------------------------------------------

    def _receipt(self, topic: str, n: int) -> tuple[int, Stage, Receipt]:
        first, stage = self.next_seq, Stage()
        self.next_seq += n
        return first, stage, Receipt(self.publisher, first, stage, n, topic)

    def publish(
        self,
        topic: str,
        payload: bytes,
        key: str | None = None,
        *,
        partitions: int | None = None,
        headers: dict | None = None,
        priority: int = 0,
        expires_at: float | None = None,
        deliver_at: float | None = None,
        msg_id: str | None = None,
        published_at: float = 1000.0,
    ) -> Publish:
        seq, stage, receipt = self._receipt(topic, 1)
        partitions = partitions or self.outbox.lanes.config(topic).partitions
        return Publish(
            seq,
            topic,
            partition_for(key, partitions, seq),
            key,
            headers,
            payload,
            priority,
            published_at,
            expires_at,
            deliver_at,
            receipt,
            stage,
            msg_id,
        )

    def publish_many(
        self,
        topic: str,
        payloads: list[bytes],
        keys: list[str | None] | None = None,
        *,
        partitions: int | None = None,
        headers: dict | None = None,
        published_at: float = 1000.0,
    ) -> PublishMany:
        n = len(payloads)
        first, stage, receipt = self._receipt(topic, n)
        partitions = partitions or self.outbox.lanes.config(topic).partitions
        if keys is not None:
            parts = [partition_for(k, partitions, first + i) for i, k in enumerate(keys)]
            return PublishMany(
                first,
                topic,
                parts,
                keys,
                headers,
                payloads,
                published_at,
                receipt,
                stage,
                n,
                sum(map(len, payloads)),
            )
        return PublishMany(
            first,
            topic,
            [],  # (one partition for all, picked when staged)
            None,
            headers,
            payloads,
            published_at,
            receipt,
            stage,
            n,
            sum(map(len, payloads)),
            partitions,
        )

    # -- the loop's steps -----------------------------------------------------------------

    def step(self, fn: Callable[[WriteBatch], T]) -> T:
        """``fn(batch)``, then the batch committed."""
        wb = WriteBatch()
        out = fn(wb)
        self.store.commit(wb)
        return out

    def group(self, topic: str, name: str, now: float = 0.0, mode: str = "shared") -> Lane:
        """The lane of a group learned from a hello (made and stored)."""
        return self.step(lambda wb: self.outbox.groups.ensure(topic, name, name, mode, wb, now))

    def commit(self, *pubs: AnyPublish, now: float = 0.0) -> list[AnyPublish]:
        """One iteration's publishes: staged, committed, owed to their lanes (what that
        deletes, a supersession, committed with the next batch)."""
        staging = self.outbox.staging
        wb = WriteBatch()
        staging.prepare_lanes(list(pubs), wb, now)
        fresh = staging.stage(list(pubs), wb)
        self.store.commit(wb)
        self.step(lambda after: staging.added(fresh, now, after))
        return fresh

    def ack(self, topic: str, lane: str, seqs: list[int] | range) -> int:
        return self.step(lambda wb: self.outbox.settler.on_ack(topic, lane, seqs, wb))

    def dispatch(
        self, now: float, keep: Callable[[Taken], int] = len
    ) -> list[tuple[bytes, str, Taken, Columns]]:
        """What one dispatch hands ``send`` (which takes ``keep(taken)`` of each), its
        batch committed."""
        sent: list[tuple[bytes, str, Taken, Columns]] = []

        def send(member: bytes, lane: Lane, taken: Taken, columns: Columns) -> int:
            sent.append((member, lane.name, taken, columns))
            return keep(taken)

        self.step(lambda wb: self.outbox.dispatcher.dispatch(now, send, wb))
        return sent

    @property
    def depth(self) -> int:
        return self.outbox.depth

    def outcome(self, seq: int, lane: str = "g") -> Outcome:
        """What became of ``seq`` for ``lane``, as its receipt would say once settled."""
        return self.outcomes.of(seq, 1, [lane], True)[lane]


def one_group(store: Store, member: bool = True, **cfg: Any) -> tuple[Producer, Lane]:
    """A producer of topic "t" (``TopicConfig(**cfg)``) and the lane of its group "g",
    with member A (``member``), whose credit takes all a test publishes."""
    producer = Producer(store, t=TopicConfig(**cfg))
    lane = producer.group("t", "g")
    if member:
        lane.set_member(A, 100, 100)
    return producer, lane


def reopened(store: Store, now: float = 0.0, **topics: TopicConfig) -> Producer:
    """A producer started again on ``store`` (what a restart owes is what it stored)."""
    producer = Producer(store, **topics)
    producer.step(lambda wb: producer.outbox.load(now, wb))
    return producer


def owes(lane: Lane) -> list[int]:
    return sorted(lane.seqs())
