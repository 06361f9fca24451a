"""The wire codec: round trips, and hostile input meets only DecodeError."""

from __future__ import annotations

import dataclasses
import struct
from array import array
from collections.abc import Sequence
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zmesh._protocol.checks import NODE_ID_BYTES
from zmesh._protocol.codec import (
    INLINE_PAYLOAD_BYTES,
    LARGE_PAYLOAD_BYTES,
    MAX_BATCH_HEADER_BYTES,
    MAX_BATCH_ITEMS,
    MAX_HEADER_BYTES,
    MAX_SUBSCRIPTION_BYTES,
    MAX_SUBSCRIPTIONS,
    _pack_indexes,
    _pack_optional,
    _pack_uints,
    _split,
    announced_bytes,
    check_headers,
    decode_batch,
    decode_control,
    encode_batch,
    encode_control,
    encode_lane_batch,
    pack_columns,
    wire_seqs,
)
from zmesh._protocol.frames import (
    ACK,
    BATCH,
    BYE,
    FAIL,
    FETCH_REP,
    FETCH_REQ,
    GOSSIP,
    GROUP_DEL,
    HANDBACK,
    HANDBACK_ACK,
    HELLO,
    LAST_REP,
    LAST_REQ,
    NACK,
    PING,
    PING_REQ,
    PONG,
    PROTOCOL_VERSION,
    REPL_ACK,
    REPL_DROP,
    REPL_OPS,
    REPLY,
    STATUS_REP,
    STATUS_REQ,
    SYNC_BEGIN,
    SYNC_END,
    TOUCH,
    Ack,
    Batch,
    Bye,
    CopyRef,
    Fail,
    FetchHead,
    FetchItem,
    FetchReply,
    FetchRequest,
    Gossip,
    GroupDel,
    Handback,
    HandbackAck,
    HandbackLane,
    Hello,
    LastItem,
    LastReply,
    LastRequest,
    Nack,
    PeerRef,
    Ping,
    PingReq,
    Pong,
    ReplAck,
    ReplDrop,
    ReplOps,
    Reply,
    Rumor,
    StatusReply,
    StatusRequest,
    SubInfo,
    Touch,
    Writes,
)
from zmesh._protocol.swim import MAX_RUMORS
from zmesh.errors import DecodeError

# No example database: nothing is written into the repository.
FAST = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
FUZZ = settings(
    max_examples=700, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

MAX_MESSAGE_BYTES = 1 << 16
assert MAX_MESSAGE_BYTES >= LARGE_PAYLOAD_BYTES  # large payloads are valid ones
CONTROL_TYPES = (
    Hello,
    Bye,
    Ack,
    Nack,
    Fail,
    Touch,
    GroupDel,
    Ping,
    PingReq,
    Pong,
    Gossip,
    StatusRequest,
    StatusReply,
    FetchRequest,
    FetchReply,
    Reply,
    LastRequest,
    LastReply,
    ReplOps,
    ReplAck,
    ReplDrop,
    Handback,
    HandbackAck,
)
U63 = (1 << 63) - 1
NODE = b"\x01" * NODE_ID_BYTES

# -- strategies -----------------------------------------------------------------------------

node_ids = st.binary(min_size=NODE_ID_BYTES, max_size=NODE_ID_BYTES)
names = st.text(max_size=40)
u63 = st.integers(0, U63)
ports = st.integers(1, 65535)
seq_lists = st.lists(u63, max_size=50).map(tuple)
finite = st.floats(allow_nan=False, allow_infinity=False)

sub_infos = st.builds(
    SubInfo,
    topic=names,
    group=names,
    mode=st.sampled_from(["shared", "broadcast"]),
    max_in_flight=st.integers(1, 1 << 24),
    batch_size=st.integers(1, MAX_BATCH_ITEMS),
    max_message_bytes=st.integers(1, U63),
    deliver=st.sampled_from([None, "last_per_key"]),
)
hosts = st.one_of(
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9.\-]{0,30}\Z"),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)
endpoints = st.builds(lambda h, p: f"tcp://{h}:{p}", hosts, ports)
curve_keys = st.one_of(st.just(""), st.text(min_size=40, max_size=40))
peer_refs = st.builds(PeerRef, node_id=node_ids, ctrl_endpoint=endpoints, public_key=curve_keys)

# Plain msgpack values that come back equal (lists, not tuples; str map keys).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | finite
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
msgpack_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

hellos = st.builds(
    Hello,
    node_id=node_ids,
    name=names,
    mesh=names,
    incarnation=u63,
    ctrl_port=ports,
    data_port=ports,
    hosts=st.lists(names, max_size=5).map(tuple),
    subs=st.lists(sub_infos, max_size=5).map(tuple),
    peers=st.lists(peer_refs, max_size=5).map(tuple),
    replica_host=st.booleans(),
    copies=st.lists(st.builds(CopyRef, producer=node_ids, incarnation=u63, version=u63)).map(tuple),
    serving=st.lists(node_ids, max_size=3).map(tuple),
)
producers = st.just(b"") | node_ids  # (b"": a settlement of the receiver's own lane)
acks = st.builds(Ack, node_id=node_ids, topic=names, lane=names, seqs=seq_lists, producer=producers)
nacks = st.builds(
    Nack,
    node_id=node_ids,
    topic=names,
    lane=names,
    seqs=seq_lists,
    delay_s=finite,
    producer=producers,
)
fails = st.builds(
    Fail,
    node_id=node_ids,
    topic=names,
    lane=names,
    seq=u63,
    reason=st.text(max_size=300),
    producer=producers,
)
byes = st.builds(Bye, node_id=node_ids, incarnation=u63)
status_requests = st.builds(StatusRequest, token=u63)
status_replies = st.builds(
    StatusReply, token=u63, status=st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6)
)
partitions = st.integers(0, 4095)
fetch_requests = st.builds(
    FetchRequest,
    token=u63,
    topic=names,
    cursors=st.lists(st.tuples(partitions, u63), max_size=5).map(tuple),
    start=st.none() | u63,
    max_items=st.integers(1, 10_000),
    max_payload_bytes=st.integers(1, U63),
)
fetch_replies = st.builds(
    FetchReply,
    token=u63,
    topic=names,
    items=st.lists(
        st.builds(
            FetchItem,
            partition=partitions,
            index=u63,
            seq=u63,
            key=st.none() | st.text(max_size=60),
            headers=st.none() | st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4),
            published_at=finite,
            payload=st.binary(max_size=64),
        ),
        max_size=5,
    ).map(tuple),
    heads=st.lists(
        st.builds(FetchHead, partition=partitions, oldest=u63, next=u63, scanned=u63), max_size=5
    ).map(tuple),
)
rumors = st.builds(
    Rumor,
    node_id=node_ids,
    name=names,
    incarnation=u63,
    refuted=u63,
    state=st.sampled_from([0, 1, 2]),
    by=st.just(b"") | node_ids,
    ctrl_endpoint=endpoints,
    data_port=ports,
    public_key=curve_keys,
)
rumor_lists = st.lists(rumors, max_size=6).map(tuple)
pings = st.builds(Ping, sender=rumors, seq=u63, target=node_ids, rumors=rumor_lists)
ping_reqs = st.builds(PingReq, sender=rumors, seq=u63, target=node_ids, rumors=rumor_lists)
pongs = st.builds(Pong, sender=rumors, seq=u63, about=node_ids, rumors=rumor_lists)
gossips = st.builds(Gossip, sender=rumors, rumors=rumor_lists)
replies = st.builds(
    Reply,
    node_id=node_ids,
    topic=names,
    seq=u63,
    ok=st.booleans(),
    headers=st.none() | st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4),
    payload=st.binary(max_size=64),
)
last_requests = st.builds(
    LastRequest,
    token=u63,
    pattern=names,
    after=st.none() | st.tuples(names, u63),
    max_items=st.integers(1, 10_000),
    max_payload_bytes=st.integers(1, U63),
)
last_replies = st.builds(
    LastReply,
    token=u63,
    items=st.lists(
        st.builds(
            LastItem,
            topic=names,
            partition=partitions,
            index=st.none() | u63,
            seq=u63,
            key=st.none() | st.text(max_size=60),
            headers=st.none() | st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4),
            published_at=finite,
            payload=st.binary(max_size=64),
        ),
        max_size=5,
    ).map(tuple),
    more=st.booleans(),
)
seq_keys = st.binary(min_size=8, max_size=8)
lane_keys = st.binary(min_size=12, max_size=12)
values = st.binary(max_size=40)
writes = st.builds(
    Writes,
    msgs_put=st.lists(st.tuples(seq_keys, values), max_size=3).map(tuple),
    pend_put=st.lists(st.tuples(lane_keys, values), max_size=3).map(tuple),
    pend_runs=st.lists(
        st.integers(0, 4).flatmap(
            lambda n: st.tuples(
                st.binary(min_size=4, max_size=4),
                st.lists(seq_keys, min_size=n, max_size=n).map(tuple),
                st.lists(values, min_size=n, max_size=n).map(tuple),
            )
        ),
        max_size=2,
    ).map(tuple),
    runs_put=st.lists(st.tuples(seq_keys, values), max_size=2).map(tuple),
    prun_put=st.lists(st.tuples(lane_keys, values), max_size=2).map(tuple),
    prun_set=st.lists(st.tuples(lane_keys, st.none() | values), max_size=2).map(tuple),
    lanes_put=st.lists(st.tuples(st.binary(max_size=30), values), max_size=2).map(tuple),
    lanes_del=st.lists(
        st.tuples(st.binary(max_size=30), st.integers(0, (1 << 32) - 1)), max_size=2
    ).map(tuple),
    dead_put=st.lists(st.tuples(lane_keys, values), max_size=2).map(tuple),
    pend_del=st.lists(lane_keys, max_size=3).map(tuple),
    msgs_del=st.lists(seq_keys, max_size=3).map(tuple),
    runs_del=st.lists(seq_keys, max_size=3).map(tuple),
    dead_del=st.lists(lane_keys, max_size=3).map(tuple),
)
repl_ops = st.builds(
    ReplOps,
    producer=node_ids,
    incarnation=u63,
    op=u63,
    prev=u63,
    version=u63,
    replicas=st.lists(node_ids, max_size=4).map(tuple),
    sync=st.integers(0, SYNC_END),
    fsync=st.booleans(),
    topics=st.lists(
        st.tuples(names, st.dictionaries(st.text(max_size=8), msgpack_values, max_size=3)),
        max_size=2,
    ).map(tuple),
    writes=writes,
)
repl_acks = st.builds(
    ReplAck, node_id=node_ids, producer=node_ids, incarnation=u63, op=u63, resync=st.booleans()
)
repl_drops = st.builds(ReplDrop, producer=node_ids, incarnation=u63)
handbacks = st.builds(
    Handback,
    node_id=node_ids,
    producer=node_ids,
    token=u63,
    lanes=st.lists(
        st.builds(
            HandbackLane,
            topic=names,
            lane=names,
            outcome=st.sampled_from(["acked", "dead_lettered", "expired"]),
            ranges=st.lists(u63, max_size=3).map(lambda r: tuple(r[: len(r) // 2 * 2])),
            dead=st.lists(st.tuples(u63, values), max_size=2).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
    last=st.booleans(),
)
handback_acks = st.builds(HandbackAck, node_id=node_ids, token=u63)
controls = (
    hellos
    | pings
    | ping_reqs
    | pongs
    | gossips
    | acks
    | nacks
    | fails
    | byes
    | status_requests
    | status_replies
    | fetch_requests
    | fetch_replies
    | replies
    | last_requests
    | last_replies
    | repl_ops
    | repl_acks
    | repl_drops
    | handbacks
    | handback_acks
)

headers = st.none() | st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4)
# A few payloads large enough to travel as frames of their own.
LARGE_PAYLOADS = [b"L" * LARGE_PAYLOAD_BYTES, bytes(range(256)) * (LARGE_PAYLOAD_BYTES // 256)]
small_payloads = st.binary(max_size=64)
payloads = small_payloads | small_payloads | small_payloads | st.sampled_from(LARGE_PAYLOADS)
# One message of a batch: (seq, partition, key, headers, attempt, published_at, index,
# payload).
rows = st.tuples(
    u63,
    st.integers(0, 65535),
    st.none() | st.text(max_size=60),
    headers,
    st.integers(0, 1 << 31),
    finite,
    st.none() | u63,
    payloads,
)


def make_batch(
    node_id: bytes, incarnation: int, topic: str, lane: str, floor: int, messages: list[tuple]
) -> Batch:
    """A Batch from per-message rows (the columns transposed)."""
    columns = tuple(zip(*messages, strict=True)) if messages else ((),) * 8
    return Batch(node_id, incarnation, topic, lane, floor, *columns)


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    return make_batch(
        draw(node_ids),
        draw(u63),
        draw(names),
        draw(names),
        draw(u63),
        draw(st.lists(rows, max_size=8)),
    )


def sample_hello() -> Hello:
    return Hello(
        NODE,
        "n1",
        "plant",
        7,
        5000,
        5001,
        ("127.0.0.1",),
        (
            SubInfo("metrics", "agg", "shared", 100, 10, 8 << 20),
            SubInfo("plant.*.temp", "agg", "broadcast", 100, 10, 8 << 20, "last_per_key"),
        ),
        (PeerRef(b"\x02" * NODE_ID_BYTES, "tcp://127.0.0.1:6000"),),
    )


def test_subscriptions_a_node_may_announce_fit_in_a_hello() -> None:
    # subscribe() refuses past MAX_SUBSCRIPTIONS or MAX_SUBSCRIPTION_BYTES (by
    # announced_bytes): with the longest names (128 characters) and numbers, and 2,048
    # peers on IPv6 endpoints, the hello still decodes.
    topic, group = "t" * 128, "g" * 128
    many = MAX_SUBSCRIPTION_BYTES // announced_bytes(topic, group)
    subs = tuple(
        SubInfo(f"{i:08d}" + topic[8:], group, "broadcast", 1 << 24, MAX_BATCH_ITEMS, (1 << 63) - 1)
        for i in range(many)
    )
    peers = tuple(
        PeerRef(
            i.to_bytes(NODE_ID_BYTES, "big"),
            f"tcp://[fd00:aaaa:bbbb:cccc:dddd:eeee:ffff:{i:04x}]:65535",
            "k" * 40,
        )
        for i in range(2048)
    )
    hello = Hello(NODE, "n" * 128, "m" * 128, U63, 65535, 65535, ("h" * 255,) * 64, subs, peers)
    frame = encode_control(hello)
    assert len(frame) <= MAX_HEADER_BYTES
    assert decode_control(frame) == hello
    # Short names: the count is what bounds them.
    short = tuple(
        SubInfo(f"t{i}", "g", "shared", 1000, 100, 8 << 20) for i in range(MAX_SUBSCRIPTIONS)
    )
    assert sum(announced_bytes(s.topic, s.group) for s in short) <= MAX_SUBSCRIPTION_BYTES
    hello = dataclasses.replace(hello, subs=short)
    assert decode_control(encode_control(hello)) == hello


def sample_rumor(state: int = 0, by: bytes = b"") -> Rumor:
    return Rumor(NODE, "n1", 7, 2, state, by, "tcp://10.0.0.1:5000", 5001, "")


SUSPECT = Rumor(b"\x03" * 16, "n3", 4, 0, 1, NODE, "tcp://[fd00::3]:7000", 7001, "k" * 40)
OTHER = b"\x02" * NODE_ID_BYTES
SAMPLE_CONTROLS: list[Any] = [
    sample_hello(),
    Ack(NODE, "metrics", "agg", (1, 2, 3)),
    Nack(NODE, "metrics", "agg", (4,), 2.5),
    Fail(NODE, "metrics", "agg", 9, "bad record"),
    Bye(NODE, 7),
    Touch(NODE, "metrics", "agg", (5, 9)),
    GroupDel(NODE, "metrics", "agg"),
    Ping(sample_rumor(), 1, b"\x02" * 16, (SUSPECT,)),
    PingReq(sample_rumor(), 2, b"\x03" * 16, ()),
    Pong(sample_rumor(), 1, b"\x02" * 16, (sample_rumor(2, NODE), SUSPECT)),
    Gossip(sample_rumor(), (SUSPECT,)),
    Ack(NODE, "metrics", "agg", (7, 8), OTHER),  # relayed to the node serving OTHER's lanes
    ReplOps(
        NODE,
        3,
        12,
        11,
        2,
        (OTHER,),
        SYNC_BEGIN,
        True,
        (("metrics", {"replicas": 2, "groups": ["agg"]}),),
        Writes(
            msgs_put=((b"\x00" * 7 + b"\x05", b"record"),),
            pend_runs=((b"\x00\x00\x00\x01", (b"\x00" * 7 + b"\x05",), (b"pending",)),),
            prun_set=((b"\x00" * 12, None), (b"\x01" * 12, b"entry")),
            lanes_del=((b"lane key", 4),),
            msgs_del=(b"\x00" * 8,),
        ),
    ),
    ReplAck(OTHER, NODE, 3, 12, False),
    ReplDrop(NODE, 3),
    Handback(
        OTHER,
        NODE,
        99,
        (HandbackLane("metrics", "agg", "dead_lettered", (5, 9), ((5, b"dead letter"),)),),
        True,
    ),
    HandbackAck(NODE, 99),
    StatusRequest(42),
    StatusReply(42, {"lanes": [], "ok": True}),
    Reply(NODE, "calib.l4", 12, True, {"unit": "C"}, b"21.5"),
    LastRequest(44, "plant.*.temp", ("plant.l4.temp", 9), 1000, 8 << 20),
    LastReply(44, (LastItem("plant.l4.temp", 3, 7, 12, "k", None, 1.5, b"v"),), True),
    FetchRequest(43, "metrics", ((0, 5), (3, 0)), 0, 500, 8 << 20),
    FetchReply(
        43,
        "metrics",
        (FetchItem(3, 7, 12, "k", {"h": 1}, 1.5, b"payload"),),
        (FetchHead(3, 2, 9, 8), FetchHead(0, 0, 0, 5)),
    ),
]


BIG = b"B" * LARGE_PAYLOAD_BYTES


def sample_batch() -> Batch:
    """Two inline payloads and a large one that travels as a second frame (sequences
    with a gap: they travel as an array)."""
    return make_batch(
        NODE,
        3,
        "metrics",
        "agg",
        10,
        [
            (10, 4, "line-4", {"unit": "C"}, 1, 1.5, 7, b"first"),
            (11, 0, None, None, 0, 2.0, None, b""),
            (13, 65535, "k", {}, 1 << 31, 0.0, 0, BIG),
        ],
    )


COLUMN_FIELDS = (
    "seqs",
    "partitions",
    "keys",
    "headers",
    "attempts",
    "published_ats",
    "indexes",
    "payloads",
)


def plain(batch: Batch) -> tuple:
    """A batch's fields with each column as a list: a decoded batch's columns of numbers
    are arrays (or bytes, a byte each), a made one's tuples."""
    return tuple(
        list(getattr(batch, f.name)) if f.name in COLUMN_FIELDS else getattr(batch, f.name)
        for f in dataclasses.fields(batch)
    )


def empty(n: int) -> list[tuple]:
    """``n`` messages with every field at its smallest."""
    return [(i, 0, None, None, 0, 0.0, None, b"") for i in range(n)]


def repack(frame: bytes, change: Any) -> bytes:
    """Unpack a valid frame, let ``change`` edit the list, pack it again."""
    obj = msgpack.unpackb(frame, raw=False)
    change(obj)
    return msgpack.packb(obj, use_bin_type=True)


# -- round trips ----------------------------------------------------------------------------


def with_tuple_seqs(msg: Any) -> Any:
    """An ACK with its sequences as a tuple: decoded, consecutive ones are a range."""
    return dataclasses.replace(msg, seqs=tuple(msg.seqs)) if isinstance(msg, Ack) else msg


@FAST
@given(controls)
def test_control_round_trip(msg: Any) -> None:
    frame = encode_control(msg)
    assert isinstance(frame, bytes)
    assert with_tuple_seqs(decode_control(frame)) == msg


@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_every_control_kind_round_trips(msg: Any) -> None:
    decoded = decode_control(encode_control(msg))
    assert type(decoded) is type(msg)
    assert with_tuple_seqs(decoded) == msg


def test_control_kinds_are_distinct_on_the_wire() -> None:
    kinds = [msgpack.unpackb(encode_control(m))[1] for m in SAMPLE_CONTROLS]
    assert kinds == [
        HELLO,
        ACK,
        NACK,
        FAIL,
        BYE,
        TOUCH,
        GROUP_DEL,
        PING,
        PING_REQ,
        PONG,
        GOSSIP,
        ACK,
        REPL_OPS,
        REPL_ACK,
        REPL_DROP,
        HANDBACK,
        HANDBACK_ACK,
        STATUS_REQ,
        STATUS_REP,
        REPLY,
        LAST_REQ,
        LAST_REP,
        FETCH_REQ,
        FETCH_REP,
    ]
    assert all(msgpack.unpackb(encode_control(m))[0] == PROTOCOL_VERSION for m in SAMPLE_CONTROLS)


def rumor_list(**change: Any) -> list:
    """A valid rumor on the wire, with ``change`` (field index -> value) applied."""
    wire = [NODE, "n1", 7, 2, 0, b"", "tcp://10.0.0.1:5000", 5001, ""]
    for index, value in change.items():
        wire[int(index[1:])] = value
    return wire


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"f0": b"short"}, "node id"),
        ({"f2": -1}, "incarnation"),
        ({"f3": "1"}, "refuted"),
        ({"f4": 3}, "state"),
        ({"f4": True}, "state"),
        ({"f5": b"x" * 15}, "author"),
        ({"f6": "udp://10.0.0.1:5000"}, "endpoint"),
        ({"f6": "tcp://10.0.0.1:0"}, "endpoint"),
        ({"f7": 0}, "data port"),
        ({"f8": "k" * 41}, "public key"),
    ],
)
def test_a_bad_rumor_does_not_decode(change: dict, what: str) -> None:
    for rumor_at in (2, 5):  # as the sender, and among the rumors
        frame = encode_control(Ping(sample_rumor(), 1, NODE, (sample_rumor(),)))

        def edit(obj: list, rumor_at: int = rumor_at) -> None:
            if rumor_at == 2:
                obj[2] = rumor_list(**change)
            else:
                obj[5] = [rumor_list(**change)]

        with pytest.raises(DecodeError, match=what):
            decode_control(repack(frame, edit))


def test_a_frame_holds_a_bounded_number_of_rumors() -> None:
    many = tuple(sample_rumor() for _ in range(MAX_RUMORS))
    assert decode_control(encode_control(Gossip(sample_rumor(), many))).rumors == many
    frame = encode_control(Gossip(sample_rumor(), (*many, sample_rumor())))
    with pytest.raises(DecodeError, match="rumors"):
        decode_control(frame)


@pytest.mark.parametrize(
    "msg",
    [m for m in SAMPLE_CONTROLS if isinstance(m, Ping | PingReq | Pong | Gossip)],
    ids=lambda m: type(m).__name__,
)
def test_a_membership_frame_of_another_length_does_not_decode(msg: Any) -> None:
    for change in (lambda obj: obj.append(1), lambda obj: obj.pop()):
        with pytest.raises(DecodeError, match="length"):
            decode_control(repack(encode_control(msg), change))


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), float("-inf")])
def test_a_nack_delay_that_is_not_finite_does_not_decode(delay) -> None:
    frame = encode_control(Nack(b"\x01" * NODE_ID_BYTES, "t", "g", (1,), delay))
    with pytest.raises(DecodeError, match="delay"):
        decode_control(frame)


def test_nack_delay_decodes_as_float() -> None:
    decoded = decode_control(encode_control(Nack(NODE, "t", "g", (1,), 3)))  # type: ignore[arg-type]
    assert isinstance(decoded, Nack)
    assert decoded.delay_s == 3.0 and isinstance(decoded.delay_s, float)


def test_encode_control_rejects_non_control() -> None:
    with pytest.raises(TypeError):
        encode_control(sample_batch())  # type: ignore[arg-type]


@FAST
@given(batches())
def test_batch_round_trip(batch: Batch) -> None:
    frames = encode_batch(batch)
    large = [p for p in batch.payloads if len(p) >= LARGE_PAYLOAD_BYTES]
    assert len(frames) == 1 + len(large)
    # Large payloads travel as raw frames: the very objects, for a zero-copy send.
    assert all(f is p for f, p in zip(frames[1:], large, strict=True))
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)
    # The header as a node reads it, a view of the received frame: the same batch, its
    # payloads bytes of their own.
    viewed = decode_batch([memoryview(frames[0]), *frames[1:]], MAX_MESSAGE_BYTES)
    assert plain(viewed) == plain(batch)
    assert all(type(p) is bytes for p in viewed.payloads)


@pytest.mark.parametrize("n", [70, INLINE_PAYLOAD_BYTES // 1000, INLINE_PAYLOAD_BYTES // 1000 + 3])
def test_small_payloads_travel_inline_up_to_the_inline_bytes(n: int) -> None:
    """Payloads of 1,000 bytes: all inside the header while together within
    INLINE_PAYLOAD_BYTES (past LARGE_PAYLOAD_BYTES in all too), those beyond it as frames
    of their own; the frames are what packing the whole header at once gives."""
    batch = make_batch(
        b"\x01" * NODE_ID_BYTES,
        1,
        "t",
        "g",
        0,
        [(i + 1, 0, None, None, 1, 1.0, i, bytes([i % 256]) * 1000) for i in range(n)],
    )
    frames = encode_batch(batch)
    beyond = max(0, n - INLINE_PAYLOAD_BYTES // 1000)
    assert len(frames) == 1 + beyond
    assert frames == packed_at_once(batch)
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)


# Any value publish() might be given as a header value: msgpack's and others.
header_values = st.recursive(
    scalars
    | st.integers()
    | st.floats()
    | st.tuples(scalars)
    | st.sets(st.integers(), max_size=2)
    | st.just(object()),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.text(max_size=4) | st.integers() | st.binary(max_size=4), inner, max_size=3
        )
    ),
    max_leaves=8,
)


def travels(hdrs: dict) -> bool:
    """Whether a batch with ``hdrs`` as a message's headers is encoded and decoded (back
    to the same headers)."""
    batch = make_batch(
        b"\x01" * NODE_ID_BYTES, 1, "t", "g", 0, [(1, 0, None, hdrs, 1, 1.0, 0, b"p")]
    )
    try:
        frames = encode_batch(batch)
        decoded = decode_batch(frames, MAX_MESSAGE_BYTES)
    except (TypeError, ValueError, OverflowError, DecodeError):
        return False
    assert msgpack.packb(decoded.headers[0]) == msgpack.packb(hdrs)  # (NaN != NaN)
    return True


def taken(hdrs: dict) -> bool:
    try:
        check_headers(hdrs)
    except ValueError:
        return False
    return True


@FAST
@given(st.dictionaries(st.text(max_size=8), header_values, max_size=4))
def test_headers_publish_takes_are_headers_every_consumer_decodes(hdrs: dict) -> None:
    """``check_headers`` refuses exactly what would stop a batch from decoding: what it
    takes travels, what it refuses would not."""
    assert taken(hdrs) == travels(hdrs)


@pytest.mark.parametrize(
    "hdrs",
    [
        {},
        {"a": 1, "b": "x", "c": b"\x00", "d": None, "e": True, "f": 1.5, "g": -(1 << 63)},
        {"nested": {"k": [1, {"deeper": [None, "s"]}]}, "list": [1, "two", 3.0]},
        {"tuple": (1, 2)},  # (travels as a list)
    ],
)
def test_plain_headers_are_taken_and_travel(hdrs: dict) -> None:
    assert taken(hdrs) and travels(hdrs)


@pytest.mark.parametrize(
    "hdrs",
    [
        {"set": {1, 2}},
        {"obj": object()},
        {"big": 1 << 64},
        {"nested": {1: "int key"}},
    ],
)
def test_headers_a_consumer_cannot_decode_are_refused(hdrs: dict) -> None:
    assert not taken(hdrs) and not travels(hdrs)


def uints_bin(values: Sequence[int], wide: str) -> bytes:
    """Unsigned ints as protocol 5 carries them, made with ``struct``: a byte each when
    all are below 256, else little-endian of format ``wide`` each."""
    if all(v < 256 for v in values):
        return bytes(values)
    return struct.pack(f"<{len(values)}{wide}", *values)


def indexes_bin(indexes: Sequence[int | None]) -> bytes:
    """Indexes as protocol 5 carries them: uint32 each, or int64 with -1 for None."""
    if None not in indexes and all(i < 1 << 32 for i in indexes):  # type: ignore[operator]
        return struct.pack(f"<{len(indexes)}I", *indexes)
    return struct.pack(f"<{len(indexes)}q", *(-1 if i is None else i for i in indexes))


def packed_at_once(b: Batch) -> list[bytes]:
    """The frames of ``b`` with its header packed by msgpack in one call."""
    inline, extra = (
        _split(b.payloads)
        if sum(map(len, b.payloads)) >= LARGE_PAYLOAD_BYTES
        else (list(b.payloads), [])
    )
    n = len(b.seqs)
    return [
        msgpack.packb(
            [
                PROTOCOL_VERSION,
                BATCH,
                b.node_id,
                b.incarnation,
                b.topic,
                b.lane,
                b.floor,
                wire_seqs(b.seqs),
                uints_bin(b.partitions, "H"),
                list(b.keys),
                list(b.headers),
                uints_bin(b.attempts, "I"),
                struct.pack(f"<{n}d", *b.published_ats),
                indexes_bin(b.indexes),
                inline,
            ],
            use_bin_type=True,
        ),
        *extra,
    ]


@FAST
@given(batches(), names, u63, st.lists(st.integers(0, 1 << 31), min_size=8, max_size=8))
def test_columns_packed_once_serve_every_lane(
    batch: Batch, lane: str, floor: int, attempts: list[int]
) -> None:
    """A topic's other lanes send the same packed columns with their own lane, floor and
    attempts: the frames are those of the whole header packed at once, as msgpack packs
    a list."""
    columns = pack_columns(
        batch.seqs,
        batch.partitions,
        batch.keys,
        batch.headers,
        batch.published_ats,
        batch.indexes,
        batch.payloads,
    )
    other = dataclasses.replace(
        batch, lane=lane, floor=floor, attempts=tuple(attempts[: len(batch.seqs)])
    )
    for b in (batch, other):
        frames = encode_lane_batch(
            b.node_id, b.incarnation, b.topic, b.lane, b.floor, b.attempts, columns
        )
        whole = packed_at_once(b)
        assert frames[0] == whole[0] and frames[1:] == whole[1:]
        assert encode_batch(b) == frames
        assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(b)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                0,
                100,
                INLINE_PAYLOAD_BYTES // 10,
                LARGE_PAYLOAD_BYTES - 1,
                LARGE_PAYLOAD_BYTES,
                3 * LARGE_PAYLOAD_BYTES,
            ]
        ),
        max_size=30,
    )
)
@example([LARGE_PAYLOAD_BYTES - 1] * 9)  # none large, past the header's share together
@example([INLINE_PAYLOAD_BYTES // 10] * 10)  # none large, within it
@example([100, 100, LARGE_PAYLOAD_BYTES, 100])
def test_payloads_travel_inline_unless_large_or_past_the_headers_share(sizes: list[int]):
    """Whatever the columns know or look at first, the payloads split as ``_split`` splits
    them: a large one as a frame of its own, the rest inline until the header holds
    INLINE_PAYLOAD_BYTES of them."""
    n = len(sizes)
    payloads = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    _before, after, extra = pack_columns(
        range(n),
        bytes(n),
        [None] * n,
        [None] * n,
        array("d", bytes(8 * n)),
        array("I", bytes(4 * n)),
        payloads,
    )
    inline, want_extra = _split(payloads)
    assert extra == want_extra and msgpack.unpackb(after[-1]) == inline


@given(
    st.lists(st.integers(0, 300), max_size=40),
    st.lists(st.integers(0, 1 << 31) | st.none(), max_size=20),
    st.lists(st.none() | st.text(max_size=3), max_size=20),
)
def test_columns_packed_at_c_speed_are_what_struct_and_msgpack_pack(
    ints: list[int], indexes: list[int | None], optional: list
) -> None:
    """Partitions and attempts (a byte each when they fit), indexes, keys and headers
    (all nil, mostly): byte for byte what ``struct`` and msgpack make."""
    for wide in ("H", "I"):
        assert (
            _pack_uints(ints, wide)
            == msgpack.packb(uints_bin(ints, wide))
            == _pack_uints(tuple(ints), wide)
        )
    big = [i if i is None else i << 2 for i in indexes]  # (some at or past 2**32)
    for column in (indexes, big, [i for i in indexes if i is not None]):
        assert _pack_indexes(column) == msgpack.packb(indexes_bin(column))
    assert _pack_optional(optional) == msgpack.packb(optional, use_bin_type=True)


@pytest.mark.parametrize("n", [0, 15, 16, 65535, 65536])
def test_nil_columns_packed_at_c_speed_have_msgpack_array_headers(n: int) -> None:
    assert _pack_optional([None] * n) == msgpack.packb([None] * n)


def test_sample_batch_round_trips() -> None:
    batch = sample_batch()
    frames = encode_batch(batch)
    assert frames[1:] == [BIG]
    decoded = decode_batch(frames, MAX_MESSAGE_BYTES)
    assert plain(decoded) == plain(batch)
    assert decoded.keys == ("line-4", None, "k")
    assert decoded.indexes == (7, None, 0)
    assert decoded.payloads == (b"first", b"", BIG)


def test_small_payloads_travel_inside_the_header() -> None:
    batch = make_batch(
        NODE, 1, "t", "g", 0, [(i, 0, None, None, 0, 0.0, i, bytes([i]) * 100) for i in range(100)]
    )
    frames = encode_batch(batch)
    assert len(frames) == 1
    assert msgpack.unpackb(frames[0])[14] == list(batch.payloads)
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)


def test_a_payload_just_under_the_large_size_stays_inline() -> None:
    batch = make_batch(
        NODE,
        1,
        "t",
        "g",
        0,
        [
            (0, 0, None, None, 0, 0.0, None, b"s" * (LARGE_PAYLOAD_BYTES - 1)),
            (1, 0, None, None, 0, 0.0, None, b"L" * LARGE_PAYLOAD_BYTES),
        ],
    )
    frames = encode_batch(batch)
    assert len(frames) == 2 and len(frames[1]) == LARGE_PAYLOAD_BYTES
    assert msgpack.unpackb(frames[0])[14] == [batch.payloads[0], None]
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)


def test_inline_payloads_stop_at_the_header_budget() -> None:
    size = LARGE_PAYLOAD_BYTES - 1
    fit = INLINE_PAYLOAD_BYTES // size
    batch = make_batch(
        NODE,
        1,
        "t",
        "g",
        0,
        [(i, 0, None, None, 0, 0.0, None, bytes([i]) * size) for i in range(fit + 5)],
    )
    frames = encode_batch(batch)
    assert len(frames) == 1 + 5
    assert frames[1:] == list(batch.payloads[fit:])
    assert len(frames[0]) <= MAX_BATCH_HEADER_BYTES
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)


def test_empty_batch_round_trips() -> None:
    batch = make_batch(NODE, 0, "t", "g", 5, [])
    frames = encode_batch(batch)
    assert len(frames) == 1
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)


def test_nils_take_the_extra_frames_in_order() -> None:
    # A sender may put any payload in a frame of its own, not only a large one.
    frames = encode_batch(make_batch(NODE, 1, "t", "g", 0, empty(4)))

    def change(obj: list) -> None:
        obj[14] = [None, b"inline", None, None]

    decoded = decode_batch([repack(frames[0], change), b"a", b"b", b"c"], MAX_MESSAGE_BYTES)
    assert decoded.payloads == (b"a", b"inline", b"b", b"c")


def test_the_layout_before_columns_is_rejected() -> None:
    item = [10, 4, "line-4", {"unit": "C"}, 1, 1.5, 7]
    for version in (1, PROTOCOL_VERSION):
        header = msgpack.packb([version, BATCH, NODE, 3, "metrics", "agg", 10, [item]])
        with pytest.raises(DecodeError):
            decode_batch([header, b"payload"], MAX_MESSAGE_BYTES)


def test_published_at_decodes_as_float() -> None:
    batch = make_batch(
        NODE,
        1,
        "t",
        "g",
        0,
        [(i, 0, None, None, 1, at, None, b"") for i, at in enumerate((3, 1 << 63))],
    )
    decoded = decode_batch(encode_batch(batch), MAX_MESSAGE_BYTES)
    assert list(decoded.published_ats) == [3.0, float(1 << 63)]
    assert all(type(t) is float for t in decoded.published_ats)


@pytest.mark.parametrize(
    ("partitions", "attempts", "indexes", "sizes"),
    [
        ((0, 255), (1, 255), (0, (1 << 32) - 1), (1, 1, 4)),
        ((256, 0), (1, 256), (0, 1 << 32), (2, 4, 8)),
        ((0, 1), (1, 1), (None, 5), (1, 1, 8)),
    ],
)
def test_numbers_travel_in_the_smallest_size_that_holds_them(
    partitions: tuple, attempts: tuple, indexes: tuple, sizes: tuple
) -> None:
    batch = make_batch(
        NODE,
        1,
        "t",
        "g",
        0,
        [
            (i, p, None, None, a, 1.5, x, b"")
            for i, (p, a, x) in enumerate(zip(partitions, attempts, indexes, strict=True))
        ],
    )
    frames = encode_batch(batch)
    obj = msgpack.unpackb(frames[0])
    assert [len(obj[c]) // 2 for c in (8, 11, 13)] == list(sizes)
    assert len(obj[12]) == 16  # (a double each)
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)


# -- hostile input ----------------------------------------------------------------------------


def decode_control_or_decode_error(frame: bytes) -> None:
    """Decoding either yields a control message or raises DecodeError; nothing else."""
    try:
        result = decode_control(frame)
    except DecodeError:
        return
    assert isinstance(result, CONTROL_TYPES)


def decode_batch_or_decode_error(frames: list[bytes]) -> None:
    """Decoding either yields a valid batch or raises DecodeError; nothing else."""
    try:
        result = decode_batch(frames, MAX_MESSAGE_BYTES)
    except DecodeError:
        return
    assert isinstance(result, Batch)
    assert_valid(result)
    assert len(frames) - 1 <= len(result.seqs)


def assert_valid(batch: Batch) -> None:
    """Every column of the right length, type and range."""
    n = len(batch.seqs)
    assert n <= MAX_BATCH_ITEMS
    columns = (
        batch.seqs,
        batch.partitions,
        batch.keys,
        batch.headers,
        batch.attempts,
        batch.published_ats,
        batch.indexes,
        batch.payloads,
    )
    # (numbers as arrays, or bytes for a byte each; consecutive sequences as a range; the
    # rest as tuples)
    assert all(type(c) in (tuple, bytes, array, range) and len(c) == n for c in columns)
    assert len(batch.node_id) == NODE_ID_BYTES
    assert all(type(s) is int and 0 <= s <= U63 for s in batch.seqs)
    assert all(type(p) is int and 0 <= p <= 65535 for p in batch.partitions)
    assert all(k is None or (type(k) is str and len(k) <= 4096) for k in batch.keys)
    assert all(
        h is None or (type(h) is dict and all(type(k) is str for k in h)) for h in batch.headers
    )
    assert all(type(a) is int and 0 <= a < 1 << 32 for a in batch.attempts)
    assert all(type(t) is float for t in batch.published_ats)
    assert all(i is None or (type(i) is int and 0 <= i <= U63) for i in batch.indexes)
    assert all(type(p) is bytes and len(p) <= MAX_MESSAGE_BYTES for p in batch.payloads)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    decode_control_or_decode_error(data)
    decode_batch_or_decode_error([data])
    decode_batch_or_decode_error([data, data])


# Valid frames with one field swapped for a random value reach the per-field checks that
# random bytes rarely get past.
small_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=4)
field_values = small_values | node_ids | st.sampled_from([PROTOCOL_VERSION, BATCH, HELLO, ACK])


def paths(obj: list, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position in a nested list, as index paths."""
    out = []
    for index, child in enumerate(obj):
        out.append((*prefix, index))
        if isinstance(child, list):
            out.extend(paths(child, (*prefix, index)))
    return out


def swap(obj: list, path: tuple[int, ...], value: object) -> None:
    """Replace the element at ``path`` with ``value``."""
    for index in path[:-1]:
        obj = obj[index]
    obj[path[-1]] = value


def replaced(frame: bytes, path: tuple[int, ...], value: object) -> bytes:
    """``frame`` with the element at ``path`` replaced by ``value``."""
    return repack(frame, lambda obj: swap(obj, path, value))


EDGE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    65535,
    65536,
    1 << 31,
    (1 << 31) + 1,
    (1 << 63) - 1,
    1 << 63,
    -(1 << 63),
    (1 << 64) - 1,
    0.5,
    -0.0,
    float("nan"),
    float("inf"),
    "",
    "x",
    "x" * 257,
    "x" * 4097,
    b"",
    b"\x01" * NODE_ID_BYTES,
    b"\x01" * (NODE_ID_BYTES + 1),
    [],
    [0],
    [[]],
    [None] * 6,
    {},
    {"a": 1},
    {b"k": 1},
    msgpack.ExtType(5, b"x"),
    msgpack.Timestamp(0, 0),
]


@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_control_with_any_field_set_to_an_edge_value(msg: Any) -> None:
    frame = encode_control(msg)
    for path in paths(msgpack.unpackb(frame)):
        for value in EDGE_VALUES:
            decode_control_or_decode_error(replaced(frame, path, value))


@pytest.mark.parametrize("extra_payloads", [-1, 0, 1])
def test_batch_with_any_field_set_to_an_edge_value(extra_payloads: int) -> None:
    frames = encode_batch(sample_batch())
    payloads = frames[1:] + [b"x"] * extra_payloads if extra_payloads >= 0 else frames[1:-1]
    for path in paths(msgpack.unpackb(frames[0])):
        for value in EDGE_VALUES:
            decode_batch_or_decode_error([replaced(frames[0], path, value), *payloads])


control_fields = st.sampled_from(SAMPLE_CONTROLS).flatmap(
    lambda msg: st.tuples(
        st.just(msg), st.sampled_from(paths(msgpack.unpackb(encode_control(msg))))
    )
)
batch_fields = st.sampled_from(paths(msgpack.unpackb(encode_batch(sample_batch())[0])))


@FUZZ
@given(control_fields, field_values)
def test_control_with_a_random_field_raises_only_decode_error(
    msg_path: tuple[Any, tuple[int, ...]],
    value: object,
) -> None:
    msg, path = msg_path
    decode_control_or_decode_error(replaced(encode_control(msg), path, value))


@FUZZ
@given(batch_fields, field_values, st.integers(-1, 1))
def test_batch_with_a_random_field_raises_only_decode_error(
    path: tuple[int, ...],
    value: object,
    extra_payloads: int,
) -> None:
    frames = encode_batch(sample_batch())
    header = replaced(frames[0], path, value)
    payloads = frames[1:] + [b"x"] * extra_payloads if extra_payloads >= 0 else frames[1:-1]
    decode_batch_or_decode_error([header, *payloads])


@FUZZ
@given(st.lists(field_values, max_size=10), st.lists(st.binary(max_size=8), max_size=3))
def test_frame_shaped_garbage_raises_only_decode_error(
    fields: list,
    payloads: list[bytes],
) -> None:
    for kind in (
        HELLO,
        BYE,
        ACK,
        NACK,
        FAIL,
        STATUS_REQ,
        STATUS_REP,
        FETCH_REQ,
        FETCH_REP,
        BATCH,
        REPL_OPS,
        REPL_ACK,
        REPL_DROP,
        HANDBACK,
        HANDBACK_ACK,
    ):
        frame = msgpack.packb([PROTOCOL_VERSION, kind, *fields], use_bin_type=True)
        decode_control_or_decode_error(frame)
        decode_batch_or_decode_error([frame, *payloads])


@FUZZ
@given(st.sampled_from(SAMPLE_CONTROLS) | controls, st.data())
def test_mutated_control_frames_raise_only_decode_error(msg: Any, data: st.DataObject) -> None:
    frame = bytearray(encode_control(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(frame) - 1))
        frame[pos] = data.draw(st.integers(0, 255))
    decode_control_or_decode_error(bytes(frame))


@FUZZ
@given(st.data())
def test_mutated_batch_frames_raise_only_decode_error(data: st.DataObject) -> None:
    frames = encode_batch(sample_batch())
    header = bytearray(frames[0])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(header) - 1))
        header[pos] = data.draw(st.integers(0, 255))
    decode_batch_or_decode_error([bytes(header), *frames[1:]])


@FAST
@given(controls, st.data())
def test_truncated_control_frames_raise_decode_error(msg: Any, data: st.DataObject) -> None:
    frame = encode_control(msg)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(DecodeError):
        decode_control(frame[:cut])


@FAST
@given(batches(), st.data())
def test_truncated_batch_headers_raise_decode_error(batch: Batch, data: st.DataObject) -> None:
    frames = encode_batch(batch)
    cut = data.draw(st.integers(0, len(frames[0]) - 1))
    with pytest.raises(DecodeError):
        decode_batch([frames[0][:cut], *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_every_prefix_of_a_control_frame_is_rejected(msg: Any) -> None:
    frame = encode_control(msg)
    for cut in range(len(frame)):
        with pytest.raises(DecodeError):
            decode_control(frame[:cut])


# -- specific rejections ----------------------------------------------------------------------


OTHER_VERSIONS: list[Any] = [
    0,
    PROTOCOL_VERSION - 1,
    PROTOCOL_VERSION + 1,
    -1,
    255,
    str(PROTOCOL_VERSION),
    None,
    [PROTOCOL_VERSION],
]


@pytest.mark.parametrize("version", OTHER_VERSIONS)
@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_control_with_wrong_protocol_version(msg: Any, version: object) -> None:
    frame = repack(encode_control(msg), lambda obj: obj.__setitem__(0, version))
    with pytest.raises(DecodeError, match="protocol version"):
        decode_control(frame)


@pytest.mark.parametrize("version", OTHER_VERSIONS)
def test_batch_with_wrong_protocol_version(version: object) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj.__setitem__(0, version))
    with pytest.raises(DecodeError, match="protocol version"):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_control_with_an_extra_field(msg: Any) -> None:
    frame = repack(encode_control(msg), lambda obj: obj.append(0))
    with pytest.raises(DecodeError):
        decode_control(frame)


@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_control_with_a_missing_field(msg: Any) -> None:
    frame = repack(encode_control(msg), lambda obj: obj.pop())
    with pytest.raises(DecodeError):
        decode_control(frame)


@pytest.mark.parametrize(
    "frame",
    [
        msgpack.packb([]),
        msgpack.packb([PROTOCOL_VERSION]),
        msgpack.packb({"v": 1}),
        msgpack.packb(PROTOCOL_VERSION),
        b"",
    ],
    ids=["empty-list", "version-only", "map", "int", "no-bytes"],
)
def test_control_that_is_not_a_frame(frame: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_control(frame)


@pytest.mark.parametrize("kind", [0, 8, BATCH, 99, "hello", None])
def test_control_with_unknown_kind(kind: object) -> None:
    frame = msgpack.packb([PROTOCOL_VERSION, kind, NODE, 1])
    with pytest.raises(DecodeError):
        decode_control(frame)


def test_batch_header_is_not_a_control_frame() -> None:
    with pytest.raises(DecodeError):
        decode_control(encode_batch(sample_batch())[0])


def test_control_frame_is_not_a_batch() -> None:
    frames = encode_batch(sample_batch())
    frame = repack(frames[0], lambda obj: obj.__setitem__(1, ACK))
    with pytest.raises(DecodeError, match="not a batch"):
        decode_batch([frame, *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("length", [0, 1, NODE_ID_BYTES - 1, NODE_ID_BYTES + 1, 32])
@pytest.mark.parametrize("msg", SAMPLE_CONTROLS[:5], ids=lambda m: type(m).__name__)
def test_control_with_bad_node_id_length(msg: Any, length: int) -> None:
    frame = repack(encode_control(msg), lambda obj: obj.__setitem__(2, b"\x07" * length))
    with pytest.raises(DecodeError, match="node id"):
        decode_control(frame)


def test_control_with_node_id_as_text() -> None:
    frame = repack(encode_control(Bye(NODE, 1)), lambda obj: obj.__setitem__(2, "x" * 16))
    with pytest.raises(DecodeError, match="node id"):
        decode_control(frame)


def test_hello_with_bad_peer_node_id() -> None:
    def change(obj: list) -> None:
        obj[10][0][0] = b"\x02" * (NODE_ID_BYTES - 1)

    with pytest.raises(DecodeError, match="node id"):
        decode_control(repack(encode_control(sample_hello()), change))


@pytest.mark.parametrize("length", [0, NODE_ID_BYTES - 1, NODE_ID_BYTES + 1])
def test_batch_with_bad_node_id_length(length: int) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj.__setitem__(2, b"\x07" * length))
    with pytest.raises(DecodeError, match="node id"):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("change", ["header-extra", "header-missing"])
def test_batch_header_of_the_wrong_length(change: str) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj.append(0) if change == "header-extra" else obj.pop())
    with pytest.raises(DecodeError):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


COLUMNS = {
    "seq": 7,
    "partition": 8,
    "key": 9,
    "headers": 10,
    "attempt": 11,
    "published_at": 12,
    "index": 13,
    "payload": 14,
}


@pytest.mark.parametrize("how", ["extra", "missing", "empty"])
@pytest.mark.parametrize("column", COLUMNS.values(), ids=list(COLUMNS))
def test_batch_column_of_the_wrong_length(column: int, how: str) -> None:
    frames = encode_batch(sample_batch())

    def change(obj: list) -> None:
        if isinstance(obj[column], bytes):  # numbers: one message's bytes more or fewer
            size = len(obj[column]) // 3
            obj[column] = {
                "extra": obj[column] + obj[column][:size],
                "missing": obj[column][size:],
                "empty": b"",
            }[how]
        elif how == "extra":
            obj[column].append(obj[column][0])
        elif how == "missing":
            obj[column].pop(0)
        else:
            obj[column] = []

    with pytest.raises(DecodeError):
        decode_batch([repack(frames[0], change), *frames[1:]], MAX_MESSAGE_BYTES)


def test_batch_with_too_few_payload_frames() -> None:
    frames = encode_batch(sample_batch())
    with pytest.raises(DecodeError, match="payload count"):
        decode_batch(frames[:-1], MAX_MESSAGE_BYTES)


def test_batch_with_a_stray_payload_frame() -> None:
    frames = encode_batch(sample_batch())
    with pytest.raises(DecodeError, match="payload count"):
        decode_batch([*frames, b"stray"], MAX_MESSAGE_BYTES)
    inline = encode_batch(make_batch(NODE, 1, "t", "g", 0, empty(2)))
    assert len(inline) == 1
    with pytest.raises(DecodeError, match="payload count"):
        decode_batch([*inline, b"stray"], MAX_MESSAGE_BYTES)


def test_batch_with_an_inline_payload_turned_into_nil() -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj[14].__setitem__(0, None))
    with pytest.raises(DecodeError, match="payload count"):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


def test_empty_data_message() -> None:
    with pytest.raises(DecodeError):
        decode_batch([], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize(
    ("seqs", "wire"),
    [
        ((5, 6, 7), 5),
        ((9,), 9),
        ((5, 7, 8), [5, 7, 8]),  # a gap
        ((6, 5, 7), [6, 5, 7]),  # consecutive, not ascending
        ((5, 5, 6), [5, 5, 6]),  # a repeat spans as many as it counts
        ((), []),
    ],
)
def test_consecutive_sequences_travel_as_their_first(seqs: tuple, wire: object) -> None:
    batch = make_batch(NODE, 0, "t", "g", 0, [(s, 0, None, None, 1, 0.0, None, b"x") for s in seqs])
    frames = encode_batch(batch)
    assert msgpack.unpackb(frames[0])[7] == wire
    assert plain(decode_batch(frames, MAX_MESSAGE_BYTES)) == plain(batch)
    ack = Ack(NODE, "t", "g", seqs)
    frame = encode_control(ack)
    assert msgpack.unpackb(frame)[5:] == [wire, len(seqs), b""]
    decoded = decode_control(frame)
    assert with_tuple_seqs(decoded) == ack
    assert isinstance(decoded, Ack)
    assert type(decoded.seqs) is (range if isinstance(wire, int) else tuple)


@pytest.mark.parametrize("first", [-1, True, U63 - 1, 1.0, "5"])
def test_batch_with_a_bad_first_sequence(first: object) -> None:
    batch = make_batch(NODE, 0, "t", "g", 0, empty(3))
    header = repack(encode_batch(batch)[0], lambda obj: obj.__setitem__(7, first))
    with pytest.raises(DecodeError):
        decode_batch([header], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("size", [100, LARGE_PAYLOAD_BYTES])
def test_payload_at_max_message_bytes_is_accepted(size: int) -> None:
    batch = make_batch(NODE, 0, "t", "g", 0, [(0, 0, None, None, 0, 0.0, None, b"x" * size)])
    assert plain(decode_batch(encode_batch(batch), size)) == plain(batch)


@pytest.mark.parametrize("size", [100, LARGE_PAYLOAD_BYTES])
def test_payload_over_max_message_bytes(size: int) -> None:
    # Inline (100) and in a frame of its own (LARGE_PAYLOAD_BYTES).
    batch = make_batch(
        NODE,
        0,
        "t",
        "g",
        0,
        [(0, 0, None, None, 0, 0.0, None, b"ok"), (1, 0, None, None, 0, 0.0, None, b"x" * size)],
    )
    with pytest.raises(DecodeError, match="max_message_bytes"):
        decode_batch(encode_batch(batch), size - 1)


def test_oversized_batch_header_is_rejected_before_parsing() -> None:
    batch = make_batch(
        NODE, 0, "t", "g", 0, [(0, 0, "k", {"h": "x" * MAX_BATCH_HEADER_BYTES}, 0, 0.0, None, b"")]
    )
    with pytest.raises(DecodeError, match="exceeds"):
        decode_batch(encode_batch(batch), MAX_MESSAGE_BYTES)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (7, -1),
        (7, "1"),
        (7, True),
        (7, 1.0),
        (7, 1 << 63),
        (9, 5),
        (9, b"k"),
        (9, "k" * 4097),
        (10, [1]),
        (10, {1: "x"}),
        (10, {b"k": "x"}),
        (10, "h"),
        (14, "text"),
        (14, 5),
        (14, [b"x"]),
        (14, True),
        (14, b"x" * (MAX_MESSAGE_BYTES + 1)),
    ],
    ids=[
        "seq-negative",
        "seq-text",
        "seq-bool",
        "seq-float",
        "seq-big",
        "key-int",
        "key-bytes",
        "key-long",
        "headers-list",
        "headers-int-key",
        "headers-bytes-key",
        "headers-text",
        "payload-text",
        "payload-int",
        "payload-list",
        "payload-bool",
        "payload-oversized",
    ],
)
@pytest.mark.parametrize("position", [0, 1, 2])
def test_batch_column_with_a_bad_element(column: int, value: object, position: int) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj[column].__setitem__(position, value))
    with pytest.raises(DecodeError):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (8, [4, 0, 65535]),  # protocol 4's array
        (8, "\x04\x00"),
        (11, [1, 0, 1 << 31]),
        (11, 1),
        (12, [1.5, 2.0, 0.0]),
        (12, b"\x00" * 23),
        (13, [7, None, 0]),
        (13, struct.pack("<3q", 7, -2, 0)),  # only -1 stands for none
        (13, struct.pack("<3q", 7, -1 << 63, 0)),
        (13, b"\x00" * 20),
    ],
    ids=[
        "partition-array",
        "partition-text",
        "attempt-array",
        "attempt-int",
        "published-array",
        "published-short",
        "index-array",
        "index-negative",
        "index-most-negative",
        "index-odd-size",
    ],
)
def test_batch_number_column_that_is_not_its_bin(column: int, value: object) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj.__setitem__(column, value))
    with pytest.raises(DecodeError):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (3, -1),
        (3, "1"),
        (4, 7),
        (4, "t" * 257),
        (5, None),
        (6, -1),
        (6, 1.5),
        *((column, {}) for column in COLUMNS.values()),
        *((column, None) for column in COLUMNS.values()),
    ],
    ids=[
        "incarnation-negative",
        "incarnation-text",
        "topic-int",
        "topic-long",
        "lane-none",
        "floor-negative",
        "floor-float",
        *(f"{name}-map" for name in COLUMNS),
        *(f"{name}-nil" for name in COLUMNS),
    ],
)
def test_batch_header_with_bad_field(index: int, value: object) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj.__setitem__(index, value))
    with pytest.raises(DecodeError):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize(
    "change",
    [
        lambda obj: obj.__setitem__(6, 0),  # ctrl port 0
        lambda obj: obj.__setitem__(7, 65536),  # data port too big
        lambda obj: obj.__setitem__(8, "127.0.0.1"),  # hosts not a list
        lambda obj: obj.__setitem__(8, [1]),  # host not text
        lambda obj: obj[9][0].__setitem__(2, "fanout"),  # unknown sub mode
        lambda obj: obj[9][0].__setitem__(3, 0),  # max_in_flight 0
        lambda obj: obj[9][0].__setitem__(4, MAX_BATCH_ITEMS + 1),
        lambda obj: obj[9][0].__setitem__(5, 0),  # max_message_bytes 0
        lambda obj: obj[9][0].pop(),  # a sub without max_message_bytes (protocol 2)
        lambda obj: obj[9].__setitem__(0, "sub"),  # sub not a list
        lambda obj: obj[10][0].append("extra"),  # peer ref length
        lambda obj: obj.__setitem__(5, -1),  # incarnation negative
    ],
    ids=[
        "ctrl-port",
        "data-port",
        "hosts",
        "host",
        "mode",
        "max-in-flight",
        "batch-size",
        "max-message-bytes",
        "sub-length",
        "sub",
        "peer",
        "incarnation",
    ],
)
def test_hello_with_bad_field(change: Any) -> None:
    with pytest.raises(DecodeError):
        decode_control(repack(encode_control(sample_hello()), change))


@pytest.mark.parametrize(
    ("msg", "index", "value"),
    [
        (Ack(NODE, "t", "g", (1, 3)), 5, [-1, 3]),
        (Ack(NODE, "t", "g", (1, 3)), 5, [1.0, 3]),
        (Ack(NODE, "t", "g", (1, 3)), 5, "1"),
        (Ack(NODE, "t", "g", (1, 3)), 5, [1, True]),
        (Ack(NODE, "t", "g", (1, 3)), 5, [1, -3]),
        (Ack(NODE, "t", "g", (1, 3)), 5, [1, None]),
        (Ack(NODE, "t", "g", (1, 3)), 5, [1, 3, 5]),
        (Ack(NODE, "t", "g", (1, 3)), 6, 3),
        (Ack(NODE, "t", "g", (1, 3)), 6, -1),
        (Ack(NODE, "t", "g", (1, 2)), 5, -1),
        (Ack(NODE, "t", "g", (1, 2)), 5, True),
        (Ack(NODE, "t", "g", (1, 2)), 5, U63),
        (Ack(NODE, "t", "g", (1, 2)), 5, 1.0),
        (Ack(NODE, "t", "g", (1, 2)), 6, MAX_BATCH_ITEMS + 1),
        (Ack(NODE, "t", "g", (1, 2)), 6, None),
        (Ack(NODE, "t", "g", (1, 3)), 5, list(range(MAX_BATCH_ITEMS + 1))),
        (Nack(NODE, "t", "g", (1,), 1.0), 5, [0, "1"]),
        (Nack(NODE, "t", "g", (1,), 1.0), 6, "soon"),
        (Fail(NODE, "t", "g", 1, "r"), 6, "r" * 4097),
        (Fail(NODE, "t", "g", 1, "r"), 5, None),
        (StatusReply(1, {}), 3, [1]),
        (StatusRequest(1), 2, -5),
    ],
    ids=[
        "ack-negative-seq",
        "ack-float-seq",
        "ack-seqs-text",
        "ack-bool-seq",
        "ack-negative-later-seq",
        "ack-nil-seq",
        "ack-more-seqs-than-its-count",
        "ack-count-more-than-its-seqs",
        "ack-count-negative",
        "ack-first-negative",
        "ack-first-bool",
        "ack-range-past-u63",
        "ack-first-float",
        "ack-range-too-long",
        "ack-count-nil",
        "ack-too-many-seqs",
        "nack-text-seq",
        "nack-delay-text",
        "fail-reason-long",
        "fail-seq-none",
        "status-not-map",
        "status-token-negative",
    ],
)
def test_control_with_bad_field(msg: Any, index: int, value: object) -> None:
    frame = repack(encode_control(msg), lambda obj: obj.__setitem__(index, value))
    with pytest.raises(DecodeError):
        decode_control(frame)


def test_oversized_header_is_rejected_before_parsing() -> None:
    frame = msgpack.packb([PROTOCOL_VERSION, STATUS_REP, 1, {"x": b"y" * MAX_HEADER_BYTES}])
    assert len(frame) > MAX_HEADER_BYTES
    with pytest.raises(DecodeError, match="exceeds"):
        decode_control(frame)


def test_too_many_items_is_rejected() -> None:
    batch = make_batch(NODE, 0, "t", "g", 0, empty(MAX_BATCH_ITEMS + 1))
    with pytest.raises(DecodeError):
        decode_batch(encode_batch(batch), MAX_MESSAGE_BYTES)


def test_the_largest_batch_is_accepted() -> None:
    batch = make_batch(NODE, 0, "t", "g", 0, empty(MAX_BATCH_ITEMS))
    assert plain(decode_batch(encode_batch(batch), MAX_MESSAGE_BYTES)) == plain(batch)


@pytest.mark.parametrize(
    ("msg", "change"),
    [
        (SAMPLE_CONTROLS[-2], lambda obj: obj[4].append([4096, 0])),  # partition too big
        (SAMPLE_CONTROLS[-2], lambda obj: obj[4].append([1])),
        (SAMPLE_CONTROLS[-2], lambda obj: obj.__setitem__(5, -1)),
        (SAMPLE_CONTROLS[-2], lambda obj: obj.__setitem__(6, 0)),  # max items 0
        (SAMPLE_CONTROLS[-2], lambda obj: obj.__setitem__(6, 10_001)),
        (SAMPLE_CONTROLS[-1], lambda obj: obj[4][0].__setitem__(6, "text")),  # payload
        (SAMPLE_CONTROLS[-1], lambda obj: obj[4][0].__setitem__(1, -1)),  # index
        (SAMPLE_CONTROLS[-1], lambda obj: obj[4][0].pop()),
        (SAMPLE_CONTROLS[-1], lambda obj: obj[5][0].append(1)),
        (SAMPLE_CONTROLS[-1], lambda obj: obj[5][0].__setitem__(2, None)),
    ],
    ids=[
        "cursor-partition",
        "cursor-short",
        "start-negative",
        "max-items-0",
        "max-items-big",
        "payload-text",
        "index-negative",
        "item-short",
        "head-long",
        "head-next-none",
    ],
)
def test_fetch_with_bad_field(msg: Any, change: Any) -> None:
    with pytest.raises(DecodeError):
        decode_control(repack(encode_control(msg), change))


REPLY_SAMPLE, LAST_REQ_SAMPLE, LAST_REP_SAMPLE = (
    next(m for m in SAMPLE_CONTROLS if isinstance(m, kind))
    for kind in (Reply, LastRequest, LastReply)
)


@pytest.mark.parametrize(
    ("msg", "change"),
    [
        (REPLY_SAMPLE, lambda obj: obj.__setitem__(5, 1)),  # ok not a bool
        (REPLY_SAMPLE, lambda obj: obj.__setitem__(7, "text")),  # payload
        (REPLY_SAMPLE, lambda obj: obj.__setitem__(4, -1)),  # seq
        (REPLY_SAMPLE, lambda obj: obj.__setitem__(6, [1])),  # headers
        (LAST_REQ_SAMPLE, lambda obj: obj.__setitem__(4, ["t"])),  # after
        (LAST_REQ_SAMPLE, lambda obj: obj.__setitem__(4, ["t", -1])),
        (LAST_REQ_SAMPLE, lambda obj: obj.__setitem__(5, 0)),  # max items
        (LAST_REQ_SAMPLE, lambda obj: obj.__setitem__(5, 10_001)),
        (LAST_REP_SAMPLE, lambda obj: obj.__setitem__(4, None)),  # more
        (LAST_REP_SAMPLE, lambda obj: obj[3][0].__setitem__(7, "text")),  # payload
        (LAST_REP_SAMPLE, lambda obj: obj[3][0].__setitem__(2, -1)),  # index
        (LAST_REP_SAMPLE, lambda obj: obj[3][0].__setitem__(1, 4096)),  # partition
        (LAST_REP_SAMPLE, lambda obj: obj[3][0].__setitem__(4, 5)),  # key
        (LAST_REP_SAMPLE, lambda obj: obj[3][0].pop()),
    ],
    ids=[
        "reply-ok",
        "reply-payload",
        "reply-seq",
        "reply-headers",
        "last-after-short",
        "last-after-seq",
        "last-max-items-0",
        "last-max-items-big",
        "last-more",
        "last-payload",
        "last-index",
        "last-partition",
        "last-key",
        "last-item-short",
    ],
)
def test_reply_and_last_values_with_bad_field(msg: Any, change: Any) -> None:
    with pytest.raises(DecodeError):
        decode_control(repack(encode_control(msg), change))


def test_a_subscription_says_how_it_is_delivered() -> None:
    hello = sample_hello()
    frame = repack(encode_control(hello), lambda obj: obj[9][1].__setitem__(6, "everything"))
    with pytest.raises(DecodeError, match="deliver"):
        decode_control(frame)
    frame = repack(encode_control(hello), lambda obj: obj[9][1].pop())
    with pytest.raises(DecodeError, match="bad sub"):
        decode_control(frame)


def test_fetch_reply_over_the_default_size_needs_a_larger_limit() -> None:
    big = FetchReply(1, "t", (FetchItem(0, 0, 1, None, None, 0.0, b"x" * MAX_HEADER_BYTES),), ())
    frame = encode_control(big)
    with pytest.raises(DecodeError, match="exceeds"):
        decode_control(frame)
    assert decode_control(frame, max_bytes=2 * MAX_HEADER_BYTES) == big


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(DecodeError):
        decode_control(encode_control(Bye(NODE, 1)) + b"\x00")


def test_deeply_nested_input_is_rejected() -> None:
    frame = b"\x91" * 100_000 + b"\x00"  # 100k nested one-element arrays
    with pytest.raises(DecodeError):
        decode_control(frame)


@pytest.mark.parametrize(
    "endpoint",
    [
        "127.0.0.1:6000",
        "tcp://127.0.0.1X1",
        "tcp://h:0",
        "tcp://h:70000",
        "ipc:///tmp/x",
        "tcp://a b:1",
        "",
    ],
)
def test_hello_with_an_unusable_peer_endpoint_is_rejected(endpoint: str) -> None:
    hello = Hello(
        b"\x01" * NODE_ID_BYTES,
        "n",
        "m",
        1,
        5000,
        5001,
        (),
        (),
        (PeerRef(b"\x02" * NODE_ID_BYTES, endpoint),),
    )
    with pytest.raises(DecodeError, match="endpoint"):
        decode_control(encode_control(hello))
