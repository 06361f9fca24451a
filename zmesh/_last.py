"""``Node.last``: the values every producer keeps of the topics a pattern matches
(``TopicConfig.keep_last``), asked over the producers' control sockets.

Like a replay reader, the asking thread uses sockets of its own in a context of its own;
every live producer (this node included) is asked at once, a page of up to 1,000 values
(1 MiB of payloads, keys and headers) at a time, each page after the last value of the
one before, until each says none is left or the timeout passes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import zmq

from ._engine.inbox.origin import Origin
from ._http.collect import all_targets, ask
from ._protocol.frames import LastItem, LastReply, LastRequest, random_token
from .subscription import Message

if TYPE_CHECKING:
    from ._engine.engine import Engine

log = logging.getLogger(__name__)

PAGE_ITEMS = 1000


def last_values(engine: Engine, pattern: str, timeout_s: float) -> list[Message]:
    """The kept values of ``pattern``'s topics from every live producer, by topic, then
    producer, then publish order; a producer that does not answer in time is left out
    (and logged)."""
    targets = [t for t in all_targets(engine) if t.alive]
    after: dict[str, tuple[str, int] | None] = dict.fromkeys((t.node_id for t in targets), None)
    got: dict[str, list[LastItem]] = {t.node_id: [] for t in targets}
    deadline = time.monotonic() + timeout_s
    ctx = zmq.Context()
    try:
        while targets:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            requests = [
                (
                    t,
                    LastRequest(
                        random_token(),
                        pattern,
                        after[t.node_id],
                        PAGE_ITEMS,
                        engine.config.max_message_bytes,
                    ),
                )
                for t in targets
            ]
            more = []
            for answer in ask(ctx, requests, engine.keys, left):
                reply, target = answer.reply, answer.target
                if not isinstance(reply, LastReply):
                    log.warning("last values of %s: %s: %s", pattern, target.name, answer.error)
                    continue
                got[target.node_id].extend(reply.items)
                if reply.more and reply.items:
                    after[target.node_id] = (reply.items[-1].topic, reply.items[-1].seq)
                    more.append(target)
            targets = more
    finally:
        ctx.term()
    out: list[Message] = []
    for producer, items in got.items():
        by_topic: dict[str, list[LastItem]] = {}
        for item in items:
            by_topic.setdefault(item.topic, []).append(item)
        for topic, values in by_topic.items():
            out.extend(_messages(bytes.fromhex(producer), topic, values))
    out.sort(key=lambda m: (m.topic, m.id.producer, m.id.seq))
    return out


def _messages(producer: bytes, topic: str, items: list[LastItem]) -> list[Message]:
    """``items`` as messages that settle nothing (as a replay reader's are)."""
    origin = Origin(
        None,
        (producer, topic, ""),
        None,
        [i.seq for i in items],
        [i.headers for i in items],
        bytes(len(items)),
        [i.partition for i in items],
        [i.published_at for i in items],
        [i.index for i in items],
    )
    return [Message(origin, n, i.key, i.payload) for n, i in enumerate(items)]
