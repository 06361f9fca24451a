"""The wall clock as a node observed it (outbox/wallclock.py), with both clocks passed in:
steps seen between beats and across restarts, the observed time they leave, and what
they take off retained messages' ages."""

from __future__ import annotations

import logging

import pytest

from zmesh._engine.limits import CLOCK_SAVE_S
from zmesh._engine.outbox.retention import Head, reclaimable
from zmesh._engine.outbox.wallclock import WallClock, step_between
from zmesh.config import TopicConfig

DAY = 86400.0
YEAR = 365 * DAY
BOOT = "b00t"


def started(wall: float = 1000.0, mono: float = 50.0, seq: int = 0) -> WallClock:
    clock = WallClock()
    assert clock.start(None, wall, mono, BOOT, seq) == 0.0
    return clock


def test_a_step_is_what_the_wall_clock_moved_beyond_the_monotonic_one() -> None:
    assert step_between(10.5, 10.0) == 0.0  # (within the tolerance: drift, two readings)
    assert step_between(30 * DAY + 10.0, 10.0) == 30 * DAY
    assert step_between(-10 * YEAR + 10.0, 10.0) == -10 * YEAR


def test_beats_see_steps_and_the_observed_time_goes_on_with_the_monotonic_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = started()
    assert clock.beat(1001.0, 51.0, 0) == 0.0
    assert clock.observed(1001.0) == 1001.0
    with caplog.at_level(logging.WARNING):
        assert clock.beat(1002.0 + 30 * DAY, 52.0, 5) == 30 * DAY
    assert "the wall clock stepped by +2592000s" in caplog.text
    assert clock.observed(1002.0 + 30 * DAY) == 1002.0
    assert clock.beat(1003.0 + 30 * DAY - 10 * YEAR, 53.0, 9) == -10 * YEAR
    assert clock.observed(1003.0 + 30 * DAY - 10 * YEAR) == 1003.0
    assert clock.to_wall(1003.0) == 1003.0 + 30 * DAY - 10 * YEAR


def test_retention_takes_the_steps_after_a_publish_off_its_age() -> None:
    clock = started(seq=1)
    clock.beat(1001.0, 51.0, 3)  # seqs 1, 2 published before the step forward
    clock.beat(1002.0 + DAY, 52.0, 5)  # 3, 4 between the beats: taken as before it
    clock.beat(1003.0 + DAY, 53.0, 7)  # 5, 6 published after it
    clock.beat(1004.0 + DAY - YEAR, 54.0, 8)  # 7 between the beats: taken as after it
    assert [clock.stepped_since(seq) for seq in (1, 4, 5, 6, 7)] == [
        DAY - YEAR,
        DAY - YEAR,
        -YEAR,
        -YEAR,
        0.0,
    ]
    cfg = TopicConfig(retention_s=3600)
    heads = [Head(1, 0, 0, 10, 1000.5), Head(7, 0, 1, 10, 1003.5 + DAY - YEAR)]

    def kept(wall: float) -> int:
        n = reclaimable(
            heads,
            wall=wall,
            cfg=cfg,
            retained_bytes=20,
            owed=lambda _s: False,
            stepped=clock.stepped_since,
        )
        return len(heads) - n

    now = 1005.0 + DAY - YEAR  # (4.5 s of observed time after the first publish)
    assert kept(now) == 2
    assert kept(now + 3600) == 0  # (neither stepped ahead nor held back a year)


def test_a_start_on_the_same_boot_sees_a_step_while_the_node_was_stopped() -> None:
    clock = started()
    clock.beat(1010.0, 60.0, 4)
    stored = clock.changed()
    again = WallClock()  # stopped 100 s, and the clock stepped a month meanwhile
    assert again.start(stored, 1110.0 + 30 * DAY, 160.0, BOOT, 4) == 30 * DAY
    assert again.observed(1110.0 + 30 * DAY) == 1110.0
    assert again.stepped_since(3) == 30 * DAY
    quiet = WallClock()
    assert quiet.start(stored, 1110.0, 160.0, BOOT, 4) == 0.0
    assert quiet.observed(1110.0) == 1110.0


def test_after_a_reboot_the_time_the_node_was_down_is_not_counted() -> None:
    clock = started()
    clock.beat(1010.0, 60.0, 4)
    stored = clock.changed()
    forward = WallClock()  # (not a step it can tell: not counted as one)
    assert forward.start(stored, 1010.0 + 30 * DAY, 5.0, "another", 4) == 0.0
    assert forward.observed(1010.0 + 30 * DAY) == 1010.0
    back = WallClock()  # a board without a real-time clock, back in 2000
    assert back.start(stored, 1010.0 - 10 * YEAR, 5.0, "another", 4) == -10 * YEAR
    assert back.observed(1010.0 - 10 * YEAR) == 1010.0


def test_an_unreadable_stored_clock_starts_anew() -> None:
    clock = WallClock()
    assert clock.start(b"\xc1", 1000.0, 5.0, BOOT, 0) == 0.0
    assert clock.observed(1000.0) == 1000.0


def test_the_clock_is_saved_after_its_start_and_each_step_and_now_and_then() -> None:
    clock = started()
    assert clock.changed() is not None  # (the start)
    clock.beat(1001.0, 51.0, 0)
    assert clock.changed() is None  # (no write a beat: a full disk's room is kept)
    clock.beat(1002.0 + DAY, 52.0, 0)
    saved = clock.changed()
    assert saved is not None and WallClock().start(saved, 1003.0 + DAY, 53.0, BOOT, 0) == 0.0
    clock.beat(1002.0 + DAY + CLOCK_SAVE_S, 52.0 + CLOCK_SAVE_S, 0)
    assert clock.changed() is not None
