"""The runs' index: which run holds a sequence, found per run and per gap."""

from __future__ import annotations

from array import array
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from zmesh._engine.runs import Run, Runs, run_message, run_record
from zmesh._store.damage import decode_run


def _runs(spans: list[tuple[int, int]]) -> Runs:
    runs = Runs()
    for first, count in spans:
        runs.add(Run(first, count, "t", array("H", [0] * count), count, {}))
    return runs


@st.composite
def _layout(draw):
    """Disjoint runs (added in any order) and distinct sequences in and around them."""
    gaps = draw(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=8))
    spans, at = [], draw(st.integers(0, 3))
    for gap, count in gaps:
        at += gap
        spans.append((at, count))
        at += count
    order = draw(st.permutations(spans))
    seqs = draw(st.lists(st.integers(0, at + 5), unique=True, min_size=1))
    return order, seqs


@given(_layout())
def test_split_and_find_agree_with_a_scan_of_every_run(layout):
    spans, seqs = layout
    runs = _runs(spans)

    def holder(seq: int) -> int | None:
        return next((first for first, n in spans if first <= seq < first + n), None)
    singles, hits = runs.split(seqs)
    assert sorted(singles) == sorted(s for s in seqs if holder(s) is None)
    assert hits == dict(Counter(h for s in seqs if (h := holder(s)) is not None))
    for seq in seqs:
        found = runs.find(seq)
        assert (found.first if found else None) == holder(seq)


def test_gone_deletes_a_run_with_its_last_message_and_forgets_it():
    runs = _runs([(10, 5), (20, 5)])
    runs.by_first[10].left = 5
    batch = type("B", (), {"runs_del": []})()
    assert runs.gone([10, 11, 3], batch) == ([3], [])  # type: ignore[arg-type]
    assert batch.runs_del == [] and runs.by_first[10].left == 3
    assert runs.gone([12, 13, 14, 21], batch) == ([], [10])  # type: ignore[arg-type]
    assert batch.runs_del == [(10).to_bytes(8, "big")]
    assert runs.find(12) is None and runs.find(21) is not None and len(runs) == 1


def test_a_run_record_decodes_to_each_messages_fields():
    record = run_record(["t", [1, 0], ["k", None], {"h": 1}, 5.0, [b"a", b"b"], [7, 3]])
    fields = decode_run(record)
    assert fields is not None
    assert [run_message(fields, 0), run_message(fields, 1)] == [
        ("t", 1, "k", {"h": 1}, 0, 5.0, None, None, b"a", 7),
        ("t", 0, None, {"h": 1}, 0, 5.0, None, None, b"b", 3)]
    no_keys = decode_run(run_record(["t", [0], None, None, 5.0, [b"a"], [0]]))
    assert no_keys is not None and run_message(no_keys, 0)[2] is None
    for bad in (b"\xc1", run_record(["t", [0, 1], None, None, 5.0, [b"a"], [0, 1]]),
                run_record(["t", [], None, None, 5.0, [], []]),
                run_record(["t", [0], None, None, 5.0, ["text"], [0]])):
        assert decode_run(bad) is None
