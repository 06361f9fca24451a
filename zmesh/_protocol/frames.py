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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROTOCOL_VERSION = 7  # 2: data batches in columns, payloads inside the header frame;
#                       3: subscriptions and fetch requests carry max_message_bytes;
#                       4: consecutive sequences of a batch or an ack travel as the first;
#                       5: a batch's numbers (partitions, attempts, publish times, indexes)
#                          travel as bins of fixed-size little-endian numbers;
#                       6: ephemeral subscriptions, GROUP_DEL, TOUCH;
#                       7: membership by SWIM (PING, PING_REQ, PONG, GOSSIP), subscriptions
#                          by pattern and with ``deliver``, REPLY, LAST_REQ / LAST_REP

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
class Hello:
    """Announcement and heartbeat: who I am, where I listen, what I consume."""

    node_id: bytes
    name: str
    mesh: str
    incarnation: int
    ctrl_port: int
    data_port: int
    hosts: tuple[str, ...]
    subs: tuple[SubInfo, ...]
    peers: tuple[PeerRef, ...]


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


@dataclass(frozen=True, slots=True)
class Nack:
    """Redeliver these sequences after ``delay_s`` (negative: the lane's backoff)."""

    node_id: bytes
    topic: str
    lane: str
    seqs: Sequence[int]  # (a tuple when decoded)
    delay_s: float


@dataclass(frozen=True, slots=True)
class Fail:
    """Park this sequence in the lane's dead letters with a reason."""

    node_id: bytes
    topic: str
    lane: str
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Touch:
    """The sender's member still works on these in-flight sequences of the receiver's
    lane: their ack deadline starts again (``Message.in_progress``)."""

    node_id: bytes
    topic: str
    lane: str
    seqs: Sequence[int]  # (a tuple when decoded)


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
    headers: dict | None
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
    headers: dict | None
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
    status: dict


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """An operator's request to a node (dead letters: list, replay, purge)."""

    token: int
    op: str
    args: dict


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
    headers: dict | None
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
    headers: Sequence[dict | None]
    attempts: Sequence[int]
    published_ats: Sequence[float]
    indexes: Sequence[int | None]
    payloads: Sequence[bytes]


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
)
