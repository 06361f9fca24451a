"""Wire messages: frozen slotted dataclasses, no I/O.

Control travels DEALER -> ROUTER as one msgpack frame ``[version, kind, ...]``.

Data travels PUSH -> PULL as one multipart message per batch. Its first frame is a
msgpack list, with the batch's messages as parallel columns (one array per field, every
array as long as the batch)::

    [version, BATCH, node_id, incarnation, topic, lane, floor,
     seqs, partitions, keys, headers, attempts, published_ats, indexes, payloads]

``payloads`` holds each payload as a msgpack bin, so a batch of small messages is a single
ZeroMQ frame. A payload of ``LARGE_PAYLOAD_BYTES`` (64 KiB) or more, and any payload past
``INLINE_PAYLOAD_BYTES`` of inline payloads in one batch (both in ``codec``), travels
instead as a raw frame of its own after the header, sent without a copy; its place in
``payloads`` holds nil, and the nils take the extra frames in order. A batch with as many
nils as extra frames is the only valid one.

This module is long because each frame is a dataclass documented with its fields, and
the kinds are numbered in one place, where no two can collide.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_os_random = random.SystemRandom()


def random_token() -> int:
    """A random 62-bit number from the OS, for a request's id or a session's token (not
    ``secrets``: through hmac it loads OpenSSL, 3.5 MB a node has no other use for)."""
    return _os_random.getrandbits(62)


PROTOCOL_VERSION = 7  # 2: data batches in columns, payloads inside the header frame;
#                       3: subscriptions and fetch requests carry max_message_bytes;
#                       4: consecutive sequences of a batch or an ack travel as the first;
#                       5: a batch's numbers (partitions, attempts, publish times, indexes)
#                          travel as bins of fixed-size little-endian numbers;
#                       6: ephemeral subscriptions, GROUP_DEL, TOUCH;
#                       7: membership by SWIM (PING, PING_REQ, PONG, GOSSIP), subscriptions
#                          by pattern and with ``deliver``, REPLY, LAST_REQ / LAST_REP,
#                          replicas (hello's replica fields, REPL_*, HANDBACK*, settlements
#                          relayed to a taker with their producer)

# Control kinds.
HELLO = 1
BYE = 2
ACK = 3
NACK = 4
FAIL = 5
STATUS_REQ = 6
STATUS_REP = 7
ADMIN_REQ = 8
ADMIN_REP = 9
FETCH_REQ = 10
FETCH_REP = 11
GROUP_DEL = 12
TOUCH = 13
REPL_OPS = 14
REPL_ACK = 15
REPL_DROP = 17
HANDBACK = 18
HANDBACK_ACK = 19
# Membership (SWIM): probes, their answers, and news.
PING = 20
PING_REQ = 21
PONG = 22
GOSSIP = 23
# Requests' replies and last values per key.
REPLY = 24
LAST_REQ = 25
LAST_REP = 26
# Data kinds.
BATCH = 16


@dataclass(frozen=True, slots=True)
class SubInfo:
    """One subscription a node announces: which lane of which topic (or of the topics a
    pattern matches) it consumes."""

    topic: str  # a topic name or a pattern
    group: str  # (an ephemeral subscription's: a name of its own, unique at its node)
    mode: str  # "shared" | "broadcast" | "ephemeral"
    max_in_flight: int
    batch_size: int
    max_message_bytes: int  # the largest payload the subscribing node accepts
    deliver: str | None = None  # "last_per_key": kept values first (a new lane's)


@dataclass(frozen=True, slots=True)
class PeerRef:
    """A peer known to the sender, gossiped so others can contact it."""

    node_id: bytes
    ctrl_endpoint: str
    public_key: str = ""  # Z85 CURVE key on a secured mesh


@dataclass(frozen=True, slots=True)
class CopyRef:
    """A whole copy of a producer's replicated outbox that the sender holds: whose, and
    how fresh (the producer's incarnation and replica-set version it last heard of)."""

    producer: bytes
    incarnation: int
    version: int


@dataclass(frozen=True, slots=True)
class Hello:
    """Announcement and heartbeat: who I am, where I listen, what I consume; whether I
    host replicas, whose copies I hold, whose lanes I took over."""

    node_id: bytes
    name: str
    mesh: str
    incarnation: int
    ctrl_port: int
    data_port: int
    hosts: tuple[str, ...]
    subs: tuple[SubInfo, ...]
    peers: tuple[PeerRef, ...]
    replica_host: bool = False
    copies: tuple[CopyRef, ...] = ()
    serving: tuple[bytes, ...] = ()  # producers whose lanes the sender took over


@dataclass(frozen=True, slots=True)
class Rumor:
    """What the sender believes of one node (SWIM's membership news): its state in one of
    its lives, ordered by (incarnation, refuted), and where it listens.

    ``state``: 0 alive, 1 suspect, 2 dead; ``by``: who suspected it or declared it dead
    (empty when alive). ``ctrl_endpoint`` is where the sender reaches it (a node's own
    rumor of itself names its bound address, and its receiver uses the connection's).
    """

    node_id: bytes
    name: str
    incarnation: int
    refuted: int
    state: int
    by: bytes
    ctrl_endpoint: str
    data_port: int
    public_key: str = ""  # Z85 CURVE key on a secured mesh


@dataclass(frozen=True, slots=True)
class Ping:
    """Are you alive? ``target`` is the node meant (answered only by it)."""

    sender: Rumor  # the sender as it is now
    seq: int
    target: bytes
    rumors: tuple[Rumor, ...]


@dataclass(frozen=True, slots=True)
class PingReq:
    """Ping ``target`` for me (my own ping went unanswered) and tell me its answer."""

    sender: Rumor
    seq: int
    target: bytes
    rumors: tuple[Rumor, ...]


@dataclass(frozen=True, slots=True)
class Pong:
    """The answer to ping ``seq``: ``about`` is alive (the sender, or the node the sender
    pinged for the receiver)."""

    sender: Rumor
    seq: int
    about: bytes
    rumors: tuple[Rumor, ...]


@dataclass(frozen=True, slots=True)
class Gossip:
    """News, with nothing asked."""

    sender: Rumor
    rumors: tuple[Rumor, ...]


@dataclass(frozen=True, slots=True)
class Bye:
    """The sender is closing cleanly: treat it as dead now."""

    node_id: bytes
    incarnation: int


@dataclass(frozen=True, slots=True)
class Ack:
    """The sender's group processed these sequences of the receiver's lane."""

    node_id: bytes
    topic: str
    lane: str
    seqs: Sequence[int]  # (decoded: a range when consecutive and ascending, else a tuple)
    producer: bytes = b""  # whose lane (relayed to a node that took it over; b"": the receiver)


@dataclass(frozen=True, slots=True)
class Nack:
    """Redeliver these sequences after ``delay_s`` (negative: the lane's backoff)."""

    node_id: bytes
    topic: str
    lane: str
    seqs: Sequence[int]  # (a tuple when decoded)
    delay_s: float
    producer: bytes = b""


@dataclass(frozen=True, slots=True)
class Fail:
    """Park this sequence in the lane's dead letters with a reason."""

    node_id: bytes
    topic: str
    lane: str
    seq: int
    reason: str
    producer: bytes = b""


@dataclass(frozen=True, slots=True)
class Touch:
    """The sender's member still works on these in-flight sequences of the receiver's
    lane: their ack deadline starts again (``Message.in_progress``)."""

    node_id: bytes
    topic: str
    lane: str
    seqs: Sequence[int]  # (a tuple when decoded)
    producer: bytes = b""


@dataclass(frozen=True, slots=True)
class GroupDel:
    """An operator deleted ``group`` of ``topic``: drop its lanes (sent by the node that
    was asked to every live peer)."""

    node_id: bytes
    topic: str
    group: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A responder's answer to a request: the message ``seq`` of the receiver (its
    producer) on ``topic``. ``ok`` False: the handler raised, ``payload`` says why. The
    payload travels as a raw frame after this one."""

    node_id: bytes
    topic: str
    seq: int
    ok: bool
    headers: dict[str, Any] | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class LastRequest:
    """Ask a producer for the values it keeps of the topics ``pattern`` matches, in
    (topic, sequence) order after ``after`` (None: from the start)."""

    token: int
    pattern: str
    after: tuple[str, int] | None
    max_items: int
    max_payload_bytes: int


@dataclass(frozen=True, slots=True)
class LastItem:
    """One kept value in a LastReply."""

    topic: str
    partition: int
    index: int | None
    seq: int
    key: str | None
    headers: dict[str, Any] | None
    published_at: float
    payload: bytes


@dataclass(frozen=True, slots=True)
class LastReply:
    """The answer to a LastRequest: items, and whether more are left after them."""

    token: int
    items: tuple[LastItem, ...]
    more: bool


@dataclass(frozen=True, slots=True)
class StatusRequest:
    """Ask a node for its status; answered on the same ROUTER connection."""

    token: int


@dataclass(frozen=True, slots=True)
class StatusReply:
    """A node's status as a plain msgpack-able mapping."""

    token: int
    status: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """An operator's request to a node (dead letters: list, replay, purge)."""

    token: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AdminReply:
    """The answer to an AdminRequest: a result, or an error message."""

    token: int
    ok: bool
    result: object
    error: str


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A reader asks a producer for stored messages of a topic, by index.

    ``cursors``: (partition, first index wanted); ``start``: the first index of every other
    partition the producer has (None: only the partitions in ``cursors``);
    ``max_payload_bytes``: the reader's ``max_message_bytes`` (a message with a larger
    payload is left out: a gap for the reader).
    """

    token: int
    topic: str
    cursors: tuple[tuple[int, int], ...]
    start: int | None
    max_items: int
    max_payload_bytes: int


@dataclass(frozen=True, slots=True)
class FetchItem:
    """One stored message in a FetchReply."""

    partition: int
    index: int
    seq: int
    key: str | None
    headers: dict[str, Any] | None
    published_at: float
    payload: bytes


@dataclass(frozen=True, slots=True)
class FetchHead:
    """Where one partition stands at the producer, for the reader's cursor.

    ``oldest``: the oldest stored index; ``next``: the next index to be allocated;
    ``scanned``: the reader's next cursor (indexes below it that no item carried are gone).
    """

    partition: int
    oldest: int
    next: int
    scanned: int


@dataclass(frozen=True, slots=True)
class FetchReply:
    """The answer to a FetchRequest: items in index order per partition, and heads."""

    token: int
    topic: str
    items: tuple[FetchItem, ...]
    heads: tuple[FetchHead, ...]


@dataclass(frozen=True, slots=True)
class Batch:
    """Messages of one lane from one producer, with the lane's acked floor.

    The messages are columns: the i-th message is ``seqs[i]``, ``partitions[i]``, ...,
    ``payloads[i]``; every column has one element per message. ``indexes[i]`` is the
    message's index in its (topic, partition) at the producer, or None (not indexed).

    ``floor``: every sequence of this lane below it is settled at the producer and will
    never be delivered again, so consumers may forget their dedupe entries below it.
    """

    node_id: bytes
    incarnation: int
    topic: str
    lane: str
    floor: int
    seqs: Sequence[int]  # (decoded: a range when consecutive and ascending, else a tuple)
    # (decoded: numbers as arrays, or bytes for a byte each, the rest as tuples; a
    # producer hands the columns of its outbox, lists or tuples)
    partitions: Sequence[int]
    keys: Sequence[str | None]
    headers: Sequence[dict[str, Any] | None]
    attempts: Sequence[int]
    published_ats: Sequence[float]
    indexes: Sequence[int | None]
    payloads: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class Writes:
    """What a producer committed to its outbox for its replicated topics: the store's
    keys and values as they are (see _store/store.py), for a replica to commit as they
    are. Sequences and lane ids are the producer's own. The fields are in the order a
    store applies them (puts, then deletions): parts of one commit, cut in that order,
    applied one after the other, end as the whole would."""

    msgs_put: tuple[tuple[bytes, bytes], ...] = ()
    pend_put: tuple[tuple[bytes, bytes], ...] = ()
    # (lane key prefix, sequence keys, values): a stage's pending entries of one lane
    pend_runs: tuple[tuple[bytes, tuple[bytes, ...], tuple[bytes, ...]], ...] = ()
    runs_put: tuple[tuple[bytes, bytes], ...] = ()
    prun_put: tuple[tuple[bytes, bytes], ...] = ()
    prun_set: tuple[tuple[bytes, bytes | None], ...] = ()  # None: deleted
    lanes_put: tuple[tuple[bytes, bytes], ...] = ()
    lanes_del: tuple[tuple[bytes, int], ...] = ()
    dead_put: tuple[tuple[bytes, bytes], ...] = ()
    pend_del: tuple[bytes, ...] = ()
    msgs_del: tuple[bytes, ...] = ()
    runs_del: tuple[bytes, ...] = ()
    dead_del: tuple[bytes, ...] = ()


# ReplOps.sync
SYNC_NONE = 0  # a delta: writes the producer committed
SYNC_BEGIN = 1  # a new copy starts (the replica keeps its old one until the end)
SYNC_PART = 2  # part of the outbox as it stands (read from the producer's store)
SYNC_END = 3  # the new copy is whole


@dataclass(frozen=True, slots=True)
class ReplOps:
    """One frame of a producer's stream to one of its replicas.

    ``op``: the producer's number of it (growing over its incarnation; acks name it);
    ``prev``: the op of the frame sent to this replica before it (a replica that did not
    get that one asks for its copy again). ``replicas``: the producer's replica set, best
    first, at ``version``. ``topics``: the replicated topics' configurations (with
    SYNC_BEGIN)."""

    producer: bytes
    incarnation: int
    op: int
    prev: int
    version: int
    replicas: tuple[bytes, ...]
    sync: int
    fsync: bool
    topics: tuple[tuple[str, dict[str, Any]], ...]
    writes: Writes


@dataclass(frozen=True, slots=True)
class ReplAck:
    """A replica committed its copy up to ``op`` of ``producer``'s stream; or
    (``resync``) it refused frame ``op``, which did not follow the last it applied, and
    asks for a new copy."""

    node_id: bytes
    producer: bytes
    incarnation: int
    op: int
    resync: bool


@dataclass(frozen=True, slots=True)
class ReplDrop:
    """Drop your copy of ``producer``'s outbox: the producer no longer counts on it, or
    (sent by the node that served its lanes) it is gone for good and owed nothing more."""

    producer: bytes
    incarnation: int


@dataclass(frozen=True, slots=True)
class HandbackLane:
    """What a lane of a taken-over producer became at the taker: ``outcome`` (an
    ``Outcome`` value) for the sequences in ``ranges`` (``[lo, hi)`` pairs, flat);
    ``dead``: the dead-letter entries (sequence, stored value) of those parked there."""

    topic: str
    lane: str
    outcome: str
    ranges: tuple[int, ...]
    dead: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Handback:
    """A taker gives a returned producer its lanes back: what it settled of them (in
    parts: ``last`` marks the final one of ``token``'s)."""

    node_id: bytes
    producer: bytes
    token: int
    lanes: tuple[HandbackLane, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class HandbackAck:
    """The producer applied the hand-back ``token``: the taker lets go of its lanes."""

    node_id: bytes
    token: int


Control = (
    Hello
    | Bye
    | Ack
    | Nack
    | Fail
    | Touch
    | GroupDel
    | Ping
    | PingReq
    | Pong
    | Gossip
    | StatusRequest
    | StatusReply
    | AdminRequest
    | AdminReply
    | FetchRequest
    | FetchReply
    | Reply
    | LastRequest
    | LastReply
    | ReplOps
    | ReplAck
    | ReplDrop
    | Handback
    | HandbackAck
)
