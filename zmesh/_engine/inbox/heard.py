"""When each producer was last heard from, for the consumer's dedupe window (IO thread).

The window (_store/acked.py) keeps a few chunks of bits per (producer, lane) until the
producer's floor passes them; a producer that never sends again never moves its floor,
so a consumer whose producers come and go (a worker with a new data dir, and so a new
node id, for each run) would keep their chunks, and its own entries of them, for good.
A producer that sent this node nothing for ``dedupe_window_s`` is forgotten: running,
it would have sent again what it never received the ack of within its ack timeout,
long before; one back after longer (its data dir kept) may deliver once more what was
acked just before it went silent. Time is the wall clock's observed time (wallclock.py), so
a clock step forgets no one, and the last-heard times are saved (every HEARD_SAVE_S
while a producer sends) so that a restart forgets no one early.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..._store.batch import WriteBatch
from ..limits import HEARD_SAVE_S


class ProducersHeard:
    """Producers of batches to this node's groups, and when each was last heard from."""

    def __init__(self, saved: dict[bytes, float], unsaved: Iterable[bytes]) -> None:
        """``saved``: the times the store holds; ``unsaved``: producers the window holds
        chunks of with no time (a store written before times were kept): heard now."""
        self._at = dict(saved)  # (the clock's observed time)
        self._saved = dict(saved)
        self._fresh: set[bytes] = {p for p in unsaved if p not in saved}

    def heard(self, producer: bytes) -> None:
        """A batch of ``producer``'s arrived (or this node acked one)."""
        self._fresh.add(producer)

    def sweep(self, observed: float, window_s: float, wb: WriteBatch) -> list[bytes]:
        """Note who was heard since the last sweep (their times to ``wb`` when the saved
        one is HEARD_SAVE_S old), and return the producers not heard from for
        ``window_s``, forgotten here and in the store (``wb.seen_forget``)."""
        at, saved = self._at, self._saved
        for producer in self._fresh:
            at[producer] = observed
            if observed - saved.get(producer, float("-inf")) >= HEARD_SAVE_S:
                saved[producer] = wb.seen_heard[producer] = observed
        self._fresh.clear()
        gone = [p for p, t in at.items() if observed - t > window_s]
        for producer in gone:
            del at[producer]
            saved.pop(producer, None)
        wb.seen_forget.extend(gone)
        return gone
