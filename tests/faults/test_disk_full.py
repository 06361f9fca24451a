"""A full disk is a state: publishes are held, settlements commit, nothing wedges, also
after kill -9 and a restart on the still-full disk. The disk is a real tmpfs of 24 MiB
(mounting it needs root: the tests skip without it)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

import zmesh
import zmesh.aio
from tests.conftest import read_line, reap, spawn, wait_until
from tests.faults.disk_worker import payload
from zmesh._store import disk as disk_module
from zmesh._store.disk import RESERVE_BYTES, RESERVE_FILE, ROOM_PLENTY_BYTES, Disk

DISK_BYTES = 24 << 20
WORKER = str(Path(__file__).with_name("disk_worker.py"))
RUNS = 20
MORE = 100  # messages the restarted producer publishes on the full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_BYTES mounted for the test, unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill_up(path: Path) -> int:
    """Write ``path`` until the disk has no room left; the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 4096):  # (the last pages one by one)
            while True:
                try:
                    written += f.write(b"\0" * size) or 0
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return written


def json_line(proc: subprocess.Popen) -> dict:
    line = read_line(proc, 60)
    assert isinstance(line, bytes)
    return json.loads(line)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("run", range(RUNS))
def test_a_full_disk_holds_publishes_and_loses_nothing_across_kill_9(
    small_disk, make_node, mesh_name, run, record_summary
):
    # Odd runs store each message alone: acking those copies many pages to fresh ones.
    alone = ["--alone"] if run % 2 else []
    data_dir = small_disk / "producer"
    common = ["--mesh", mesh_name, "--data-dir", str(data_dir)]
    proc = spawn([WORKER, "fill", *common, *alone], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    drainer = None
    try:
        full = json_line(proc)
        # publish() gave up naming the disk and what it has left; status said so, no raise.
        assert full["disk"].startswith(str(small_disk)) and "tmpfs" in full["disk"]
        assert f"{full['free_bytes']:,} bytes free" in full["error"]
        assert "free space on that disk" in full["error"]
        assert full["status"]["disk_full"] and full["status"]["full"]
        assert full["status"]["disk_reserve_held"]
        published, stored = full["published"], full["stored"]
        assert 1000 < stored <= published
        # Something else takes the last bytes of the disk.
        fill_up(small_disk / "filler")
        assert proc.stdin is not None
        proc.stdin.write(b"status?\n")
        proc.stdin.flush()
        assert json_line(proc)["status"]["disk_full"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # Restarted on the still-full disk: it starts, and its outbox drains.
        drainer = spawn(
            [WORKER, "drain", *common, "--first", str(published), "--more", str(MORE)],
            stdout=subprocess.PIPE,
        )
        up = json_line(drainer)
        assert up["status"]["disk_full"] and up["outbox"] >= stored
        cons = make_node("cons", seeds=[up["address"]])
        sub = cons.subscribe("t", group="g")
        got: dict[int, int] = {}

        def take() -> bool:
            for m in sub.fetch(1000, timeout=0.05):
                i = int(bytes(m.payload).rstrip(b"."))
                got[i] = got.get(i, 0) + 1
                m.ack()
            return all(i in got for i in range(stored)) and all(
                i in got for i in range(published, published + MORE)
            )

        wait_until(take, 60, what="every stored message and the ones published after")
        assert read_line(drainer, 60).strip() == b"stored"
        assert read_line(drainer, 90).strip() == b"drained"
        end = json_line(drainer)
        assert drainer.wait(30) == 0
        assert set(got) <= set(range(published + MORE))
        assert not [i for i, n in got.items() if n > 1], "duplicates without a consumer crash"
        record_summary(
            f"full disk run {run} ({'alone' if alone else 'runs'}): published "
            f"{published}, stored {stored}, {len(got)} delivered; reserve held at "
            f"the end: {end['status']['disk_reserve_held']}, commits that found "
            f"it full: {end['counters'].get('store_full', 0)}"
        )
    finally:
        reap(proc)
        if drainer is not None:
            reap(drainer)


def test_a_disk_filled_by_another_gives_its_reserve_to_settlements(small_disk, make_node):
    data_dir = small_disk / "p"
    prod = make_node("p", data_dir=str(data_dir), topics={"t": zmesh.TopicConfig(groups=("g",))})
    assert (data_dir / RESERVE_FILE).stat().st_blocks * 512 >= RESERVE_BYTES
    # The reserve goes only to a commit the full disk refuses (disk.py). The pages the
    # backlog's own commits free (some 20) may hold the first commit after the fill, and the
    # acks' commits free hundreds for the next ones: then no commit needs the reserve, and
    # it is rightly kept. A reader from before the backlog (a snapshot being copied) holds
    # every page freed since: no commit after the fill finds one.
    reader = spawn(
        ["-c", HOLD_READER, str(data_dir / "store")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert read_line(reader, 30).strip() == b"reading"
        # Messages stored alone (a priority): acking them changes a leaf per few messages,
        # each copied to a fresh page before the old one is freed.
        count = 4000
        for i in range(count):
            prod.publish("t", payload(i, 1000), priority=1)
        prod.publish("t", payload(count, 1000), priority=1).wait_stored(10)
        fill_up(small_disk / "filler")
        status = prod.status()["store"]
        assert status["disk_full"] and status["disk_free_bytes"] < 64 << 10
        held = count + 1  # the index of the next publish
        with pytest.raises(zmesh.StoreFullError) as err:
            for _ in range(5000):  # (up to 2,000 are taken at once, and held: commands.py)
                prod.publish("t", payload(held, 1000), timeout=0.5)
                held += 1
        assert err.value.disk is not None and str(small_disk) in err.value.disk
        assert err.value.waited_s == 0.5
        # The commit after the refused publishes (the rest of their batch) needs a fresh
        # page: the reserve is released for it.
        wait_until(
            lambda: not prod.status()["store"]["disk_reserve_held"], 10, what="the reserve given"
        )
        # The reader ends its transaction itself: killed, it would leave its slot in LMDB's
        # reader table, holding those pages until the node restarts.
        assert reader.stdin is not None
        reader.stdin.close()
        assert reader.wait(10) == 0
    finally:
        reap(reader)
    # The consumer's acks delete records: commits LMDB can only make with fresh pages (the
    # reserve's room) or pages freed before. Once they freed pages in the store, the held
    # publishes are stored and sent too.
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = set()

    def take() -> bool:
        for m in sub.fetch(1000, timeout=0.05):
            got.add(int(bytes(m.payload).rstrip(b".")))
            m.ack()
        return len(got) >= held

    wait_until(take, 30, what="the backlog delivered")
    assert got == set(range(held))
    wait_until(lambda: prod.status()["outbox"] == 0, 30, what="the outbox drained")
    assert not (data_dir / RESERVE_FILE).exists()  # released for those commits
    assert prod.status()["store"]["disk_reserve_held"] is False
    # Room in the store again (pages the acks freed): publishes go on, disk still full.
    prod.publish("t", payload(held, 100), timeout=10).wait_stored(10)
    # The disk gets room: the reserve is made again.
    (small_disk / "filler").unlink()
    prod.publish("t", payload(held + 1, 100)).wait_stored(10)
    wait_until(
        lambda: prod.status()["store"]["disk_reserve_held"], 15, what="the reserve made again"
    )
    assert (data_dir / RESERVE_FILE).stat().st_blocks * 512 >= RESERVE_BYTES


def test_an_async_publish_on_a_full_disk_says_the_disk_is_full(small_disk, mesh_name):
    async def main() -> zmesh.StoreFullError:
        async with zmesh.aio.Node(
            "p",
            mesh=mesh_name,
            data_dir=str(small_disk / "p"),
            mdns=False,
            interfaces=["127.0.0.1"],
            topics={"t": zmesh.TopicConfig(groups=("g",))},
        ) as node:
            await (await node.publish("t", payload(0, 1000))).wait_stored(10)
            fill_up(small_disk / "filler")
            with pytest.raises(zmesh.StoreFullError) as err:
                for i in range(5000):  # (up to 2,000 are taken at once, and held)
                    await node.publish("t", payload(i + 1, 1000), timeout=0.5)
            return err.value

    error = asyncio.run(main())
    assert error.disk is not None and str(small_disk) in error.disk
    assert error.waited_s == 0.5 and "the disk" in str(error)


class LookCounting(Disk):
    """A Disk that counts how often it looks at the file system (statvfs)."""

    looks = 0

    def free_bytes(self) -> int | None:
        self.looks += 1
        return super().free_bytes()


def test_a_roomy_disk_is_looked_at_again_once_commits_may_have_spent_its_room(tmp_path):
    disk = LookCounting(tmp_path)
    room = disk.room_bytes()
    assert room is not None and disk.looks == 1
    if room - 2 * (1 << 20) < ROOM_PLENTY_BYTES:  # (this disk is not roomy: looked at each time)
        disk.room_bytes(1 << 20)
        assert disk.looks == 2
        return
    # Within the second: the room last seen, less what the commits said they would take.
    assert disk.room_bytes(1 << 20) == room
    assert disk.room_bytes(1 << 20) == room - (1 << 20)
    assert disk.looks == 1
    # A commit that could take the room down to ROOM_PLENTY_BYTES: looked at again.
    disk.room_bytes(room - ROOM_PLENTY_BYTES)
    assert disk.looks == 2


def test_a_roomy_disk_is_looked_at_again_after_room_look_s(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_module, "ROOM_LOOK_S", 0.0)
    disk = LookCounting(tmp_path)
    for _ in range(3):
        disk.room_bytes(4096)
    assert disk.looks == 3


def test_a_small_disk_is_looked_at_before_every_commit(small_disk):
    disk = LookCounting(small_disk)
    room = disk.room_bytes(4096)
    assert room is not None and 0 < room < ROOM_PLENTY_BYTES
    fill_up(small_disk / "filler")  # (another process's file: seen at the next commit)
    after = disk.room_bytes(4096)
    assert disk.looks == 2 and after is not None and after < 64 << 10


def test_eio_means_a_full_disk_only_on_a_nearly_full_disk(small_disk, tmp_path):
    eio = lmdb.Error("mdb_txn_commit: Input/output error")
    enospc = lmdb.DiskError("mdb_txn_commit: No space left on device")
    roomy = Disk(tmp_path)
    assert roomy.is_full_error(enospc) and not roomy.is_full_error(eio)
    fill_up(small_disk / "filler")
    assert Disk(small_disk).is_full_error(eio)


def test_a_new_store_is_not_made_on_a_full_disk(small_disk, mesh_name):
    fill_up(small_disk / "filler")
    with pytest.raises(zmesh.StoreFullError) as err:
        zmesh.Node(
            "n",
            mesh=mesh_name,
            data_dir=str(small_disk / "n"),
            interfaces=["127.0.0.1"],
            mdns=False,
        )
    assert err.value.disk is not None and "bytes free" in str(err.value)
    assert not (small_disk / "n" / "store" / "data.mdb").exists()


# A reader of a store, in a process of its own, that holds one read transaction open
# until its stdin closes (as a snapshot being copied does): LMDB reuses no page freed
# after it began, so every commit of the store needs pages its full disk cannot give.
HOLD_READER = """\
import sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, max_dbs=16, subdir=True)
txn = env.begin()
print("reading", flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(120)
def test_a_consumer_on_a_full_disk_gets_its_acks_to_the_producer(small_disk, make_node, caplog):
    """The consumer's data dir is on the full disk, the producer's is not. Its acks reach
    the producer and its handler sees each message once: with the disk's reserve
    (released for the acks' commit, which carries them), and when the store cannot take
    their dedupe entries at all (sent all the same, written once there is room)."""
    caplog.set_level(logging.WARNING, logger="zmesh")
    prod = make_node("p", topics={"t": zmesh.TopicConfig(groups=("g",), ack_timeout_s=3)})
    cons = make_node("c", data_dir=str(small_disk / "c"), seeds=[prod.control_address])
    handled: dict[int, int] = {}
    lock = threading.Lock()

    def handle(msg: zmesh.Message) -> None:
        with lock:
            handled[msg.id.seq] = handled.get(msg.id.seq, 0) + 1

    cons.subscribe("t", group="g", handler=handle)
    prod.publish("t", b"first").wait_acked(10)
    fill_up(small_disk / "filler")
    # 1. The reserve is there: released for the first commit that finds the disk full,
    # which commits the acks with it.
    for i in range(500):
        last = prod.publish("t", payload(i, 100))
    last.wait_stored(10)
    wait_until(lambda: prod.status()["outbox"] == 0, 30, what="the first 500 acked")
    assert len(handled) == 501 and max(handled.values()) == 1, "handled twice"
    status = cons.status()
    assert status["store"]["disk_reserve_held"] is False
    assert "acks_rolled_back" not in status["counters"]
    # 2. The reserve is gone and the disk full again; a reader holds the store's pages
    # (a snapshot being copied): no commit of the consumer finds room.
    reader = spawn(
        ["-c", HOLD_READER, str(small_disk / "c" / "store")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert read_line(reader, 30).strip() == b"reading"
        fill_up(small_disk / "filler-2")
        for i in range(500, 3500):
            last = prod.publish("t", payload(i, 100))
        last.wait_stored(10)
        wait_until(lambda: prod.status()["outbox"] == 0, 40, what="the next 3,000 acked")
        assert len(handled) == 3501 and max(handled.values()) == 1, "handled twice"
        status = cons.status()
        store, counters = status["store"], status["counters"]
        assert store["full"] and store["disk_full"] and store["acks_unwritten"] > 0
        assert counters["acks_unwritten"] > 0 and counters["store_full"] > 0
        assert "acks_rolled_back" not in counters
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("sent without their dedupe entries" in line for line in said)
        assert len(said) < 20  # (said at most once a minute each, however many commits)
    finally:
        assert reader.stdin is not None
        reader.stdin.close()
        reap(reader)
    # Room again: the dedupe entries are written; the window has them.
    (small_disk / "filler").unlink()
    wait_until(
        lambda: cons.status()["store"]["acks_unwritten"] == 0, 15, what="the entries written"
    )
    assert not cons.status()["store"]["full"]
    assert any("are written" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(120)
def test_publishes_held_on_a_full_disk_never_take_the_reserve(small_disk, make_node, caplog):
    """Publishes of 512 KiB wait for room while a consumer drains the outbox: the pages
    each ack frees are reused only two commits later, and a commit of the held
    publishes counted on them would fill the disk; the reserve stays for settlements."""
    caplog.set_level(logging.WARNING, logger="zmesh")
    data_dir = small_disk / "p"
    prod = make_node(
        "p",
        data_dir=str(data_dir),
        publish_timeout_s=2,
        topics={"t": zmesh.TopicConfig(groups=("g",))},
    )
    published = 0
    with pytest.raises(zmesh.StoreFullError):
        for _ in range(100):
            prod.publish_many("t", [b"." * (512 << 10)] * 4)
            published += 4
    store = prod.status()["store"]
    assert store["full"] and store["disk_reserve_held"]
    cons = make_node("c", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = 0
    taken: list[zmesh.Message] = []

    def take() -> bool:
        # Acked 8 at a time (4 MiB freed by one commit: the held publishes fit in it).
        nonlocal got
        taken.extend(sub.fetch(8 - len(taken), timeout=0.05))
        if len(taken) == 8 or (taken and got + len(taken) >= published):
            sub.ack_many(taken)
            got += len(taken)
            taken.clear()
        return got >= published and prod.status()["outbox"] == 0

    wait_until(take, 60, what="the backlog and the held publishes delivered")
    assert got == published
    store = prod.status()["store"]
    assert store["disk_reserve_held"] and not store["full"]
    assert (data_dir / RESERVE_FILE).stat().st_blocks * 512 >= RESERVE_BYTES
    assert not [r for r in caplog.records if "reserve of" in r.getMessage()]


@pytest.mark.timeout(120)
def test_the_reserve_is_made_again_with_the_room_inside_the_store(small_disk, make_node):
    """The store's file never shrinks: once the reserve went to settlements, the disk may
    never again have the reserve and the margin free. The pages the drained outbox left
    free inside the file count for the margin; the reserve itself is on the disk."""
    data_dir = small_disk / "p"
    prod = make_node("p", data_dir=str(data_dir), topics={"t": zmesh.TopicConfig(groups=("g",))})
    count = 4000
    for i in range(count):
        prod.publish("t", payload(i, 1000), priority=1)  # (stored alone)
    prod.publish("t", payload(count, 1000), priority=1).wait_stored(10)
    fill_up(small_disk / "filler")
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = 0

    def take() -> bool:
        nonlocal got
        for msg in sub.fetch(1000, timeout=0.05):
            msg.ack()
            got += 1
        return got > count and prod.status()["outbox"] == 0

    wait_until(take, 30, what="the outbox drained")
    assert prod.status()["store"]["disk_reserve_held"] is False  # (the acks took it)
    # Room on the disk for the reserve, not for the margin besides: that is in the file.
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler = small_disk / "filler"
    os.truncate(filler, filler.stat().st_size - (RESERVE_BYTES + (256 << 10) - free))
    wait_until(
        lambda: prod.status()["store"]["disk_reserve_held"], 15, what="the reserve made again"
    )
    assert (data_dir / RESERVE_FILE).stat().st_blocks * 512 >= RESERVE_BYTES
    # New messages go on in the room inside the file.
    prod.publish("t", payload(count + 1, 1000), timeout=5).wait_stored(10)


def test_a_reserve_deleted_under_a_running_node_is_noticed_and_made_again(
    make_node, tmp_path, caplog
):
    # Held by its cached flag, it was never made again: a disk that filled up then had
    # nothing to give the settlements, which were not written (and sent again after a
    # restart).
    data_dir = tmp_path / "p"
    prod = make_node("p", data_dir=str(data_dir), topics={"t": zmesh.TopicConfig(groups=("g",))})
    reserve = data_dir / RESERVE_FILE
    assert reserve.is_file() and prod.status()["store"]["disk_reserve_held"]
    caplog.set_level(logging.INFO, logger="zmesh._store.disk")
    reserve.unlink()
    wait_until(lambda: f"the disk reserve {reserve} is gone" in caplog.text, what="it noticed")

    def made_again() -> bool:
        prod.publish("t", b"x").wait_stored(5)  # (a commit: where the reserve is made)
        return reserve.is_file()

    wait_until(made_again, what="the reserve made again")
    assert f"disk reserve {reserve} of {RESERVE_BYTES} bytes made" in caplog.text
    assert reserve.stat().st_blocks * 512 >= RESERVE_BYTES
    assert prod.status()["store"]["disk_reserve_held"]


def test_a_reader_killed_mid_read_no_longer_holds_the_stores_pages(make_node, tmp_path):
    """A process killed inside a read transaction of a node's store (a copier, say)
    leaves its slot in LMDB's reader table: no page freed after its snapshot was reused,
    and every commit grew the file, until the node restarted. The node frees such slots
    each heartbeat, says so, and the file stops growing."""
    data_dir = tmp_path / "p"
    prod = make_node("p", data_dir=str(data_dir), topics={"t": zmesh.TopicConfig(groups=("g",))})
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    reader = spawn(
        ["-c", HOLD_READER, str(data_dir / "store")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )  # (its stdin a pipe of its own: one at its end, /dev/null, would end it at once)
    try:
        assert read_line(reader, 30).strip() == b"reading"
        os.kill(reader.pid, signal.SIGKILL)
        assert reader.wait(10) == -signal.SIGKILL
    finally:
        reap(reader)
    wait_until(lambda: prod.stats().get("stale_readers_cleared") == 1, 10, what="the slot freed")
    # The same backlog, sent and acked over and over, now fits in pages freed before it.
    data = data_dir / "store" / "data.mdb"
    sizes = []
    for round_ in range(6):
        receipts = [prod.publish("t", payload(round_ * 500 + i, 2000)) for i in range(500)]
        got = 0
        while got < 500:
            for msg in sub.fetch(100, timeout=10):
                msg.ack()
                got += 1
        for receipt in receipts:
            receipt.wait_acked(10)
        sizes.append(data.stat().st_size)
    # Held, the slot kept every round's pages (about 1 MB a round) from being reused. The
    # pages in use at once vary with how far acks lag publishes (a loaded machine: more),
    # so the file may still grow a little past its size after the first rounds.
    assert sizes[-1] - sizes[2] < 500 * 2000 // 2, sizes
