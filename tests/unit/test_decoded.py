"""Records kept decoded until sent (and for the other lanes of a topic): bounded, oldest
out first, and only when trimmed (between dispatch calls). Batch columns kept packed for
the other lanes: bounded, the newest kept."""

from __future__ import annotations

from zmesh._engine.outbox.cache import Decoded, Packed
from zmesh._engine.outbox.record import Record


def fields(payload: bytes) -> Record:
    return Record("t", 0, None, None, 0, 1.0, None, None, payload, 0)


def test_kept_records_stay_under_the_limit_and_the_oldest_go_first() -> None:
    kept = Decoded(limit=1620)
    for seq in range(10):
        kept.keep(seq, fields(bytes(100)))  # 540 bytes each as counted
    assert len(kept.fields) == 10  # a dispatch call in progress loses nothing it counted on
    kept.trim()
    assert list(kept.fields) == [7, 8, 9]
    assert kept.bytes == 1620
    kept.forget([8])
    kept.forget([8, 3])  # settled twice (another lane's expiry), or dropped already
    assert list(kept.fields) == [7, 9] and kept.bytes == 1080
    kept.keep(10, fields(bytes(2000)))  # larger than the limit: nothing stays
    kept.trim()
    assert not kept.fields and kept.bytes == 0


def test_packed_columns_stay_under_the_limit_and_the_newest_stay() -> None:
    packed = Packed(limit=2000)
    for first in range(0, 50, 10):  # 300 bytes each, and 400 of their keys
        packed.keep(tuple(range(first, first + 10)), (bytes(100), (bytes(150),), [bytes(50)]))
    # Past the limit, the oldest go until half of it is left (their keys counted: a
    # tuple of sequences takes about a third as much again as the columns of small messages).
    assert [key[0] for key in packed.columns] == [40] and packed.bytes == 700
    got = packed.get(tuple(range(40, 50)))
    assert got is not None and got[1] == (bytes(150),)
    packed.keep(range(50, 60), (bytes(100), (bytes(150),), [bytes(50)]))  # (a range: no key)
    assert packed.bytes == 1000 and packed.get(range(0, 10)) is None
