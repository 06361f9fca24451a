"""Damaged stores never abort the process: a store whose last node did not close it (or
whose file changed since, also in place with its times put back) is walked in a child
process before LMDB reads it; a start on a damaged store fails with one line naming the
file and the remedies; ``zmesh store check`` reports the damage and ``zmesh store
salvage`` copies what can be read. Damage that changes nothing a clean close records (bit
rot) is met by the running node: reads LMDB refuses settle their messages as lost, and
its status says the store is damaged and what to do. The damage is real: pages of real
store files overwritten at their meta page, a branch page, a leaf page and an overflow
page."""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from lmdb import verify

import zmesh
from tests.conftest import LOOPBACK, read_line, reap, run_module, spawn, wait_until
from tests.integration.test_delivery import drain
from zmesh._store.lock import stamp

CLI = ["-m", "zmesh.cli"]
ROOT = str(Path(__file__).resolve().parents[2])
SMALL, LARGE = 3000, 20  # messages of 300 bytes (leaves, branches) and of 5,000 (overflow)
GROUPS = {"t": zmesh.TopicConfig(groups=("g",))}


class _Pages(verify._Verifier):
    """The verifier's walk, noting each reachable page of each database by its kind."""

    def __init__(self, f, size):
        super().__init__(f, size)
        self.pages: dict[str, dict[str, list[int]]] = {}

    def _note(self, db: str, kind: str, pgno: int) -> None:
        self.pages.setdefault(db, {}).setdefault(kind, []).append(pgno)

    def _walk_page(self, ctx, pgno, depth):
        buf = self.read_page(pgno)
        if buf is not None:
            kind = {verify.P_BRANCH: "branch", verify.P_LEAF: "leaf"}.get(
                self._pg_flags(buf, 0) & verify._TYPE_MASK, "other"
            )
            self._note(ctx["name"], kind, pgno)
            if kind == "leaf":
                self._note(ctx["name"], f"keys@{pgno}", self._numkeys(self._pg_lower(buf, 0)))
        super()._walk_page(ctx, pgno, depth)

    def _bigdata(self, ctx, pgno, i, buf, doff, dsize, want_bytes):
        self._note(ctx["name"], "overflow", verify._U64.unpack_from(buf, doff)[0])
        return super()._bigdata(ctx, pgno, i, buf, doff, dsize, want_bytes)


def pages_of(data_dir: Path) -> dict[str, dict[str, list[int]]]:
    data = data_dir / "store" / "data.mdb"
    with open(data, "rb") as f:
        walk = _Pages(f, data.stat().st_size)
        assert walk.verify() == []
    return walk.pages


def overwrite(data_dir: Path, pgno: int) -> None:
    """Put random bytes over page ``pgno`` of the store's data file (4 KiB pages), the
    same for a page each run: which damage LMDB refuses with an error and which fails an
    assertion in it (exit 134: a cursor stepping onto a page that is not a leaf) depends
    on the bytes, so a test of one must not meet the other by chance."""
    with open(data_dir / "store" / "data.mdb", "r+b") as f:
        f.seek(pgno * 4096)
        f.write(random.Random(pgno).randbytes(4096))


P_LEAF, F_BIGDATA = 0x02, 0x01  # (LMDB's page flag and node flag)


def lose_overflow(data_dir: Path, pgno: int) -> None:
    """Make leaf page ``pgno`` hold only its first record, pointing past the end of the
    file for its value (an overflow page number rotted): every read of that value, and
    a cursor stepping onto the page, is refused by LMDB with an error, whatever the
    page's place in its tree (random bytes over a leaf fail an assertion in LMDB
    instead, or not, by the bytes and by how the page is reached)."""
    with open(data_dir / "store" / "data.mdb", "r+b") as f:
        f.seek(pgno * 4096)
        page = bytearray(f.read(4096))
        (first,) = struct.unpack_from("<H", page, 16)  # (where the first node is)
        (ksize,) = struct.unpack_from("<H", page, first + 6)
        key = bytes(page[first + 8 : first + 8 + ksize])
        node = struct.pack("<HHHH", 5000, 0, F_BIGDATA, ksize) + key + struct.pack("<Q", 1 << 40)
        at = 4096 - len(node)
        struct.pack_into("<HHHH", page, 10, P_LEAF, 18, at, at)  # (flags, lower, upper, ptr)
        page[at:] = node
        f.seek(pgno * 4096)
        f.write(page)


def older_meta(data_dir: Path) -> int:
    """The meta page (0 or 1) of the older of LMDB's last two transactions: a commit
    writes the one that is not the newest, so which is newest depends on how many
    commits there were. (Its txnid: 8 bytes at offset 144 of the page, 64-bit LMDB.)"""
    with open(data_dir / "store" / "data.mdb", "rb") as f:
        txnids = []
        for pgno in (0, 1):
            f.seek(pgno * 4096 + 144)
            txnids.append(int.from_bytes(f.read(8), "little"))
    return txnids.index(min(txnids))


def payload(i: int) -> bytes:
    return str(i).encode().ljust(300 if i < SMALL else 5000, b".")


def build(data_dir: Path, mesh: str, *, kill: bool, batch: int = 0) -> None:
    """A store holding SMALL + LARGE messages each stored alone (a priority), and a
    ``publish_many`` of ``batch`` more (b"b0", b"b1", ...: a run), owed to g. ``kill``:
    its node is killed with SIGKILL instead of closed."""
    many = f"rs.append(n.publish_many('t', [b'b%d' % i for i in range({batch})]))\n"
    code = (
        "import sys, zmesh\n"
        "from tests.faults.test_damaged_stores import GROUPS, SMALL, LARGE, payload\n"
        f"n = zmesh.Node('p', mesh={mesh!r}, data_dir={str(data_dir)!r}, "
        "interfaces=['127.0.0.1'], mdns=False, topics=GROUPS).start()\n"
        "rs = [n.publish('t', payload(i), priority=1) for i in range(SMALL + LARGE)]\n"
        f"{many if batch else ''}"
        "for r in rs:\n    r.wait_stored(30)\n"
        "print('stored', flush=True)\n"
        "sys.stdin.read()\n"
        "n.close()\n"
    )
    proc = spawn(["-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_line(proc).strip() == b"stored"
        assert proc.stdin is not None
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        else:
            proc.stdin.close()
            assert proc.wait(30) == 0
    finally:
        reap(proc)


def definition(tmp_path: Path, data_dir: Path, mesh: str) -> Path:
    path = tmp_path / f"{data_dir.name}.toml"
    path.write_text(
        f'[node]\nname = "p"\nmesh = "{mesh}"\ndata_dir = "{data_dir}"\n'
        'interfaces = ["127.0.0.1"]\nmdns = false\n'
    )
    return path


@pytest.mark.parametrize("where", ["meta", "branch", "leaf", "overflow"])
def test_a_damaged_store_is_refused_in_one_line_checked_and_salvaged(
    tmp_path, mesh_name, make_node, where
):
    data_dir = tmp_path / "p"
    build(data_dir, mesh_name, kill=where in ("branch", "overflow"))
    msgs = pages_of(data_dir)["main/msgs"]
    # (the older meta page: the newer one still says where every message is)
    pgno = {
        "meta": older_meta(data_dir),
        "branch": msgs["branch"][0],
        "leaf": msgs["leaf"][len(msgs["leaf"]) // 2],
        "overflow": msgs["overflow"][0],
    }[where]
    lost = msgs[f"keys@{pgno}"][0] if where == "leaf" else 1 if where == "overflow" else 0
    overwrite(data_dir, pgno)
    before = (data_dir / "store" / "data.mdb").read_bytes()

    # The node refuses it: one line naming the file and the remedies, exit 1, no abort.
    code, out = run_module(
        [*CLI, "node", "run", str(definition(tmp_path, data_dir, mesh_name))], 60, ROOT
    )
    assert code == 1, out
    errors = [line for line in out.splitlines() if line.startswith("zmesh: error:")]
    assert len(errors) == 1 and "Traceback" not in out, out
    assert f"{data_dir}/store/data.mdb is damaged" in errors[0]
    assert f"zmesh store salvage {data_dir} NEW_DIR" in errors[0]
    assert "snapshot" in errors[0] and f"zmesh store check {data_dir}" in errors[0]

    # The check says what is damaged.
    code, out = run_module([*CLI, "store", "check", str(data_dir)], 60, ROOT)
    assert code == 1, out
    assert re.search(
        r"problem\(s\) in .*" + ("LMDB's meta pages" if where == "meta" else "msgs"), out
    ), out

    # Salvage copies what can be read; the damaged store is left as it was.
    dest = tmp_path / "salvaged"
    code, out = run_module([*CLI, "store", "salvage", str(data_dir), str(dest)], 120, ROOT)
    assert code == 0, out
    assert re.search(
        rf"msgs\s*│\s*{SMALL + LARGE:,}\s*│\s*{SMALL + LARGE - lost:,}\s*│\s*"
        rf"{lost:,}\s*│",
        out,
    ), out
    assert (data_dir / "store" / "data.mdb").read_bytes() == before
    prod = make_node("p", data_dir=str(dest))
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, SMALL + LARGE - lost, 30)
    indexes = sorted(int(bytes(m.payload).rstrip(b".")) for m in got)
    assert len(set(indexes)) == len(indexes) == SMALL + LARGE - lost
    assert set(indexes) <= set(range(SMALL + LARGE))
    counters = prod.status()["counters"]
    assert counters.get("lost_records", 0) == lost  # (their pending entries, settled)


def test_the_check_runs_after_an_unclean_shutdown_and_not_after_a_clean_close(
    tmp_path, mesh_name, caplog
):
    caplog.set_level(logging.WARNING, logger="zmesh._store.store")

    def start_and_close(data_dir: Path) -> None:
        zmesh.Node(
            "p", mesh=mesh_name, data_dir=str(data_dir), interfaces=LOOPBACK, mdns=False
        ).close()

    killed, closed = tmp_path / "killed", tmp_path / "closed"
    build(killed, mesh_name, kill=True)
    build(closed, mesh_name, kill=False)
    start_and_close(closed)
    assert "checking the store" not in caplog.text
    start_and_close(killed)
    assert f"checking the store {killed}/store" in caplog.text
    assert "the node that had it open (pid" in caplog.text and "sound" in caplog.text
    caplog.clear()
    start_and_close(killed)  # closed cleanly this time: no check
    assert "checking the store" not in caplog.text
    # A data file that changed while its node was stopped (restored, copied) is checked.
    data = closed / "store" / "data.mdb"
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1))
    start_and_close(closed)
    assert "its data file changed after its node closed it" in caplog.text


def test_store_check_reports_a_sound_store(tmp_path, mesh_name):
    build(tmp_path / "p", mesh_name, kill=False)
    code, out = run_module([*CLI, "store", "check", str(tmp_path / "p")], 60, ROOT)
    assert code == 0 and "is sound" in out, out
    code, out = run_module([*CLI, "store", "check", str(tmp_path)], 60, ROOT)
    assert code == 1 and "does not exist" in out, out


def overwrite_in_place(
    data_dir: Path, pages: list[int], damage: Callable[[Path, int], None] = overwrite
) -> os.stat_result:
    """Random bytes (or ``damage``) over ``pages`` of the data file, written in place
    with its times put back (``dd conv=notrunc`` then ``touch -r``, or ``rsync --inplace
    -t``): the file keeps its size, modification time and inode. Returns its stat from
    before."""
    data = data_dir / "store" / "data.mdb"
    ref = data.stat()
    for pgno in pages:
        damage(data_dir, pgno)
    os.utime(data, ns=(ref.st_atime_ns, ref.st_mtime_ns))
    now = data.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (ref.st_size, ref.st_mtime_ns, ref.st_ino)
    return ref


def test_a_store_damaged_in_place_with_its_times_put_back_is_refused_at_start(tmp_path, mesh_name):
    data_dir = tmp_path / "p"
    build(data_dir, mesh_name, kill=False, batch=100)  # (closed cleanly: no check due)
    overwrite_in_place(data_dir, list(range(5, 35)))
    data = data_dir / "store" / "data.mdb"
    before = data.read_bytes()
    with pytest.raises(zmesh.StoreError) as err:
        zmesh.Node(
            "p", mesh=mesh_name, data_dir=str(data_dir), interfaces=LOOPBACK, mdns=False
        ).start()
    message = str(err.value)
    assert f"{data} is damaged: " in message, message
    assert f"zmesh store check {data_dir} lists what is damaged" in message
    assert f"zmesh store salvage {data_dir} NEW_DIR" in message and "snapshot" in message
    assert data.read_bytes() == before  # (checked, never opened by LMDB nor written)


def test_bit_rot_past_the_start_check_is_met_by_the_running_node(
    tmp_path, mesh_name, make_node, caplog
):
    caplog.set_level(logging.WARNING)
    # Damage that changes nothing a clean close records: the node starts without a check
    # and meets it in LMDB's reads of the oldest message's record (status) and of what
    # it sends. It goes on, and says what is damaged and what to do.
    data_dir, batch = tmp_path / "p", 100
    build(data_dir, mesh_name, kill=False, batch=batch)
    msgs = pages_of(data_dir)["main/msgs"]
    leaves = [msgs["leaf"][0], msgs["leaf"][len(msgs["leaf"]) // 2]]  # (the oldest first)
    lost = sum(msgs[f"keys@{pgno}"][0] for pgno in leaves)
    overwrite_in_place(data_dir, leaves)
    data = data_dir / "store" / "data.mdb"
    (data_dir / "LOCK").write_text(f"clean {' '.join(stamp(data.stat()))}\n")  # (bit rot)

    topics = {**GROUPS, "u": zmesh.TopicConfig(groups=("g",))}
    prod = make_node("p", topics=topics)
    assert "checking the store" not in caplog.text
    status = prod.status()  # (reads the oldest record of lane g: in a damaged page)
    damaged = status["store"]["damaged"]
    assert damaged is not None, status["store"]
    assert "reading the msgs database failed" in damaged["error"], damaged
    assert damaged["databases"] == ["msgs"] and damaged["reads_failed"] >= 1
    assert damaged["remedy"].startswith(f"zmesh store check {data_dir} lists what is damaged")
    assert f"zmesh store salvage {data_dir} NEW_DIR" in damaged["remedy"]
    assert status["outbox"] == SMALL + LARGE + batch

    # Every message whose record can be read is delivered; the others are settled as
    # lost, counted, never sent.
    cons = make_node("cons", seeds=[prod.control_address])
    sub = cons.subscribe("t", group="g")
    got = drain(sub, SMALL + LARGE + batch - lost, 30)  # (those whose record can be read)
    payloads = [bytes(m.payload) for m in got]
    assert len(set(payloads)) == len(payloads) == SMALL + LARGE + batch - lost
    assert {p for p in payloads if p.startswith(b"b")} == {b"b%d" % i for i in range(batch)}
    wait_until(lambda: prod.status()["outbox"] == 0, what="the outbox settled")
    counters = prod.status()["counters"]
    assert counters["unreadable_records"] == counters["lost_records"] == lost
    assert sub.fetch(10, timeout=0.3) == []

    # The IO thread goes on: another topic is published and consumed.
    other = cons.subscribe("u", group="g")
    prod.publish("u", b"after the damage").wait_stored(5)
    (msg,) = wait_until(lambda: other.fetch(1, timeout=0.05), 10, what="the message of u")
    assert msg.payload == b"after the damage"
    msg.ack()

    # The page walk the first failure started says what is damaged, in status and log.
    check = wait_until(lambda: prod.status()["store"]["damaged"]["check"], 30, what="the check")
    assert f"{data} is damaged: main/msgs DB" in str(check), check
    assert f"zmesh store salvage {data_dir} NEW_DIR" in caplog.text

    # Closed as damaged: the next start walks the store and refuses it with the remedies.
    prod.close()
    with pytest.raises(zmesh.StoreError) as err:
        zmesh.Node("p", mesh=mesh_name, data_dir=str(data_dir), interfaces=LOOPBACK, mdns=False)
    assert f"{data} is damaged: main/msgs DB" in str(err.value)
    assert "its last node found it damaged" in caplog.text


def test_a_producer_whose_store_is_damaged_leaves_its_replicas_copy_unfinished_and_goes_on(
    tmp_path, mesh_name, make_node, caplog
):
    # A new replica's copy is read from the producer's store: a page LMDB refuses there
    # leaves that copy unfinished (never whole: its replica never takes over from it),
    # and the producer's IO thread goes on.
    caplog.set_level(logging.WARNING)
    data_dir = tmp_path / "p"
    build(data_dir, mesh_name, kill=False)
    leaves = pages_of(data_dir)["main/msgs"]["leaf"]
    overwrite_in_place(data_dir, [leaves[len(leaves) // 2]], lose_overflow)
    data = data_dir / "store" / "data.mdb"
    (data_dir / "LOCK").write_text(f"clean {' '.join(stamp(data.stat()))}\n")  # (bit rot)

    topics = {
        "t": zmesh.TopicConfig(groups=("g",), replicas=2),
        "u": zmesh.TopicConfig(groups=("g",)),
    }
    prod = make_node("p", topics=topics, replica_host=False)
    make_node("r", seeds=[prod.control_address])

    def states() -> list[str]:
        return [m["state"] for m in prod.status()["replicas"]["set"]]

    wait_until(lambda: states() == ["failed"], 15, what="the replica's copy to fail")
    status = prod.status()
    assert status["counters"]["replica_syncs_failed"] >= 1
    assert "reading the msgs database failed" in status["store"]["damaged"]["error"]
    assert "replica r cannot get a whole copy of this outbox" in caplog.text

    # The receipts of the replicated topic wait; the rest of the node goes on.
    held = prod.publish("t", b"replicated")
    cons = make_node("cons", seeds=[prod.control_address], replica_host=False)
    other = cons.subscribe("u", group="g")
    prod.publish("u", b"after the damage").wait_stored(5)
    (msg,) = wait_until(lambda: other.fetch(1, timeout=0.05), 10, what="the message of u")
    assert msg.payload == b"after the damage"
    msg.ack()
    with pytest.raises(zmesh.TimeoutError):
        held.wait_stored(0.5)
    assert states() == ["failed"]


def test_a_replica_whose_copy_is_damaged_drops_it_instead_of_taking_over(
    tmp_path, mesh_name, make_node, caplog
):
    caplog.set_level(logging.WARNING)
    timing = {"takeover_after_s": 2.0, "replica_host": True}
    prod = make_node("p", replica_host=False, takeover_after_s=2.0)
    rep = make_node("r", seeds=[prod.control_address], **timing)
    prod.topic("t", replicas=2, groups=["g"])
    receipts = [prod.publish("t", payload(i), priority=1) for i in range(SMALL)]
    receipts[-1].wait_stored(15)
    (copy,) = rep.status()["replicas"]["copies"]
    assert copy["state"] == "whole" and copy["owed_entries"] == SMALL
    rep.close()
    prod.close()

    # Bit rot in the copy's record of what is owed, met when the replica would take over.
    (copy_dir,) = (tmp_path / "r" / "replicas").iterdir()
    overwrite_in_place(copy_dir, pages_of(copy_dir)["main/pend"]["leaf"][:1])
    data = copy_dir / "store" / "data.mdb"
    (copy_dir / "LOCK").write_text(f"clean {' '.join(stamp(data.stat()))}\n")

    rep = make_node("r", **timing)
    assert [c["producer"] for c in rep.status()["replicas"]["copies"]] == [prod.id]
    wait_until(
        lambda: rep.status()["counters"].get("takeovers_failed"), 15, what="the takeover to fail"
    )
    status = rep.status()
    assert status["replicas"]["copies"] == [] and status["replicas"]["serving"] == []
    assert not copy_dir.exists()
    assert "this node's copy of it cannot be read" in caplog.text
    # The IO thread goes on: the replica's own publishes are delivered.
    sub = rep.subscribe("own", group="g")
    rep.publish("own", b"after the damage").wait_stored(5)
    assert sub.get(timeout=10).payload == b"after the damage"
