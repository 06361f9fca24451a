"""The wall clock as this node observed it (IO thread only): what the times it judges by
count, so that a step of the wall clock (NTP setting a board that booted with a stale
clock, an operator's ``date -s``) never expires an idle group, reclaims retained
messages or forgets the publish-id window early, and never holds them back for the size
of a step either.

Each heartbeat compares how far the wall clock moved with how far the monotonic one did;
a difference past ``CLOCK_STEP_TOLERANCE_S`` is a step. The node keeps ``skew``, the sum
of the steps it saw: ``wall - skew`` is its *observed* time, which moves only as the
monotonic clock does. Idle groups' stamps and the publish-id window's are observed
times. Retained messages keep the wall time they were published at (readers see it), so
the steps are also kept with the first sequence published after each: retention takes
off a message's age the steps after it (``stepped_since``).

A start reads what the node before it last saved (``meta["wall_clock"]``: after its
start, after each step, and every ``CLOCK_SAVE_S``): on the same boot the monotonic clock
went on meanwhile, and what the wall clock moved beyond it is a step; after a reboot the
time the node was down is not known, and is not counted (the whole move of the wall
clock since the save is taken as a step).
"""

from __future__ import annotations

import logging

from ..._store.store import pack, unpackb
from ..limits import CLOCK_SAVE_S, CLOCK_STEP_TOLERANCE_S, CLOCK_STEPS_KEPT

log = logging.getLogger(__name__)

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot of the machine ('' where it cannot be told): the monotonic clock of one
    boot goes on across the node's restarts."""
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError:
        return ""


def step_between(wall_moved: float, mono_moved: float) -> float:
    """The step of the wall clock in an interval (0.0: none past the tolerance)."""
    step = wall_moved - mono_moved
    return step if abs(step) > CLOCK_STEP_TOLERANCE_S else 0.0


class WallClock:
    """The steps of the wall clock this node saw, and its observed time."""

    def __init__(self) -> None:
        self.skew = 0.0  # the sum of the steps seen: wall - observed
        self.steps: list[tuple[int, float]] = []  # (first seq published after, step)
        self._wall = 0.0  # at the last beat (0.0: none yet)
        self._mono = 0.0
        self._seq = 0
        self._boot = ""
        self._unsaved = True  # (changed since ``changed`` last gave it)
        self._saved_mono = 0.0  # the monotonic clock when it last did

    def observed(self, wall: float) -> float:
        """``wall`` (a reading of the wall clock now) on the observed clock."""
        return wall - self.skew

    def to_wall(self, observed: float) -> float:
        """An observed time on the wall clock as it is now (for operators)."""
        return observed + self.skew

    def stepped_since(self, seq: int) -> float:
        """How far the wall clock stepped after ``seq`` was published."""
        return sum(step for first, step in self.steps if first > seq)

    def start(self, stored: bytes | None, wall: float, mono: float, boot: str, seq: int) -> float:
        """Take up the clock from what the node before last saved, with adjacent
        readings of both clocks and the next sequence; returns the step found (0.0: none,
        or a move of the wall clock across a reboot, not counted as one)."""
        self._boot = boot
        if stored is None:  # (a new store, or one from before the wall clock was kept)
            self._mark(wall, mono, seq)
            return 0.0
        try:
            skew, last_wall, last_mono, last_boot, steps = unpackb(stored)
            self.skew = float(skew)
            self.steps = [(int(first), float(step)) for first, step in steps]
        except (ValueError, TypeError):
            log.warning("the stored state of the wall clock is unreadable: started anew")
            self._mark(wall, mono, seq)
            return 0.0
        same_boot = bool(boot) and boot == last_boot and mono >= last_mono
        ran = mono - last_mono if same_boot else 0.0
        step = step_between(wall - last_wall, ran)
        if step > 0 and not same_boot:
            # (the machine restarted: how long the node was down is not known)
            self._add(step, seq)
            log.info(
                "the machine restarted since this node last ran: the %.0fs the wall clock "
                "moved meanwhile are not counted as groups' idle time, messages' retention "
                "or the publish-id window",
                step,
            )
            step = 0.0
        elif step:
            self._stepped(step, seq, "since the node last ran")
        self._mark(wall, mono, seq)
        return step

    def beat(self, wall: float, mono: float, seq: int) -> float:
        """A heartbeat's adjacent readings of both clocks and the next sequence; returns
        the step since the last beat (0.0: none)."""
        step = step_between(wall - self._wall, mono - self._mono) if self._wall else 0.0
        if step:
            # Messages published between the beats were stamped before or after the
            # step: taken as before it for a step forward, after it for one back, so
            # that retention takes none of them for older than it is.
            self._stepped(step, seq if step > 0 else self._seq, "")
        self._mark(wall, mono, seq)
        return step

    def changed(self) -> bytes | None:
        """What a start takes the clock up from (kept in ``meta["wall_clock"]``), when it
        is to be saved: after the start, after a step, and ``CLOCK_SAVE_S`` after the last
        save. Readings from any time after the last step tell a start on the same boot
        the steps made since; after a reboot, the time since the last save is not
        counted, so it is saved now and then, not at every beat (a write a beat would
        also take, on a full disk, the room kept for settlements)."""
        if not self._unsaved and self._mono - self._saved_mono < CLOCK_SAVE_S:
            return None
        self._unsaved = False
        self._saved_mono = self._mono
        return pack([self.skew, self._wall, self._mono, self._boot, self.steps])

    def _stepped(self, step: float, seq: int, when: str) -> None:
        self._add(step, seq)
        log.warning(
            "the wall clock stepped by %+.0fs%s; idle groups, retention and the publish-id "
            "window count the time this node observed, TTLs and schedules follow the wall "
            'clock (docs/operations.md, "Clock steps")',
            step,
            f" {when}" if when else "",
        )

    def _add(self, step: float, seq: int) -> None:
        self._unsaved = True
        self.skew += step
        self.steps.append((seq, step))
        del self.steps[:-CLOCK_STEPS_KEPT]

    def _mark(self, wall: float, mono: float, seq: int) -> None:
        self._wall, self._mono, self._seq = wall, mono, seq
