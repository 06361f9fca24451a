"""Replicated topics between nodes on loopback: receipts stored once a replica holds the
messages, a replica replaced when it leaves, a producer's lanes taken over when it is
gone and handed back when it returns (tests/faults/netns has the same with kill -9 on
hosts of their own)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.integration.test_cli import LOOP, Proc, run_cli
from tests.web.conftest import get_json, post_json
from zmesh._engine.replica import copies as copies_module
from zmesh._engine.replica import replication as replication_module
from zmesh._engine.replica import streams as streams_module
from zmesh._engine.replica.writes import SyncReader
from zmesh.errors import StoreError

TAKEOVER = {"takeover_after_s": 2.0}  # (dead_after_s is 1.5 in these tests)


def _drain(
    sub: zmesh.Subscription, seen: Counter[bytes], want: int | list[bytes], timeout: float
) -> None:
    """Handle and ack until ``want`` distinct payloads were seen (a count), or every
    payload of ``want`` (a list)."""

    def more() -> bool:
        for msg in sub.fetch(500, timeout=0.05):
            seen[msg.payload] += 1
            msg.ack()
        if isinstance(want, int):
            return len(seen) >= want
        return all(payload in seen for payload in want)

    count = want if isinstance(want, int) else len(want)
    wait_until(more, timeout, what=f"{count} distinct messages")


def _replicas(node: zmesh.Node) -> dict:
    return node.status()["replicas"]


def test_a_receipt_is_stored_once_a_replica_holds_its_message(
    make_node: Callable[..., zmesh.Node],
) -> None:
    p = make_node("p", replica_host=False)
    c = make_node("c", seeds=[p.control_address], replica_host=False)
    p.topic("t", replicas=2, groups=["g"])
    sub = c.subscribe("t", group="g")
    wait_members(p, "t", "g", 1)
    receipt = p.publish("t", b"first")
    # Delivery does not wait for the replicas; the receipt does.
    msg = sub.get(timeout=10)
    assert msg.payload == b"first"
    msg.ack()
    with pytest.raises(zmesh.TimeoutError):
        receipt.wait_stored(timeout=0.5)
    assert not receipt.stored and not receipt.acked
    assert _replicas(p)["lag"] == 1
    once = p.publish("t", b"idempotent", msg_id="m-1")
    again = p.publish("t", b"idempotent", msg_id="m-1")  # (a duplicate: it follows the first)
    with pytest.raises(zmesh.TimeoutError):
        again.wait_stored(timeout=0.5)
    r = make_node("r", seeds=[p.control_address])
    receipt.wait_stored(timeout=10)
    once.wait_stored(timeout=10)
    again.wait_stored(timeout=10)
    assert again.id == once.id
    receipt.wait_acked(timeout=10)
    later = p.publish_many("t", [b"%d" % i for i in range(500)])
    later.wait_stored(timeout=10)
    status = _replicas(p)
    assert status["lag"] == 0
    assert [(m["name"], m["state"]) for m in status["set"]] == [("r", "whole")]
    # Settlements follow: the copy ends empty once the group acked everything.
    _drain(sub, Counter(), 501, 10)
    later.wait_acked(timeout=10)

    def copy_empty() -> bool:
        copies = _replicas(r)["copies"]
        return bool(copies) and copies[0]["records"] == 0 and copies[0]["owed_entries"] == 0

    wait_until(copy_empty, 10, what="the replica's copy to empty as the group acks")


def test_a_replica_that_leaves_is_replaced(make_node: Callable[..., zmesh.Node]) -> None:
    p = make_node("p", replica_host=False)
    r1 = make_node("r1", seeds=[p.control_address])
    r2 = make_node("r2", seeds=[p.control_address])
    p.topic("t", replicas=2, groups=["g"])
    first = p.publish_many("t", [b"a"] * 100)
    first.wait_stored(timeout=10)
    (chosen,) = _replicas(p)["set"]
    gone, other = (r1, r2) if chosen["name"] == "r1" else (r2, r1)
    gone.close()
    receipt = p.publish_many("t", [b"b"] * 100)
    receipt.wait_stored(timeout=15)
    (now,) = _replicas(p)["set"]
    assert now["name"] == other.name and now["state"] == "whole"
    # The new replica got the whole backlog, the messages of before too.
    (copy,) = _replicas(other)["copies"]
    assert copy["producer"] == p.id and copy["records"] >= 1
    assert p.status()["counters"]["replica_set_changes"] == 2


def test_lanes_taken_over_then_handed_back(make_node: Callable[..., zmesh.Node], tmp_path) -> None:
    p = make_node("p", replica_host=False, **TAKEOVER)
    r = make_node("r", seeds=[p.control_address], **TAKEOVER)
    c = make_node("c", seeds=[p.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    sub = c.subscribe("t", group="g", max_in_flight=100, batch_size=50)
    wait_members(p, "t", "g", 1)
    n = 2000
    receipts = [p.publish("t", b"%d" % i) for i in range(n)]
    receipts[-1].wait_stored(timeout=10)
    seen: Counter[bytes] = Counter()
    _drain(sub, seen, n // 2, 10)
    p_id = p.id
    p.close()
    # The replica takes over and delivers the rest with the producer's ids: the
    # consumer's dedupe window drops what it acked before.
    _drain(sub, seen, n, 20)
    assert max(seen.values()) == 1
    served = _replicas(r)["serving"]
    assert [s["producer"] for s in served] == [p_id]
    assert r.status()["counters"]["takeovers"] == 1
    taken_ids = {m.id.producer for m in sub.fetch(10, timeout=0.2)}
    assert taken_ids <= {p_id}

    def all_acked_at_the_taker() -> bool:
        serving = _replicas(r)["serving"]
        return bool(serving) and serving[0]["owed"] == 0

    wait_until(all_acked_at_the_taker, 10, what="the taker to owe nothing")
    # The producer comes back on its data dir: it learns what was settled while it was
    # away before it sends anything, and delivers none of it again. (Its outbox owes them
    # until the hand-back comes, which may be before anyone looks: the count of what the
    # hand-back settled says it owed them.)
    p2 = make_node("p", replica_host=False, data_dir=str(tmp_path / "p"), **TAKEOVER)
    assert p2.id == p_id
    wait_until(lambda: p2.status()["outbox"] == 0, 15, what="the hand-back to settle the outbox")
    assert p2.status()["counters"].get("handed_back", 0) > 0
    # (the taker lets go once the producer's HANDBACK_ACK reaches it)
    wait_until(lambda: not _replicas(r)["serving"], 10, what="the taker to let go")
    assert r.status()["counters"]["handbacks"] == 1
    assert p2.status()["counters"]["handbacks_received"] == 1
    assert not sub.fetch(100, timeout=0.5)
    assert c.status()["counters"].get("received", 0) == n


def test_a_producer_gone_again_before_its_hand_back_leaves_the_taker_serving(
    make_node: Callable[..., zmesh.Node], tmp_path: Path
) -> None:
    """A producer back on its data dir stops its taker, which hands its lanes back once
    nothing it sent is in flight. Gone again before that (a crash loop), its taker sends
    again what the lanes owe; it stayed stopped, and they waited for a producer that
    might never return."""
    p = make_node("p", replica_host=False, **TAKEOVER)
    r = make_node("r", seeds=[p.control_address], **TAKEOVER)
    c = make_node("c", seeds=[p.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"], ack_timeout_s=30.0)
    wait_until(lambda: {x["name"] for x in c.peers()} == {"p", "r"}, what="c meets r")
    n = 200
    p.publish_many("t", [b"%d" % i for i in range(n)]).wait_stored(timeout=10)
    p.close()
    sub = c.subscribe("t", group="g", max_in_flight=20, batch_size=10)
    held = fetched(sub, 5)  # (from the taker, held unacked: the hand-back must wait)
    assert [s["producer"] for s in _replicas(r)["serving"]] == [held[0].id.producer]
    back = make_node("p", replica_host=False, data_dir=str(tmp_path / "p"), **TAKEOVER)
    wait_until(lambda: _replicas(r)["serving"][0]["handing_back"], 10, what="the taker stopped")
    back.close()  # (gone again before the hand-back)
    seen: Counter[bytes] = Counter()
    for msg in held:
        seen[msg.payload] += 1
        msg.ack()
    _drain(sub, seen, n, 30)
    assert r.status()["counters"].get("handbacks", 0) == 0


def test_status_shows_replicas_and_cli_nodes_host_none(
    make_node: Callable[..., zmesh.Node], mesh_name: str, tmp_path: Path
) -> None:
    p = make_node("p", replica_host=False)
    p.topic("t", replicas=2, groups=["g"])
    # A command line node is a peer like any other, but hosts no replica: the producer
    # finds no replica host while it is the only other node.
    sub = Proc(
        tmp_path,
        "sub",
        ["sub", "t", "--group", "g", *LOOP, "--mesh", mesh_name, "--seed", p.control_address],
    )
    try:
        wait_members(p, "t", "g", 1, timeout=30)
        receipt = p.publish("t", b"one")
        wait_until(lambda: "one" in sub.stdout(), 30, what="the command line's subscriber")
        assert not receipt.stored and _replicas(p)["set"] == []
        text = run_cli(["status", p.control_address])
        assert text.returncode == 0, text.stderr
        assert "replicated topics" in text.stdout and "t (2)" in text.stdout
        assert "no replica host" in text.stdout and "1 not on replicas yet" in text.stdout
        r = make_node("r", seeds=[p.control_address])
        receipt.wait_stored(timeout=15)
        text = run_cli(["status", r.control_address])
        assert text.returncode == 0, text.stderr
        assert "copy held" in text.stdout and p.id[:12] in text.stdout
    finally:
        sub.popen.terminate()
        sub.popen.wait(30)


def _open_under(path: Path) -> list[str]:
    """The files under ``path`` this process holds open (LMDB's data and lock files)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)):
                out.append(target)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_taker_forgets_producers_gone_for_good(
    make_node: Callable[..., zmesh.Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica host whose producers each run once (a new data dir, so a new node id)
    takes over each one's lanes when it goes, owing something or not. A taker whose
    lanes have owed nothing for FORGET_DEAD_AFTER_S (600 s; 1 s here) lets go and
    deletes its copy; one holding a dead letter keeps it. Each producer gone used to
    leave its copy for good: a directory of MiBs, an open LMDB store (4 fds, a map of
    map_size_bytes) and a taker, so that at 1024 fds a host could hold no new copy. A
    producer back after all, on its data dir, sends again what the taker settled, and
    its consumer drops it by its dedupe window."""
    monkeypatch.setattr(replication_module, "FORGET_DEAD_AFTER_S", 1.0)
    r = make_node("r", **TAKEOVER)
    c = make_node("c", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    sub = c.subscribe("t", group="g", max_in_flight=100, batch_size=50)
    copies_dir = tmp_path / "r" / "replicas"
    seen: Counter[bytes] = Counter()
    ids = []
    for name, owed in (("p1", True), ("p2", False)):
        p = make_node(name, seeds=[r.control_address], replica_host=False, **TAKEOVER)
        p.topic("t", replicas=2, groups=["g"])
        wait_members(p, "t", "g", 1)
        mine = [b"%s-%d" % (name.encode(), i) for i in range(400)]
        sent = p.publish_many("t", mine)
        sent.wait_stored(timeout=10)
        # (what p1 owes may come from the taker meanwhile: p2's own are waited for)
        _drain(sub, seen, len(seen) + 100 if owed else mine, 10)
        if not owed:
            sent.wait_acked(timeout=10)
        ids.append(p.id)
        p.close()  # (gone for good, owing some messages or none)
    _drain(sub, seen, 800, 30)  # (the taker delivers what p1 owed)
    assert max(seen.values()) == 1
    wait_until(lambda: r.stats().get("takeovers", 0) == 2, 10, what="both taken over")

    def forgotten() -> bool:
        rep = _replicas(r)
        return not rep["copies"] and not rep["serving"]

    wait_until(forgotten, 15, what="the copies of producers gone for good forgotten")
    assert r.stats()["replica_copies_forgotten"] == 2
    assert not list(copies_dir.iterdir())
    assert not _open_under(copies_dir)
    assert not r._engine.replication.taken
    # A producer that parked a dead letter: its copy, with the dead letter, stays.
    p3 = make_node("p3", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p3.topic("t", replicas=2, groups=["g"])
    wait_members(p3, "t", "g", 1)
    p3.publish_many("t", [b"bad", b"good"]).wait_stored(timeout=10)
    for msg in fetched(sub, 2):
        if msg.payload == b"bad":
            msg.fail("unreadable")
        else:
            msg.ack()
    wait_until(lambda: p3.status()["outbox"] == 0, 10, what="p3 settled")
    p3.close()
    wait_until(lambda: bool(_replicas(r)["serving"]), 10, what="p3 taken over")
    time.sleep(2.0)  # (twice FORGET_DEAD_AFTER_S here)
    assert [cp["producer"] for cp in _replicas(r)["copies"]] == [p3.id]
    assert r.stats()["replica_copies_forgotten"] == 2
    # p1 back on its data dir after its copy was forgotten: nothing to hand back, so it
    # sends what it owed when it left; the consumer acked those (from the taker) and
    # drops them.
    received, dropped = c.stats()["received"], c.stats().get("duplicates_dropped", 0)
    p1 = make_node(
        "p1",
        seeds=[r.control_address],
        replica_host=False,
        data_dir=str(tmp_path / "p1"),
        **TAKEOVER,
    )
    assert p1.id == ids[0]
    wait_until(lambda: p1.status()["outbox"] == 0, 15, what="p1's outbox settled")
    assert not sub.fetch(100, timeout=0.5)
    assert c.stats()["received"] == received
    assert c.stats()["duplicates_dropped"] > dropped  # (it did send them again)


def test_a_copy_whose_producer_left_during_its_sync_is_forgotten(
    make_node: Callable[..., zmesh.Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy whose producer went away before its sync ended (here: its store could not
    be read) is never whole, and so never taken over: once the producer has been silent
    for FORGET_DEAD_AFTER_S (1 s here) it is deleted; it stayed, its store open, until
    the host restarted."""
    monkeypatch.setattr(replication_module, "FORGET_DEAD_AFTER_S", 1.0)

    class Damaged(SyncReader):  # (the producer's store refuses the sync's reads)
        def part(self) -> None:
            raise StoreError("damaged")

    monkeypatch.setattr(streams_module, "SyncReader", Damaged)
    r = make_node("r", **TAKEOVER)
    p = make_node("p", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    p.publish("t", b"one")
    wait_until(
        lambda: [cp["state"] for cp in _replicas(r)["copies"]] == ["syncing"],
        10,
        what="a copy being made",
    )
    assert p.stats()["replica_syncs_failed"] >= 1
    time.sleep(1.5)  # (kept while its producer lives)
    assert [cp["state"] for cp in _replicas(r)["copies"]] == ["syncing"]
    p.close()
    wait_until(lambda: not _replicas(r)["copies"], 10, what="the copy being made forgotten")
    assert r.stats()["replica_copies_forgotten"] == 1
    assert not list((tmp_path / "r" / "replicas").iterdir())
    assert not r.stats().get("takeovers")


def test_a_copy_whose_store_cannot_be_opened_is_asked_for_again_later(
    make_node: Callable[..., zmesh.Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica host that cannot open a new copy's store (no file descriptor left, a full
    disk) asks for a new copy again once RESYNC_ASK_AGAIN_S (30 s) has passed, its
    directory removed. The next frame asked for one at once, each sync begun left a
    directory behind: thousands a second, for as long as the store could not be opened."""

    def refused(data_dir: str, _map_size: int) -> None:
        Path(data_dir).mkdir(parents=True)  # (a Store makes its dir before LMDB refuses)
        raise StoreError("Too many open files", data_dir)

    monkeypatch.setattr(copies_module, "Store", refused)
    r = make_node("r", **TAKEOVER)
    p = make_node("p", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    receipt = p.publish("t", b"one")
    wait_until(lambda: p.stats().get("replica_syncs_begun"), 10, what="a copy begun")
    time.sleep(1.5)
    assert p.stats()["replica_syncs_begun"] == 1
    assert not list((tmp_path / "r" / "replicas").iterdir())
    assert r.stats()["replica_commit_errors"] == 1
    assert not receipt.stored


def test_a_replicas_directory_that_is_no_directory_is_said_and_counted(
    make_node: Callable[..., zmesh.Node], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # (each sync begun raised a FileExistsError the host logged as a traceback, and its
    # back-off and count did not apply)
    caplog.set_level(logging.WARNING, logger="zmesh._engine.replica.copies")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "replicas").write_text("not a directory")
    r = make_node("r", **TAKEOVER)
    assert "replicas is not a directory" in caplog.text
    p = make_node("p", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    receipt = p.publish("t", b"one")
    wait_until(lambda: r.stats().get("replica_commit_errors"), 10, what="the copy refused")
    assert "cannot make the replicas' directory" in caplog.text
    assert not receipt.stored


def test_a_takers_dead_letters_are_listed_replayed_and_purged_at_the_replica_host(
    make_node: Callable[..., zmesh.Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dead letters of a producer gone for good stay in its copy at the replica host
    that serves its lanes: `zmesh dlq --producer` asks that host for them, and a node's
    HTTP API lists and acts on them there. Replayed, they reach the group again from the
    taker; purged, the copy holds none and is forgotten like any other
    (FORGET_DEAD_AFTER_S, 1 s here). No command reached them before: the copy stayed for
    good."""
    monkeypatch.setattr(replication_module, "FORGET_DEAD_AFTER_S", 1.0)
    r = make_node("r", **TAKEOVER)
    c = make_node(
        "c",
        seeds=[r.control_address],
        replica_host=False,
        http_address="127.0.0.1:0",
        http_admin=True,
        **TAKEOVER,
    )
    sub = c.subscribe("t", group="g")
    p = make_node("p", seeds=[r.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=2, groups=["g"])
    wait_members(p, "t", "g", 1)
    p.publish_many("t", [b"bad-1", b"good", b"bad-2", b"bad-3"]).wait_stored(timeout=10)
    for msg in fetched(sub, 4):
        if msg.payload.startswith(b"bad"):
            msg.fail("unreadable")
        else:
            msg.ack()
    wait_until(lambda: p.status()["outbox"] == 0, 10, what="p settled")
    where = ["--topic", "t", "--group", "g"]
    # While the producer is alive, its dead letters are its own to handle.
    alive = run_cli(["dlq", "list", r.control_address, *where, "--producer", p.id])
    assert alive.returncode == 1 and "its dead letters are at the producer" in alive.stderr
    p_id = p.id
    p.close()
    wait_until(lambda: bool(_replicas(r)["serving"]), 10, what="p taken over")
    (copy,) = _replicas(r)["copies"]
    assert copy["dead_letters"] == 3
    # At the replica host its own dead letters are asked for by default (none), the
    # producer's by its id or the first digits of it.
    own = run_cli(["dlq", "list", r.control_address, *where])
    assert own.returncode == 0 and "no dead letters" in own.stdout, own.stderr
    listed = run_cli(["dlq", "list", r.control_address, *where, "--producer", p_id[:8], "--json"])
    assert listed.returncode == 0, listed.stderr
    letters = json.loads(listed.stdout)
    assert [(d["payload_text"], d["reason"]) for d in letters] == [
        ("bad-1", "unreadable"),
        ("bad-2", "unreadable"),
        ("bad-3", "unreadable"),
    ]
    assert all(d["id"].startswith(p_id + ":") for d in letters)
    # An id names its producer: no --producer needed.
    replayed = run_cli(["dlq", "replay", r.control_address, *where, "--id", letters[0]["id"]])
    assert replayed.returncode == 0 and "replayed 1 dead letter" in replayed.stdout
    (again,) = fetched(sub, 1)
    assert again.payload == b"bad-1" and again.id.producer == p_id
    again.ack()
    # Another node's HTTP API lists them with the node that holds them, and acts there
    # when asked to act at the producer.
    base = f"http://{c.http_address}/api/dead-letters"
    code, found = get_json(f"{base}?topic=t&group=g")
    assert code == 200 and not found["errors"], found
    assert [(d["payload_text"], d["node"], d["serving"]) for d in found["letters"]] == [
        ("bad-2", "r", p_id),
        ("bad-3", "r", p_id),
    ]
    for node in (p_id, "r"):  # (the producer's, or those the node holds)
        code, one = get_json(f"{base}?topic=t&group=g&node={node}")
        assert code == 200 and one["letters"] == found["letters"], one
    body = {"node": p_id, "topic": "t", "group": "g", "seqs": [found["letters"][0]["seq"]]}
    code, done = post_json(f"{base}/replay", body)
    assert code == 200 and (done["name"], done["replayed"], done["producer"]) == ("r", 1, p_id)
    (again,) = fetched(sub, 1)
    assert again.payload == b"bad-2"
    again.ack()
    purged = run_cli(
        ["dlq", "purge", r.control_address, *where, "--producer", p_id, "--id", "0", "--yes"]
    )
    assert purged.returncode == 0 and "purged 0 dead letter" in purged.stdout  # (seq 0: acked)
    purged = run_cli(["dlq", "purge", r.control_address, *where, "--producer", p_id[:6], "--yes"])
    assert purged.returncode == 0 and "purged 1 dead letter" in purged.stdout, purged.stderr
    for command, bad, said in (
        ("list", ["--producer", "ffffffff"], "holds no copy of producer ffffffff"),
        ("list", ["--producer", "p"], "is not a node id"),
        ("replay", ["--id", f"{p_id}:1", "--id", "abcd:2"], "the ids name more than one producer"),
        ("replay", ["--producer", "ffff", "--id", f"{p_id}:1"], f"name producer {p_id}, not ffff"),
    ):
        refused = run_cli(["dlq", command, r.control_address, *where, *bad])
        assert refused.returncode in (1, 2) and said in refused.stderr, refused.stderr
    # Owing nothing and holding no dead letter, the copy is forgotten.
    wait_until(lambda: not _replicas(r)["copies"], 15, what="the copy forgotten")
    assert r.stats()["replica_copies_forgotten"] == 1
    assert not sub.fetch(10, timeout=0.3)


def test_the_other_holders_drop_their_copies_when_the_taker_forgets_a_producer(
    make_node: Callable[..., zmesh.Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 3 replicas a producer gone for good leaves a copy at two hosts; one takes over
    and delivers what the producer owed. Once its lanes owe nothing for
    FORGET_DEAD_AFTER_S (1 s here) it deletes its copy, and tells the other host to drop
    its own, which still owes what the taker settled: the other host took over in turn,
    sent it all again (the consumer dropped it as duplicates) and kept it another 600 s."""
    monkeypatch.setattr(replication_module, "FORGET_DEAD_AFTER_S", 1.0)
    r1 = make_node("r1", **TAKEOVER)
    r2 = make_node("r2", seeds=[r1.control_address], **TAKEOVER)
    c = make_node("c", seeds=[r1.control_address], replica_host=False, **TAKEOVER)
    sub = c.subscribe("t", group="g", max_in_flight=100, batch_size=50)
    p = make_node("p", seeds=[r1.control_address], replica_host=False, **TAKEOVER)
    p.topic("t", replicas=3, groups=["g"])
    wait_members(p, "t", "g", 1)
    n = 400
    p.publish_many("t", [b"%d" % i for i in range(n)]).wait_stored(timeout=10)
    seen: Counter[bytes] = Counter()
    _drain(sub, seen, n // 2, 10)
    p.close()
    _drain(sub, seen, n, 20)  # (the rest from the taker)
    hosts = (r1, r2)

    def total(counter: str) -> int:
        return sum(r.stats().get(counter, 0) for r in hosts)

    wait_until(lambda: not any(_replicas(r)["copies"] for r in hosts), 15, what="both copies gone")
    assert (total("takeovers"), total("replica_copies_forgotten")) == (1, 1)
    assert total("replica_copies_dropped") == 1  # (no copy is left to take over from)
    assert not sub.fetch(100, timeout=0.2)
    assert max(seen.values()) == 1
