"""Pure encode/decode of zmesh frames. Decoding raises only DecodeError.

This module is long because every control kind's encoder and decoder sit side by side,
so a field is changed in one place; the field checks are in checks.py, membership's
frames in swim.py and the replicas' in replication.py."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Any

import msgpack

from .._numbers import le_bytes, le_column
from .._seqs import consecutive
from ..errors import DecodeError
from . import swim
from .checks import NODE_ID_BYTES as NODE_ID_BYTES
from .checks import U63
from .checks import check as _check
from .checks import column as _column
from .checks import endpoint as _endpoint
from .checks import integer as _int
from .checks import ints as _ints
from .checks import node_id as _node_id
from .checks import number as _num
from .checks import producer as _producer
from .checks import text as _str
from .frames import (
    ACK,
    ADMIN_REP,
    ADMIN_REQ,
    BATCH,
    BYE,
    FAIL,
    FETCH_REP,
    FETCH_REQ,
    GROUP_DEL,
    HELLO,
    LAST_REP,
    LAST_REQ,
    NACK,
    PROTOCOL_VERSION,
    REPL_OPS,
    REPLY,
    STATUS_REP,
    STATUS_REQ,
    TOUCH,
    Ack,
    AdminReply,
    AdminRequest,
    Batch,
    Bye,
    Control,
    CopyRef,
    Fail,
    FetchHead,
    FetchItem,
    FetchReply,
    FetchRequest,
    GroupDel,
    Handback,
    HandbackAck,
    Hello,
    LastItem,
    LastReply,
    LastRequest,
    Nack,
    PeerRef,
    ReplAck,
    ReplDrop,
    ReplOps,
    Reply,
    StatusReply,
    StatusRequest,
    SubInfo,
    Touch,
)
from .replication import DECODERS, encode_repl_ops, encode_replication, pack_writes

MAX_HEADER_BYTES = 1 << 20
MAX_BATCH_ITEMS = 10_000
MAX_IN_FLIGHT = 1 << 24  # a member's credit, as a hello carries it
MAX_PARTITIONS = 4096
MAX_KEY_CHARS = 4096
MAX_MSG_ID_BYTES = 256  # an idempotency id (Node.publish's msg_id), in UTF-8 (a key in LMDB)
MAX_HEADERS_BYTES = 64 << 10  # one message's headers, packed
MAX_REASON_CHARS = 4096  # a failed message's reason, as a FAIL carries it
# What one hello announces: subscriptions, and bytes of them (see ``announced_bytes``), so
# that with the peers it names it stays within MAX_HEADER_BYTES.
MAX_SUBSCRIPTIONS = 4096
MAX_SUBSCRIPTION_BYTES = 512 << 10
# A data batch carries its payloads inside its header frame, except a payload this large
# (sent as a frame of its own, without a copy) and any payload once the header holds
# INLINE_PAYLOAD_BYTES of them, so the header stays within MAX_BATCH_HEADER_BYTES.
LARGE_PAYLOAD_BYTES = 64 << 10
INLINE_PAYLOAD_BYTES = 512 << 10
MAX_BATCH_HEADER_BYTES = MAX_HEADER_BYTES + INLINE_PAYLOAD_BYTES
MAX_COPIES = 4096  # copies (and producers served) a hello names

_packb = msgpack.Packer(use_bin_type=True).pack

# Column checks compare the set of an array's element types with these (bool is not int).
_NONE = type(None)
_STR_OR_NONE: frozenset[type] = frozenset({str, _NONE})
_DICT_OR_NONE: frozenset[type] = frozenset({dict, _NONE})
_BYTES_OR_NONE: frozenset[type] = frozenset({bytes, _NONE})
_STR: frozenset[type] = frozenset({str})


def _unpack(frame: bytes | memoryview, max_bytes: int = MAX_HEADER_BYTES) -> Any:
    if len(frame) > max_bytes:
        raise DecodeError(f"header of {len(frame)} bytes exceeds {max_bytes}")
    try:
        return msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=MAX_BATCH_ITEMS * 8,
            max_map_len=MAX_BATCH_ITEMS,
        )
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        UnicodeDecodeError,
    ) as exc:
        raise DecodeError(f"not msgpack: {exc}") from exc
    except Exception as exc:  # msgpack raises a few odd types on hostile input
        raise DecodeError(f"not msgpack: {type(exc).__name__}: {exc}") from exc


def check_headers(headers: dict[str, Any]) -> None:
    """ValueError unless every consumer can decode ``headers`` in a batch: values msgpack
    packs, string keys in nested maps too, and at most ``MAX_HEADERS_BYTES`` packed."""
    try:
        packed = _packb(headers)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"headers cannot be packed: {exc}") from exc
    if len(packed) > MAX_HEADERS_BYTES:
        raise ValueError(f"headers pack to {len(packed)} bytes, more than {MAX_HEADERS_BYTES}")
    try:
        _unpack(packed, MAX_HEADERS_BYTES)
    except DecodeError as exc:
        raise ValueError(f"headers would not decode at a consumer ({exc})") from exc


def announced_bytes(topic: str, group: str) -> int:
    """At least what one subscription takes in a hello: its names (ASCII, checked at
    subscribe), their msgpack headers, and the packed mode and numbers."""
    return len(topic) + len(group) + 32


def _seqs(value: Any) -> tuple[int, ...]:
    _check(isinstance(value, list) and len(value) <= MAX_BATCH_ITEMS, "bad seq list")
    return _ints(value, len(value), "seq")


def wire_seqs(seqs: Sequence[int]) -> int | list[int]:
    """Sequences as a batch or an ack carries them: the first of them when they are
    consecutive and ascending (a take from the front of a lane's window, the acks of
    messages handled in order; a ``range`` is, with no look at each), else the array of
    them (see ``_seq_column``)."""
    return seqs[0] if consecutive(seqs) else list(seqs)


def _seq_column(value: Any, n: int) -> tuple[int, ...] | range:
    """``n`` sequences as ``wire_seqs`` sent them: an array of ``n``, or an int, the
    first of ``n`` consecutive ones (checked once, not per sequence), as a ``range``."""
    if type(value) is int:
        _check(value >= 0 and value + n - 1 <= U63, "bad seq")
        return range(value, value + n)
    return _ints(value, n, "seq")


def _key(value: Any) -> str | None:
    _check(value is None or (isinstance(value, str) and len(value) <= MAX_KEY_CHARS), "bad key")
    return value


def _header(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    _check(isinstance(value, dict), "bad headers")
    for k in value:
        _check(isinstance(k, str), "bad header name")
    return value


# -- control -----------------------------------------------------------------------------


def encode_control(msg: Control) -> bytes:
    """One frame for a control message."""
    v = PROTOCOL_VERSION
    if isinstance(msg, Hello):
        return _packb(
            [
                v,
                HELLO,
                msg.node_id,
                msg.name,
                msg.mesh,
                msg.incarnation,
                msg.ctrl_port,
                msg.data_port,
                list(msg.hosts),
                [
                    [
                        s.topic,
                        s.group,
                        s.mode,
                        s.max_in_flight,
                        s.batch_size,
                        s.max_message_bytes,
                        s.deliver,
                    ]
                    for s in msg.subs
                ],
                [[p.node_id, p.ctrl_endpoint, p.public_key] for p in msg.peers],
                msg.replica_host,
                [[c.producer, c.incarnation, c.version] for c in msg.copies],
                list(msg.serving),
            ]
        )
    if isinstance(msg, swim.Membership):
        return _packb(swim.encode(msg, v))
    if isinstance(msg, Ack):
        return _packb(
            [
                v,
                ACK,
                msg.node_id,
                msg.topic,
                msg.lane,
                wire_seqs(msg.seqs),
                len(msg.seqs),
                msg.producer,
            ]
        )
    if isinstance(msg, Nack):
        return _packb(
            [v, NACK, msg.node_id, msg.topic, msg.lane, list(msg.seqs), msg.delay_s, msg.producer]
        )
    if isinstance(msg, Fail):
        return _packb(
            [v, FAIL, msg.node_id, msg.topic, msg.lane, msg.seq, msg.reason, msg.producer]
        )
    if isinstance(msg, Bye):
        return _packb([v, BYE, msg.node_id, msg.incarnation])
    if isinstance(msg, Touch):
        return _packb([v, TOUCH, msg.node_id, msg.topic, msg.lane, list(msg.seqs), msg.producer])
    if isinstance(msg, GroupDel):
        return _packb([v, GROUP_DEL, msg.node_id, msg.topic, msg.group])
    if isinstance(msg, ReplOps):
        return encode_repl_ops(msg, pack_writes(msg.writes))
    if isinstance(msg, ReplAck | ReplDrop | Handback | HandbackAck):
        return encode_replication(msg)
    if isinstance(msg, StatusRequest):
        return _packb([v, STATUS_REQ, msg.token])
    if isinstance(msg, StatusReply):
        return _packb([v, STATUS_REP, msg.token, msg.status])
    if isinstance(msg, AdminRequest):
        return _packb([v, ADMIN_REQ, msg.token, msg.op, msg.args])
    if isinstance(msg, AdminReply):
        return _packb([v, ADMIN_REP, msg.token, msg.ok, msg.result, msg.error])
    if isinstance(msg, FetchRequest):
        return _packb(
            [
                v,
                FETCH_REQ,
                msg.token,
                msg.topic,
                [list(c) for c in msg.cursors],
                msg.start,
                msg.max_items,
                msg.max_payload_bytes,
            ]
        )
    if isinstance(msg, FetchReply):
        return _packb(
            [
                v,
                FETCH_REP,
                msg.token,
                msg.topic,
                [
                    [i.partition, i.index, i.seq, i.key, i.headers, i.published_at, i.payload]
                    for i in msg.items
                ],
                [[h.partition, h.oldest, h.next, h.scanned] for h in msg.heads],
            ]
        )
    if isinstance(msg, Reply):
        return _packb([v, REPLY, msg.node_id, msg.topic, msg.seq, msg.ok, msg.headers, msg.payload])
    if isinstance(msg, LastRequest):
        after = None if msg.after is None else list(msg.after)
        return _packb(
            [v, LAST_REQ, msg.token, msg.pattern, after, msg.max_items, msg.max_payload_bytes]
        )
    if isinstance(msg, LastReply):
        return _packb(
            [
                v,
                LAST_REP,
                msg.token,
                [
                    [
                        i.topic,
                        i.partition,
                        i.index,
                        i.seq,
                        i.key,
                        i.headers,
                        i.published_at,
                        i.payload,
                    ]
                    for i in msg.items
                ],
                msg.more,
            ]
        )
    raise TypeError(f"not a control message: {msg!r}")


def decode_control(
    frame: bytes, max_bytes: int = MAX_HEADER_BYTES, max_repl_bytes: int = 0
) -> Control:
    """Parse one control frame; DecodeError for anything that is not a valid one.

    ``max_bytes``: the largest frame accepted (a reader raises it for fetch replies, which
    carry payloads); ``max_repl_bytes``: the largest replication frame (``ReplOps``, which
    carries records: a replica host's ``max_message_bytes`` and a MiB).
    """
    obj = _unpack(frame, max(max_bytes, max_repl_bytes))
    _check(isinstance(obj, list) and len(obj) >= 2, "control frame is not a list")
    _check(
        type(obj[0]) is int and obj[0] == PROTOCOL_VERSION,
        f"unsupported protocol version {obj[0]!r}",
    )
    kind = obj[1]
    _check(type(kind) is int, "bad kind")
    _check(kind == REPL_OPS or len(frame) <= max_bytes, f"frame of {len(frame)} bytes")
    try:
        if kind == HELLO:
            _check(len(obj) == 14, "bad hello length")
            subs_raw, peers_raw = obj[9], obj[10]
            _check(isinstance(subs_raw, list) and len(subs_raw) <= MAX_SUBSCRIPTIONS, "bad subs")
            _check(isinstance(peers_raw, list) and len(peers_raw) <= 4096, "bad peers")
            hosts = obj[8]
            _check(isinstance(hosts, list) and len(hosts) <= 64, "bad hosts")
            subs = []
            for s in subs_raw:
                _check(isinstance(s, list) and len(s) == 7, "bad sub")
                _check(s[2] in ("shared", "broadcast", "ephemeral"), "bad sub mode")
                _check(s[6] in (None, "last_per_key"), "bad sub deliver")
                subs.append(
                    SubInfo(
                        _str(s[0], "topic"),
                        _str(s[1], "group"),
                        s[2],
                        _int(s[3], "max_in_flight", 1, MAX_IN_FLIGHT),
                        _int(s[4], "batch_size", 1, MAX_BATCH_ITEMS),
                        _int(s[5], "max_message_bytes", 1),
                        s[6],
                    )
                )
            peers = []
            for p in peers_raw:
                _check(isinstance(p, list) and len(p) == 3, "bad peer ref")
                peers.append(PeerRef(_node_id(p[0]), _endpoint(p[1]), _str(p[2], "public key", 40)))
            _check(type(obj[11]) is bool, "bad replica host flag")
            copies, serving = obj[12], obj[13]
            _check(isinstance(copies, list) and len(copies) <= MAX_COPIES, "bad copies")
            _check(isinstance(serving, list) and len(serving) <= MAX_COPIES, "bad serving")
            refs = []
            for c in copies:
                _check(isinstance(c, list) and len(c) == 3, "bad copy")
                refs.append(
                    CopyRef(_node_id(c[0]), _int(c[1], "copy incarnation"), _int(c[2], "version"))
                )
            return Hello(
                _node_id(obj[2]),
                _str(obj[3], "name"),
                _str(obj[4], "mesh"),
                _int(obj[5], "incarnation"),
                _int(obj[6], "ctrl port", 1, 65535),
                _int(obj[7], "data port", 1, 65535),
                tuple(_str(h, "host") for h in hosts),
                tuple(subs),
                tuple(peers),
                obj[11],
                tuple(refs),
                tuple(_node_id(p) for p in serving),
            )
        if kind in swim.KINDS:
            return swim.decode(obj)
        if kind == ACK:
            _check(len(obj) == 8, "bad ack length")
            return Ack(
                _node_id(obj[2]),
                _str(obj[3], "topic"),
                _str(obj[4], "lane"),
                _seq_column(obj[5], _int(obj[6], "ack count", 0, MAX_BATCH_ITEMS)),
                _producer(obj[7]),
            )
        if kind == NACK:
            _check(len(obj) == 8, "bad nack length")
            return Nack(
                _node_id(obj[2]),
                _str(obj[3], "topic"),
                _str(obj[4], "lane"),
                _seqs(obj[5]),
                _num(obj[6], "delay"),
                _producer(obj[7]),
            )
        if kind == FAIL:
            _check(len(obj) == 8, "bad fail length")
            return Fail(
                _node_id(obj[2]),
                _str(obj[3], "topic"),
                _str(obj[4], "lane"),
                _int(obj[5], "seq"),
                _str(obj[6], "reason", MAX_REASON_CHARS),
                _producer(obj[7]),
            )
        if kind == BYE:
            _check(len(obj) == 4, "bad bye length")
            return Bye(_node_id(obj[2]), _int(obj[3], "incarnation"))
        if kind == TOUCH:
            _check(len(obj) == 7, "bad touch length")
            return Touch(
                _node_id(obj[2]),
                _str(obj[3], "topic"),
                _str(obj[4], "lane"),
                _seqs(obj[5]),
                _producer(obj[6]),
            )
        if kind in DECODERS:
            return DECODERS[kind](obj)
        if kind == GROUP_DEL:
            _check(len(obj) == 5, "bad group deletion length")
            return GroupDel(_node_id(obj[2]), _str(obj[3], "topic"), _str(obj[4], "group"))
        if kind == STATUS_REQ:
            _check(len(obj) == 3, "bad status request length")
            return StatusRequest(_int(obj[2], "token"))
        if kind == ADMIN_REQ:
            _check(len(obj) == 5 and isinstance(obj[4], dict), "bad admin request")
            return AdminRequest(_int(obj[2], "token"), _str(obj[3], "op", 32), obj[4])
        if kind == ADMIN_REP:
            _check(len(obj) == 6 and isinstance(obj[3], bool), "bad admin reply")
            return AdminReply(_int(obj[2], "token"), obj[3], obj[4], _str(obj[5], "error", 4096))
        if kind == FETCH_REQ:
            _check(len(obj) == 8, "bad fetch request length")
            cursors = obj[4]
            _check(isinstance(cursors, list) and len(cursors) <= MAX_PARTITIONS, "bad cursors")
            for c in cursors:
                _check(isinstance(c, list) and len(c) == 2, "bad cursor")
            return FetchRequest(
                _int(obj[2], "token"),
                _str(obj[3], "topic"),
                tuple(
                    (_int(c[0], "partition", 0, MAX_PARTITIONS - 1), _int(c[1], "index"))
                    for c in cursors
                ),
                None if obj[5] is None else _int(obj[5], "start index"),
                _int(obj[6], "max items", 1, MAX_BATCH_ITEMS),
                _int(obj[7], "max payload bytes", 1),
            )
        if kind == FETCH_REP:
            _check(len(obj) == 6, "bad fetch reply length")
            raw_items, raw_heads = obj[4], obj[5]
            _check(
                isinstance(raw_items, list) and len(raw_items) <= MAX_BATCH_ITEMS, "bad fetch items"
            )
            _check(
                isinstance(raw_heads, list) and len(raw_heads) <= MAX_PARTITIONS, "bad fetch heads"
            )
            items = []
            for i in raw_items:
                _check(isinstance(i, list) and len(i) == 7, "bad fetch item")
                _check(isinstance(i[6], bytes), "bad payload")
                items.append(
                    FetchItem(
                        _int(i[0], "partition", 0, MAX_PARTITIONS - 1),
                        _int(i[1], "index"),
                        _int(i[2], "seq"),
                        _key(i[3]),
                        _header(i[4]),
                        _num(i[5], "published_at"),
                        i[6],
                    )
                )
            heads = []
            for h in raw_heads:
                _check(isinstance(h, list) and len(h) == 4, "bad fetch head")
                heads.append(
                    FetchHead(
                        _int(h[0], "partition", 0, MAX_PARTITIONS - 1),
                        _int(h[1], "oldest index"),
                        _int(h[2], "next index"),
                        _int(h[3], "scanned index"),
                    )
                )
            return FetchReply(
                _int(obj[2], "token"), _str(obj[3], "topic"), tuple(items), tuple(heads)
            )
        if kind == STATUS_REP:
            _check(len(obj) == 4 and isinstance(obj[3], dict), "bad status reply")
            return StatusReply(_int(obj[2], "token"), obj[3])
        if kind == REPLY:
            _check(len(obj) == 8, "bad reply length")
            _check(isinstance(obj[5], bool), "bad reply status")
            _check(isinstance(obj[7], bytes), "bad reply payload")
            return Reply(
                _node_id(obj[2]),
                _str(obj[3], "topic"),
                _int(obj[4], "seq"),
                obj[5],
                _header(obj[6]),
                obj[7],
            )
        if kind == LAST_REQ:
            _check(len(obj) == 7, "bad last values request length")
            after = obj[4]
            _check(after is None or (isinstance(after, list) and len(after) == 2), "bad after")
            return LastRequest(
                _int(obj[2], "token"),
                _str(obj[3], "pattern"),
                None if after is None else (_str(after[0], "topic"), _int(after[1], "seq")),
                _int(obj[5], "max items", 1, MAX_BATCH_ITEMS),
                _int(obj[6], "max payload bytes", 1),
            )
        if kind == LAST_REP:
            _check(len(obj) == 5 and isinstance(obj[4], bool), "bad last values reply")
            raw_items = obj[3]
            _check(
                isinstance(raw_items, list) and len(raw_items) <= MAX_BATCH_ITEMS, "bad last items"
            )
            kept: list[LastItem] = []
            for i in raw_items:
                _check(isinstance(i, list) and len(i) == 8, "bad last item")
                _check(isinstance(i[7], bytes), "bad payload")
                kept.append(
                    LastItem(
                        _str(i[0], "topic"),
                        _int(i[1], "partition", 0, MAX_PARTITIONS - 1),
                        None if i[2] is None else _int(i[2], "index"),
                        _int(i[3], "seq"),
                        _key(i[4]),
                        _header(i[5]),
                        _num(i[6], "published_at"),
                        i[7],
                    )
                )
            return LastReply(_int(obj[2], "token"), tuple(kept), obj[4])
    except (TypeError, IndexError) as exc:
        raise DecodeError(f"malformed control frame: {exc}") from exc
    raise DecodeError(f"unknown control kind {kind!r}")


# -- data --------------------------------------------------------------------------------


def encode_batch(batch: Batch) -> list[bytes]:
    """All frames of a data batch: the header, then the payloads that travel apart.

    Small payloads go inside the header; a payload of ``LARGE_PAYLOAD_BYTES`` or more, or
    one past ``INLINE_PAYLOAD_BYTES`` of inline payloads, is left as its own frame (the
    same bytes object, for a zero-copy send) and nil takes its place in the header.
    """
    return encode_lane_batch(
        batch.node_id,
        batch.incarnation,
        batch.topic,
        batch.lane,
        batch.floor,
        batch.attempts,
        pack_columns(
            batch.seqs,
            batch.partitions,
            batch.keys,
            batch.headers,
            batch.published_ats,
            batch.indexes,
            batch.payloads,
        ),
    )


# A batch's columns that depend only on its messages, packed: (the columns before
# ``attempts``, each column after it, the payloads that travel as their own frames).
PackedColumns = tuple[bytes, tuple[bytes, ...], list[bytes]]
_BATCH_HEADER = b"\x9f"  # a msgpack array of the header's 15 fields
_array_header = msgpack.Packer(use_bin_type=True).pack_array_header


# (Any: ``_pack_indexes`` tries an array of indexes that may hold None, for array to refuse)
def _numbers_bin(column: array[Any]) -> bytes:
    """A column of numbers as the bin a batch carries: little-endian, fixed size each."""
    return _packb(le_bytes(column))


def _pack_uints(values: Sequence[int], wide: str) -> bytes:
    """Unsigned ints as a bin of one byte each when all are below 256 (a batch's
    partitions and attempts, mostly), else of ``wide`` (an array type code) each."""
    try:
        return _packb(bytes(values))
    except ValueError:  # (one of them above 255)
        return _numbers_bin(array(wide, values))


def _pack_indexes(indexes: Sequence[int | None]) -> bytes:
    """Indexes as a bin of uint32 each, or of int64 each when one is not below 2**32 or
    is None (not indexed: -1). Runs' indexes come as such an array already."""
    if type(indexes) is array and indexes.typecode in "Iq":
        return _numbers_bin(indexes)
    try:
        return _numbers_bin(array("I", indexes))
    except (TypeError, OverflowError):
        return _numbers_bin(array("q", [-1 if i is None else i for i in indexes]))


def _pack_optional(values: Sequence[Any]) -> bytes:
    """An array packed as msgpack packs it: at C speed when every value is None (a
    batch's keys and headers, mostly)."""
    n = len(values)
    if values.count(None) == n:
        return _array_header(n) + b"\xc0" * n
    return _packb(values)


def pack_columns(
    seqs: Sequence[int],
    partitions: Sequence[int],
    keys: Sequence[str | None],
    headers: Sequence[dict[str, Any] | None],
    published_ats: Sequence[float],
    indexes: Sequence[int | None],
    payloads: Sequence[bytes],
    all_inline: bool = False,
) -> PackedColumns:
    """Pack what every lane sending these messages sends alike (a topic with several
    groups packs them once and keeps them for its other lanes). ``all_inline``: the
    payloads are known to fit inside the header (see ``encode_batch``), none looked at."""
    inline: Sequence[bytes | None] = payloads
    extra: list[bytes] = []
    # All inline when none is large and together they fit: known with no look at each
    # payload, or from the largest alone (one pass) unless as many of it would not fit.
    largest = 0 if all_inline else max(map(len, payloads), default=0)
    if (
        largest >= LARGE_PAYLOAD_BYTES
        or largest * len(payloads) > INLINE_PAYLOAD_BYTES
        and sum(map(len, payloads)) > INLINE_PAYLOAD_BYTES
    ):
        inline, extra = _split(payloads)
    return (
        b"".join(
            (
                _packb(wire_seqs(seqs)),
                _pack_uints(partitions, "H"),
                _pack_optional(keys),
                _pack_optional(headers),
            )
        ),
        (_numbers_bin(array("d", published_ats)), _pack_indexes(indexes), _packb(inline)),
        extra,
    )


def encode_lane_batch(
    node_id: bytes,
    incarnation: int,
    topic: str,
    lane: str,
    floor: int,
    attempts: Sequence[int],
    columns: PackedColumns,
) -> list[bytes]:
    """The frames of a batch from its lane's fields and its packed columns: the same
    bytes as packing the whole header at once (msgpack is a stream of its values)."""
    before, after, extra = columns
    # The first seven fields packed as an array of seven, less its one-byte array header.
    lead = _packb((PROTOCOL_VERSION, BATCH, node_id, incarnation, topic, lane, floor))
    return [
        b"".join((_BATCH_HEADER, memoryview(lead)[1:], before, _pack_uints(attempts, "I"), *after)),
        *extra,
    ]


def _split(payloads: Sequence[bytes]) -> tuple[list[bytes | None], list[bytes]]:
    inline: list[bytes | None] = []
    extra: list[bytes] = []
    room = INLINE_PAYLOAD_BYTES
    for p in payloads:
        n = len(p)
        if n < LARGE_PAYLOAD_BYTES and n <= room:
            inline.append(p)
            room -= n
        else:
            inline.append(None)
            extra.append(p)
    return inline, extra


def _all_none(value: Any, n: int) -> bool:
    """Whether ``value`` is an array of ``n`` nils (most batches' keys and headers): a
    count instead of a pass that makes a type object per element."""
    return type(value) is list and len(value) == n and value.count(None) == n


def _numbers(value: Any, n: int, codes: str, what: str) -> Sequence[Any]:
    """A bin of ``n`` little-endian numbers of the first type of ``codes`` (array type
    codes) that its length fits; a byte each comes as the bytes themselves (their
    elements are ints). Every value of those types is valid: no step per element."""
    _check(type(value) is bytes, f"bad {what} column")
    if codes[0] == "B" and len(value) == n:
        return value
    column = le_column(value, n, codes)
    _check(column is not None, f"bad {what} column")
    return column  # type: ignore[return-value]


def _indexes(value: Any, n: int) -> Sequence[int | None]:
    """The index column (see ``_pack_indexes``): -1 for a message not indexed."""
    column = _numbers(value, n, "Iq", "index")
    low = min(column) if column and column.typecode == "q" else 0  # type: ignore[attr-defined]
    if low < 0:
        _check(low == -1, "bad index")
        return tuple(None if i == -1 else i for i in column)
    return column


def decode_batch(frames: Sequence[bytes | memoryview], max_message_bytes: int) -> Batch:
    """Parse a data batch; DecodeError for anything that is not a valid one. The header
    (the first frame) may be a view of the received frame; the payloads that follow it as
    frames of their own must be bytes, since they become the messages' payloads."""
    _check(len(frames) >= 1, "empty data message")
    obj = _unpack(frames[0], MAX_BATCH_HEADER_BYTES)
    _check(isinstance(obj, list) and len(obj) == 15, "bad batch header")
    _check(
        type(obj[0]) is int and obj[0] == PROTOCOL_VERSION,
        f"unsupported protocol version {obj[0]!r}",
    )
    _check(type(obj[1]) is int and obj[1] == BATCH, "not a batch")
    payloads = obj[14]
    _check(type(payloads) is list and len(payloads) <= MAX_BATCH_ITEMS, "bad payload column")
    n = len(payloads)
    seqs = _seq_column(obj[7], n)
    keys = obj[9]
    if not _all_none(keys, n) and str in _column(keys, n, "key", _STR_OR_NONE):
        _check(max(map(len, filter(None, keys)), default=0) <= MAX_KEY_CHARS, "bad key")
    headers = obj[10]
    if not _all_none(headers, n) and dict in _column(headers, n, "headers", _DICT_OR_NONE):
        # Every header name: the keys of every dict, in one pass.
        _check(
            set(map(type, chain.from_iterable(filter(None, headers)))) <= _STR, "bad header name"
        )
    extra = frames[1:]
    if _NONE in _column(payloads, n, "payload", _BYTES_OR_NONE):
        _check(payloads.count(None) == len(extra), "payload count does not match items")
        taken = iter(extra)
        payloads = [next(taken) if p is None else p for p in payloads]
    else:
        _check(not extra, "payload count does not match items")
    # (an inline payload is shorter than the header frame that holds it)
    _check(
        max(map(len, payloads if len(frames[0]) > max_message_bytes else extra), default=0)
        <= max_message_bytes,
        "payload exceeds max_message_bytes",
    )
    return Batch(
        _node_id(obj[2]),
        _int(obj[3], "incarnation"),
        _str(obj[4], "topic"),
        _str(obj[5], "lane"),
        _int(obj[6], "floor"),
        seqs,
        _numbers(obj[8], n, "BH", "partition"),
        tuple(keys),
        tuple(headers),
        _numbers(obj[11], n, "BI", "attempt"),
        _numbers(obj[12], n, "d", "published_at"),
        _indexes(obj[13], n),
        tuple(payloads),
    )
