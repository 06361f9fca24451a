"""The runs' index: which run holds a sequence, found per run and per gap."""

from __future__ import annotations

import time
from array import array
from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zmesh._engine.engine import Engine
from zmesh._engine.lane.delivery import NO_SIZE_LIMIT, Timing
from zmesh._engine.lane.lane import Lane
from zmesh._engine.lane.plain import PlainRun
from zmesh._engine.outbox.records import run_message
from zmesh._engine.outbox.runs import (
    JOINED_MAX_MESSAGES,
    RUN_MAX_BYTES,
    Run,
    Runs,
    lane_entry,
    run_entry,
    run_record,
)
from zmesh._numbers import le_bytes
from zmesh._protocol.codec import LARGE_PAYLOAD_BYTES, pack_columns
from zmesh._store.damage import decode_run, run_offsets
from zmesh._store.store import Store, WriteBatch, pack, pend_key, unpackb
from zmesh.config import NodeConfig, TopicConfig


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
    # A range (a take from a window's front, an ack of consecutive sequences) is split
    # as its list is.
    span = range(min(seqs), max(seqs) + 1)
    assert runs.split(span) == runs.split(list(span))
    # Pieces cut ascending sequences where they enter or leave a run, in order.
    ordered = sorted(seqs)
    pieces = runs.pieces(ordered)
    assert sum(n for _first, n in pieces) == len(ordered)
    pos = 0
    for first, n in pieces:
        assert n > 0 and {holder(s) for s in ordered[pos : pos + n]} == {
            None if first < 0 else first
        }
        pos += n
    assert all(a != b or a < 0 for (a, _), (b, _) in pairwise(pieces))
    assert runs.pieces(span) == runs.pieces(list(span))


def test_gone_deletes_a_run_with_its_last_message_and_forgets_it():
    runs = _runs([(10, 5), (20, 5)])
    runs.by_first[10].left = 5
    runs.by_first[10].nbytes = 1234
    batch = WriteBatch()
    assert runs.gone([10, 11, 3], batch) == ([3], [])
    assert batch.runs_del == [] and runs.by_first[10].left == 3
    assert runs.gone([12, 13, 14, 21], batch) == ([], [10])
    assert batch.runs_del == [(10).to_bytes(8, "big")]
    assert batch.del_bytes == 1234  # (the store lets go of the pages a deletion maps)
    assert runs.find(12) is None and runs.find(21) is not None and len(runs) == 1
    runs.by_first[20].left = 1  # a run loaded at restart: its bytes are not known
    runs.gone([22], batch)
    assert batch.del_bytes == 1234 + RUN_MAX_BYTES


@given(
    sizes=st.lists(
        st.sampled_from([0, 1, 255, 256, 65535, LARGE_PAYLOAD_BYTES, 300_000]),
        min_size=1,
        max_size=JOINED_MAX_MESSAGES + 1,
    ),
    keys=st.booleans(),
    each_time=st.booleans(),
)
def test_a_run_record_with_large_payloads_is_the_bytes_msgpack_packs(sizes, keys, each_time):
    # Large payloads are joined into the record after their bin headers: the same bytes.
    n = len(sizes)
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    fields = [
        "t",
        array("H", [300] * n),
        [f"k{i}" for i in range(n)] if keys else None,
        {"h": 1},
        array("d", [5.0] * n) if each_time else 5.0,
        payloads,
        array("I", range(n)),
    ]
    record = run_record(fields)
    assert record == pack(
        [
            "t",
            le_bytes(fields[1]),
            fields[2],
            {"h": 1},
            5.0 if not each_time else le_bytes(fields[4]),
            payloads,
            le_bytes(fields[6]),
        ]
    )
    decoded = decode_run(record)
    assert decoded is not None and decoded[5] == payloads


def test_a_run_record_decodes_to_each_messages_fields():
    record = run_record(
        ["t", array("B", [1, 0]), ["k", None], {"h": 1}, 5.0, [b"a", b"b"], array("I", [7, 3])]
    )
    fields = decode_run(record)
    assert fields is not None
    assert [run_message(fields, 0), run_message(fields, 1)] == [
        ("t", 1, "k", {"h": 1}, 0, 5.0, None, None, b"a", 7),
        ("t", 0, None, {"h": 1}, 0, 5.0, None, None, b"b", 3),
    ]
    no_keys = decode_run(
        run_record(["t", array("H", [300]), None, None, 5.0, [b"a"], array("q", [1 << 40])])
    )
    assert no_keys is not None and run_message(no_keys, 0)[2] is None
    assert run_message(no_keys, 0)[1:10:8] == (300, 1 << 40)
    # One publish time per message (publishes gathered, batches joined): an array of
    # doubles, stored as their bytes.
    each = decode_run(
        run_record(
            [
                "t",
                array("B", [1, 0]),
                None,
                None,
                array("d", [5.0, 6.5]),
                [b"a", b"b"],
                array("I", [7, 3]),
            ]
        )
    )
    assert each is not None and each[4] == array("d", [5.0, 6.5])
    assert [run_message(each, i)[5] for i in (0, 1)] == [5.0, 6.5]
    # A record written with its partitions, indexes and times as lists (before they were
    # stored as their bytes) reads the same; a time written as an int reads as a float.
    older = decode_run(pack(["t", [1, 0], ["k", None], {"h": 1}, 5, [b"a", b"b"], [7, 3]]))
    assert older is not None and older[1:] == fields[1:] and type(older[4]) is float
    older = decode_run(pack(["t", [1, 0], None, None, [5.0, 6.5], [b"a", b"b"], [7, 3]]))
    assert older is not None and older[4] == each[4]
    for bad in (
        b"\xc1",
        pack(["t", [0, 1], None, None, 5.0, [b"a"], [0, 1]]),
        pack(["t", [], None, None, 5.0, [], []]),
        pack(["t", [0], None, None, 5.0, ["text"], [0]]),
        pack(["t", [0], None, None, 5.0, [b"a"], [-1]]),
        pack(["t", [0], None, None, 5.0, [b"a"], [None]]),
        pack(["t", b"\0" * 3, None, None, 5.0, [b"a"], b"\0" * 4]),  # 1 or 2 bytes each
        pack(["t", b"\0\0", None, None, 5.0, [b"a"], b"\0" * 5]),
        pack(["t", b"\0\0", None, None, 5.0, [b"a"], b"\xff" * 8]),  # int64 -1
        pack(["t", b"\0", None, None, b"\0" * 7, [b"a"], b"\0"]),  # times: 8 bytes each
        pack(["t", b"\0", None, None, [5.0, 6.0], [b"a"], b"\0"]),
        pack(["t", b"\0", None, None, ["5"], [b"a"], b"\0"]),
        pack(["t", b"\0", None, None, None, [b"a"], b"\0"]),
    ):
        assert decode_run(bad) is None


@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.data())
def test_a_lane_entry_from_the_owed_count_is_the_one_a_scan_finds(sizes, data):
    # Runs of consecutive sequences added to a lane, some taken, some of those acked (in
    # order or not): the entry written from the owed count is what a look at every
    # sequence of the run gives.
    lane = Lane("t", "g", producer=b"P" * 16, partitions=4, timing=Timing())
    lane.set_member(b"A" * 16, max_in_flight=1000, batch_size=1000)
    runs, at = [], 0
    for size in sizes:
        seqs = list(range(at, at + size))
        lane.add_plain(PlainRun(seqs, [s % 4 for s in seqs]))
        runs.append(Run(at, size, "t", array("H", [s % 4 for s in seqs]), size, {}))
        at += size
    taken = sorted(lane.take(0.0)[0][b"A" * 16].seqs)
    cut = data.draw(st.integers(0, len(taken)))
    acked = (
        taken[:cut]
        if data.draw(st.booleans())
        else data.draw(st.lists(st.sampled_from(taken), unique=True))
        if taken
        else []
    )
    lane.ack(acked)
    for run in runs:
        owed = len(lane.owed_among(run.seqs()))
        fast = lane_entry(lane, run, owed)
        assert fast == lane_entry(lane, run)
        if fast is not None:
            parts, offsets, attempts = unpackb(fast)
            if type(offsets) is list:  # (a tail owed is the offset it starts from)
                assert not (offsets[-1] == run.count - 1 and len(offsets) == run.count - offsets[0])
            offsets = run_offsets(offsets, run.count)
            owed_seqs = [run.first + o for o in offsets] if offsets is not None else run.seqs()
            assert owed_seqs == lane.owed_among(run.seqs()) and attempts is None


@given(st.lists(st.integers(1, 30), min_size=1, max_size=4), st.data())
def test_what_the_counts_say_others_owe_agrees_with_asking_each_lane(sizes, data):
    # Three lanes owe runs (and a few messages of no run past them), each having acked
    # some; for any sequences, the runs' counts split them into those no other lane owes
    # and those to ask about, and asking about the latter gives what a scan gives.
    lanes = [
        Lane("t", f"g{i}", producer=b"P" * 16, partitions=4, timing=Timing()) for i in range(3)
    ]
    total = sum(sizes) + 5
    spans, at = [], 0
    for size in [*sizes, 5]:
        spans.append(range(at, at + size))
        at += size
    for lane in lanes:
        lane.set_member(b"A" * 16, max_in_flight=1000, batch_size=1000)
        lane.add_plain(PlainRun(list(range(total)), [s % 4 for s in range(total)]))
        lane.take(0.0)
        for span in spans:  # of each run: none, one, all but one, all or some acked
            how = data.draw(st.sampled_from(["none", "one", "all but one", "all", "some"]))
            one = data.draw(st.sampled_from(list(span)))
            acked = {
                "none": [],
                "one": [one],
                "all but one": [s for s in span if s != one],
                "all": list(span),
            }.get(how)
            lane.ack(
                data.draw(st.lists(st.sampled_from(list(span)), unique=True))
                if acked is None
                else acked
            )
    runs, at = Runs(), 0
    for size in sizes:
        run = Run(
            at,
            size,
            "t",
            array("H", [s % 4 for s in range(at, at + size)]),
            size,
            {i: len(lane.owed_among(list(range(at, at + size)))) for i, lane in enumerate(lanes)},
        )
        runs.add(run)
        at += size
    seqs = data.draw(st.lists(st.integers(0, total - 1), unique=True))
    others = [1, 2]
    free, check = runs.owed_elsewhere(seqs, others)
    asked = [s for s in check if not any(s in lanes[i].owed_among([s]) for i in others)]
    assert sorted(free + asked) == sorted(
        s for s in seqs if not any(lanes[i].owed_among([s]) for i in others)
    )
    assert set(free).isdisjoint(check) and set(free) | set(check) <= set(seqs)
    span = range(min(seqs, default=0), max(seqs, default=-1) + 1)
    free_of, check_of = runs.owed_elsewhere(span, others)
    assert (free_of, list(check_of)) == tuple(map(list, runs.owed_elsewhere(list(span), others)))


def _stored_runs(tmp_path, batches: list[list[bytes]]):
    """An engine (its IO thread not started) that stored ``batches`` as runs of a topic
    with one group, one loop iteration each, and their first sequences."""
    eng = Engine(
        NodeConfig(
            name="p",
            mesh="unit",
            data_dir=str(tmp_path / "p"),
            mdns=False,
            topics={"t": TopicConfig(groups=("g",))},
        )
    )
    eng.queue.state = "running"  # (publishes are prepared; nothing wakes a thread)
    now = time.monotonic()
    wb = WriteBatch()
    for topic, cfg in eng.outbox.lanes.topics.items():
        eng.outbox.set_topic(topic, cfg, wb, now)
    eng.commits.commit(wb, [])
    firsts = []
    for payloads in batches:
        pubs = eng.queue.prepare(
            "t", payloads, [None] * len(payloads), None, 0, None, None, 16, 5.0
        )
        firsts.append(pubs[0].seq)
        nxt = WriteBatch()  # (staged as the IO thread stages what it drained)
        eng.commits.store_pubs(WriteBatch(), pubs, [], now, nxt)
        eng.commits.commit(nxt, [])
    return eng, firsts


@pytest.mark.parametrize(
    ("sizes", "inline"),
    [
        ([1000] * 60, True),  # 60 KB in all: inside the header
        ([1000] * 600, False),  # past INLINE_PAYLOAD_BYTES together
        ([1000] * 59 + [LARGE_PAYLOAD_BYTES], False),  # one run holds a large payload
    ],
)
def test_columns_of_runs_know_their_payloads_travel_inline(tmp_path, sizes, inline):
    """A take of several runs knows from the runs' payload bytes, with no look at each,
    whether its payloads all travel inside a batch's header; the frames are the same
    either way."""
    payloads = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    eng, firsts = _stored_runs(tmp_path, [payloads[i : i + 30] for i in range(0, len(sizes), 30)])
    try:
        seqs = range(firsts[0], firsts[0] + len(sizes))
        columns = eng.outbox.records.run_columns(seqs, NO_SIZE_LIMIT)
        assert columns is not None and list(columns.payloads) == payloads
        assert columns.inline is inline
        parts = [p % 16 for p in seqs]
        assert pack_columns(seqs, parts, *columns[:5], all_inline=columns.inline) == pack_columns(
            seqs, parts, *columns[:5]
        )
    finally:
        eng.queue.state = "new"
        eng.close()


def test_columns_of_a_scattered_take_are_those_of_its_places(tmp_path):
    """A take of one member's partitions (a scatter across runs, a sequence alone between
    gaps too) gets each column's values at its sequences' places, as a take of them all
    has them."""
    payloads = [str(i).encode() for i in range(200)]
    eng, firsts = _stored_runs(tmp_path, [payloads[i : i + 50] for i in range(0, 200, 50)])
    try:
        every = range(firsts[0], firsts[0] + 200)
        whole = eng.outbox.records.run_columns(every, NO_SIZE_LIMIT)
        assert whole is not None
        for mine in ({1, 2, 5, 11}, {0}, {15}, set(range(16)) - {7}):
            seqs = [s for s in every if s % 16 in mine]
            columns = eng.outbox.records.run_columns(seqs, NO_SIZE_LIMIT)
            assert columns is not None
            places = [s - every[0] for s in seqs]
            for got, full in zip(columns[:5], whole[:5], strict=True):
                assert list(got) == [full[i] for i in places]
    finally:
        eng.queue.state = "new"
        eng.close()


def test_run_entries_read_back_with_their_partitions_as_bytes_or_as_lists(tmp_path):
    """A ``pruns`` value holds its run's partitions as a byte each, or as a list when one
    is past 255 (as every entry written before did): each reads back as an array; the
    offsets owed as a list, or as the one a tail starts from (a range); one that is
    neither, or whose offsets or attempts do not fit its run, is set aside as damaged."""
    store = Store(str(tmp_path), 1 << 24)
    try:
        batch = WriteBatch()
        parts = array("B", [3, 0, 255])
        batch.prun_put += [
            (pend_key(1, 100), run_entry(parts, [0, 2])),
            (pend_key(1, 200), run_entry(array("H", [3, 0, 65535]))),
            (pend_key(1, 300), pack([[3, 0, 7], None, None])),  # written before
            (pend_key(1, 310), run_entry(parts, 1)),  # the tail from 1
            (pend_key(1, 320), pack([[3, 0, 7], [1, 2], None])),  # before
            (pend_key(1, 330), run_entry(parts, [1], [2])),
            (pend_key(1, 400), pack([5, None, None])),
            (pend_key(1, 500), pack([[], None, None])),
        ]
        # Damaged offsets or attempts: past the run, negative, out of order, not ints, a
        # tail that owes nothing, attempts not one per offset.
        batch.prun_put += [
            (pend_key(1, 600 + i), pack([b"\3\0\7", offsets, attempts]))
            for i, (offsets, attempts) in enumerate(
                [
                    ([3], None),
                    ([-1, 0], None),
                    ([2, 1], None),
                    ([0.0], None),
                    ([], None),
                    (3, None),
                    (-1, None),
                    (True, None),
                    ([0, 1], [1]),
                    (None, [1, 2]),
                    ([0], [-1]),
                ]
            )
        ]
        store.commit(batch)
        entries = [
            (first, parts.typecode, list(parts), offsets, attempts)
            for _lane, first, (parts, offsets, attempts) in store.iter_pruns()
        ]
        assert entries == [
            (100, "B", [3, 0, 255], [0, 2], None),
            (200, "H", [3, 0, 65535], None, None),
            (300, "B", [3, 0, 7], None, None),
            (310, "B", [3, 0, 255], range(1, 3), None),
            (320, "B", [3, 0, 7], [1, 2], None),
            (330, "B", [3, 0, 255], [1], [2]),
        ]
        assert sorted(int.from_bytes(c.key[4:], "big") for c in store.take_corrupt()) == [
            400,
            500,
            *range(600, 611),
        ]
    finally:
        store.close()
