"""Full disks and damaged stores: a full LMDB map blocks publish() and loses nothing; a
damaged store is reported with its path and left untouched; a corrupt record is set
aside without stopping the node."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import subprocess
from pathlib import Path

import lmdb
import pytest

import zmesh
from tests.conftest import LOOPBACK, reap, spawn, wait_members, wait_until
from tests.integration.test_delivery import drain

SMALL_MAP = 1 << 20
# A map this small, with the largest messages it allows (an eighth of it).
SMALL = {"map_size_bytes": SMALL_MAP, "max_message_bytes": SMALL_MAP // 8}
PAYLOAD = 4000
GROUPS = {"t": zmesh.TopicConfig(groups=("g",))}


def payload(i: int) -> bytes:
    return str(i).encode().ljust(PAYLOAD, b".")


def index(msg: zmesh.Message) -> int:
    return int(msg.payload.rstrip(b"."))


def fill(
    node: zmesh.Node, limit: int = 5000, receipts: list[zmesh.Receipt] | None = None
) -> tuple[int, zmesh.StoreFullError]:
    """Publish until publish() gives up; (how many returned, the error)."""
    for i in range(limit):
        try:
            r = node.publish("t", payload(i), timeout=0.5)
        except zmesh.StoreFullError as exc:
            return i, exc
        if receipts is not None:
            receipts.append(r)
    pytest.fail(f"{limit} publishes of {PAYLOAD} bytes fit a {SMALL_MAP}-byte map")


def _delivers_each_once(make_node, prod: zmesh.Node, accepted: int) -> zmesh.Subscription:
    """A consumer of group g gets indexes 0..accepted-1 once each and the outbox drains;
    returns its subscription."""
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, accepted, timeout=30)
    assert sorted(index(m) for m in got) == list(range(accepted))
    assert sub.fetch(100, timeout=0.3) == []
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox drained")
    return sub


def test_full_map_blocks_publish_loses_nothing_and_recovers(make_node, tmp_path):
    prod = make_node("prod", **SMALL, topics=GROUPS)
    accepted, err = fill(prod)
    store = str(tmp_path / "prod" / "store")
    assert accepted > 50
    assert store in str(err) and err.path == store
    assert "map_size_bytes" in str(err) and "max_map_size_bytes" in str(err)
    assert "drain" in str(err) and str(SMALL_MAP) in str(err)
    assert err.waited_s == 0.5
    status = prod.status()
    assert status["store"]["full"] and status["store"]["held_publishes"] >= 1
    assert status["counters"]["store_full"] >= 1
    # Every publish that returned is owed to the group: stored, or held until there is room.
    sub = _delivers_each_once(make_node, prod, accepted)
    assert not prod.status()["store"]["full"]
    # Room came back by itself: publishing works again without a restart.
    r = prod.publish("t", payload(accepted), timeout=5)
    r.wait_stored(5)
    assert [index(m) for m in drain(sub, 1)] == [accepted]


def test_memory_runs_spilling_into_a_full_map_are_held_and_lose_nothing(make_node):
    # The budget holds a few batches: the rest spill, until a spill no longer fits the map
    # and the commit that carried it fails (what it staged and spilled is given back).
    prod = make_node(
        "prod",
        **SMALL,
        memory_budget_bytes=64_000,
        topics={"t": zmesh.TopicConfig(groups=("g",), durability="memory")},
    )
    accepted = 0
    with pytest.raises(zmesh.StoreFullError):
        for _ in range(200):
            prod.publish_many("t", [payload(accepted + i) for i in range(10)], timeout=0.5)
            accepted += 10
    assert accepted > 100
    status = prod.status()
    assert status["store"]["full"] and status["counters"]["store_full"] >= 1
    assert status["counters"]["spilled"] > 0
    _delivers_each_once(make_node, prod, accepted)


def test_closing_with_held_publishes_fails_their_receipts(make_node, tmp_path):
    prod = make_node("prod", **SMALL, topics=GROUPS)
    receipts: list[zmesh.Receipt] = []
    fill(prod, receipts=receipts)
    held = [r for r in receipts if not r.stored]
    assert held and len(held) == prod.status()["store"]["held_publishes"]
    prod.close()
    for r in held:  # not a silent drop: whoever waits on them learns it
        with pytest.raises(zmesh.StoreFullError):
            r.wait_stored(1)
    again = make_node("prod", data_dir=str(tmp_path / "prod"))
    assert again.status()["outbox"] == len(receipts) - len(held)


def test_max_map_size_grows_the_map_for_the_same_workload(make_node):
    prod = make_node("prod", **SMALL, max_map_size_bytes=16 * SMALL_MAP, topics=GROUPS)
    count = 800  # about three times what fits in SMALL_MAP
    rs = [prod.publish("t", payload(i), timeout=5) for i in range(count)]
    for r in rs:
        r.wait_stored(10)
    status = prod.status()
    assert status["store"]["map_size_bytes"] > SMALL_MAP
    assert status["counters"]["map_grown"] >= 1
    assert "store_full" not in status["counters"]
    cons = make_node("cons", seeds=[prod.control_address])
    got = drain(cons.subscribe("t", group="g"), count, timeout=30)
    assert sorted(index(m) for m in got) == list(range(count))


def test_a_transaction_the_full_map_cannot_take_fails_and_changes_nothing(make_node):
    prod = make_node("prod", **SMALL, topics=GROUPS)
    committed = 0
    for i in range(5000):
        try:
            with prod.transaction(timeout=5) as tx:
                tx.publish("t", payload(i))
        except zmesh.StoreFullError as exc:
            err = exc
            break
        committed += 1
    else:
        pytest.fail("the map never filled up")
    assert err.waited_s is None  # the commit failed at once, no waiting for room
    assert prod.status()["counters"]["store_full"] >= 1
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, committed, timeout=30)
    assert sorted(index(m) for m in got) == list(range(committed))
    assert sub.fetch(100, timeout=0.3) == []


@pytest.mark.parametrize("content", [os.urandom(64 * 1024), b""], ids=["garbage", "empty"])
def test_a_damaged_data_file_is_reported_and_left_untouched(tmp_path, mesh_name, content):
    store = tmp_path / "n" / "store"
    store.mkdir(parents=True)
    (store / "data.mdb").write_bytes(content)
    with pytest.raises(zmesh.StoreError) as err:
        zmesh.Node(
            "n", mesh=mesh_name, data_dir=str(tmp_path / "n"), interfaces=LOOPBACK, mdns=False
        ).start()
    assert str(store) in str(err.value) and err.value.path == str(store)
    assert "snapshot" in str(err.value) and "move it aside" in str(err.value)
    assert (store / "data.mdb").read_bytes() == content


def _publish_and_stop(make_node, name: str, count: int) -> list[int]:
    """``count`` messages each published alone: stored before the next is published, so
    each has a record and pending entries of its own (publishes staged together are stored
    as a run)."""
    node = make_node(name, topics=GROUPS)
    rs = []
    for i in range(count):
        rs.append(node.publish("t", payload(i)))
        rs[-1].wait_stored(5)
    node.close()
    return [r.id.seq for r in rs]


def _damage(data_dir: Path, db_name: bytes, pick) -> bytes:
    """Overwrite one record of ``db_name`` with bytes msgpack cannot decode; its key."""
    env = lmdb.open(str(data_dir / "store"), max_dbs=16, subdir=True)
    try:
        db = env.open_db(db_name)
        with env.begin(write=True, db=db) as txn:
            key = pick(list(txn.cursor().iternext(values=False)))
            txn.put(key, b"\xc1 not msgpack")
    finally:
        env.close()
    return key


def _bad_records(data_dir: Path) -> list[bytes]:
    env = lmdb.open(str(data_dir / "store"), max_dbs=16, subdir=True, readonly=True)
    try:
        with env.begin(db=env.open_db(b"bad", create=False)) as txn:
            return list(txn.cursor().iternext(values=False))
    finally:
        env.close()


def test_a_corrupt_outbox_record_is_set_aside_and_the_rest_delivered(make_node, tmp_path):
    data_dir = tmp_path / "prod"
    seqs = _publish_and_stop(make_node, "prod", 20)
    key = _damage(data_dir, b"msgs", lambda keys: keys[4])
    assert int.from_bytes(key, "big") == seqs[4]
    prod = make_node("prod", data_dir=str(data_dir))
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, 19)
    assert sorted(index(m) for m in got) == [i for i in range(20) if i != 4]
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox settled")
    assert prod.status()["counters"]["corrupt_records"] == 1
    assert sub.fetch(10, timeout=0.3) == []
    prod.close()
    assert _bad_records(data_dir) == [b"msgs\0" + key]
    # Set aside for good: the next restart finds nothing to complain about.
    again = make_node("prod", data_dir=str(data_dir))
    assert "corrupt_records" not in again.status()["counters"]


@pytest.mark.parametrize("db", [b"pend", b"pruns"])
def test_a_corrupt_pending_entry_is_rebuilt_at_restart(make_node, tmp_path, db):
    # pend: an entry of a message published alone; pruns: a lane's entry of a run (two
    # publish_many batches of 10), rebuilt as owing the whole run.
    data_dir = tmp_path / "prod"
    if db == b"pend":
        _publish_and_stop(make_node, "prod", 20)
    else:
        _publish_runs_and_stop(make_node, "prod", 2, 10)
    key = _damage(data_dir, db, lambda keys: keys[len(keys) // 3])
    prod = make_node("prod", data_dir=str(data_dir))
    assert prod.status()["counters"]["corrupt_records"] == 1
    assert prod.status()["outbox"] == 20
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    got = drain(sub, 20)
    assert sorted(index(m) for m in got) == list(range(20))
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox settled")
    prod.close()
    assert _bad_records(data_dir) == [db + b"\0" + key]


def _publish_runs_and_stop(make_node, name: str, batches: int, size: int) -> None:
    node = make_node(name, topics=GROUPS)
    for b in range(batches):  # (each stored before the next: batches staged together
        #                        would be joined into one run)
        node.publish_many("t", [payload(i) for i in range(b * size, (b + 1) * size)]).wait_stored(5)
    node.close()


def test_a_corrupt_run_record_is_set_aside_and_the_other_runs_delivered(make_node, tmp_path):
    data_dir = tmp_path / "prod"
    _publish_runs_and_stop(make_node, "prod", 3, 10)
    key = _damage(data_dir, b"runs", lambda keys: keys[1])  # messages 10..19
    prod = make_node("prod", data_dir=str(data_dir))
    assert prod.status()["outbox"] == 30  # (its lanes' entries still owe it)
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, 20)
    assert sorted(index(m) for m in got) == [i for i in range(30) if not 10 <= i < 20]
    wait_until(lambda: prod.status()["outbox"] == 0, what="outbox settled")
    counters = prod.status()["counters"]
    assert counters["corrupt_records"] == 1 and counters["lost_records"] == 10
    assert sub.fetch(10, timeout=0.3) == []
    prod.close()
    assert _bad_records(data_dir) == [b"runs\0" + key]
    again = make_node("prod", data_dir=str(data_dir))
    assert "corrupt_records" not in again.status()["counters"]
    assert again.status()["outbox"] == 0


def _node(data_dir: Path, mesh: str, **kw: object) -> zmesh.Node:
    """A node on ``data_dir``, created (its store opened) but not started."""
    return zmesh.Node("n", mesh=mesh, data_dir=str(data_dir), interfaces=LOOPBACK, mdns=False, **kw)  # type: ignore[arg-type]


def test_a_map_too_large_to_map_is_a_config_error_not_damage(tmp_path, mesh_name):
    huge = 1 << 50  # 1 PiB: more address space than a process has
    with pytest.raises(zmesh.StoreError) as err:
        _node(tmp_path / "n", mesh_name, map_size_bytes=huge)
    message = str(err.value)
    assert f"map_size_bytes {huge} cannot be mapped on this host" in message
    assert "lower map_size_bytes" in message and "Cannot allocate memory" in message
    assert "move it aside" not in message and "snapshot" not in message
    assert isinstance(err.value.__cause__, lmdb.MemoryError)
    # The failed open let go of the data dir: a sane map opens it at once.
    _node(tmp_path / "n", mesh_name).close()


def test_a_data_dir_that_is_a_file_or_holds_a_lock_directory_is_a_store_error(tmp_path, mesh_name):
    afile = tmp_path / "afile"
    afile.write_text("not a data dir")
    with pytest.raises(zmesh.StoreError, match="exists and is not a directory"):
        _node(afile, mesh_name)
    with pytest.raises(zmesh.StoreError, match="cannot create data dir .*Not a directory"):
        _node(afile / "sub", mesh_name)
    (tmp_path / "d" / "LOCK").mkdir(parents=True)
    with pytest.raises(zmesh.StoreError, match="lock file .*LOCK: Is a directory") as err:
        _node(tmp_path / "d", mesh_name)
    assert isinstance(err.value.__cause__, IsADirectoryError)
    assert afile.read_text() == "not a data dir"


def test_a_node_dropped_without_close_lets_go_of_its_data_dir(tmp_path, mesh_name, caplog):
    data_dir = tmp_path / "n"
    first = _node(data_dir, mesh_name)
    # Held: the error names this process, not "another" one.
    with pytest.raises(zmesh.DataDirLockedError) as err:
        _node(data_dir, mesh_name)
    assert err.value.holder_pid == os.getpid()
    assert f"of this process (pid {os.getpid()}) that was not closed" in str(err.value)
    node_id = first.id
    del first  # never started, never closed (an exception before its `with`, a REPL)
    gc.collect()
    assert "released: its node was dropped without close()" in caplog.text
    with _node(data_dir, mesh_name) as again:
        assert again.id == node_id
    # Without a collection in between: finding its own pid in the lock, the store runs
    # the collector before it gives up (a node's reference cycles keep it until then).
    dropped = _node(data_dir, mesh_name)
    del dropped
    _node(data_dir, mesh_name).close()
    # Closed twice, and collected after close(): the store is let go of once.
    again.close()
    del again
    gc.collect()
    _node(data_dir, mesh_name).close()


def test_a_data_dir_locked_by_another_process_names_its_pid(tmp_path, mesh_name):
    data_dir = tmp_path / "n"
    holder = spawn(
        [
            "-c",
            "import sys, zmesh\n"
            f"n = zmesh.Node('h', mesh={mesh_name!r}, data_dir={str(data_dir)!r}, "
            "interfaces=['127.0.0.1'], mdns=False)\n"
            "print('open', flush=True)\n"
            "sys.stdin.read()\n"
            "n.close()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == b"open"
        with pytest.raises(zmesh.DataDirLockedError) as err:
            _node(data_dir, mesh_name)
        assert err.value.holder_pid == holder.pid
        assert f"in use by another zmesh node (pid {holder.pid})" in str(err.value)
        holder.stdin.close()
        assert holder.wait(30) == 0
    finally:
        reap(holder)
    _node(data_dir, mesh_name).close()


@pytest.mark.parametrize("dest", ["afile/x", "/proc/snap"])
def test_a_snapshot_to_a_path_that_cannot_be_a_directory_is_a_store_error(
    make_node, tmp_path, dest
):
    (tmp_path / "afile").write_text("")
    node = make_node("n")
    with pytest.raises(zmesh.StoreError, match="cannot create the snapshot destination") as err:
        node.snapshot(tmp_path / dest)
    assert isinstance(err.value.__cause__, OSError)
    assert node.status()["outbox"] == 0  # the node runs on


@pytest.mark.timeout(60)
def test_a_data_dir_deleted_under_a_running_node_is_found_and_publishes_refused(
    make_node, tmp_path, caplog
):
    """``rm -rf`` of a running node's data dir: LMDB goes on in files no name reaches,
    which go when the node stops. The node finds it at its next heartbeat, says so,
    shows and counts it, and refuses new publishes; what it holds still reaches its
    consumers, and Node.snapshot still copies it, node id and all, to start over from."""
    caplog.set_level(logging.ERROR, logger="zmesh")
    data_dir = tmp_path / "prod"
    prod = make_node("prod", topics=GROUPS)
    for i in range(100):
        prod.publish("t", payload(i))
    prod.publish("t", payload(100)).wait_stored(5)
    shutil.rmtree(data_dir)
    wait_until(lambda: prod.status()["store"]["lost"], 5, what="the deletion found")
    status = prod.status()
    assert str(data_dir) in status["store"]["lost"] and "deleted" in status["store"]["lost"]
    assert status["counters"]["store_lost"] == 1
    assert status["store"]["disk_reserve_held"] is False  # (gone with the data dir)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(str(data_dir) in line and "101 unacknowledged" in line for line in said)
    # publish() itself raises (it is not given a receipt that fails later).
    with pytest.raises(zmesh.StoreError, match="publishes are refused") as err:
        prod.publish("t", payload(101))
    assert str(data_dir) in str(err.value) and "Node.snapshot" in str(err.value)
    with pytest.raises(zmesh.StoreError, match="publishes are refused"):
        prod.publish_many("t", [payload(102), payload(103)])
    with pytest.raises(zmesh.StoreError), prod.transaction(timeout=5) as tx:
        tx.publish("t", payload(104))
    assert prod.status()["counters"]["publishes_refused_store_lost"] == 4
    assert not data_dir.exists()  # (no reserve, nothing made again in its place)
    # What the node held: copied out of the files it still has open, id and all.
    rescued = prod.snapshot(tmp_path / "rescued")
    node_id = prod.id
    prod.close()
    assert any("closing the store" in r.getMessage() for r in caplog.records)
    again = make_node("prod-again", data_dir=str(rescued), topics=GROUPS)
    assert again.id == node_id and again.status()["outbox"] == 101
    cons = make_node("cons", seeds=[again.control_address])
    got = drain(cons.subscribe("t", group="g"), 101, timeout=30)
    assert sorted(index(m) for m in got) == list(range(101))


def test_a_store_gone_from_under_its_lock_file_is_refused_until_the_lock_file_goes(
    make_node, tmp_path
):
    # (an empty store was made in its place: the node started with a new id, its
    # backlog gone, and nothing said so)
    data_dir = tmp_path / "prod"
    prod = make_node("prod", topics=GROUPS)
    prod.publish("t", payload(0)).wait_stored(5)
    first_id = prod.id
    prod.close()
    closed = (data_dir / "LOCK").read_text()
    assert closed.startswith("clean ")
    shutil.rmtree(data_dir / "store")
    with pytest.raises(zmesh.StoreError, match="is gone, where the data dir's LOCK says its"):
        make_node("prod", data_dir=str(data_dir), topics=GROUPS)
    # A start that failed before it opened the store leaves the lock file as it found it
    # (it said the pid of that start: the next start walked the whole store for damage).
    assert (data_dir / "LOCK").read_text() == closed
    (data_dir / "LOCK").unlink()  # what the message says to start afresh
    again = make_node("prod", data_dir=str(data_dir), topics=GROUPS)
    assert again.id != first_id and again.status()["outbox"] == 0


def test_a_store_that_is_no_directory_or_truncated_is_refused_and_snapshotting_it_too(
    make_node, tmp_path
):
    data_dir = tmp_path / "prod"
    data_dir.mkdir()
    (data_dir / "store").write_text("not a directory")
    with pytest.raises(zmesh.StoreError, match="store is not a directory, where the store's"):
        make_node("prod", topics=GROUPS)
    (data_dir / "store").unlink()
    prod = make_node("prod", topics=GROUPS)
    for i in range(200):
        prod.publish("t", payload(i) * 50)
    prod.publish("t", payload(200)).wait_stored(5)
    prod.close()
    data = data_dir / "store" / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    # (LMDB maps a truncated file as it is: reading past its end was a SIGBUS, the
    # snapshot's whole process gone, an empty copy left behind)
    dest = tmp_path / "copy"
    with pytest.raises(zmesh.StoreError, match="it was truncated"):
        zmesh.snapshot(str(data_dir), str(dest))
    assert not dest.exists() or not any(dest.iterdir())
