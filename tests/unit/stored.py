"""What a producer's LMDB store holds, read back db by db for the unit tests of the
engine's parts to compare (no tests here)."""

from __future__ import annotations

from zmesh._store.damage import decode_run
from zmesh._store.store import Store, unpackb


def msgs(store: Store) -> dict[int, list]:
    """The ``msgs`` db: sequence -> record fields."""
    with store.env.begin(db=store.msgs) as txn:
        return {int.from_bytes(k, "big"): unpackb(v) for k, v in txn.cursor()}


def runs(store: Store) -> dict[int, list]:
    """The ``runs`` db: first sequence -> decoded run record."""
    with store.env.begin(db=store.runs) as txn:
        return {int.from_bytes(k, "big"): decode_run(v) or [] for k, v in txn.cursor()}


def pend(store: Store) -> dict[tuple[int, int], tuple]:
    """The ``pend`` db: (lane id, seq) -> (partition, priority, attempt, expires_at,
    deliver_at)."""
    return {(lane, seq): value for lane, seq, value in store.iter_pending()}


def pruns(store: Store) -> dict[tuple[int, int], tuple]:
    """The ``pruns`` db: (lane id, first) -> (partitions, offsets, attempts), partitions
    as a list."""
    return {
        (lane, first): (list(parts), offsets, attempts)
        for lane, first, (parts, offsets, attempts) in store.iter_pruns()
    }


def db_keys(store: Store, name: str) -> list[bytes]:
    """The keys of one of the store's dbs."""
    with store.env.begin(db=getattr(store, name)) as txn:
        return [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)]
