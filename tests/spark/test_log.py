"""The bridge log on its own: runs and offsets, dedupe, reads, retention (time injected),
sink rows and ranges."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zmesh._store.acked import _masks as masks_of_list
from zmesh.spark import BridgeError, LogFullError
from zmesh.spark._log import BridgeLog
from zmesh.spark._runs import Run, columns, encode, messages
from zmesh.spark._seen import masks

P1 = bytes(range(16))
P2 = bytes(range(16, 32))
T0 = 1_000_000.0


def run(*seqs: int, producer: bytes = P1, keys: bool = True, size: int = 0) -> Run:
    """A run of the given sequences, each message's payload and key from its sequence."""
    return Run(
        producer,
        list(seqs),
        [T0 + s for s in seqs],
        [f"p{s}".encode() + b"x" * size for s in seqs],
        [f"k{s}" for s in seqs] if keys else None,
        [{"n": s} for s in seqs] if keys else None,
    )


def logged(log: BridgeLog, stream: str, start: int = 0, end: int = 1 << 40) -> list:
    """(offset, producer, seq, key, payload) of each message of ``stream`` in [start, end)."""
    first, runs = log.read(stream, start, end, 1 << 30)
    return [
        (m.offset, m.producer, m.seq, m.key, m.payload)
        for run_first, record in runs
        for m in messages(run_first, record)
        if first <= m.offset < end
    ]


@pytest.fixture
def blog(tmp_path: Path):
    log = BridgeLog(tmp_path / "log", map_size_bytes=64 << 20)
    yield log
    log.close()


def test_a_run_keeps_its_columns() -> None:
    r = run(5, 6, 9)
    record = encode(r, T0 + 1)
    c = columns(record)
    assert (c.appended_at, c.count, c.producer) == (T0 + 1, 3, P1)
    assert c.seq_list() == [5, 6, 9] and c.payload_list() == [b"p5", b"p6", b"p9"]
    assert c.time_list() == [T0 + 5, T0 + 6, T0 + 9]
    assert c.keys == ["k5", "k6", "k9"] and c.headers == [{"n": 5}, {"n": 6}, {"n": 9}]
    # consecutive sequences are kept as the first; no keys or headers: nothing kept
    plain = columns(
        encode(Run(P1, range(7, 10), [T0] * 3, [b"a", b"", b"c"], [None] * 3, [None] * 3), T0)
    )
    assert plain.seqs is None and plain.seq_list() == [7, 8, 9]
    assert (plain.keys, plain.headers) == (None, None)
    assert plain.payload_list() == [b"a", b"", b"c"]
    with pytest.raises(BridgeError, match="not a bridge log record"):
        columns(b"\0" * 12 + b"\xc1")


def test_offsets_per_partition_without_gaps(blog: BridgeLog) -> None:
    assert blog.append([("t/0", run(1, 3)), ("t/3", run(2)), ("u/0", run(4))], T0) == (4, 0)
    assert blog.streams() == {"t/0": (0, 2), "t/3": (0, 1), "u/0": (0, 1)}
    assert blog.append([("t/0", run(5, 6, 7))], T0) == (3, 0)
    assert logged(blog, "t/0") == [
        (0, P1, 1, "k1", b"p1"),
        (1, P1, 3, "k3", b"p3"),
        (2, P1, 5, "k5", b"p5"),
        (3, P1, 6, "k6", b"p6"),
        (4, P1, 7, "k7", b"p7"),
    ]
    assert blog.stat()["log"] == 4, "one record per run"
    sizes = blog.stream_sizes()
    assert sizes["t/0"][:2] == (0, 5) and sizes["t/0"][2] > 5 * len(b"p1")


def test_duplicates_are_dropped_by_message_id(blog: BridgeLog) -> None:
    blog.append([("t/0", run(1, 2))], T0)
    # redelivered: 2 again (in the same stream, or moved to another), 1 of another producer
    assert blog.append(
        [("t/0", run(2, 3)), ("t/1", run(2, 3000)), ("t/0", run(1, producer=P2))], T0
    ) == (3, 2)
    assert blog.streams() == {"t/0": (0, 4), "t/1": (0, 1)}
    assert [m[2] for m in logged(blog, "t/1")] == [3000]
    assert blog.append([("t/0", run(1, 2, 3))], T0) == (0, 3)
    assert blog.streams()["t/0"] == (0, 4)


def test_reads_find_the_run_holding_an_offset(blog: BridgeLog) -> None:
    blog.append([("t/0", run(*range(0, 4)))], T0)
    blog.append([("t/0", run(*range(4, 10))), ("t/1", run(100))], T0)
    assert [m[0] for m in logged(blog, "t/0", 3, 7)] == [3, 4, 5, 6]
    first, runs = blog.read("t/0", 5, 7, 100)
    assert first == 5 and [start for start, _r in runs] == [4], "the run holding 5..6"
    assert [start for start, _r in blog.read("t/0", 2, 10, 100)[1]] == [0, 4]
    assert [start for start, _r in blog.read("t/0", 2, 10, 2)[1]] == [0], "2 from offset 2"
    assert blog.read("t/0", 10, 20, 5) == (10, [])
    assert blog.read("nope/0", 0, 5, 5) == (0, [])
    assert len(blog.read("t/0", 0, 10, 100, max_bytes=1)[1]) == 1


def test_reopen_keeps_offsets_dedupe_and_id(tmp_path: Path) -> None:
    log = BridgeLog(tmp_path / "log")
    log_id = log.log_id
    log.append([("t/0", run(1, 2))], T0)
    with pytest.raises(BridgeError, match="in use"):
        BridgeLog(tmp_path / "log")
    log.close()
    log = BridgeLog(tmp_path / "log")
    assert log.log_id == log_id and len(log_id) == 8
    assert log.append([("t/0", run(2, 3)), ("t/9", run(4))], T0) == (2, 1)
    assert log.streams() == {"t/0": (0, 3), "t/9": (0, 1)}
    log.close()
    assert BridgeLog(tmp_path / "other").log_id != log_id


def test_read_only_handle_in_the_same_process_is_the_writer(
    blog: BridgeLog, tmp_path: Path
) -> None:
    blog.append([("t/0", run(1))], T0)
    blog.register()
    assert BridgeLog.open_reader(tmp_path / "log") is blog
    with pytest.raises(BridgeError, match="no bridge log"):
        BridgeLog.open_reader(tmp_path / "elsewhere")


def test_retention_waits_for_every_reader_of_the_topic(blog: BridgeLog) -> None:
    for i in range(0, 10, 2):  # runs of two: 0-1, 2-3, ... of t/0
        blog.append([("t/0", run(i, i + 1))], T0)
    blog.append([("u/0", run(*range(10, 15)))], T0)
    blog.set_watermark("q1", ["t"], {"t/0": 6}, T0)
    blog.set_watermark("q2", None, {"t/0": 5, "u/0": 5}, T0)
    # whole runs go: those below 5 on t/0 (0-1, 2-3), the run of u/0
    assert blog.prune(T0 + 10, retain_s=0) == 4 + 5
    assert blog.streams() == {"t/0": (4, 10), "u/0": (5, 5)}
    assert blog.read("t/0", 0, 10, 100)[0] == 4
    # watermarks only move forward; a reader without a mark for a stream holds it all
    blog.set_watermark("q2", None, {"t/0": 2}, T0)
    blog.set_watermark("q3", ["t"], {}, T0)
    assert blog.prune(T0 + 10, retain_s=0) == 0
    assert blog.drop_reader("q3")
    blog.set_watermark("q2", None, {"t/0": 9}, T0)
    assert blog.prune(T0 + 10, retain_s=0) == 2
    assert blog.streams()["t/0"] == (6, 10)


def test_the_dedupe_window_goes_with_the_runs_that_set_it(blog: BridgeLog) -> None:
    blog.append([("t/0", run(1, 2))], T0)
    blog.append([("t/0", run(2000, 2001))], T0 + 100)  # another chunk of sequences
    assert blog.stat()["seen"] == 2
    assert blog.prune(T0 + 50, retain_s=10) == 2
    assert blog.stat()["seen"] == 1, "the first chunk was set by the run pruned alone"
    assert blog.append([("t/0", run(1))], T0 + 100) == (1, 0), "forgotten with its run"
    assert blog.append([("t/0", run(2001))], T0 + 100) == (0, 1)
    while blog.prune(T0 + 1000, retain_s=0):
        pass
    assert blog.stat() == {"log": 0, "seen": 0, "sink": 0, "readers": 0}


def test_retention_floors_time_and_size(blog: BridgeLog) -> None:
    blog.append([("t/0", run(*range(5)))], T0)
    blog.append([("t/0", run(*range(5, 7)))], T0 + 100)
    blog.append([("t/0", run(*range(7, 10)))], T0 + 100)
    # no reader: only the floors apply
    assert blog.prune(T0 + 50, retain_s=60) == 0
    assert blog.prune(T0 + 61, retain_s=60) == 5
    assert blog.prune(T0 + 1000, retain_s=60, retain_records=3) == 2
    assert blog.streams()["t/0"] == (7, 10)
    assert blog.prune(T0 + 1000, retain_s=60, retain_records=2) == 0, "runs go whole"
    assert blog.prune(T0 + 1000, retain_s=60, max_delete=1) == 3
    assert blog.streams()["t/0"] == (10, 10)


def test_reader_ttl_forgets_silent_readers(blog: BridgeLog) -> None:
    blog.append([("t/0", run(*range(4)))], T0)
    blog.set_watermark("gone", None, {}, T0)
    assert blog.prune(T0 + 100, retain_s=0) == 0
    assert blog.prune(T0 + 100, retain_s=0, reader_ttl_s=50) == 4
    assert blog.readers() == {}


def test_sink_ids_and_ranges_are_remembered_for_a_window(blog: BridgeLog) -> None:
    blog.sink_put([(b"q:0:h1", "ab", 1), (b"q:0:h2", "ab", 2)], T0)
    blog.sink_put([(b"q:1:h1", "ab", 3)], T0 + 100)
    assert blog.sink_filter([b"q:0:h1", b"q:0:h3", b"q:1:h1"]) == {b"q:0:h1", b"q:1:h1"}
    blog.sink_put_ranges(b"q:0:3", [(0, 100, "ab", 10), (150, 200, "ab", 110)], T0)
    blog.sink_put_ranges(b"q:0:3", [(300, 400, "ab", 160)], T0 + 100)
    blog.sink_put_ranges(b"q:0:30", [(0, 1000, "ab", 300)], T0)
    assert blog.sink_covered(b"q:0:3", 50, 350) == [(50, 100), (150, 200), (300, 350)]
    assert blog.sink_covered(b"q:0:3", 100, 150) == []
    assert blog.sink_covered(b"q:0:3", 400, 500) == []
    assert blog.sink_prune(T0 + 50, window_s=10) == 5
    assert blog.sink_filter([b"q:0:h1", b"q:1:h1"]) == {b"q:1:h1"}
    assert blog.sink_covered(b"q:0:3", 0, 1000) == [(300, 400)]


def test_the_size_budget_leaves_room_to_prune(tmp_path: Path) -> None:
    log = BridgeLog(tmp_path / "log", map_size_bytes=1 << 20)
    try:
        runs = [(f"t/{i % 16}", run(*range(i * 10, i * 10 + 10), size=1500)) for i in range(100)]
        taken = 0
        while taken < len(runs):
            try:
                log.append(runs[taken : taken + 1], T0)
            except LogFullError:
                break
            taken += 1
        assert 0 < taken < len(runs)
        with pytest.raises(LogFullError):
            log.append(runs[taken : taken + 1], T0)
        assert sum(end for _h, end in log.streams().values()) == taken * 10, "nothing taken"
        while log.prune(T0 + 1, retain_s=0):
            pass
        assert log.append(runs[taken : taken + 1], T0) == (10, 0), "pruning made room again"
    finally:
        log.close()


@given(st.integers(0, 5000), st.integers(1, 40), st.integers(1, 400))
def test_a_stepped_range_marks_the_bits_of_its_sequences(start: int, step: int, n: int) -> None:
    seqs = range(start, start + step * n, step)
    assert masks(seqs) == masks_of_list(list(seqs))
