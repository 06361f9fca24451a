"""SeqQueue: the lanes' FIFO of sequence numbers, across its compactions."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from zmesh._engine.lane.blocks import (
    MOST_BLOCKS,
    block_parts,
    blocks,
    by_partition,
    cut,
    joined_blocks,
    one_block,
    slots_of,
)
from zmesh._engine.lane.plain import compact
from zmesh._engine.lane.seqqueue import (
    COMPACT_AFTER,
    SPARSE,
    STRETCH,
    WINDOW_MIN,
    SentWindow,
    SeqQueue,
    SeqWindow,
    consecutive_array,
    slot_partitions,
)
from zmesh._engine.outbox.allocate import allocate as _allocate


def _window(mapping: dict[int, int]) -> SeqWindow:
    w = SeqWindow()
    for seq, partition in mapping.items():
        w.put(seq, partition)
    return w


def _sent(*seqs: int) -> SentWindow:
    sent = SentWindow()
    for seq in seqs:
        sent.put_many([seq], [0], [b"m"], 1.0)
    return sent


def test_first_skips_what_is_no_longer_owed_and_survives_compaction() -> None:
    q = SeqQueue()
    n = 3 * COMPACT_AFTER
    for seq in range(n):
        q.append(seq)
    owed = _window({seq: 0 for seq in range(n) if seq % 7 == 0})
    seen = []
    while (first := q.first_in(owed)) is not None:
        seen.append(first)
        q.popleft()
        assert owed.pop(first) == 0
    assert seen == [seq for seq in range(n) if seq % 7 == 0]
    assert len(q) == 0 and q.first_in(_window({n: 0})) is None
    q.append(n)
    assert q.first_in(_window({n: 0})) == n and len(q) == 1


def test_insort_keeps_order_behind_the_front() -> None:
    q = SeqQueue()
    for seq in (5, 9, 12):
        q.append(seq)
    q.popleft()
    q.insort(7)
    assert not q.append(12) and not q.append(3) and len(q) == 3  # only above the last
    owed = [
        q.first_owed(SeqWindow(), _sent(*(s for s in (7, 9, 12) if s >= k)), {}) for k in (0, 8, 10)
    ]
    assert owed == [7, 9, 12]
    assert q.first_owed(_window({12: 3}), SentWindow(), {9: 0}) == 12  # (9 dropped before)


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
            owed = _window(dict.fromkeys(model[skip:], 0))
            first = q.first_in(owed)
            model = model[skip:]
            assert first == (model[0] if model else None)
            if model:
                q.popleft()
                model.pop(0)
        assert len(q) == len(model)


@given(
    st.lists(
        st.tuples(st.integers(0, 200), st.sampled_from(["window", "sent", "entry"])),
        min_size=1,
        max_size=30,
    )
)
def test_first_owed_skips_long_settled_runs(runs: list[tuple[int, str]]) -> None:
    """Runs of settled sequences, each followed by one owed from the window, the sent map
    or the entries, settled in turn."""
    q, window, sent, entries, owed, seq = SeqQueue(), SeqWindow(), SentWindow(), {}, [], 0
    for gap, where in runs:
        for s in range(seq, seq + gap + 1):
            q.append(s)
        seq += gap
        {
            "window": lambda s: window.put(s, 0),
            "sent": lambda s: sent.put_many([s], [0], [b"m"], 1.0),
            "entry": lambda s: entries.__setitem__(s, 0),
        }[where](seq)
        owed.append(seq)
        seq += 1
    for expected in owed:
        assert q.first_owed(window, sent, entries) == expected
        window.pop(expected), sent.pop(expected), entries.pop(expected, None)
    assert q.first_owed(window, sent, entries) is None and len(q) == 0


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.integers(1, 3 * STRETCH), st.integers(0, 3)), min_size=1, max_size=6),
    st.lists(
        st.tuples(st.integers(0, 3 * STRETCH * 4), st.sampled_from(["window", "sent"])), max_size=40
    ),
    st.booleans(),
)
def test_first_owed_past_stretches_matches_one_by_one(
    stretches: list[tuple[int, int]], owed: list[tuple[int, str]], aside: bool
) -> None:
    """A queue of consecutive stretches with gaps between them, some of its sequences in
    the ready window or the sent one (long settled runs between them, wherever they fall
    against ``STRETCH``), settled in turn: the first owed is the one a look at each
    sequence finds, with the windows alone (passed a stretch at a time) or with an entry
    aside (one by one)."""
    q, queued, seq = SeqQueue(), [], 0
    for length, gap in stretches:
        for s in range(seq, seq + length):
            q.append(s)
            queued.append(s)
        seq += length + gap
    window, sent, entries = SeqWindow(), SentWindow(), {}
    where = {}
    for place, kind in owed:
        target = queued[place % len(queued)]
        if target not in where:
            where[target] = kind
            if kind == "window":
                window.put(target, 0)
            else:
                sent.put_many([target], [0], [b"m"], 1.0)
    if aside and queued[-1] + 1 not in where:  # past every queued one: changes nothing
        entries[queued[-1] + 1] = 0
    for expected in sorted(where):
        assert q.first_owed(window, sent, entries) == expected
        assert len(q) == len(queued) - queued.index(expected)
        window.pop(expected)
        sent.pop(expected)
    assert q.first_owed(window, sent, entries) is None and len(q) == 0


def test_drop_front_drops_only_the_front_in_order() -> None:
    q = SeqQueue()
    for seq in range(10):
        q.append(seq)
    for not_front in ([1, 2], [0, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], []):
        q.drop_front(not_front)
        assert len(q) == 10
    q.drop_front([0, 1, 2])
    assert len(q) == 7 and q.first_owed(SeqWindow(), _sent(*range(10)), {}) == 3


def _check(w: SeqWindow, model: dict[int, int]) -> None:
    assert len(w) == len(model) and bool(w) == bool(model)
    assert sorted(w) == sorted(model)
    # What a lane owes: the window's entries, or those of its sent window and entries.
    probe = sorted({s + d for s in model for d in (-1, 0, 1)} | {-1, 0})
    assert w.owed_among(probe, SentWindow(), {}) == [s for s in probe if s in model]
    assert w.owed_among(probe, _sent(-1, 0), {probe[-1]: 0}) == [
        s for s in probe if s in model or s in (-1, 0, probe[-1])
    ]
    # A run's consecutive sequences, partly in either window, partly beyond both.
    sent = _sent(*[s + 1 for s in model if s + 1 not in model])
    for first in {-2, *(s - 3 for s in model)}:
        span = list(range(first, first + 9))
        assert (
            w.owed_in(first, 9, sent, {})
            == w.owed_among(span, sent, {})
            == [s for s in span if s in model or s in sent]
        )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "run", "pop", "has"]), st.integers(0, 3), st.integers(0, 12)
        ),
        max_size=80,
    )
)
@settings(max_examples=1000)
def test_window_matches_a_dict(ops: list[tuple[str, int, int]]) -> None:
    """Single puts, runs (consecutive or not, into an empty window or continuing it),
    pops and lookups."""
    w, model = SeqWindow(), {}
    for op, partition, seq in ops:
        if op == "put" and seq not in model:
            w.put(seq, partition)
            model[seq] = partition
        elif op == "run":
            run = [s for s in range(seq, seq + 2 + partition) if s not in model]
            if run:
                w.put_run(run, [s % 4 for s in run], array("H", [s % 4 + 1 for s in run]))
                model.update((s, s % 4) for s in run)
        elif op == "pop":
            assert w.pop(seq) == model.pop(seq, None)
        else:
            assert (seq in w) == (seq in model)
        _check(w, model)


def test_window_keeps_older_entries_below_its_base() -> None:
    """An entry below the base (an old sequence owed again) stays found after the window
    empties and starts again, also when it grows back over that entry's place."""
    w = SeqWindow()
    w.put(10, 1)
    w.put(5, 2)  # below the base: kept aside
    assert w.pop(10) == 1  # the window is empty, the old entry is not
    w.put(3, 0)
    w.put(6, 0)
    assert 5 in w and sorted(w) == [3, 5, 6]
    assert w.pop(5) == 2 and 5 not in w and len(w) == 2


@given(st.lists(st.integers(1, 3 * WINDOW_MIN), min_size=1, max_size=40), st.integers(0, 4095))
def test_window_of_a_quiet_topic_moves_old_entries_aside(gaps: list[int], partition: int) -> None:
    """Sequences far apart (one topic of a busy node) never make the window large."""
    w, model, seq = SeqWindow(), {}, 0
    for gap in gaps:
        seq += gap
        w.put(seq, partition)
        model[seq] = partition
        assert len(w._w) <= max(WINDOW_MIN, SPARSE * len(model)) + 1
    _check(w, model)
    for s in list(model):
        assert s in w and w.pop(s) == model.pop(s)
    _check(w, model)


def test_window_of_a_dense_backlog_costs_two_bytes_per_message() -> None:
    w = SeqWindow()
    n = 200_000
    for seq in range(10, 10 + n):
        w.put(seq, seq % 16)
    assert len(w) == n and not w._old and len(w._w) == n
    for seq in range(10, 10 + n, 2):  # taken from the front of each partition
        assert w.pop(seq) == seq % 16
    assert len(w) == n // 2 and 11 in w and 10 not in w
    w.put(10 + n, 3)  # the front is dropped only when the window would grow sparse
    assert w.pop(10 + n) == 3 and w.pop(10 + n) is None


def test_front_shows_what_take_front_removes_and_leaves_it() -> None:
    w = SeqWindow()
    for seq in (5, 6, 8, 9, 12):
        w.put(seq, seq % 3)
    assert w.front(3) == ([5, 6, 8], [2, 0, 2], None)  # (not consecutive: no slots)
    assert len(w) == 5 and 5 in w  # nothing removed
    assert w.take_front(3) == ([5, 6, 8], [2, 0, 2], None)
    assert w.front(10) == ([9, 12], [0, 0], None) and len(w) == 2
    assert w.take_front(10) == ([9, 12], [0, 0], None) and not w
    assert w.front(1) == ([], [], None)


def test_a_consecutive_front_comes_as_a_range_with_its_slots() -> None:
    w = SeqWindow()
    w.put_run(
        list(range(20, 30)),
        [300 if s == 25 else s % 4 for s in range(20, 30)],
        array("H", [301 if s == 25 else s % 4 + 1 for s in range(20, 30)]),
    )
    seqs, partitions, slots = w.front(4)
    # (partitions below 255 as bytes, a byte each, the way a batch carries them)
    assert (seqs, partitions, slots) == (
        range(20, 24),
        bytes([0, 1, 2, 3]),
        array("H", [1, 2, 3, 4]),
    )
    assert w.take_front(8) == (
        range(20, 28),
        [0, 1, 2, 3, 0, 300, 2, 3],
        array("H", [1, 2, 3, 4, 1, 301, 3, 4]),
    )
    assert len(w) == 2 and w.front(5)[0] == range(28, 30)


@given(st.lists(st.integers(1, 65535), max_size=50))
def test_slot_partitions(slots: list[int]) -> None:
    assert list(slot_partitions(array("H", slots))) == [v - 1 for v in slots]


# Partitions of a run: batches of one partition each (keyless), or each message's own
# (keys), sometimes past 255.
_batches = st.lists(st.tuples(st.integers(0, 19), st.integers(1, 30)), min_size=1, max_size=8)
_partitions = _batches.map(lambda bs: [p for p, n in bs for _ in range(n)]) | st.lists(
    st.integers(0, 19) | st.integers(0, 400), min_size=1, max_size=120
)


def _blocks_model(partitions: list[int]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for i, p in enumerate(partitions):
        if out and out[-1][0] == p:
            out[-1] = (p, out[-1][1], i + 1)
        else:
            out.append((p, i, i + 1))
    return out


@given(_partitions)
def test_blocks_of_one_partition(partitions: list[int]) -> None:
    """A run's stretches of one partition, from a list, bytes or an array of "B"; None
    past MOST_BLOCKS of them or with a partition past 255."""
    want = _blocks_model(partitions)
    found = blocks(partitions)
    if len(want) > MOST_BLOCKS or max(partitions) > 255:
        assert found is None
        return
    assert found == want
    assert blocks(bytes(partitions)) == want and blocks(array("B", partitions)) == want
    assert blocks(array("H", partitions)) is None  # (two bytes each: not looked at)


@given(st.lists(_batches.map(lambda bs: [p for p, n in bs for _ in range(n)]), max_size=5))
def test_blocks_known_from_batches_are_those_found(runs: list[list[int]]) -> None:
    """Blocks passed on, not looked for: those of batches joined into one run, and of a
    run cut into pieces, are what ``blocks`` finds in their partitions; a run's stored
    partitions are made from them."""
    whole = [p for run in runs for p in run]
    joined = joined_blocks([(blocks(run), len(run)) for run in runs])
    assert joined == blocks(whole) == _blocks_model(whole)
    assert joined_blocks([(None, 3), (one_block(1, 2), 2)]) is None  # (keys: not known)
    if whole:
        assert list(block_parts(joined)) == whole
        for start in range(0, len(whole), 7):
            end = min(len(whole), start + 11)
            assert cut(joined, start, end) == _blocks_model(whole[start:end])


def test_partitions_held_in_little_memory() -> None:
    # Blocks (keyless batches: a tuple each, whatever their length), else a byte each, else
    # two (keys: past MOST_BLOCKS, or past partition 255).
    assert compact([5] * 4) == [(5, 0, 4)] == compact(bytes([5, 5, 5, 5]))
    assert compact([1, 1, 2]) == [(1, 0, 2), (2, 2, 3)] == compact(array("B", [1, 1, 2]))
    keyed = [k % 7 for k in range(MOST_BLOCKS + 1)]
    assert compact(keyed) == bytes(keyed) == compact(array("B", keyed))
    assert compact(array("H", [300, 1])) == array("H", [300, 1]) == compact([300, 1])


@given(st.integers(0, 10_000), _partitions)
def test_by_partition_and_slots_a_block_at_a_time_or_not(first, partitions):
    seqs = list(range(first, first + len(partitions)))
    found = blocks(partitions)
    split = by_partition(array("q", seqs), partitions, found)
    assert split == by_partition(array("q", seqs), partitions, None)  # (a step each)
    assert len(split) >= max(partitions) + 1 and not any(split[max(partitions) + 1 :])
    for p, part in enumerate(split):
        assert list(part) == [s for s, q in zip(seqs, partitions, strict=True) if q == p]
    assert list(slots_of(partitions, found)) == [p + 1 for p in partitions]
    assert list(slots_of(partitions, None)) == [p + 1 for p in partitions]


def _allocate_each(
    partitions: list[int], next_index: dict[int, int], firsts: dict[int, int]
) -> list[int]:
    """``Indexes.allocate``, one message at a time: the model ``_allocate`` must match."""
    out = []
    for partition in partitions:
        index = next_index.get(partition, 0)
        next_index[partition] = index + 1
        out.append(index)
        firsts.setdefault(partition, index)
    return out


@given(
    _partitions,
    st.dictionaries(
        st.integers(0, 400), st.integers(0, 1000) | st.integers((1 << 32) - 30, (1 << 32) + 30)
    ),
    st.dictionaries(st.integers(0, 400), st.integers(0, 1000), max_size=3),
)
def test_indexes_a_block_at_a_time_match_one_at_a_time(partitions, next_index, firsts):
    """Indexes of batches (a range per block of one partition) or of keyed messages match
    those made one message at a time; indexes past 2**32 come as int64."""
    want_next, want_firsts = dict(next_index), dict(firsts)
    want = _allocate_each(partitions, want_next, want_firsts)
    indexes, found = _allocate(partitions, next_index, firsts)
    assert list(indexes) == want and found == blocks(partitions)
    assert indexes.typecode == ("I" if max(want) < 1 << 32 else "q")
    assert (next_index, firsts) == (want_next, want_firsts)


@given(st.integers(0, (1 << 63) - 1), st.integers(0, 10_000))
def test_an_array_of_consecutive_sequences_is_what_array_makes_of_the_range(first, n):
    n = min(n, (1 << 63) - first)
    assert consecutive_array(range(first, first + n)) == array("q", range(first, first + n))


def _sent_check(w: SentWindow, model: dict[int, tuple[int, bytes, float]]) -> None:
    assert len(w) == len(model) and bool(w) == bool(model)
    assert sorted(w) == sorted(model)
    for seq in {s + d for s in model for d in (-1, 0, 1)}:
        assert (seq in w) == (seq in model) and w.get(seq) == model.get(seq)
    for member in (b"a", b"b", b"c"):
        assert w.to(member) == {s for s, state in model.items() if state[1] == member}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "run", "many", "pop", "pop_run", "pop_run_of", "pops"]),
            st.integers(0, 200),
            st.integers(1, 12),
            st.integers(0, 2),
        ),
        max_size=80,
    )
)
@settings(max_examples=1000)
def test_sent_window_matches_a_dict(ops: list[tuple[str, int, int, int]]) -> None:
    """Single puts (the heap's way), runs of consecutive sequences (a take of the front),
    single pops and consecutive pops (acks), against a dict of the same states."""
    w, model = SentWindow(), {}
    members = [b"a", b"b", b"c"]
    for op, seq, n, m in ops:
        deadline = float(seq + n)
        if op == "put" and seq not in model:
            w.put_many([seq], [n % 5], [members[m]], deadline)
            model[seq] = (n % 5, members[m], deadline)
        elif op == "run":
            run = range(seq, seq + n)
            if any(s in model for s in run):
                continue  # (a take puts sequences not in flight)
            # (m 0: all to one member, a shared group's keyless batch; else mixed)
            whose = [members[(m + s) % 3] if m else members[0] for s in run]
            if w.put_run(seq, array("H", [s % 7 + 1 for s in run]), whose, deadline):
                model.update((s, (s % 7, who, deadline)) for s, who in zip(run, whose, strict=True))
            else:  # (not above the window: the lane puts them one by one)
                assert seq - w._base < len(w._w)
        elif op == "many":  # (the heap's way: ascending or not, gaps, below the window)
            seqs = [
                s for s in dict.fromkeys(range(seq + n, seq - n, -3)) if s >= 0 and s not in model
            ]
            states = [(s % 5, members[(m + s) % 3], deadline) for s in seqs]
            w.put_many(seqs, [st[0] for st in states], [st[1] for st in states], deadline)
            model.update(zip(seqs, states, strict=True))
        elif op == "pop":
            assert w.pop(seq) == model.pop(seq, None)
        elif op == "pops":  # (acks of one member of several: not consecutive)
            seqs = [*range(seq, seq + 3 * n, 2 + m), seq]  # (a repeat: popped once)
            found, by = w.pop_many(seqs)
            popped = [model.pop(s, None) for s in seqs]
            assert [bool(f) for f in found] == [p is not None for p in popped]
            assert by == {
                mb: sum(1 for p in popped if p and p[1] == mb) for mb in {p[1] for p in popped if p}
            }
        elif op == "pop_run":
            run = range(seq, seq + n)
            if w.pop_run(seq, n):
                for s in run:
                    del model[s]
            else:  # (some not in the window: the lane pops them one by one)
                assert not all(s in model and s not in w._old for s in run)
        elif op == "pop_run_of":  # (one member of several acking a batch it was sent)
            run = range(seq, seq + n)
            to = w.pop_run_of(seq, n)
            whose = {model[s][1] if s in model else None for s in run}
            if to is not None:
                assert whose == {to}
                for s in run:
                    del model[s]
            else:
                assert len(whose) > 1 or None in whose or any(s in w._old for s in run)
        _sent_check(w, model)


def test_sent_window_pops_a_run_only_when_all_of_it_is_there() -> None:
    w = SentWindow()
    assert w.put_run(10, array("H", [1, 2, 3, 4]), [b"a"] * 4, 2.0)
    assert not w.put_run(12, array("H", [1]), [b"a"], 3.0)  # (not above it)
    assert w.pop(11) == (1, b"a", 2.0)
    assert not w.pop_run(10, 3) and len(w) == 3  # 11 is gone: nothing done
    assert w.pop_run(12, 2) and w.pop_run(10, 1) and not w
    assert not w.pop_run(10, 1)


def test_sent_window_of_a_stuck_message_moves_it_aside() -> None:
    """One message in flight far below many sent and acked after it (a member that never
    acks it, until its deadline): the window stays small, the message found."""
    w = SentWindow()
    w.put_many([0], [3], [b"slow"], 9.0)
    seq = 1
    for _ in range(3 * WINDOW_MIN // 500):
        assert w.put_run(seq, array("H", [1]) * 500, [b"fast"] * 500, 1.0)
        assert w.pop_run(seq, 500)
        seq += 500
        assert len(w._w) <= 2 * WINDOW_MIN
    assert len(w) == 1 and w.get(0) == (3, b"slow", 9.0) and w.to(b"slow") == {0}
    assert w.pop(0) == (3, b"slow", 9.0) and not w
