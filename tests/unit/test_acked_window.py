"""The consumer's dedupe window in a real LMDB store: bitmaps per chunk of sequences."""

from __future__ import annotations

from pathlib import Path

import lmdb
from hypothesis import given, settings
from hypothesis import strategies as st

from zmesh._store.acked import CHUNK
from zmesh._store.batch import WriteBatch
from zmesh._store.store import Store

P1, P2 = b"\x01" * 16, b"\x02" * 16
LANES = (b"g", b"gg")  # one a prefix of the other: keys must not mix them up

# Acks as they come (any order, repeats), runs of consecutive sequences across chunk
# bounds (what one member acks, mostly), and runs with a hole filled by a repeat.
runs_st = st.builds(
    lambda first, n: list(range(first, first + n)),
    st.integers(0, 3 * CHUNK),
    st.integers(1, 2 * CHUNK + 3),
)
seqs_st = st.one_of(
    st.lists(st.one_of(st.integers(0, 3 * CHUNK), st.integers(0, 2**40)), max_size=60),
    runs_st,
    st.builds(
        lambda run, i: run[: i % len(run)] + [run[0]] + run[i % len(run) + 1 :],
        runs_st.filter(lambda run: len(run) > 2),
        st.integers(1, 10**6),
    ),
)
step_st = st.one_of(
    st.tuples(st.just("ack"), st.sampled_from((P1, P2)), st.sampled_from(LANES), seqs_st),
    st.tuples(
        st.just("prune"),
        st.sampled_from((P1, P2)),
        st.sampled_from(LANES),
        st.integers(0, 4 * CHUNK),
    ),
)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(step_st, min_size=1, max_size=12))
def test_window_answers_like_a_set_of_acks(tmp_path_factory, steps) -> None:
    """Against a model: every ack since the last prune below it is remembered, nothing
    that was not acked is, a prune drops whole chunks below the floor (its own chunk
    stays), and reopening keeps the window and its tops."""
    path = tmp_path_factory.mktemp("acked")
    store = Store(str(path), 1 << 26)
    ever: dict[tuple[bytes, bytes], set[int]] = {}  # acked at some point
    kept: dict[tuple[bytes, bytes], set[int]] = {}  # acked, no prune may have dropped it
    gone: dict[tuple[bytes, bytes], set[int]] = {}  # acked, then dropped by a prune
    try:
        for kind, producer, lane, arg in steps:
            wb = WriteBatch()
            at = (producer, lane)
            if kind == "ack":
                wb.seen_put.append((producer, lane, list(arg)))
                ever.setdefault(at, set()).update(arg)
                kept.setdefault(at, set()).update(arg)
                gone.setdefault(at, set()).difference_update(arg)
            else:
                wb.seen_prune.append((producer, arg, lane))
                kept[at] = {s for s in kept.get(at, ()) if s >= arg}
                gone.setdefault(at, set()).update(
                    s for s in ever.get(at, ()) if s < arg - arg % CHUNK
                )
            store.commit(wb)
        for reopen in (False, True):
            if reopen:
                store.close()
                store = Store(str(path), 1 << 26)
            tops = store.window_state().tops
            for (producer, lane), seqs in ever.items():
                found = store.seen_filter(producer, lane, sorted(seqs | {s + 1 for s in seqs}))
                assert kept[(producer, lane)] <= found <= seqs
                assert not found & gone.get((producer, lane), set())
                assert tops.get((producer, lane.decode())) == (max(found) if found else None)
            assert set(tops) <= {(p, ln.decode()) for p, ln in ever}
    finally:
        store.close()


def test_a_store_with_one_entry_per_ack_is_migrated_at_open(tmp_path: Path) -> None:
    """A store from before the bitmaps: its ``seen`` entries answer the same afterwards,
    and the old db is gone."""
    store = Store(str(tmp_path), 1 << 24)
    store.close()
    old = [(P1, 5, b"g"), (P1, CHUNK + 7, b"g"), (P2, 3, b"gg"), (P1, 9, b"gg")]
    env = lmdb.open(str(tmp_path / "store"), max_dbs=16, subdir=True)
    seen = env.open_db(b"seen")
    with env.begin(write=True, db=seen) as txn:
        for producer, seq, lane in old:
            txn.put(producer + seq.to_bytes(8, "big") + lane, b"")
    env.close()

    store = Store(str(tmp_path), 1 << 24)
    try:
        assert store.seen_filter(P1, b"g", [4, 5, 6, CHUNK + 7, 9]) == {5, CHUNK + 7}
        assert store.seen_filter(P1, b"gg", [5, 9]) == {9}
        assert store.seen_filter(P2, b"gg", [3, 5]) == {3}
        assert store.window_state().tops == {(P1, "g"): CHUNK + 7, (P1, "gg"): 9, (P2, "gg"): 3}
        with store.env.begin() as txn:
            assert txn.get(b"seen") is None  # the main db no longer names it
    finally:
        store.close()
