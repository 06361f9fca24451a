"""A replica host whose frames are smaller than a producer's records: the copy it is
asked to make never ends, and it says why instead of asking again at once."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

import zmesh
from tests.conftest import wait_until
from zmesh._engine.replica import copies as copies_module


def test_a_sync_that_loses_a_frame_again_is_asked_for_later_not_at_once(
    make_node: Callable[..., zmesh.Node],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer's record larger than a replica host's frames may be (its
    max_message_bytes and a MiB: docs/replicas.md) is refused by the host's socket,
    which drops the connection. The host found the frame after it missing and asked for
    a new copy; the new copy lost the same frame, and it asked again at once: a new sync
    of the producer's whole outbox, and a connection dropped (the peer suspected), many
    times a second for good, with no word of why. A copy asked for again is asked for
    RESYNC_ASK_AGAIN_S after the last ask (an hour here), with a warning that says why it
    may fail."""
    monkeypatch.setattr(copies_module, "RESYNC_ASK_AGAIN_S", 3600.0)
    caplog.set_level(logging.WARNING, logger="zmesh._engine.replica.copies")
    r = make_node("r", max_message_bytes=64 << 10)
    p = make_node("p", seeds=[r.control_address], replica_host=False, max_message_bytes=8 << 20)
    p.topic("t", replicas=2)
    p.publish("t", b"small").wait_stored(timeout=10)
    big = p.publish("t", b"x" * (4 << 20))  # (more than r's frames may be: 1 MiB + 64 KiB)

    def publisher_goes_on() -> bool:
        p.publish("t", b"more")
        return r.stats().get("replica_stream_gaps", 0) >= 50

    wait_until(publisher_goes_on, 30, what="50 frames that follow no frame applied")
    assert p.stats()["replica_syncs_begun"] == 2  # (the first copy, and one asked for)
    assert "lost a frame again" in caplog.text
    assert not big.stored
