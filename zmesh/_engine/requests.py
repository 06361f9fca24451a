"""Requests and replies on the IO thread: a request published only when some group of its
topic has a live member, and replies sent to their requesters (see zmesh/_requests.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._protocol.codec import encode_control
from .._protocol.frames import Reply
from .._store.store import WriteBatch
from ..errors import NoRespondersError
from .stats import Counters

if TYPE_CHECKING:
    from .commands import Request, Respond
    from .mesh import Mesh
    from .outbox.outbox import Outbox
    from .submit import Submitter


def accept(cmd: Request, outbox: Outbox, queue: Submitter, batch: WriteBatch, now: float) -> bool:
    """Whether to publish the request: some lane of its topic (a topic first asked for
    gets the lanes of the pattern groups matching it) has a live member. If none has,
    the request fails with NoRespondersError and is not stored."""
    topic = cmd.pub.topic
    lanes = outbox.lanes
    patterns = outbox.groups.patterns
    if topic not in patterns.checked and not patterns.new_topic(topic, batch, now):
        # (no pattern group has it: a topic only asked for is not remembered, or a
        # pattern group learned later would get a lane of every topic ever asked)
        patterns.checked.discard(topic)
    live = sum(1 for lane in lanes.of_topic(topic) if lane.members)
    if not live:
        queue.abandon(1, len(cmd.pub.payload))
        cmd.pending.fail(NoRespondersError(topic))
        return False
    cmd.pending.accept(live)
    return True


def send_reply(mesh: Mesh, cmd: Respond, node_id: bytes, counters: Counters) -> None:
    """Send a reply to the node that published the request (at most once: a requester
    that is gone, or whose pipe is full, misses it, counted in ``replies_dropped``)."""
    origin = cmd.origin
    producer = origin.source[0]
    frame = encode_control(Reply(node_id, origin.topic, cmd.seq, cmd.ok, cmd.headers, cmd.payload))
    peer = mesh.peer(producer)
    if peer is not None and peer.alive and mesh.send_raw(peer.dealer, frame):
        counters.add("replies_sent", 1)
    else:
        counters.add("replies_dropped", 1)
