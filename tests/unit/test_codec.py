"""The wire codec: round trips, and hostile input meets only DecodeError."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmesh._protocol.codec import (
    MAX_BATCH_ITEMS,
    MAX_HEADER_BYTES,
    NODE_ID_BYTES,
    decode_batch,
    decode_control,
    encode_batch,
    encode_batch_header,
    encode_control,
)
from zmesh._protocol.frames import (
    ACK,
    BATCH,
    BYE,
    FAIL,
    FETCH_REP,
    FETCH_REQ,
    HELLO,
    NACK,
    PROTOCOL_VERSION,
    STATUS_REP,
    STATUS_REQ,
    Ack,
    Batch,
    Bye,
    Fail,
    FetchHead,
    FetchItem,
    FetchReply,
    FetchRequest,
    Hello,
    Item,
    Nack,
    PeerRef,
    StatusReply,
    StatusRequest,
    SubInfo,
)
from zmesh.errors import DecodeError

# No example database: nothing is written into the repository.
FAST = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
FUZZ = settings(
    max_examples=700, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

MAX_MESSAGE_BYTES = 1 << 16
CONTROL_TYPES = (Hello, Bye, Ack, Nack, Fail, StatusRequest, StatusReply, FetchRequest,
                 FetchReply)
U63 = (1 << 63) - 1
NODE = b"\x01" * NODE_ID_BYTES

# -- strategies -----------------------------------------------------------------------------

node_ids = st.binary(min_size=NODE_ID_BYTES, max_size=NODE_ID_BYTES)
names = st.text(max_size=40)
u63 = st.integers(0, U63)
ports = st.integers(1, 65535)
seq_lists = st.lists(u63, max_size=50).map(tuple)
finite = st.floats(allow_nan=False)

sub_infos = st.builds(
    SubInfo,
    topic=names,
    group=names,
    mode=st.sampled_from(["shared", "broadcast"]),
    max_in_flight=st.integers(1, 1 << 24),
    batch_size=st.integers(1, MAX_BATCH_ITEMS),
)
hosts = st.one_of(
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9.\-]{0,30}\Z"),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)
endpoints = st.builds(lambda h, p: f"tcp://{h}:{p}", hosts, ports)
curve_keys = st.one_of(st.just(""), st.text(min_size=40, max_size=40))
peer_refs = st.builds(PeerRef, node_id=node_ids, ctrl_endpoint=endpoints,
                      public_key=curve_keys)

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
)
acks = st.builds(Ack, node_id=node_ids, topic=names, lane=names, seqs=seq_lists)
nacks = st.builds(Nack, node_id=node_ids, topic=names, lane=names, seqs=seq_lists, delay_s=finite)
fails = st.builds(
    Fail, node_id=node_ids, topic=names, lane=names, seq=u63, reason=st.text(max_size=300)
)
byes = st.builds(Bye, node_id=node_ids, incarnation=u63)
status_requests = st.builds(StatusRequest, token=u63)
status_replies = st.builds(
    StatusReply, token=u63, status=st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6)
)
partitions = st.integers(0, 4095)
fetch_requests = st.builds(
    FetchRequest, token=u63, topic=names,
    cursors=st.lists(st.tuples(partitions, u63), max_size=5).map(tuple),
    start=st.none() | u63, max_items=st.integers(1, 10_000),
)
fetch_replies = st.builds(
    FetchReply, token=u63, topic=names,
    items=st.lists(st.builds(FetchItem, partition=partitions, index=u63, seq=u63,
                             key=st.none() | st.text(max_size=60),
                             headers=st.none() | st.dictionaries(st.text(max_size=10),
                                                                 msgpack_values, max_size=4),
                             published_at=finite, payload=st.binary(max_size=64)),
                   max_size=5).map(tuple),
    heads=st.lists(st.builds(FetchHead, partition=partitions, oldest=u63, next=u63,
                             scanned=u63), max_size=5).map(tuple),
)
controls = (hellos | acks | nacks | fails | byes | status_requests | status_replies
            | fetch_requests | fetch_replies)

headers = st.none() | st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4)
items = st.builds(
    Item,
    seq=u63,
    partition=st.integers(0, 65535),
    key=st.none() | st.text(max_size=60),
    headers=headers,
    attempt=st.integers(0, 1 << 31),
    published_at=finite,
    index=st.none() | u63,
)


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    pairs = draw(st.lists(st.tuples(items, st.binary(max_size=64)), max_size=8))
    return Batch(
        node_id=draw(node_ids),
        incarnation=draw(u63),
        topic=draw(names),
        lane=draw(names),
        floor=draw(u63),
        items=tuple(i for i, _ in pairs),
        payloads=tuple(p for _, p in pairs),
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
        (SubInfo("metrics", "agg", "shared", 100, 10),),
        (PeerRef(b"\x02" * NODE_ID_BYTES, "tcp://127.0.0.1:6000"),),
    )


SAMPLE_CONTROLS: list[Any] = [
    sample_hello(),
    Ack(NODE, "metrics", "agg", (1, 2, 3)),
    Nack(NODE, "metrics", "agg", (4,), 2.5),
    Fail(NODE, "metrics", "agg", 9, "bad record"),
    Bye(NODE, 7),
    StatusRequest(42),
    StatusReply(42, {"lanes": [], "ok": True}),
    FetchRequest(43, "metrics", ((0, 5), (3, 0)), 0, 500),
    FetchReply(43, "metrics", (FetchItem(3, 7, 12, "k", {"h": 1}, 1.5, b"payload"),),
               (FetchHead(3, 2, 9, 8), FetchHead(0, 0, 0, 5))),
]


def sample_batch() -> Batch:
    return Batch(
        NODE,
        3,
        "metrics",
        "agg",
        10,
        (Item(10, 4, "line-4", {"unit": "C"}, 1, 1.5, 7), Item(11, 0, None, None, 0, 2.0)),
        (b"first", b""),
    )


def repack(frame: bytes, change: Any) -> bytes:
    """Unpack a valid frame, let ``change`` edit the list, pack it again."""
    obj = msgpack.unpackb(frame, raw=False)
    change(obj)
    return msgpack.packb(obj, use_bin_type=True)


# -- round trips ----------------------------------------------------------------------------


@FAST
@given(controls)
def test_control_round_trip(msg: Any) -> None:
    frame = encode_control(msg)
    assert isinstance(frame, bytes)
    assert decode_control(frame) == msg


@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_every_control_kind_round_trips(msg: Any) -> None:
    decoded = decode_control(encode_control(msg))
    assert type(decoded) is type(msg)
    assert decoded == msg


def test_control_kinds_are_distinct_on_the_wire() -> None:
    kinds = [msgpack.unpackb(encode_control(m))[1] for m in SAMPLE_CONTROLS]
    assert kinds == [HELLO, ACK, NACK, FAIL, BYE, STATUS_REQ, STATUS_REP, FETCH_REQ, FETCH_REP]
    assert all(msgpack.unpackb(encode_control(m))[0] == PROTOCOL_VERSION for m in SAMPLE_CONTROLS)


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
    assert len(frames) == 1 + len(batch.items)
    assert frames[1:] == list(batch.payloads)  # payloads travel as raw frames, untouched
    assert decode_batch(frames, MAX_MESSAGE_BYTES) == batch


def test_sample_batch_round_trips() -> None:
    batch = sample_batch()
    decoded = decode_batch(encode_batch(batch), MAX_MESSAGE_BYTES)
    assert decoded == batch
    assert decoded.items[0].key == "line-4"
    assert decoded.items[1].key is None
    assert decoded.payloads == (b"first", b"")


def test_empty_batch_round_trips() -> None:
    batch = Batch(NODE, 0, "t", "g", 5, (), ())
    frames = encode_batch(batch)
    assert len(frames) == 1
    assert decode_batch(frames, MAX_MESSAGE_BYTES) == batch


def test_batch_header_encoder_matches_batch_encoder() -> None:
    batch = sample_batch()
    header = encode_batch_header(
        batch.node_id,
        batch.incarnation,
        batch.topic,
        batch.lane,
        batch.floor,
        [(i.seq, i.partition, i.key, i.headers, i.attempt, i.published_at, i.index)
         for i in batch.items],
    )
    assert decode_batch([header, *batch.payloads], MAX_MESSAGE_BYTES) == batch


# -- hostile input ----------------------------------------------------------------------------


def decode_control_or_decode_error(frame: bytes) -> None:
    """Decoding either yields a control message or raises DecodeError; nothing else."""
    try:
        result = decode_control(frame)
    except DecodeError:
        return
    assert isinstance(result, CONTROL_TYPES)


def decode_batch_or_decode_error(frames: list[bytes]) -> None:
    try:
        result = decode_batch(frames, MAX_MESSAGE_BYTES)
    except DecodeError:
        return
    assert isinstance(result, Batch)
    assert len(result.items) == len(result.payloads) == len(frames) - 1


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
    for kind in (HELLO, BYE, ACK, NACK, FAIL, STATUS_REQ, STATUS_REP, FETCH_REQ, FETCH_REP,
                 BATCH):
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


@pytest.mark.parametrize("version", [0, 2, -1, 255, "1", None, [1]])
@pytest.mark.parametrize("msg", SAMPLE_CONTROLS, ids=lambda m: type(m).__name__)
def test_control_with_wrong_protocol_version(msg: Any, version: object) -> None:
    frame = repack(encode_control(msg), lambda obj: obj.__setitem__(0, version))
    with pytest.raises(DecodeError, match="protocol version"):
        decode_control(frame)


@pytest.mark.parametrize("version", [0, 2, "1", None])
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
    frame = repack(encode_batch(sample_batch())[0], lambda obj: obj.__setitem__(1, ACK))
    with pytest.raises(DecodeError, match="not a batch"):
        decode_batch([frame, b"first", b""], MAX_MESSAGE_BYTES)


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


@pytest.mark.parametrize(
    "change",
    [
        lambda obj: obj.append(0),
        lambda obj: obj.pop(),
        lambda obj: obj[7][0].append(0),
        lambda obj: obj[7][0].pop(),
    ],
    ids=["header-extra", "header-missing", "item-extra", "item-missing"],
)
def test_batch_with_wrong_lengths(change: Any) -> None:
    frames = encode_batch(sample_batch())
    with pytest.raises(DecodeError):
        decode_batch([repack(frames[0], change), *frames[1:]], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize("cut", [0, 1])
def test_batch_with_too_few_payloads(cut: int) -> None:
    frames = encode_batch(sample_batch())
    with pytest.raises(DecodeError, match="payload count"):
        decode_batch(frames[: len(frames) - 1 - cut], MAX_MESSAGE_BYTES)


def test_batch_with_too_many_payloads() -> None:
    frames = encode_batch(sample_batch())
    with pytest.raises(DecodeError, match="payload count"):
        decode_batch([*frames, b"stray"], MAX_MESSAGE_BYTES)


def test_empty_data_message() -> None:
    with pytest.raises(DecodeError):
        decode_batch([], MAX_MESSAGE_BYTES)


def test_payload_at_max_message_bytes_is_accepted() -> None:
    batch = Batch(NODE, 0, "t", "g", 0, (Item(0, 0, None, None, 0, 0.0),), (b"x" * 100,))
    assert decode_batch(encode_batch(batch), 100) == batch


def test_payload_over_max_message_bytes() -> None:
    batch = Batch(
        NODE,
        0,
        "t",
        "g",
        0,
        (Item(0, 0, None, None, 0, 0.0), Item(1, 0, None, None, 0, 0.0)),
        (b"ok", b"x" * 101),
    )
    with pytest.raises(DecodeError, match="max_message_bytes"):
        decode_batch(encode_batch(batch), 100)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (0, -1),
        (0, "1"),
        (0, True),
        (1, 65536),
        (1, -1),
        (2, 5),
        (2, "k" * 4097),
        (3, [1]),
        (3, {1: "x"}),
        (4, -1),
        (4, 1 << 32),
        (5, "now"),
        (5, None),
    ],
    ids=[
        "seq-negative",
        "seq-text",
        "seq-bool",
        "partition-big",
        "partition-negative",
        "key-int",
        "key-long",
        "headers-list",
        "headers-int-key",
        "attempt-negative",
        "attempt-big",
        "published-text",
        "published-none",
    ],
)
def test_batch_item_with_bad_field(field: int, value: object) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: obj[7][0].__setitem__(field, value))
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
        (7, {}),
    ],
    ids=[
        "incarnation-negative",
        "incarnation-text",
        "topic-int",
        "topic-long",
        "lane-none",
        "floor-negative",
        "floor-float",
        "items-map",
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
        (Ack(NODE, "t", "g", (1,)), 5, [-1]),
        (Ack(NODE, "t", "g", (1,)), 5, [1.0]),
        (Ack(NODE, "t", "g", (1,)), 5, 1),
        (Nack(NODE, "t", "g", (1,), 1.0), 6, "soon"),
        (Fail(NODE, "t", "g", 1, "r"), 6, "r" * 4097),
        (Fail(NODE, "t", "g", 1, "r"), 5, None),
        (StatusReply(1, {}), 3, [1]),
        (StatusRequest(1), 2, -5),
    ],
    ids=[
        "ack-negative-seq",
        "ack-float-seq",
        "ack-seqs-int",
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
    with pytest.raises(DecodeError, match="exceeds"):
        decode_batch([frame], MAX_MESSAGE_BYTES)


def test_too_many_items_is_rejected() -> None:
    items = [[i, 0, None, None, 0, 0.0, i] for i in range(MAX_BATCH_ITEMS + 1)]
    header = encode_batch_header(NODE, 0, "t", "g", 0, items)  # type: ignore[arg-type]
    with pytest.raises(DecodeError):
        decode_batch([header, *([b""] * len(items))], MAX_MESSAGE_BYTES)


@pytest.mark.parametrize(
    "change",
    [
        lambda item: item.pop(),  # an item of the format before indexes
        lambda item: item.append(0),
        lambda item: item.__setitem__(6, -1),
        lambda item: item.__setitem__(6, 1.0),
        lambda item: item.__setitem__(6, "7"),
    ],
    ids=["six-fields", "eight-fields", "negative-index", "float-index", "text-index"],
)
def test_batch_item_with_bad_index(change: Any) -> None:
    frames = encode_batch(sample_batch())
    header = repack(frames[0], lambda obj: change(obj[7][0]))
    with pytest.raises(DecodeError):
        decode_batch([header, *frames[1:]], MAX_MESSAGE_BYTES)


def test_batch_item_index_round_trips() -> None:
    batch = decode_batch(encode_batch(sample_batch()), MAX_MESSAGE_BYTES)
    assert [i.index for i in batch.items] == [7, None]


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
    ids=["cursor-partition", "cursor-short", "start-negative", "max-items-0",
         "max-items-big", "payload-text", "index-negative", "item-short", "head-long",
         "head-next-none"],
)
def test_fetch_with_bad_field(msg: Any, change: Any) -> None:
    with pytest.raises(DecodeError):
        decode_control(repack(encode_control(msg), change))


def test_fetch_reply_over_the_default_size_needs_a_larger_limit() -> None:
    big = FetchReply(1, "t", (FetchItem(0, 0, 1, None, None, 0.0, b"x" * MAX_HEADER_BYTES),),
                     ())
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


@pytest.mark.parametrize("endpoint", ["127.0.0.1:6000", "tcp://127.0.0.1X1", "tcp://h:0",
                                      "tcp://h:70000", "ipc:///tmp/x", "tcp://a b:1", ""])
def test_hello_with_an_unusable_peer_endpoint_is_rejected(endpoint: str) -> None:
    hello = Hello(b"\x01" * NODE_ID_BYTES, "n", "m", 1, 5000, 5001, (), (),
                  (PeerRef(b"\x02" * NODE_ID_BYTES, endpoint),))
    with pytest.raises(DecodeError, match="endpoint"):
        decode_control(encode_control(hello))
