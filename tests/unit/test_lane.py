"""Lane: delivery state of one (topic, group), driven with explicit times and no clock."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmesh._engine.lane.delivery import IN_FLIGHT, WINDOW_MAX_BYTES, Entry, Taken, Timing
from zmesh._engine.lane.lane import Lane, _distinct
from zmesh._engine.lane.plain import PlainRun
from zmesh._engine.lane.seqqueue import COMPACT_AFTER

PRODUCER = b"P" * 16
A, B, C, D = (bytes([i]) * 16 for i in b"ABCD")


def half() -> float:
    """A jitter draw that makes the jitter factor exactly 1.0."""
    return 0.5


def make_lane(
    partitions: int = 1,
    rng: Callable[[], float] = half,
    producer: bytes = PRODUCER,
    **timing: float,
) -> Lane:
    return Lane(
        "metrics", "agg", producer=producer, partitions=partitions, timing=Timing(**timing), rng=rng
    )  # type: ignore[arg-type]


class Sent(NamedTuple):
    """One message of a take, as a row."""

    seq: int
    partition: int
    attempt: int


def sent(out: Taken) -> list[Sent]:
    return [Sent(*row) for row in zip(out.seqs, out.partitions, out.attempts, strict=True)]


def seqs(entries: list[Entry] | list[Sent] | Taken) -> list[int]:
    if isinstance(entries, Taken):
        return list(entries.seqs)
    return [e.seq for e in entries]


def taken(lane: Lane, now: float, member: bytes = A) -> list[int]:
    """Sequences handed to ``member`` by one take; fails if anyone else got some."""
    out, expired = lane.take(now)
    assert set(out) <= {member}, f"unexpected members {set(out) - {member}}"
    assert expired == []
    return seqs(out[member]) if member in out else []


def partitions_of(lane: Lane, member: bytes) -> list[int]:
    return [p for p in range(lane._partitions) if lane.owner(p) == member]


# -- credit and order ---------------------------------------------------------------------


def test_take_respects_max_in_flight() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=3, batch_size=10)
    for seq in range(10):
        lane.add(seq, 0, now=0.0)
    assert taken(lane, 0.0) == [0, 1, 2]
    assert taken(lane, 0.0) == []
    assert lane.in_flight_count() == 3
    assert lane.ready_count == 7


def test_each_member_gets_at_most_its_own_credit() -> None:
    lane = make_lane(partitions=16)
    lane.set_member(A, max_in_flight=2, batch_size=10)
    lane.set_member(B, max_in_flight=5, batch_size=10)
    owned_a, owned_b = partitions_of(lane, A), partitions_of(lane, B)
    assert owned_a and owned_b and sorted(owned_a + owned_b) == list(range(16))
    seq = 0
    for partition in range(16):
        for _ in range(3):
            lane.add(seq, partition, now=0.0)
            seq += 1
    out, _ = lane.take(0.0)
    assert len(out[A]) == 2
    assert len(out[B]) == 5
    assert {e.partition for e in sent(out[A])} <= set(owned_a)
    assert {e.partition for e in sent(out[B])} <= set(owned_b)
    assert all(set(out[m].seqs) <= lane.in_flight_to(m) for m in out)


def test_raising_credit_lets_more_through() -> None:
    lane = make_lane()
    assert lane.set_member(A, max_in_flight=1, batch_size=10) is True
    for seq in range(4):
        lane.add(seq, 0, now=0.0)
    assert taken(lane, 0.0) == [0]
    assert lane.set_member(A, max_in_flight=3, batch_size=10) is False
    assert taken(lane, 0.0) == [1, 2]


def _window_lane(
    max_in_flight: int, batch_size: int, ready: int, ack_timeout_s: float = 4.0
) -> Lane:
    """A lane with member A and ``ready`` plain messages of partition 0 (with an ack
    timeout of 4 s, a window holds what the member acks in 1 s)."""
    lane = make_lane(ack_timeout_s=ack_timeout_s)
    lane.set_member(A, max_in_flight=max_in_flight, batch_size=batch_size)
    lane.add_plain(PlainRun(list(range(ready)), [0] * ready))
    return lane


def test_a_window_starts_at_two_frames_and_grows_to_max_in_flight_for_a_fast_member() -> None:
    lane = _window_lane(100, 10, 2000)  # (a window holds what the member acks in 1 s)
    first = taken(lane, 0.0)
    assert first == list(range(20))  # two frames
    lane.ack(first)
    assert taken(lane, 0.05) == list(range(20, 40))  # (sized again every 0.1 s at most)
    lane.ack(range(20, 40))  # 40 acks in 0.15 s: 266 a second, more than max_in_flight
    assert len(taken(lane, 0.15)) == 100


def test_a_lane_whose_acks_never_time_out_gives_an_acking_member_its_max_in_flight() -> None:
    lane = _window_lane(100, 10, 500, ack_timeout_s=float("inf"))
    lane.ack(taken(lane, 0.0))
    lane.ack(taken(lane, 0.05))  # any rate holds an endless queue time's worth of messages
    assert len(taken(lane, 0.2)) == 100


def test_a_slow_member_holds_what_it_acks_in_a_quarter_of_the_ack_timeout() -> None:
    lane = _window_lane(1000, 100, 3000)
    held = taken(lane, 0.0)
    assert len(held) == 200
    # It acks 40 in 2 s (20 a second) while holding a full window: 20 in 1 s.
    lane.ack(held[:40])
    assert taken(lane, 2.0) == []  # it still holds 160, more than its new window
    assert lane.members[A].window == 20
    lane.ack(held[40:])
    assert len(taken(lane, 2.05)) == 20


def test_a_member_holding_less_than_its_window_keeps_it() -> None:
    lane = _window_lane(1000, 100, 50)
    lane.ack(taken(lane, 0.0))  # all there was: the window was never the limit
    lane.add_plain(PlainRun(list(range(50, 60)), [0] * 10))
    assert len(taken(lane, 5.0)) == 10
    assert lane.members[A].window == 200  # few acks, but none waited for the window


def test_a_member_holding_a_full_window_unacked_is_sent_up_to_its_max_in_flight() -> None:
    # (it may be gathering a batch of what it holds before it handles and acks any)
    lane = _window_lane(700, 100, 3000)
    assert len(taken(lane, 0.0)) == 200
    assert taken(lane, 0.5) == []  # (none acked for 1 s yet)
    assert len(taken(lane, 1.0)) == 200
    assert len(taken(lane, 2.0)) == 300
    assert taken(lane, 3.0) == []
    assert lane.members[A].window == 700
    lane.ack(range(700))  # then it acks them all at once: fast
    assert len(taken(lane, 3.1)) == 700


def test_a_window_holds_about_window_max_bytes_of_what_the_lane_sends() -> None:
    lane = _window_lane(1000, 100, 3000)
    held = taken(lane, 0.0)
    assert len(held) == 200  # (nothing sent yet: two frames)
    lane.note_sent(200, 200 * WINDOW_MAX_BYTES // 50)  # a fiftieth of the bytes each
    lane.ack(held)
    assert len(taken(lane, 0.01)) == 50  # bounded at once, before the window is sized again
    assert lane.members[A].window == 50
    # Smaller messages: the bound follows a quarter of the way per frame.
    for _ in range(40):
        lane.note_sent(100, 100 * 100)
    lane.ack(range(200, 250))
    lane.ack(taken(lane, 0.2))
    assert len(taken(lane, 0.3)) == 1000  # fast, and small: its max_in_flight


def test_lowering_credit_below_what_a_member_holds_takes_nothing() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=3, batch_size=10)
    for seq in range(5):
        lane.add(seq, 0, now=0.0)
    assert taken(lane, 0.0) == [0, 1, 2]
    lane.set_member(A, max_in_flight=1, batch_size=10)
    assert taken(lane, 0.0) == []
    lane.ack([0, 1])
    assert taken(lane, 0.0) == []  # it still holds 1, its whole credit
    lane.ack([2])
    assert taken(lane, 0.0) == [3]


def test_take_limit() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=100, batch_size=10)
    for seq in range(10):
        lane.add(seq, 0, now=0.0)
    out, _ = lane.take(0.0, limit=4)
    assert seqs(out[A]) == [0, 1, 2, 3]
    assert lane.ready_count == 6


def test_no_members_takes_nothing() -> None:
    lane = make_lane()
    lane.add(0, 0, now=0.0)
    assert lane.take(0.0) == ({}, [])
    assert lane.owner(0) is None
    assert 0 in lane and len(lane) == 1


def test_order_within_a_partition_is_priority_then_seq() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=100, batch_size=10)
    for seq, priority in [(0, 2), (1, 0), (2, 1), (3, 0), (4, 2), (5, 1)]:
        lane.add(seq, 0, priority, now=0.0)
    assert taken(lane, 0.0) == [1, 3, 2, 5, 0, 4]


def test_limited_credit_goes_to_the_most_urgent() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=1, batch_size=10)
    lane.add(0, 0, priority=5, now=0.0)
    lane.add(1, 0, priority=5, now=0.0)
    assert taken(lane, 0.0) == [0]
    lane.add(2, 0, priority=0, now=0.0)  # arrives later but is more urgent
    lane.ack([0])
    assert taken(lane, 0.0) == [2]
    lane.ack([2])
    assert taken(lane, 0.0) == [1]


def test_most_urgent_goes_first_across_a_members_partitions() -> None:
    lane = make_lane(partitions=2)
    lane.set_member(A, max_in_flight=1, batch_size=10)
    lane.add(0, 0, priority=3, now=0.0)
    lane.add(1, 1, priority=0, now=0.0)  # later partition, more urgent
    assert taken(lane, 0.0) == [1]
    lane.ack([1])
    assert taken(lane, 0.0) == [0]


# -- ack ----------------------------------------------------------------------------------


def test_ack_settles_and_frees_credit() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=1, batch_size=10)
    lane.add(0, 0, now=0.0)
    lane.add(1, 0, now=0.0)
    assert taken(lane, 0.0) == [0]
    assert taken(lane, 0.0) == []
    assert lane.ack([0]) == [0]
    assert 0 not in lane and len(lane) == 1
    assert lane.in_flight_count() == 0
    assert taken(lane, 0.0) == [1]


def test_ack_of_unknown_seqs_is_ignored() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    for seq in range(3):
        lane.add(seq, 0, now=0.0)
    assert taken(lane, 0.0) == [0, 1, 2]
    assert lane.ack([0]) == [0]
    assert lane.ack([0, 7, 99]) == []
    assert len(lane) == 2
    assert lane.in_flight_count() == 2
    assert lane.ack([2, 42, 1]) == [2, 1]
    assert len(lane) == 0


def test_ack_of_a_ready_message_settles_it() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    lane.add(1, 0, now=0.0)
    assert lane.ack([0]) == [0]
    assert lane.ready_count == 1
    assert taken(lane, 0.0) == [1]


# -- timeouts, backoff, attempts ----------------------------------------------------------


def test_backoff_is_exponential_and_capped() -> None:
    lane = make_lane(retry_backoff_s=0.5, max_retry_backoff_s=3.0)
    assert [lane.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert lane.backoff(0) == 0.5


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 0.5), (0.25, 0.75), (0.999, 1.499)])
def test_backoff_jitter_scales_between_half_and_one_and_a_half(draw: float, factor: float) -> None:
    lane = make_lane(rng=lambda: draw, retry_backoff_s=2.0, max_retry_backoff_s=100.0)
    assert lane.backoff(2) == pytest.approx(4.0 * factor)


def test_ack_timeout_redelivers_after_exponential_backoff() -> None:
    lane = make_lane(ack_timeout_s=10.0, retry_backoff_s=1.0, max_retry_backoff_s=5.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    now = 0.0
    attempts = []
    # (backoff after this attempt) with jitter factor 1.0: 1, 2, 4, then capped at 5.
    for backoff in (1.0, 2.0, 4.0, 5.0, 5.0):
        out, _ = lane.take(now)
        (entry,) = sent(out[A])
        attempts.append(entry.attempt)
        assert lane.next_wakeup() == now + 10.0  # its ack deadline
        assert lane.tick(now + 9.999).timed_out == 0
        assert taken(lane, now + 9.999) == []
        result = lane.tick(now + 10.0)
        assert result.timed_out == 1 and not result.expired and not result.exhausted
        assert lane.in_flight_count() == 0
        assert lane.next_wakeup() == now + 10.0 + backoff
        # Not again before the backoff has passed, even with free credit.
        lane.tick(now + 10.0 + backoff - 0.001)
        assert taken(lane, now + 10.0 + backoff - 0.001) == []
        now += 10.0 + backoff
        lane.tick(now)
    assert attempts == [1, 2, 3, 4, 5]
    assert taken(lane, now) == [0]


def test_restored_attempt_count_continues() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, attempt=4, now=0.0)
    out, _ = lane.take(0.0)
    assert sent(out[A])[0].attempt == 5


def test_max_attempts_exhausts_on_timeout() -> None:
    lane = make_lane(ack_timeout_s=10.0, retry_backoff_s=1.0, max_attempts=3)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    now = 0.0
    for attempt in (1, 2, 3):
        out, _ = lane.take(now)
        assert [(e.seq, e.attempt) for e in sent(out[A])] == [(0, attempt)]
        now += 10.0
        result = lane.tick(now)
        assert result.timed_out == 1
        if attempt < 3:
            assert result.exhausted == []
            now += 2.0 ** (attempt - 1)
            lane.tick(now)
    assert seqs(result.exhausted) == [0]
    assert result.exhausted[0].attempt == 3
    assert 0 not in lane and len(lane) == 0
    assert lane.in_flight_count() == 0
    assert lane.take(now) == ({}, [])


def test_unlimited_attempts_never_exhaust() -> None:
    lane = make_lane(ack_timeout_s=1.0, retry_backoff_s=0.0, max_attempts=0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    now = 0.0
    for attempt in range(1, 51):
        out, _ = lane.take(now)
        assert sent(out[A])[0].attempt == attempt
        now += 1.0
        assert lane.tick(now).exhausted == []
    assert 0 in lane


# -- nack -----------------------------------------------------------------------------------


def test_nack_with_explicit_delay() -> None:
    lane = make_lane(retry_backoff_s=100.0, max_retry_backoff_s=100.0)
    lane.set_member(A, max_in_flight=1, batch_size=10)
    lane.add(0, 0, now=0.0)
    lane.add(1, 0, now=0.0)
    assert taken(lane, 0.0) == [0]
    assert lane.nack([0], 5.0, now=1.0) == []
    # The nack freed the credit: the next message goes out meanwhile.
    assert taken(lane, 1.0) == [1]
    lane.ack([1])
    lane.tick(5.999)
    assert taken(lane, 5.999) == []
    assert lane.next_wakeup() == 6.0
    lane.tick(6.0)
    out, _ = lane.take(6.0)
    assert [(e.seq, e.attempt) for e in sent(out[A])] == [(0, 2)]


def test_nack_without_delay_uses_the_backoff() -> None:
    lane = make_lane(retry_backoff_s=2.0, max_retry_backoff_s=60.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    now = 0.0
    for attempt, backoff in [(1, 2.0), (2, 4.0), (3, 8.0)]:
        out, _ = lane.take(now)
        assert sent(out[A])[0].attempt == attempt
        assert lane.nack([0], None, now=now) == []
        lane.tick(now + backoff - 0.001)
        assert taken(lane, now + backoff - 0.001) == []
        now += backoff
        lane.tick(now)
    assert taken(lane, now) == [0]


def test_nack_with_zero_delay_is_ready_at_once() -> None:
    lane = make_lane(retry_backoff_s=100.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    assert taken(lane, 0.0) == [0]
    lane.nack([0], 0.0, now=1.0)
    assert taken(lane, 1.0) == [0]


def test_nack_of_unknown_or_not_in_flight_seqs_is_ignored() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    assert lane.nack([0, 5], 1.0, now=0.0) == []  # 0 is ready, not in flight
    assert lane.ready_count == 1
    assert taken(lane, 0.0) == [0]


def test_nack_exhausts_after_max_attempts() -> None:
    lane = make_lane(max_attempts=2)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    assert taken(lane, 0.0) == [0]
    assert lane.nack([0], 0.0, now=0.0) == []
    assert taken(lane, 0.0) == [0]
    exhausted = lane.nack([0], 0.0, now=0.0)
    assert seqs(exhausted) == [0] and exhausted[0].attempt == 2
    assert 0 not in lane
    assert lane.in_flight_count() == 0


def test_fail_removes_the_message() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    assert taken(lane, 0.0) == [0]
    entry = lane.fail(0)
    assert entry is not None and entry.seq == 0
    assert lane.fail(0) is None
    assert lane.in_flight_count() == 0 and len(lane) == 0


# -- schedule and expiry --------------------------------------------------------------------


def test_scheduled_message_is_not_taken_early() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0, not_before=5.0)
    lane.add(1, 0, now=0.0)
    assert taken(lane, 0.0) == [1]
    assert lane.next_wakeup() == 5.0
    lane.tick(4.999)
    assert taken(lane, 4.999) == []
    lane.tick(5.0)
    assert taken(lane, 5.0) == [0]


def test_schedule_in_the_past_is_ready_at_once() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=10.0, not_before=5.0)
    assert taken(lane, 10.0) == [0]


def test_take_drops_expired_messages() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0, expires_at=5.0)
    lane.add(1, 0, now=0.0)
    lane.add(2, 0, now=0.0, expires_at=50.0)
    out, expired = lane.take(6.0)
    assert seqs(out[A]) == [1, 2]
    assert expired == [0]
    assert 0 not in lane and len(lane) == 2


def test_ready_count_stays_right_when_take_drops_expired() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0, expires_at=5.0)
    lane.add(1, 0, now=0.0)
    out, expired = lane.take(6.0)
    assert seqs(out[A]) == [1] and expired == [0]
    assert lane.ready_count == 0
    # A later message must still go out.
    lane.add(2, 0, now=6.0)
    assert lane.ready_count == 1
    assert taken(lane, 6.0) == [2]


def test_tick_expires_waiting_messages() -> None:
    lane = make_lane()
    lane.add(0, 0, now=0.0, expires_at=5.0)  # ready, no member
    lane.add(1, 0, now=0.0, not_before=20.0, expires_at=6.0)  # scheduled past its expiry
    lane.add(2, 0, now=0.0, expires_at=60.0)
    assert lane.next_wakeup() == 5.0
    assert lane.tick(4.999).expired == []
    assert lane.tick(5.0).expired == [0]
    assert lane.tick(6.0).expired == [1]
    assert sorted(lane.seqs()) == [2]
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.tick(20.0)
    assert taken(lane, 20.0) == [2]


def test_in_flight_message_expires_at_its_ack_timeout() -> None:
    lane = make_lane(ack_timeout_s=10.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0, expires_at=5.0)
    assert taken(lane, 0.0) == [0]
    assert lane.tick(6.0).expired == []  # in flight: its ack may still come
    result = lane.tick(10.0)
    assert result.expired == [0] and result.timed_out == 1
    assert len(lane) == 0 and lane.in_flight_count() == 0


def test_message_that_expired_in_flight_expires_when_its_member_dies() -> None:
    lane = make_lane(ack_timeout_s=30.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0, expires_at=5.0)
    assert taken(lane, 0.0) == [0]
    assert lane.tick(6.0).expired == []
    assert lane.remove_member(A, now=7.0) == 1
    # Past its expiry and owed to nobody: the next tick drops it, without a member.
    assert lane.tick(8.0).expired == [0]
    assert len(lane) == 0


def test_message_that_expired_in_flight_expires_when_nacked() -> None:
    lane = make_lane(ack_timeout_s=30.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0, expires_at=5.0)
    assert taken(lane, 0.0) == [0]
    assert lane.tick(6.0).expired == []
    lane.nack([0], 1.0, now=7.0)
    lane.remove_member(A, now=7.0)
    assert lane.tick(9.0).expired == [0]
    assert len(lane) == 0


# -- membership -----------------------------------------------------------------------------


def test_remove_member_re_pends_its_in_flight_for_the_others() -> None:
    lane = make_lane(partitions=16, ack_timeout_s=30.0)
    lane.set_member(A, max_in_flight=100, batch_size=50)
    lane.set_member(B, max_in_flight=100, batch_size=50)
    owned_a = partitions_of(lane, A)
    assert owned_a
    for seq, partition in enumerate(owned_a * 2):
        lane.add(seq, partition, now=0.0)
    out, _ = lane.take(1.0)
    moved = sorted(seqs(out[A]))
    assert moved == list(range(2 * len(owned_a))) and B not in out
    assert lane.remove_member(A, now=2.0) == len(moved)
    assert lane.remove_member(A, now=2.0) == 0
    assert lane.in_flight_count() == 0
    assert lane.ready_count == len(moved)
    # At once: no tick, no timeout needed.
    out, _ = lane.take(2.0)
    assert set(out) == {B}
    assert sorted(seqs(out[B])) == moved
    assert all(e.attempt == 2 for e in sent(out[B]))
    assert set(out[B].seqs) <= lane.in_flight_to(B)
    # The dead member's old deadlines do not time the new deliveries out.
    assert lane.tick(31.0).timed_out == 0
    assert lane.tick(32.0).timed_out == len(moved)


def test_a_key_stays_with_one_member_while_membership_is_stable() -> None:
    lane = make_lane(partitions=8)
    for m in (A, B):
        lane.set_member(m, 1000, 500)
    for seq in range(80):
        lane.add(seq, seq % 8, now=0.0)
    out, _ = lane.take(0.0)
    for member, taken_by in out.items():
        for partition in taken_by.partitions:
            assert lane.owner(partition) == member
    assert sum(len(v) for v in out.values()) == 80


# -- floor and unsend -----------------------------------------------------------------------


def test_floor_is_the_lowest_unsettled_seq() -> None:
    lane = make_lane()
    assert lane.floor() == 0
    lane.set_member(A, max_in_flight=10, batch_size=10)
    for seq in range(5):
        lane.add(seq, 0, now=0.0)
    assert lane.floor() == 0
    lane.ack([0])
    assert lane.floor() == 1
    lane.ack([2])
    assert lane.floor() == 1
    lane.ack([1])
    assert lane.floor() == 3
    lane.fail(3)
    assert lane.floor() == 4
    lane.ack([4])
    assert lane.floor() == 5  # empty: the next sequence


def test_floor_starts_at_the_first_seq_and_follows_old_replays() -> None:
    lane = make_lane()
    lane.add(10, 0, now=0.0)
    lane.add(11, 0, now=0.0)
    assert lane.floor() == 10
    lane.add(3, 0, now=0.0)  # a replayed old message
    assert lane.floor() == 3
    lane.ack([3, 10])
    assert lane.floor() == 11
    lane.ack([11])
    assert lane.floor() == 12


def test_unsend_restores_ready_state_and_attempt() -> None:
    lane = make_lane(ack_timeout_s=10.0)
    lane.set_member(A, max_in_flight=2, batch_size=10)
    for seq, priority in [(0, 1), (1, 0), (2, 2)]:
        lane.add(seq, 0, priority, now=0.0)
    out, _ = lane.take(0.0)
    assert [(e.seq, e.attempt) for e in sent(out[A])] == [(1, 1), (0, 1)]
    lane.unsend(out[A].seqs, now=0.0)
    assert lane.in_flight_count() == 0
    assert lane.ready_count == 3
    assert all(lane.attempt(seq) == 0 for seq in out[A].seqs)
    out, _ = lane.take(5.0)
    assert [(e.seq, e.attempt) for e in sent(out[A])] == [(1, 1), (0, 1)]
    # The unsent delivery's deadline (10.0) times nothing out; the new one (15.0) does.
    assert lane.tick(10.0).timed_out == 0
    assert lane.tick(15.0).timed_out == 2


def test_unsend_ignores_settled_entries() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    out, _ = lane.take(0.0)
    lane.ack([0])
    lane.unsend(out[A].seqs, now=0.0)
    assert len(lane) == 0 and lane.ready_count == 0
    assert lane.take(0.0) == ({}, [])


def test_add_is_idempotent() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    lane.add(0, 0, now=0.0)
    assert len(lane) == 1 and lane.ready_count == 1
    assert taken(lane, 0.0) == [0]
    lane.add(0, 0, now=0.0)  # already in flight: nothing changes
    assert taken(lane, 0.0) == []


def test_partition_beyond_the_configured_count_is_kept() -> None:
    lane = make_lane(partitions=2)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 5, now=0.0)
    assert lane.owner(5) == A
    out, _ = lane.take(0.0)
    assert [(e.seq, e.partition) for e in sent(out[A])] == [(0, 5)]


# -- plain messages (no Entry until something unusual happens) -----------------------------


def test_plain_messages_need_no_entry_from_add_to_ack() -> None:
    lane = make_lane(partitions=2)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    for seq in range(4):
        lane.add(seq, seq % 2, now=0.0)
    assert len(lane) == 4 and lane.entries == {}
    assert sorted(taken(lane, 0.0)) == [0, 1, 2, 3]
    assert lane.entries == {} and lane.in_flight_count() == 4
    assert all(lane.state(seq) == IN_FLIGHT and lane.attempt(seq) == 1 for seq in range(4))
    assert lane.ack([0, 1, 2, 3, 4]) == [0, 1, 2, 3]
    assert len(lane) == 0 and lane.in_flight_count() == 0 and lane.floor() == 4


def test_plain_and_other_messages_are_taken_in_urgency_order() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(0, 0, now=0.0)
    lane.add(1, 0, now=0.0, expires_at=100.0)  # not plain: it can expire
    lane.add(2, 0, now=0.0)
    lane.add(3, 0, 1, now=0.0)  # priority 1: after every priority 0 message
    lane.add(4, 0, now=0.0)
    assert taken(lane, 0.0) == [0, 1, 2, 4, 3]


def test_an_old_sequence_added_after_newer_plain_ones_goes_first() -> None:
    lane = make_lane()
    lane.set_member(A, max_in_flight=10, batch_size=10)
    lane.add(5, 0, now=0.0)
    lane.add(6, 0, now=0.0)
    lane.add(3, 0, now=0.0)  # a replayed dead letter
    assert taken(lane, 0.0) == [3, 5, 6]


def test_a_plain_message_nacked_failed_or_acked_while_ready() -> None:
    lane = make_lane(retry_backoff_s=1.0)
    lane.set_member(A, max_in_flight=10, batch_size=10)
    for seq in range(3):
        lane.add(seq, 0, now=0.0)
    assert taken(lane, 0.0) == [0, 1, 2]
    assert lane.nack([0], None, now=1.0) == []  # back after the backoff (1 s for attempt 1)
    failed = lane.fail(1)
    assert failed is not None and failed.seq == 1 and failed.attempt == 1
    assert lane.in_flight_count() == 1
    lane.tick(2.0)
    out, _ = lane.take(2.0)
    assert sent(out[A]) == [Sent(0, 0, 2)]
    lane.add(7, 0, now=2.0)
    assert lane.ack([7]) == [7] and lane.ready_count == 0  # settled before it was sent
    assert taken(lane, 2.0) == []


def test_a_quiet_topics_sparse_sequences_keep_their_order_and_floor() -> None:
    """A topic that gets one sequence in 10,000 of a busy node: its ready messages spread
    far apart, so the lane's window moves the old ones aside; nothing changes outside."""
    lane = make_lane(partitions=3)
    seqs = [7 + 10_000 * i for i in range(60)]
    for seq in seqs:
        lane.add(seq, seq % 3, now=0.0)
    assert len(lane) == 60 and lane.entries == {} and lane.floor() == seqs[0]
    assert len(lane._plain._w) <= 1 << 16  # (a dict holds the old ones, not a 600k span)
    assert all(seq in lane for seq in seqs) and seqs[0] + 1 not in lane
    lane.set_member(A, max_in_flight=25, batch_size=25)
    first = taken(lane, 0.0)
    assert first == seqs[:25]
    lane.ack(first[:10])
    assert lane.floor() == seqs[10]
    assert sorted(lane.seqs()) == seqs[10:]
    lane.ack(first[10:])
    assert taken(lane, 0.0) == seqs[25:50]


# -- take against a model -------------------------------------------------------------------


@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(
            st.sampled_from(
                ["add", "add", "run", "urgent", "old", "take", "ack", "nack", "ack_ready", "member"]
            ),
            st.integers(0, 1000),
        ),
        max_size=60,
    ),
)
@settings(max_examples=500)
def test_take_matches_a_model_of_urgency_and_credit(
    partitions: int, ops: list[tuple[str, int]]
) -> None:
    """One member or two, plain messages or not: ``take`` hands out the most urgent ready
    messages (priority, then sequence) of each member's partitions within its credit, with
    their attempt counts, and ``ack`` settles them. With only plain messages ready, take
    has a path of its own (the window's front, each message to its partition's owner,
    the heap's way from the first message whose owner is out of credit); this checks that
    both agree, with one member and with two. Runs of new
    plain messages join with ``add_plain`` (in order, or out of order as publishers on
    several threads may hand them in)."""
    lane = make_lane(partitions=partitions, retry_backoff_s=0.0)
    credit = {A: 4}
    lane.set_member(A, max_in_flight=4, batch_size=10)
    ready: dict[int, tuple[int, int]] = {}  # seq -> (priority, partition)
    in_flight: dict[int, tuple[bytes, int, int]] = {}  # seq -> (member, priority, partition)
    attempts: dict[int, int] = {}
    settled: list[int] = []
    seq = 0
    for op, arg in ops:
        if op in ("add", "urgent") or (op == "old" and not settled):
            seq += 1
            priority = 1 if op == "urgent" else 0
            lane.add(seq, seq % partitions, priority, now=0.0)
            ready[seq] = (priority, seq % partitions)
        elif op == "run":
            run: list[int] | range = list(range(seq + 1, seq + 2 + arg % 4))
            seq = run[-1]
            if arg % 3 == 0:
                run.reverse()  # type: ignore[union-attr]
            elif arg % 3 == 1:  # (consecutive publishes come as a range)
                run = range(run[0], seq + 1)
            lane.add_plain(PlainRun(run, [s % partitions for s in run]))
            ready.update({s: (0, s % partitions) for s in run})
        elif op == "old":  # a settled message owed again (a replayed dead letter)
            old = settled.pop(arg % len(settled))
            lane.add(old, old % partitions, now=0.0)
            ready[old] = (0, old % partitions)
        elif op == "take":
            limit = 1 + arg % 5
            got = lane.take(0.0, limit=limit)[0]
            expected: dict[bytes, list[int]] = {}
            left = limit
            for s in sorted(ready, key=lambda s: ready[s][0] * 10**9 + s):
                owner = lane.owner(ready[s][1])
                mine = expected.setdefault(owner, []) if owner is not None else []
                owing = sum(1 for m, _p, _q in in_flight.values() if m == owner)
                if owner is not None and left and owing + len(mine) < credit[owner]:
                    mine.append(s)
                    left -= 1
            expected = {m: v for m, v in expected.items() if v}
            assert {m: list(t.seqs) for m, t in got.items()} == expected
            for member, t in got.items():
                for s, partition, attempt in zip(t.seqs, t.partitions, t.attempts, strict=True):
                    priority, p = ready.pop(s)
                    assert partition == p
                    attempts[s] = attempts.get(s, 0) + 1
                    assert attempt == attempts[s]
                    in_flight[s] = (member, priority, p)
        elif op in ("ack", "nack") and in_flight:
            s = sorted(in_flight)[arg % len(in_flight)]
            _m, priority, p = in_flight.pop(s)
            if op == "ack":
                assert lane.ack([s]) == [s]
                settled.append(s)
                attempts.pop(s, None)
            else:
                assert lane.nack([s], 0.0, 0.0) == []
                ready[s] = (priority, p)
        elif op == "ack_ready" and ready:
            s = sorted(ready)[arg % len(ready)]
            del ready[s]
            assert lane.ack([s]) == [s]
            settled.append(s)
            attempts.pop(s, None)
        elif op == "member":  # a second member joins, or leaves (its messages go back)
            if B in lane.members:
                lane.remove_member(B, 0.0)
                del credit[B]
                for s in [s for s, v in in_flight.items() if v[0] == B]:
                    _m, priority, p = in_flight.pop(s)
                    ready[s] = (priority, p)
            else:
                lane.set_member(B, max_in_flight=2, batch_size=10)
                credit[B] = 2
        assert lane.ready_count == len(ready)
        assert lane.in_flight_count() == len(in_flight)
        assert len(lane) == len(ready) + len(in_flight)
        assert lane.floor() == min([*ready, *in_flight], default=seq + 1 if seq else 0)


def test_taking_a_long_backlog_from_the_front_keeps_the_window_small() -> None:
    """A backlog taken a little at a time from the front: what was taken is dropped from
    the window now and then, and the FIFOs stay in step."""
    lane = make_lane(partitions=4)
    lane.set_member(A, max_in_flight=100, batch_size=100)
    n = 10 * COMPACT_AFTER
    for seq in range(1, n + 1):
        lane.add(seq, seq % 4, now=0.0)
    out = []
    while lane.ready_count:
        [t] = lane.take(0.0, limit=100)[0].values()
        out += t.seqs
        assert lane.ack(t.seqs) == t.seqs
        # (the emptied front is dropped once it is half the window: 2 bytes a slot)
        assert len(lane._plain._w) <= max(2 * (n - len(out)), 2 * COMPACT_AFTER)
        assert sum(map(len, lane._fresh)) == lane.ready_count  # FIFOs hold no taken ones
    assert out == list(range(1, n + 1)) and lane.floor() == n + 1


# -- telling the producer which lanes have work -------------------------------------------


def test_a_lane_tells_when_it_gets_ready_messages_or_a_member_and_each_earlier_timer() -> None:
    # The producer's loop visits only the lanes that told it so: one that gets work and
    # does not say so would be stuck.
    lane = make_lane(ack_timeout_s=10.0)
    readied: list[Lane] = []
    timers: list[float] = []
    lane.on_ready = readied.append
    lane.on_timer = lambda _lane, at: timers.append(at)
    lane.add(1, 0, now=0.0)
    lane.add(2, 0, now=0.0)
    assert readied == [lane]  # once: from none ready to some
    lane.set_member(A, max_in_flight=10, batch_size=10)
    assert readied == [lane, lane]  # a member for its ready messages
    assert taken(lane, 1.0) == [1, 2] and timers == [11.0]  # their ack deadline
    lane.add_plain(PlainRun([3, 4], [0, 0]))
    assert readied == [lane] * 3
    assert taken(lane, 2.0) == [3, 4] and timers == [11.0]  # later than one it told of
    lane.add(5, 0, 0, now=2.0, not_before=5.0)  # delayed: a timer before the others
    lane.add(6, 0, 0, now=2.0, expires_at=4.0)
    assert timers == [11.0, 5.0, 4.0]
    lane._wake_at = float("inf")  # (what Producer.tick does before ticking it)
    lane.tick(4.5)  # 6 expired
    assert lane.next_wakeup() == 5.0


@given(st.lists(st.integers(0, 19), max_size=60), st.booleans())
def test_the_partitions_a_take_touched_as_bytes_or_as_a_list(values, as_bytes):
    # (a front taken for one member carries its partitions as bytes: searched, not walked)
    assert sorted(_distinct(bytes(values) if as_bytes else values, 20)) == sorted(set(values))


def test_the_partitions_a_take_touched_of_a_lane_past_256_partitions() -> None:
    # (keyless batches in the lane's first 256 partitions come as bytes; the lane has 300)
    values = bytes(range(0, 256, 5)) * 8
    assert sorted(_distinct(values, 300)) == list(range(0, 256, 5))


# -- runs held while the lane has no member -----------------------------------------------


def test_an_offline_lane_holds_its_runs_without_bytes_per_message() -> None:
    # A group that is away owes its whole backlog: as runs, not as slots per message.
    lane = make_lane(partitions=16)
    n = 1_000_000
    for first in range(1, n + 1, 1000):
        lane.add_plain(
            PlainRun(range(first, first + 1000), [s % 16 for s in range(first, first + 1000)])
        )
    assert len(lane) == lane.ready_count == n and lane.floor() == 1
    assert len(lane._plain._w) == 0 and sum(map(len, lane._fresh)) == 0 and len(lane._order) == 0
    assert 500_000 in lane and lane.state(500_000) is not None  # (a look joins them)
    assert sum(map(len, lane._fresh)) == n and len(lane) == n and lane.floor() == 1


def test_a_held_backlog_joins_the_arrays_one_run_at_a_time() -> None:
    # Each held run's columns are made as it joins: a member's arrival costs the lane's
    # arrays and one run's columns at a time, not every run's columns first.
    lane = make_lane(partitions=16)
    n, size = 200_000, 500
    for first in range(1, n + 1, size):
        lane.add_plain(PlainRun(range(first, first + size), [first % 16] * size))  # (a batch)
    tracemalloc.start()
    try:
        lane.set_member(A, max_in_flight=1000, batch_size=1000)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(map(len, lane._fresh)) == n and len(lane) == n
    assert peak - kept < 50 * size * 8  # (one run's columns, with room; all of them: 40 x)


@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.booleans(), st.sampled_from(["run", "add", "ack"])),
        min_size=1,
        max_size=12,
    )
)
@settings(max_examples=60, deadline=None)
def test_runs_held_offline_are_owed_and_handed_out_like_runs_joined_at_once(steps) -> None:
    # Reference: the same runs as lists of sequences, which always join the arrays at once.
    held, joined = make_lane(partitions=4), make_lane(partitions=4)
    seq, acked = 1, []
    for length, keyed, kind in steps:
        seqs = range(seq, seq + length)
        # (keyed: each its own; else a keyless batch's one partition)
        parts = [(s * 7 + 3) % 4 if keyed else seq % 4 for s in seqs]
        if kind == "run":
            held.add_plain(PlainRun(seqs, parts))
            joined.add_plain(PlainRun(list(seqs), parts))
        elif kind == "add":  # a message with a priority: an entry
            held.add(seq, parts[0], 1, now=0.0)
            joined.add(seq, parts[0], 1, now=0.0)
            seqs = range(seq, seq + 1)
        else:  # an ack of a ready message settles it (a group deleted, a purge)
            held.add_plain(PlainRun(seqs, parts))
            joined.add_plain(PlainRun(list(seqs), parts))
            assert list(held.ack([seq])) == list(joined.ack([seq])) == [seq]
            acked.append(seq)
        seq = seqs.stop
        assert len(held) == len(joined) and held.ready_count == joined.ready_count
        assert held.floor() == joined.floor()
    for lane in (held, joined):
        lane.set_member(A, max_in_flight=1000, batch_size=1000)
    out_held, out_joined = held.take(1.0), joined.take(1.0)
    owed = sorted(set(range(1, seq)) - set(acked))
    if not owed:  # (every message was acked: nothing is handed out)
        assert out_held[0] == out_joined[0] == {} and held.floor() == seq
        return
    assert sent(out_held[0][A]) == sent(out_joined[0][A])
    assert sorted(out_held[0][A].seqs) == owed
    assert held.ack(out_held[0][A].seqs) and len(held) == 0 and held.floor() == seq


def test_a_stored_run_read_back_offline_is_held_and_handed_out_as_stored() -> None:
    # A restart reads each run's partitions back as bytes (or a list past 255 partitions).
    held, joined = make_lane(partitions=3), make_lane(partitions=3)
    parts = bytes([2, 0, 1, 1, 0])
    held.add_stored(range(10, 15), parts)
    held.add_stored(range(15, 17), [2, 2])
    assert len(held) == 7 and held.floor() == 10 and sum(map(len, held._fresh)) == 0
    joined.add_plain(PlainRun(list(range(10, 17)), [*parts, 2, 2]))
    for lane in (held, joined):
        lane.set_member(A, max_in_flight=100, batch_size=100)
    assert sent(held.take(1.0)[0][A]) == sent(joined.take(1.0)[0][A])
