"""SeqQueue: the lanes' FIFO of sequence numbers, across its compactions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zmesh._engine.seqqueue import COMPACT_AFTER, SeqQueue


def test_first_skips_what_is_no_longer_owed_and_survives_compaction() -> None:
    q = SeqQueue()
    n = 3 * COMPACT_AFTER
    for seq in range(n):
        q.append(seq)
    owed = {seq: 0 for seq in range(n) if seq % 7 == 0}
    seen = []
    while (first := q.first_in(owed)) is not None:
        seen.append(first)
        q.popleft()
        del owed[first]
    assert seen == [seq for seq in range(n) if seq % 7 == 0]
    assert len(q) == 0 and q.last() is None
    q.append(n)
    assert q.first(lambda s: True) == n and len(q) == 1


def test_insort_keeps_order_behind_the_front() -> None:
    q = SeqQueue()
    for seq in (5, 9, 12):
        q.append(seq)
    q.popleft()
    q.insort(7)
    assert [q.first(lambda s, k=k: s >= k) for k in (0, 8, 10)] == [7, 9, 12]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=300))
def test_matches_a_plain_list(ops: list[tuple[bool, int]]) -> None:
    q, model, nxt = SeqQueue(), [], 0
    for add, skip in ops:
        if add:
            for _ in range(skip + 1):
                q.append(nxt)
                model.append(nxt)
                nxt += 1
        else:
            owed = dict.fromkeys(model[skip:], 0)
            first = q.first_in(owed)
            model = model[skip:]
            assert first == (model[0] if model else None)
            if model:
                q.popleft()
                model.pop(0)
        assert len(q) == len(model)
