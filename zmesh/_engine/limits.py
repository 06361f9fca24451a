"""The engine's timing and bound constants, in one place (tests may shrink them)."""

from __future__ import annotations

# Publishes that may wait for the IO thread. A publisher that gets further ahead waits for
# it: this gives the IO thread the GIL, and keeps the queued publishes (memory, and the
# garbage collector's work over them) bounded. Small enough that the IO thread gets the GIL
# every few milliseconds of publishing, to send and settle as well as store; large enough
# that the hand-offs between the threads and the loop's work per iteration are shared by
# many publishes: with members' credit as a window (lane.py) that keeps frames on their
# way, 2,000 cut a producer's CPU per message by a sixth against 500.
MAX_AHEAD_MSGS = 2000
# Payload bytes of the same (a publish larger than this waits until none is queued): large
# payloads queue a few MiB at a time, not 2,000 of them.
MAX_AHEAD_BYTES = 16 << 20
MAX_PUBS_PER_LOOP = 10_000  # publishes staged in one loop iteration (one LMDB transaction)
