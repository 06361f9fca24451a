"""The bridge log on its own: offsets, dedupe, reads, retention (time injected), sink ids."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from zmesh.spark import BridgeError
from zmesh.spark._log import BridgeLog, Incoming

P1 = bytes(range(16))
P2 = bytes(range(16, 32))
T0 = 1_000_000.0


def msg(seq: int, stream: str = "t/0", producer: bytes = P1) -> Incoming:
    return Incoming(stream, producer, seq, f"k{seq}", {"n": seq}, T0 + seq, f"p{seq}".encode())


@pytest.fixture
def blog(tmp_path: Path):
    log = BridgeLog(tmp_path / "log", map_size_bytes=64 << 20)
    yield log
    log.close()


def test_offsets_per_partition_without_gaps(blog: BridgeLog) -> None:
    assert blog.append([msg(1), msg(2, "t/3"), msg(3), msg(4, "u/0")], T0) == (4, 4, 0)
    assert blog.streams() == {"t/0": (0, 2), "t/3": (0, 1), "u/0": (0, 1)}
    first, recs = blog.read("t/0", 0, 10, 100)
    assert first == 0 and len(recs) == 2
    producer, seq, key, headers, published_at, appended_at, payload = msgpack.unpackb(recs[1])
    assert (producer, seq, key, headers, payload) == (P1, 3, "k3", {"n": 3}, b"p3")
    assert published_at == T0 + 3 and appended_at == T0


def test_duplicates_are_dropped_by_message_id(blog: BridgeLog) -> None:
    blog.append([msg(1), msg(2)], T0)
    assert blog.append([msg(2), msg(3), msg(1, producer=P2), msg(3)], T0) == (4, 2, 2)
    assert blog.streams()["t/0"] == (0, 4)


def test_reads_respect_bounds_and_limits(blog: BridgeLog) -> None:
    blog.append([msg(i) for i in range(10)] + [msg(100, "t/1")], T0)
    assert [len(blog.read("t/0", 3, 7, 100)[1])] == [4]
    assert blog.read("t/0", 3, 100, 100)[1][-1] == blog.read("t/0", 9, 10, 1)[1][0]
    assert len(blog.read("t/0", 0, 10, 3)[1]) == 3
    assert blog.read("t/0", 10, 20, 5) == (10, [])
    assert blog.read("nope/0", 0, 5, 5) == (0, [])
    assert len(blog.read("t/0", 0, 10, 100, max_bytes=1)[1]) == 1


def test_reopen_keeps_offsets_and_dedupe(tmp_path: Path) -> None:
    log = BridgeLog(tmp_path / "log")
    log.append([msg(1), msg(2)], T0)
    with pytest.raises(BridgeError, match="in use"):
        BridgeLog(tmp_path / "log")
    log.close()
    log = BridgeLog(tmp_path / "log")
    assert log.append([msg(2), msg(3), msg(4, "t/9")], T0) == (3, 2, 1)
    assert log.streams() == {"t/0": (0, 3), "t/9": (0, 1)}
    log.close()


def test_read_only_handle_in_the_same_process_is_the_writer(blog: BridgeLog,
                                                            tmp_path: Path) -> None:
    blog.append([msg(1)], T0)
    blog.register()
    assert BridgeLog.open_reader(tmp_path / "log") is blog
    with pytest.raises(BridgeError, match="no bridge log"):
        BridgeLog.open_reader(tmp_path / "elsewhere")


def test_retention_waits_for_every_reader_of_the_topic(blog: BridgeLog) -> None:
    blog.append([msg(i) for i in range(10)] + [msg(i, "u/0") for i in range(10, 15)], T0)
    blog.set_watermark("q1", ["t"], {"t/0": 6}, T0)
    blog.set_watermark("q2", None, {"t/0": 4, "u/0": 5}, T0)
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
    # deleted ids leave the dedupe window with their records
    assert blog.stat()["ids"] == 4


def test_retention_floors_time_and_size(blog: BridgeLog) -> None:
    blog.append([msg(i) for i in range(5)], T0)
    blog.append([msg(i) for i in range(5, 10)], T0 + 100)
    # no reader: only the floors apply
    assert blog.prune(T0 + 50, retain_s=60) == 0
    assert blog.prune(T0 + 61, retain_s=60) == 5
    assert blog.prune(T0 + 1000, retain_s=60, retain_records=3) == 2
    assert blog.streams()["t/0"] == (7, 10)
    assert blog.prune(T0 + 1000, retain_s=60, max_delete=1) == 1
    assert blog.streams()["t/0"] == (8, 10)


def test_reader_ttl_forgets_silent_readers(blog: BridgeLog) -> None:
    blog.append([msg(i) for i in range(4)], T0)
    blog.set_watermark("gone", None, {}, T0)
    assert blog.prune(T0 + 100, retain_s=0) == 0
    assert blog.prune(T0 + 100, retain_s=0, reader_ttl_s=50) == 4
    assert blog.readers() == {}


def test_sink_ids_are_remembered_for_a_window(blog: BridgeLog) -> None:
    blog.sink_put([(b"q:0:0:0", "ab", 1), (b"q:0:0:1", "ab", 2)], T0)
    blog.sink_put([(b"q:1:0:0", "ab", 3)], T0 + 100)
    assert blog.sink_filter([b"q:0:0:0", b"q:0:0:2", b"q:1:0:0"]) == {b"q:0:0:0", b"q:1:0:0"}
    assert blog.sink_prune(T0 + 50, window_s=10) == 2
    assert blog.sink_filter([b"q:0:0:0", b"q:1:0:0"]) == {b"q:1:0:0"}


def test_the_size_budget_leaves_room_to_prune(tmp_path: Path) -> None:
    log = BridgeLog(tmp_path / "log", map_size_bytes=1 << 20)
    try:
        big = [Incoming(f"t/{i % 16}", P1, i, None, None, T0, b"x" * 1500) for i in range(1000)]
        taken, added, _dups = log.append(big, T0)
        assert 0 < taken == added < 1000
        assert log.append(big[taken:], T0)[0] == 0, "full: nothing more is taken"
        while log.prune(T0 + 1, retain_s=0):
            pass
        assert log.append(big[taken:], T0)[0] > 0, "pruning made room again"
    finally:
        log.close()
