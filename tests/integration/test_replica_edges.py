"""Replicated topics at their edges, as a mesh run for years meets them: a topic's
replicas lowered while receipts wait for more hosts than there are, and a replica host
whose copies cannot commit (its map or disk full) while the producer goes on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

import zmesh
from tests.conftest import wait_until
from zmesh._engine.replica import copies as copies_module


def _replicas(node: zmesh.Node) -> dict:
    return node.status()["replicas"]


def test_a_topics_replicas_lowered_at_run_time_releases_the_receipts_that_wait(
    make_node: Callable[..., zmesh.Node], caplog: pytest.LogCaptureFixture
) -> None:
    """Receipts of a topic wanting more replicas than the mesh has hosts wait (as said),
    and the producer says why in its log (it said nothing: wait_stored timed out with no
    word); once the operator lowers the topic's replicas to what the mesh has, they are
    stored. They waited for good, with the new setting met, and so did every receipt
    after them (they are released in order)."""
    caplog.set_level(logging.INFO, logger="zmesh._engine.replica.streams")
    p = make_node("p", replica_host=False)
    r = make_node("r", seeds=[p.control_address])
    p.topic("t", replicas=3)  # (one replica host only)
    first = p.publish("t", b"first")
    wait_until(
        lambda: [m["state"] for m in _replicas(p)["set"]] == ["whole"], 10, what="r's copy whole"
    )
    with pytest.raises(zmesh.TimeoutError):
        first.wait_stored(timeout=0.5)
    said = "this producer finds 1 of the 2 replica hosts its replicated topics ask for"
    wait_until(lambda: said in caplog.text, 10, what="the producer to say it lacks a host")
    p.topic("t", replicas=2)
    first.wait_stored(timeout=10)  # (with no other publish to move things on)
    p.publish("t", b"later").wait_stored(timeout=10)
    again = "this producer has the 1 replica hosts it needs again"
    wait_until(lambda: again in caplog.text, 10, what="the producer to say it has its hosts")
    # The replica host lost for good: the next receipt waits, until replicas are
    # lowered to 1 (the outbox alone).
    r.close()
    wait_until(lambda: not _replicas(p)["set"], 10, what="r dropped from the replica set")
    alone = p.publish("t", b"alone")
    with pytest.raises(zmesh.TimeoutError):
        alone.wait_stored(timeout=0.5)
    p.topic("t", replicas=1)
    alone.wait_stored(timeout=10)
    p.publish("t", b"after").wait_stored(timeout=10)
    assert _replicas(p)["lag"] == 0


def test_a_copy_that_cannot_commit_is_asked_for_again_later_not_at_every_frame(
    make_node: Callable[..., zmesh.Node],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica host whose copy cannot commit (here its map is smaller than the
    producer's outbox; a full disk does the same) deletes the copy being made, giving
    back its room, and asks for a new one RESYNC_ASK_AGAIN_S later (an hour here, so
    that it is not reached). It asked at the next frame: each commit of a producer that
    went on publishing began a new sync of its whole outbox, hundreds a second, each one
    refused again, as docs/replicas.md said it did not."""
    monkeypatch.setattr(copies_module, "RESYNC_ASK_AGAIN_S", 3600.0)
    caplog.set_level(logging.WARNING, logger="zmesh._engine.replica.copies")
    r = make_node("r", map_size_bytes=1 << 20, max_message_bytes=64 << 10)
    p = make_node("p", seeds=[r.control_address], replica_host=False)
    p.topic("t", replicas=2)
    backlog = p.publish_many("t", [b"x" * 1000] * 3000)  # (3 MB: more than r's map)
    wait_until(lambda: r.stats().get("replica_commit_errors"), 10, what="the copy refused")

    def publisher_goes_on() -> bool:
        p.publish("t", b"more")
        return r.stats().get("replica_stream_gaps", 0) >= 50

    wait_until(publisher_goes_on, 30, what="50 frames that follow no copy")
    assert p.stats()["replica_syncs_begun"] == 1
    assert r.stats()["replica_commit_errors"] == 1
    assert not list((tmp_path / "r" / "replicas").iterdir())
    assert "a new one is asked for in 3600s" in caplog.text
    assert not backlog.stored


def test_a_replica_host_restarted_as_none_says_its_copies_are_not_served(
    make_node: Callable[..., zmesh.Node], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A node that held copies and is started again with replica_host false neither
    serves nor deletes them: what only they hold (a producer lost for good) would wait
    there, unseen. It said nothing."""
    p = make_node("p", replica_host=False)
    r = make_node("r", seeds=[p.control_address], data_dir=str(tmp_path / "r"))
    p.topic("t", replicas=2)
    p.publish("t", b"kept").wait_stored(timeout=10)  # (stored: r's copy holds it)
    r.close()
    caplog.set_level(logging.WARNING, logger="zmesh._engine.replica.replication")
    make_node("r", data_dir=str(tmp_path / "r"), replica_host=False)
    assert "copies kept, not served (replica_host is false)" in caplog.text
