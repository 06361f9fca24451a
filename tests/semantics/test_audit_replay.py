"""Replay readers against what a producer stores besides payloads."""

from __future__ import annotations

import zmesh


def test_a_fetch_reply_counts_headers_against_what_the_reader_takes(make_node):
    """A fetch reply was cut by its payload bytes alone: messages with large headers
    made a reply larger than the reader's sockets take, which dropped it, and the
    reader got nothing (its producer taken for unreachable; a following reader asked
    again every 5 s, forever)."""
    node = make_node(
        "solo",
        max_message_bytes=64 << 10,  # (the reader takes replies of 2 MiB + 64 KiB)
        topics={"t": zmesh.TopicConfig(partitions=1, retention_s=600)},
    )
    headers = {"trace": "x" * (60 << 10)}
    receipts = [node.publish("t", b"%d" % i, headers=headers) for i in range(60)]
    receipts[-1].wait_stored(5)
    with node.replay("t", follow=False) as reader:
        got = list(reader)
    assert reader.unreachable == set()
    assert [m.payload for m in got] == [b"%d" % i for i in range(60)]
    assert all(m.headers == headers for m in got)
    assert reader.gaps == 0
