"""A producer's outbox copied to a replica, taken over and handed back, with no IO thread:
the producer's outbox and the replica's copies on real LMDB stores, its stream over a
real DEALER -> ROUTER pair (encoded and decoded as on the wire), the clock passed in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from zmesh._engine.lane.delivery import Taken as Out
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.outcomes import Outcome, Outcomes
from zmesh._engine.outbox.publishes import AnyPublish, Publish, PublishMany
from zmesh._engine.outbox.record import Columns
from zmesh._engine.peers import Peer
from zmesh._engine.replica.copies import LAZY_ACK_S, Copies
from zmesh._engine.replica.streams import SEND_WINDOW_BYTES, Replicator
from zmesh._engine.replica.takeover import Taken, apply_handback
from zmesh._engine.replica.writes import Scope, cut, into_batch, select
from zmesh._engine.routing import assign
from zmesh._engine.stats import Counters
from zmesh._protocol.codec import decode_control, encode_control
from zmesh._protocol.frames import Ack, Fail, Handback, HandbackLane, ReplOps
from zmesh._receipt import Stage
from zmesh._store.store import Store, WriteBatch, pend_key
from zmesh.config import NodeConfig, TopicConfig

R = b"\x02" * 16  # the replica
M = b"\x03" * 16  # a consumer, member of both groups
TOPIC = "t"
PARTITIONS = 4


class Rig:
    """A producer's outbox, its replicator, and a replica's copies."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = Store(str(root / "p"), 1 << 27)
        self.node_id, self.incarnation, self.next_seq, next_lane = self.store.open_identity()
        cfg = TopicConfig(replicas=2, groups=("g1", "g2"), partitions=PARTITIONS, ack_timeout_s=5)
        self.outbox = Outbox(
            self.store,
            self.node_id,
            self.next_seq,
            next_lane,
            {TOPIC: cfg},
            1 << 20,
            1 << 20,
            Counters(),
            Outcomes(),
        )
        wb = WriteBatch()
        self.outbox.load(0.0, wb)
        self.store.commit(wb)
        self.replicator = Replicator(
            self.node_id, self.incarnation, self.store, self.outbox, Counters(), ()
        )
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind("inproc://replica")
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect("inproc://replica")
        push = self.ctx.socket(zmq.PUSH)
        self.sockets = {zmq.PUSH: push, zmq.DEALER: dealer}
        self.peer = Peer(
            R, "r", 1, "tcp://10.0.0.2:1", "tcp://10.0.0.2:2", lambda _p, k: self.sockets[k], 0.0
        )
        self.peer.replica_host = True
        self.copies = Copies(str(root / "r"), 1 << 27, R, Counters())
        self.frames: list[ReplOps] = []
        self.clock = 0.0  # the replica's (acks of settlements wait for it: LAZY_ACK_S)

    def close(self) -> None:
        self.copies.close()
        self.peer.close()
        for sock in self.sockets.values():  # (those the peer did not open)
            sock.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()
        self.store.close()

    def commit(self, wb: WriteBatch) -> None:
        self.store.commit(wb)
        self.replicator.committed(wb)
        self.replicator.copy()  # (the engine: after the loop's sends)

    def publish(
        self, n: int, *, many: bool = False, expires_at: float | None = None, size: int = 0
    ) -> list[int]:
        """Store ``n`` messages as the engine does (a run when ``many``)."""
        first = self.next_seq
        self.next_seq += n
        pubs: list[AnyPublish]
        if many:
            payloads = [b"m%d" % s + b"." * size for s in range(first, first + n)]
            pubs = [
                PublishMany(
                    first,
                    TOPIC,
                    [],  # (one partition for all, picked when staged)
                    None,
                    None,
                    payloads,
                    time.time(),
                    None,
                    Stage(),
                    n,
                    sum(map(len, payloads)),
                    PARTITIONS,
                )
            ]
        else:
            pubs = [
                Publish(
                    s,
                    TOPIC,
                    s % PARTITIONS,
                    None,
                    None,
                    b"s%d" % s,
                    0,
                    time.time(),
                    expires_at,
                    None,
                    None,
                    Stage(),
                )
                for s in range(first, first + n)
            ]
        staging = self.outbox.staging
        wb = WriteBatch()
        staging.prepare_lanes(pubs, wb, 0.0)
        fresh = staging.stage(pubs, wb)
        self.commit(wb)
        after = WriteBatch()
        staging.added(fresh, 0.0, after)
        self.commit(after)
        self.replicator.gate()
        return list(range(first, first + n))

    def pump(self) -> None:
        """Send what the replicator queued, apply it at the replica, ack it back, until
        nothing moves."""
        for _ in range(1000):
            self.replicator.flush()
            moved = False
            while self.router.poll(0):
                _ident, frame = self.router.recv_multipart()
                msg = decode_control(frame, max_repl_bytes=1 << 22)
                assert isinstance(msg, ReplOps)
                self.frames.append(msg)
                answer = self.copies.on_ops(msg, 0.0)
                if answer is not None:
                    self.replicator.on_ack(answer)
                moved = True
            self.clock += LAZY_ACK_S
            for ack in self.copies.commit(self.clock):
                self.replicator.on_ack(decode_control(encode_control(ack)))  # type: ignore[arg-type]
            if not moved and not any(s.reader for s in self.replicator.streams):
                return
        raise AssertionError("the stream never settled")

    def owed(self, outbox: Outbox) -> dict[str, set[int]]:
        return {lane.name: set(lane.seqs()) for lane in outbox.lanes.of_topic(TOPIC)}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.close()


def _dump(store: Store) -> dict[str, dict[bytes, bytes]]:
    out = {}
    for name in ("msgs", "runs", "pend", "pruns", "lanes", "dead"):
        with store.env.begin(db=getattr(store, name)) as txn:
            out[name] = dict(txn.cursor())
    return out


def test_receipts_are_stored_once_the_replica_holds_the_messages(rig: Rig) -> None:
    rig.publish(10)  # (before any replica: they wait for one)
    receipts = rig.outbox.receipts
    assert rig.replicator.lag == 10 and not receipts.stored
    rig.replicator.upkeep([rig.peer], set())
    assert [s.node_id for s in rig.replicator.streams] == [R]
    rig.publish(300, many=True)  # (during the sync: after it on the stream)
    assert rig.replicator.lag == 310
    rig.pump()
    assert rig.replicator.lag == 0
    assert len(receipts.stored) == 10 + 1  # ten messages' stages and the batch's
    copy = rig.copies.held[rig.node_id]
    assert copy.synced and copy.topics[TOPIC]["replicas"] == 2
    # The copy is the outbox, byte for byte (lanes, records, runs, what each lane owes).
    assert _dump(copy.store) == _dump(rig.store)


def test_settlements_follow_and_the_floor_waits_for_the_replica(rig: Rig) -> None:
    rig.replicator.upkeep([rig.peer], set())
    seqs = rig.publish(200, many=True) + rig.publish(20)
    rig.pump()
    g1 = rig.outbox.lanes.get(TOPIC, "g1")
    assert g1 is not None
    wb = WriteBatch()
    rig.outbox.settler.on_ack(TOPIC, "g1", seqs[:150], wb)
    rig.outbox.settler.on_ack(TOPIC, "g2", seqs[200:215], wb)  # (single records)
    rig.outbox.settler.on_fail(TOPIC, "g2", seqs[3], "bad", wb)
    assert g1.floor() == seqs[150]
    rig.commit(wb)
    # Consumers are told a floor only once the replica knows what lies below it.
    rig.replicator.snapshot_floors()
    assert rig.replicator.floor(g1) < seqs[150]
    rig.pump()
    rig.replicator.snapshot_floors()
    assert rig.replicator.floor(g1) == seqs[150]
    copy = rig.copies.held[rig.node_id]
    assert _dump(copy.store) == _dump(rig.store)  # (the dead letter too)


def test_a_frame_lost_on_the_way_gets_the_replica_a_new_copy(rig: Rig) -> None:
    rig.replicator.upkeep([rig.peer], set())
    rig.publish(50)
    rig.pump()
    syncs = rig.copies.counters.get("replica_syncs")
    rig.publish(5)
    stream = rig.replicator.streams[0]
    _op, lost = stream.frames.popleft()  # (a connection that broke with it in flight)
    assert isinstance(decode_control(lost, max_repl_bytes=1 << 22), ReplOps)
    rig.publish(5)
    rig.pump()
    assert rig.copies.counters.get("replica_stream_gaps") >= 1
    assert rig.copies.counters.get("replica_syncs") == syncs + 1
    assert rig.replicator.lag == 0
    assert _dump(rig.copies.held[rig.node_id].store) == _dump(rig.store)


def test_parts_of_a_commit_applied_in_order_end_as_the_whole(tmp_path: Path) -> None:
    # One batch that puts and deletes the same keys: a store applies puts first.
    keys = [pend_key(1, s) for s in range(3000)]
    wb = WriteBatch()
    wb.pend_put.extend((k, b"v" * 200) for k in keys)
    wb.pend_del.extend(keys[::2])
    wb.msgs_put.extend((s.to_bytes(8, "big"), b"\x9a\xa1t" + b"r" * 900) for s in range(2000))
    wb.msgs_del.extend(s.to_bytes(8, "big") for s in range(0, 2000, 3))
    scope = Scope()
    scope.topics, scope.prefixes, scope.every_lane = frozenset({"t"}), (b"\xa1t",), True
    writes = select(wb, scope)
    assert writes is not None
    parts = list(cut(writes))
    assert len(parts) > 2
    whole, pieces = Store(str(tmp_path / "a"), 1 << 26), Store(str(tmp_path / "b"), 1 << 26)
    try:
        whole.commit(wb)
        for part in parts:
            piece = WriteBatch()
            into_batch(part, piece)
            pieces.commit(piece)
        assert _dump(whole) == _dump(pieces)
        assert len(_dump(pieces)["pend"]) == 1500
    finally:
        whole.close()
        pieces.close()


def _send_all(sent: list[tuple[bytes, str, list[int]]]) -> Any:
    def send(member: bytes, lane: Any, out: Out, _columns: Columns) -> int:
        sent.append((member, lane.name, list(out.seqs)))
        return len(out.seqs)

    return send


def test_a_taker_hands_back_what_it_settled_and_the_producer_owes_the_rest(rig: Rig) -> None:
    now = time.monotonic()
    rig.replicator.upkeep([rig.peer], set())
    run = rig.publish(100, many=True)
    singles = rig.publish(10)
    expiring = rig.publish(5, expires_at=time.time() + 60)
    rig.pump()
    wb = WriteBatch()
    rig.outbox.settler.on_ack(TOPIC, "g1", run[:40], wb)  # (settled before the producer died)
    rig.commit(wb)
    rig.pump()
    before = rig.owed(rig.outbox)

    # The producer is gone; the replica opens its copy as the producer's outbox.
    config = NodeConfig(name="r", data_dir=str(rig.root / "r"), heartbeat_interval_s=0.5)
    taken = Taken(rig.copies.held[rig.node_id], config, now)
    assert rig.owed(taken.outbox) == before
    for lane in taken.outbox.lanes.of_topic(TOPIC):
        lane.set_member(M, 10_000, 1000)
    sent: list[tuple[bytes, str, list[int]]] = []
    taken.dispatch(now, _send_all(sent))
    assert not sent  # (until its peers heard that it serves the producer)
    taken.dispatch(now + 0.5, _send_all(sent))
    assert {lane for _m, lane, _s in sent} == {"g1", "g2"}
    in_flight = sum(len(s) for _m, _l, s in sent)
    assert in_flight == len(before["g1"]) + len(before["g2"])
    # The consumer acks most of it to the taker, fails one; the expiring ones expire.
    taken.settle(Ack(M, TOPIC, "g1", tuple(run[40:90]), rig.node_id), now + 1)
    taken.settle(Ack(M, TOPIC, "g2", tuple(run[:70]), rig.node_id), now + 1)
    taken.settle(Fail(M, TOPIC, "g2", singles[0], "no good", rig.node_id), now + 1)
    taken.tick(now + 120)  # (past the ttl and the ack timeout)
    taken.commit()

    # The producer is back: the taker sends no more.
    taken.back_since = now + 2
    taken.dispatch(now + 3, _send_all(sent))  # (no more sends once it is back)
    assert sum(len(s) for _m, _l, s in sent) == in_flight
    assert taken.in_flight() == 0  # (what was not settled timed out at now + 120)
    parts = taken.handback(R)
    assert parts[-1].last and all(not p.last for p in parts[:-1])
    assert {p.producer for p in parts} == {rig.node_id}
    wb = WriteBatch()
    for part in parts:
        apply_handback(rig.outbox, decode_control(encode_control(part)), wb)  # type: ignore[arg-type]
    rig.commit(wb)
    # The producer owes exactly what the taker still owed, and knows how it went.
    assert rig.owed(rig.outbox) == rig.owed(taken.outbox)
    assert run[40:90][0] not in rig.owed(rig.outbox)["g1"]
    dead = rig.store.get_dead(rig.outbox.lanes.get(TOPIC, "g2").id, singles[0])  # type: ignore[union-attr]
    assert dead is not None and dead[1] == "no good"
    outcomes = rig.outbox.settler.outcomes
    got = outcomes.of(singles[0], 1, ["g2"], True)
    assert got == {"g2": Outcome.DEAD_LETTERED}
    assert outcomes.of(expiring[0], len(expiring), ["g1", "g2"], True) == {
        "g1": Outcome.EXPIRED,
        "g2": Outcome.EXPIRED,
    }
    taken.close()


def test_a_taker_waits_for_its_in_flight_messages_up_to_the_ack_timeout(rig: Rig) -> None:
    now = time.monotonic()
    rig.replicator.upkeep([rig.peer], set())
    seqs = rig.publish(30)
    rig.pump()
    config = NodeConfig(name="r", data_dir=str(rig.root / "r"), heartbeat_interval_s=0.5)
    taken = Taken(rig.copies.held[rig.node_id], config, now)
    for lane in taken.outbox.lanes.of_topic(TOPIC):
        lane.set_member(M, 10_000, 1000)
    sent: list[tuple[bytes, str, list[int]]] = []
    taken.dispatch(now + 1, _send_all(sent))
    taken.back_since = now + 2
    assert taken.in_flight() == 60
    assert not taken.ready_to_hand_back(now + 2)
    assert not taken.ready_to_hand_back(now + 6.9)  # (the topic's ack timeout is 5 s)
    assert taken.ready_to_hand_back(now + 7.0)
    taken.settle(Ack(M, TOPIC, "g1", tuple(seqs), rig.node_id), now + 3)
    taken.settle(Ack(M, TOPIC, "g2", tuple(seqs), rig.node_id), now + 3)
    assert taken.in_flight() == 0 and taken.ready_to_hand_back(now + 3)
    taken.close()


def _joined_apart(producer: bytes) -> tuple[bytes, bytes]:
    """Two members whose table, when the first joins before the second, differs from the
    one both joining at once get: a taker that balanced afresh would move partitions."""
    for i in range(4, 200):
        a, b = bytes([i]) * 16, bytes([i + 1]) * 16
        apart = assign(assign([None] * PARTITIONS, [a], producer), [a, b], producer)
        if apart != assign([None] * PARTITIONS, [a, b], producer):
            return a, b
    raise AssertionError("no two such members")


def test_a_taker_sends_each_partition_to_the_member_the_producer_did(rig: Rig) -> None:
    now = time.monotonic()
    rig.replicator.upkeep([rig.peer], set())
    first, second = _joined_apart(rig.node_id)
    lane = rig.outbox.lanes.get(TOPIC, "g1")
    assert lane is not None
    sent: list[tuple[bytes, str, list[int]]] = []
    for member in (first, second):  # (one after the other, a dispatch between)
        lane.set_member(member, 10_000, 1000)
        sent.clear()
        wb = WriteBatch()
        rig.outbox.settler.on_ack(TOPIC, "g1", list(lane.seqs()), wb)  # (no fence)
        rig.commit(wb)
        rig.publish(PARTITIONS)
        wb = WriteBatch()
        rig.outbox.dispatcher.dispatch(now, _send_all(sent), wb)
        rig.commit(wb)
    rig.pump()
    owners = {s % PARTITIONS: m for m, name, seqs in sent for s in seqs if name == "g1"}
    assert set(owners.values()) == {first, second}

    config = NodeConfig(name="r", data_dir=str(rig.root / "r"), heartbeat_interval_s=0.5)
    taken = Taken(rig.copies.held[rig.node_id], config, now)
    taken_lane = taken.outbox.lanes.get(TOPIC, "g1")
    assert taken_lane is not None
    for member in (second, first):  # (both known at once, in any order)
        taken_lane.set_member(member, 10_000, 1000)
    resent: list[tuple[bytes, str, list[int]]] = []
    taken.dispatch(now + 1, _send_all(resent))
    got = {s % PARTITIONS: m for m, name, seqs in resent for s in seqs if name == "g1"}
    assert len(got) == PARTITIONS and got == owners
    taken.close()

    # So does the producer restarted on its store, its members back one after the other.
    again = Outbox(
        rig.store,
        rig.node_id,
        rig.next_seq,
        100,
        {TOPIC: TopicConfig(partitions=PARTITIONS)},
        1 << 20,
        1 << 20,
        Counters(),
        Outcomes(),
    )
    wb = WriteBatch()
    again.load(now, wb)
    back = again.lanes.get(TOPIC, "g1")
    assert back is not None
    for member in (second, first):
        back.set_member(member, 10_000, 1000)
        back.assignment.table()  # (balanced with each)
    assert back.assignment.table() == [owners[p] for p in range(PARTITIONS)]


def test_frames_refused_from_before_a_new_sync_do_not_start_another(rig: Rig) -> None:
    rig.replicator.upkeep([rig.peer], set())
    rig.publish(20)
    rig.pump()
    stream = rig.replicator.streams[0]
    for _ in range(3):
        rig.publish(5)
    stream.frames.popleft()  # (lost)
    rig.replicator.flush()  # (the others on their way, after a gap)
    begun = rig.replicator.counters.get("replica_syncs_begun")
    rig.replicator._begin(stream)  # (the producer starts over meanwhile: its queue overflowed)
    rig.pump()
    # The replica refused the frames of before that sync and asked once; the producer
    # knew the sync under way answers it, and began no other.
    assert rig.copies.counters.get("replica_stream_gaps") == 2
    assert rig.replicator.counters.get("replica_syncs_begun") == begun + 1
    assert stream.whole and rig.replicator.lag == 0
    assert _dump(rig.copies.held[rig.node_id].store) == _dump(rig.store)


def test_a_replica_is_sent_at_most_a_window_ahead_of_its_acks(rig: Rig) -> None:
    for _ in range(12):  # 24 MiB of outbox for the new replica's sync
        rig.publish(500, many=True, size=4096)
    rig.replicator.upkeep([rig.peer], set())
    stream = rig.replicator.streams[0]
    for _ in range(40):  # (reads 2 MiB of the outbox per flush)
        rig.replicator.flush()
    assert stream.frames and SEND_WINDOW_BYTES <= stream.unacked < SEND_WINDOW_BYTES + (1 << 20)
    rig.pump()
    assert stream.whole and stream.unacked == 0 and not stream.frames
    assert _dump(rig.copies.held[rig.node_id].store) == _dump(rig.store)


def test_a_replica_acks_what_stores_at_once_and_settlements_lazily(rig: Rig) -> None:
    rig.replicator.upkeep([rig.peer], set())
    seqs = rig.publish(50)
    rig.pump()
    stream = rig.replicator.streams[0]
    rig.clock = rig.copies.held[rig.node_id].told_at  # (just after its last ack)

    def deliver() -> list:
        rig.replicator.flush()
        while rig.router.poll(200):
            msg = decode_control(rig.router.recv_multipart()[1], max_repl_bytes=1 << 22)
            assert rig.copies.on_ops(msg, 0.0) is None  # type: ignore[arg-type]
        return rig.copies.commit(rig.clock)

    wb = WriteBatch()
    rig.outbox.settler.on_ack(TOPIC, "g1", seqs[:10], wb)
    rig.commit(wb)
    assert deliver() == []  # (a settlement: acked with the next ack, or soon)
    rig.publish(1)
    [ack] = deliver()  # (a publish: at once, the settlement's op with it)
    assert ack.op == stream.prev  # (the last frame sent)
    wb = WriteBatch()
    rig.outbox.settler.on_ack(TOPIC, "g2", seqs[:10], wb)
    rig.commit(wb)
    assert deliver() == []
    rig.clock += LAZY_ACK_S - 0.01
    assert rig.copies.commit(rig.clock) == []
    rig.clock += 0.01
    [ack] = rig.copies.commit(rig.clock)  # (nothing new to commit: the ack it owed)
    rig.replicator.on_ack(ack)
    assert stream.acked == stream.prev


def test_a_hand_back_naming_more_sequences_than_a_lane_owes_settles_only_those(
    rig: Rig,
) -> None:
    # A hand-back's ranges were walked sequence by sequence: [1, 2**62) made the IO
    # thread build arrays of 2**62 slots (a frame from any peer that may send one).
    seqs = rig.publish(20)
    lane = rig.outbox.lanes.get(TOPIC, "g1")
    assert lane is not None and set(lane.seqs()) >= set(seqs)
    part = HandbackLane(TOPIC, "g1", Outcome.ACKED.value, (seqs[5], 1 << 62))
    wb = WriteBatch()
    apply_handback(rig.outbox, Handback(R, rig.node_id, 1, (part,), True), wb)
    rig.commit(wb)
    assert set(lane.seqs()) & set(seqs) == set(seqs[:5])
