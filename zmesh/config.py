"""Frozen, keyword-only configuration objects; units are in the field names.

This module is long because every option's meaning, unit and default is documented where
it is declared (the reference of the configuration classes), and each is checked in a
line or two."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._protocol.codec import MAX_BATCH_ITEMS, MAX_IN_FLIGHT, MAX_KEY_CHARS, check_headers
from ._subjects import check_subject, is_pattern
from .errors import ArgumentError, ConfigError

__all__ = ["NodeConfig", "ProducerConfig", "RelayConfig", "SubscriptionConfig", "TopicConfig"]

Durability = Literal["fsync", "process", "memory"]
Mode = Literal["shared", "broadcast", "ephemeral"]
Deliver = Literal["last_per_key"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}\Z")
_HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
MIN_MAP_SIZE_BYTES = 1 << 20
MAX_MAP_SIZE_BYTES = 1 << 60  # (past any disk; LMDB takes a size_t, Python's int is larger)
# Liveness: probes more often than this only burn CPU; a death noticed after more than a
# day is none (and TCP's retransmission bound, set from it in ms, takes an int32).
MIN_HEARTBEAT_S = 0.01
MAX_DEAD_AFTER_S = 86_400.0
# A message may take at most this share of the LMDB map: one larger could be held for good
# (and every publish after it) waiting for room the map never has.
MAP_SHARE_OF_ONE_MESSAGE = 8
# Handler threads of one subscription: each is a real thread (20,000 took seconds to start
# and to join, 100,000 hung), and past a few dozen they only wait on each other.
MAX_CONCURRENCY = 1024
# How far ahead a publish may be scheduled (``delay``, ``deliver_at``) or a message nacked
# (``nack(delay)``): ten years. Further is a mistake (milliseconds taken for seconds, a
# sentinel date), and the message would sit in the outbox for good.
MAX_SCHEDULE_AHEAD_S = 10 * 365.25 * 86_400
# Nodes that hold a message of a replicated topic (TopicConfig.replicas), the producer
# included: each replica costs the producer a copy of every write, sent and acked.
MAX_REPLICAS = 8
# A producer silent this many times its dead_after_s is taken over by one of its replicas
# (NodeConfig.takeover_after_s, when not set).
TAKEOVER_AFTER_DEAD = 3
# An interface that binds every address: the only one a node then has.
_WILDCARDS = ("*", "0.0.0.0")
# What a host name or an IPv4 address is made of.
_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]*)\Z")


def check_name(kind: str, value: object) -> str:
    """Validate a mesh, node, topic or group name and return it. A topic name follows the
    subject rules (_subjects.py): dot-separated tokens, no wildcards."""
    if kind == "topic":
        return check_subject("topic", value)
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ConfigError(
            f"{kind} name {value!r} is invalid: use 1-128 characters from letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return value


def int_in(value: object, least: int, most: float = math.inf) -> bool:
    """Whether ``value`` is an int in ``least..most`` (a bool is not one: True would pass
    for 1)."""
    return not isinstance(value, bool) and isinstance(value, int) and least <= value <= most


def check_delay(what: str, delay: object) -> float:
    """``delay`` seconds from now (a publish's ``delay``, a nack's): a number >= 0, not a
    bool (it would be taken for 1 s), at most MAX_SCHEDULE_AHEAD_S; ArgumentError naming
    ``what`` otherwise."""
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < math.inf:
        raise ArgumentError(f"{what} must be a finite number >= 0 (seconds), got {delay!r}")
    if delay > MAX_SCHEDULE_AHEAD_S:
        raise ArgumentError(
            f"{what}={delay!r} is more than ten years ahead: give a finite "
            f"number >= 0 of seconds, at most {MAX_SCHEDULE_AHEAD_S:,.0f}"
        )
    return delay


def check_max_messages(max_messages: object) -> None:
    """How many messages a call takes at most (``fetch``, a replay reader's ``read``): an
    int >= 1, checked before any is taken; ArgumentError otherwise."""
    if not int_in(max_messages, 1):
        raise ArgumentError(f"max_messages must be an int >= 1, got {max_messages!r}")


def payload_bytes(payload: Any, what: str = "payload") -> bytes:
    """A payload (a publish's, a reply's) that is not ``bytes`` as bytes (str as UTF-8);
    ArgumentError otherwise."""
    if isinstance(payload, str):
        return utf8(payload, what)
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    raise ArgumentError(f"{what} must be bytes or str, got {type(payload).__name__}")


def utf8(text: str, what: str) -> bytes:
    """``text`` encoded as UTF-8; ArgumentError when it cannot be (lone surrogates)."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise ArgumentError(
            f"{what} is not valid text: {exc.reason} at character {exc.start}"
        ) from None


def checked_headers(headers: object) -> dict[str, Any]:
    """A publish's or a request's ``headers`` as a dict: a mapping with str keys whose
    values every consumer can decode (``codec.check_headers``); ArgumentError otherwise."""
    if not isinstance(headers, Mapping):
        raise ArgumentError(
            f"headers must be a mapping with str keys, got {type(headers).__name__}"
        )
    for name in headers:
        if not isinstance(name, str):
            raise ArgumentError(f"headers must be a mapping with str keys, got key {name!r}")
    headers = dict(headers)
    try:
        check_headers(headers)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    return headers


def check_fields(
    cls: Any,
    given: Collection[str],
    where: str,
    what: str = "key",
    *,
    leave_out: Collection[str] = (),
) -> None:
    """Raise ConfigError naming what of ``given`` is no field of the config class ``cls``
    (or is one of ``leave_out``), and listing the known ones."""
    known = {f.name for f in dataclasses.fields(cls)} - set(leave_out)
    bad = set(given) - known
    if bad:
        raise ConfigError(f"{where} has unknown {what}(s) {sorted(bad)}; known: {sorted(known)}")


def _positive(
    owner: str, name: str, value: float, *, allow_zero: bool = False, finite: bool = False
) -> None:
    """A number > 0 (``allow_zero``: >= 0); with ``finite``, not infinity either (for
    durations where infinity means never, and never is not what anyone wants)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"{owner}.{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{owner}.{name} must be {bound}, got {value!r}")
    if finite and value == math.inf:
        raise ConfigError(f"{owner}.{name} must be a finite number of seconds, got {value!r}")


def _listed(owner: str, name: str, value: object, what: str) -> tuple[Any, ...]:
    """A list (or tuple) field as a tuple: a string would be taken apart into its
    characters, and a table (TOML's or a dict) into its keys."""
    if isinstance(value, str | bytes):
        raise ConfigError(f"{owner}.{name} must be a list of {what}, not a string: [{value!r}]")
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{owner}.{name} must be a list of {what}, got {value!r}")
    return tuple(value)


def _path(owner: str, name: str, value: object, *, empty: bool = True) -> str:
    """A path field (a str, or one of pathlib's) as a str: bytes or a number would become
    a file named "b'/x'" or "5"; ``empty``: whether "" may pass."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str) or not (path or empty):
        raise ConfigError(f"{owner}.{name} must be a path (a str or os.PathLike), got {value!r}")
    if "\0" in path:
        raise ConfigError(f"{owner}.{name} must be a path, with no NUL character: {value!r}")
    return path


def _integer(owner: str, name: str, value: object, least: int, note: str = "") -> None:
    """An int (not a bool) of at least ``least``; ``note`` says what an edge value means."""
    if not int_in(value, least):
        raise ConfigError(f"{owner}.{name} must be an int >= {least}{note}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicConfig:
    """How a producer stores and delivers one topic.

    durability: ``process`` (default) commits each batch of publishes to LMDB without fsync,
    so a killed process loses nothing; ``fsync`` also fsyncs before the receipt resolves
    (publishes share one fsync); ``memory`` keeps messages in memory until the node's
    ``memory_budget_bytes`` is exceeded, then spills to LMDB.

    latest_wins: a new message replaces a still-unsent message with the same key in each
    group, so a slow or offline group gets the latest value per key, not every stale one.

    group_inactive_expiry_s: a group (lane) that has had no live member this long is
    retired at this producer, with what it still owed (counted as dropped); 0: never.
    Groups declared here (``groups``) never expire.

    retention_s / retention_bytes: keep messages after every group acked them, for
    ``Node.replay``, until they are older than ``retention_s`` (time since publish) or the
    topic's retained records exceed ``retention_bytes`` (the oldest go first). Both 0
    (default): an acked message leaves the store at once, and is replayable only while
    some group has not acked it yet.

    keep_last: keep the latest ``keep_last`` messages of every key (messages without a
    key count as one key) after every group acked them (0, default: none): what
    ``Node.last`` reads and a ``deliver="last_per_key"`` subscription gets first.
    replicas: how many nodes hold each message before its receipt says stored: this
    producer's outbox and ``replicas - 1`` replica hosts of the mesh (1, the default: the
    outbox alone). A replica takes over the lanes of a producer dead for good and
    delivers what it still owed, with the same message ids (docs/replicas.md). A
    ``memory`` topic keeps no outbox to copy: it takes 1 only.

    A node may set these for a pattern (``plant.*.temp``): a topic without settings of
    its own takes those of the most specific pattern matching it (token by token from the
    left, a literal token beats ``*``, which beats ``>``).
    """

    durability: Durability = "process"
    partitions: int = 16
    ack_timeout_s: float = 30.0
    retry_backoff_s: float = 0.5
    max_retry_backoff_s: float = 30.0
    max_attempts: int = 0
    ttl_s: float | None = None
    groups: tuple[str, ...] = ()
    latest_wins: bool = False
    retention_s: float = 0.0
    retention_bytes: int = 0
    group_inactive_expiry_s: float = 7 * 86400.0
    keep_last: int = 0
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.durability not in ("fsync", "process", "memory"):
            raise ConfigError(
                f"TopicConfig.durability must be 'fsync', 'process' or 'memory', "
                f"got {self.durability!r}"
            )
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int):
            raise ConfigError(f"TopicConfig.partitions must be an int, got {self.partitions!r}")
        if not 1 <= self.partitions <= 4096:
            raise ConfigError(f"TopicConfig.partitions must be 1..4096, got {self.partitions}")
        _positive("TopicConfig", "ack_timeout_s", self.ack_timeout_s)
        # (an infinite backoff never redelivers a nacked or timed-out message)
        _positive(
            "TopicConfig", "retry_backoff_s", self.retry_backoff_s, allow_zero=True, finite=True
        )
        _positive(
            "TopicConfig",
            "max_retry_backoff_s",
            self.max_retry_backoff_s,
            allow_zero=True,
            finite=True,
        )
        if self.retry_backoff_s > self.max_retry_backoff_s:
            raise ConfigError(
                f"TopicConfig.retry_backoff_s ({self.retry_backoff_s}) must be at "
                f"most max_retry_backoff_s ({self.max_retry_backoff_s})"
            )
        _integer("TopicConfig", "max_attempts", self.max_attempts, 0, " (0 means unlimited)")
        if self.ttl_s is not None:
            _positive("TopicConfig", "ttl_s", self.ttl_s)
        if not isinstance(self.latest_wins, bool):
            raise ConfigError(
                f"TopicConfig.latest_wins must be true or false, got {self.latest_wins!r}"
            )
        _positive("TopicConfig", "retention_s", self.retention_s, allow_zero=True)
        _integer("TopicConfig", "retention_bytes", self.retention_bytes, 0, " (0: no size cap)")
        _positive(
            "TopicConfig", "group_inactive_expiry_s", self.group_inactive_expiry_s, allow_zero=True
        )
        _integer("TopicConfig", "keep_last", self.keep_last, 0, " (0: keep none)")
        if not int_in(self.replicas, 1, MAX_REPLICAS):
            raise ConfigError(
                f"TopicConfig.replicas must be an int 1..{MAX_REPLICAS}, got {self.replicas!r}"
            )
        if self.replicas > 1 and self.durability == "memory":
            raise ConfigError(
                "TopicConfig.replicas > 1 needs a stored outbox to copy: use durability "
                "'process' or 'fsync' (a 'memory' topic keeps its messages in RAM only)"
            )
        groups = _listed("TopicConfig", "groups", self.groups, "group names")
        object.__setattr__(self, "groups", tuple(check_name("group", g) for g in groups))


@dataclass(frozen=True, kw_only=True, slots=True)
class SubscriptionConfig:
    """How a node consumes a topic as a member of a group.

    mode ``shared``: members of the group compete; each (producer, partition) goes to one
    live member. ``broadcast``: this member gets its own copy of every message. Without a
    group the subscription is ``ephemeral``: it gets what is published while it is
    connected, at most once, and no producer remembers it (acks do nothing).
    ``topic`` and ``handler`` (``"package.module:function"``) are for subscriptions a node
    starts by itself, from NodeConfig.subscriptions (a node definition file); the topic
    may be a pattern (``plant.*.temp``, ``plant.>``).

    deliver ``"last_per_key"``: first the values each producer keeps of the matching
    topics (``TopicConfig.keep_last``), then live messages. A group gets them when a
    producer first learns of it (a group it knows already had them).
    """

    group: str | None = None
    mode: Mode = "shared"
    # The most a member holds unacked from one producer; a producer sends a member fewer
    # when it acks slowly, and about 16 MiB of large payloads at most (``Member`` in
    # _engine/lane/delivery.py). 8,000 keeps eight frames on their way to a fast member: with
    # fewer, a fast ``fetch``/``ack_many`` consumer waited for acks' round trips through
    # the producer's loop, and a backlog built up behind them (performance.md).
    max_in_flight: int = 8000
    # Messages per data frame. The fixed work of a frame (its header, send and receive, the
    # consumer's loop iteration with its commit and ack) is shared by this many messages:
    # 250 cost a consumer about a fifth less per message than 100, 500 about a tenth less
    # again than 250, and 1,000 with 2,000 publishes ahead of the IO thread made four
    # groups' fan-out a tenth to a fifth faster (performance.md).
    batch_size: int = 1000
    concurrency: int = 1
    topic: str | None = None
    handler: str | None = None
    deliver: Deliver | None = None

    def __post_init__(self) -> None:
        if self.deliver not in (None, "last_per_key"):
            raise ConfigError(
                f"SubscriptionConfig.deliver must be None or 'last_per_key', got {self.deliver!r}"
            )
        if self.group is None:
            if self.mode == "broadcast":
                raise ConfigError(
                    "a broadcast subscription needs a group (its members each "
                    "get a copy); without one a subscription is ephemeral, and "
                    "gets every message anyway"
                )
            if self.mode not in ("shared", "ephemeral"):  # (shared: the default)
                raise ConfigError(
                    f"subscription mode must be 'shared' or 'broadcast', got {self.mode!r} "
                    "(a subscription without a group is ephemeral)"
                )
            object.__setattr__(self, "mode", "ephemeral")
        else:
            check_name("group", self.group)
            if self.mode not in ("shared", "broadcast"):
                raise ConfigError(
                    f"subscription mode must be 'shared' or 'broadcast', got {self.mode!r}"
                    + (
                        " (a subscription without a group is ephemeral)"
                        if self.mode == "ephemeral"
                        else ""
                    )
                )
        if self.topic is not None:
            check_subject("topic", self.topic, wildcards=True)
        if self.handler is not None and not _HANDLER_RE.match(str(self.handler)):
            raise ConfigError(f"handler {self.handler!r} must be 'package.module:function'")
        # (the bounds a producer decodes in a hello: past them it would not know the member)
        # (and concurrency: a thread each)
        for name, most in (
            ("max_in_flight", MAX_IN_FLIGHT),
            ("batch_size", MAX_BATCH_ITEMS),
            ("concurrency", MAX_CONCURRENCY),
        ):
            value = getattr(self, name)
            if not int_in(value, 1, most):
                bound = f"1..{most:,}"
                raise ConfigError(
                    f"SubscriptionConfig.{name} must be an int {bound}, got {value!r}"
                )


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerConfig:
    """A periodic producer a node runs by itself (a sensor): every ``interval_s`` it calls
    ``source`` (``"package.module:function"``) and publishes what it returns; ``count``
    bounds how many messages it sends (None: until the node closes)."""

    topic: str
    source: str
    interval_s: float = 1.0
    key: str | None = None
    count: int | None = None

    def __post_init__(self) -> None:
        check_name("topic", self.topic)
        if not _HANDLER_RE.match(str(self.source)):
            raise ConfigError(f"source {self.source!r} must be 'package.module:function'")
        _positive("ProducerConfig", "interval_s", self.interval_s, finite=True)
        if self.key is not None and not (
            isinstance(self.key, str) and len(self.key) <= MAX_KEY_CHARS and _utf8(self.key)
        ):
            raise ConfigError(
                f"ProducerConfig.key must be None or text of at most {MAX_KEY_CHARS} "
                f"characters, got {self.key!r:.80}"
            )
        if self.count is not None:
            _integer("ProducerConfig", "count", self.count, 0, " (or None: no bound)")


@dataclass(frozen=True, kw_only=True, slots=True)
class RelayConfig:
    """Consume ``from_topic`` as a member of ``group`` and publish each message (or what
    ``transform`` makes of it; None drops it) to ``to_topic``, in one transaction with its
    ack. A transform that settles the message itself (``msg.fail``: dead-lettered) is
    done with it; one that raises has it nacked."""

    from_topic: str
    to_topic: str
    group: str
    transform: str | None = None

    def __post_init__(self) -> None:
        check_name("topic", self.from_topic)
        check_name("topic", self.to_topic)
        check_name("group", self.group)
        if self.from_topic == self.to_topic:
            raise ConfigError(
                f"RelayConfig.to_topic must differ from from_topic "
                f"({self.from_topic!r}): the relay would consume what it "
                "publishes, republishing each message for good"
            )
        if self.transform is not None and not _HANDLER_RE.match(str(self.transform)):
            raise ConfigError(f"transform {self.transform!r} must be 'package.module:function'")


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    """Identity, discovery, limits and timing of a node.

    interfaces: IPv4 addresses of this host to bind and to speak mDNS on, each once;
    empty (or ``"0.0.0.0"`` alone) means all interfaces.
    seeds: control addresses ``"host:port"`` of peers to contact directly (a host name or
    an IPv4 address: nodes listen on IPv4 only).
    heartbeat_interval_s: the membership period (each node probes one member per
    interval); dead_after_s: how long a suspected member has to refute the suspicion
    before it is declared dead (less when its connections closed and others suspect it
    too: a process that ended).
    metrics_address: ``host:port`` for a Prometheus endpoint alone (port 0: any free port).
    http_address: ``host:port`` of the node's HTTP API (its state, the mesh's, and
    Prometheus metrics at ``/metrics``; port 0: any free port). http_admin: serve its
    admin actions (dead-letter replay and purge) too; refused on a secured node, whose
    admin actions go over the control socket with an admin key.
    secret_key_file / trusted_keys_dir / trusted_keys: CurveZMQ security; with a secret
    key every socket is encrypted and only trusted public keys (and this node's own) may
    connect. drop_after_bad_frames: shut down a connection that sent this many frames
    that are not zmesh wire data (0: never); ban_after_dropped_connections: ban an address
    (on a secured mesh, the CURVE key) whose connections were dropped this many times
    within ten minutes (0: never), for ban_duration_s (0: until restart); loopback
    addresses only with ban_loopback. acl_file: per-topic permissions of CURVE keys (TOML,
    see docs/security.md), read again on SIGHUP and when it changes.
    map_size_bytes / max_map_size_bytes: the LMDB map; when it is full, publishes wait for
    room (acks that delete messages), and with max_map_size_bytes above map_size_bytes the
    map first doubles, step by step, up to that size (0: never grow). At least 1 MiB, and
    at least eight times max_message_bytes.
    replica_host: whether this node offers to hold copies of other producers' replicated
    topics (TopicConfig.replicas), each in a store of its own under the data dir, and to
    take over the lanes of one that is dead for takeover_after_s (None: three times
    dead_after_s). The command line's temporary nodes never are.
    dedupe_window_s: how long a publish's ``msg_id`` is remembered, and how long a
    consumer keeps the dedupe window of a producer that sends it nothing.
    """

    name: str
    mesh: str = "default"
    data_dir: str
    interfaces: tuple[str, ...] = ()
    mdns: bool = True
    seeds: tuple[str, ...] = ()
    heartbeat_interval_s: float = 1.0
    dead_after_s: float = 5.0
    max_outbox_messages: int = 1_000_000
    publish_timeout_s: float = 10.0
    map_size_bytes: int = 1 << 30
    max_map_size_bytes: int = 0
    memory_budget_bytes: int = 64 << 20
    max_message_bytes: int = 8 << 20
    dedupe_window_s: float = 86_400.0
    secret_key_file: str | None = None
    trusted_keys_dir: str | None = None
    trusted_keys: tuple[str, ...] = ()
    drop_after_bad_frames: int = 10
    ban_after_dropped_connections: int = 5
    ban_duration_s: float = 600.0
    ban_loopback: bool = False
    acl_file: str | None = None
    topics: Mapping[str, TopicConfig] = field(default_factory=dict)
    subscriptions: tuple[SubscriptionConfig, ...] = ()
    producers: tuple[ProducerConfig, ...] = ()
    relays: tuple[RelayConfig, ...] = ()
    metrics_address: str | None = None
    http_address: str | None = None
    http_admin: bool = False
    replica_host: bool = True
    takeover_after_s: float | None = None

    @property
    def takeover_delay_s(self) -> float:
        """How long a producer is silent before a replica takes over its lanes."""
        if self.takeover_after_s is None:
            return TAKEOVER_AFTER_DEAD * self.dead_after_s
        return self.takeover_after_s

    def __post_init__(self) -> None:
        check_name("node", self.name)
        check_name("mesh", self.mesh)
        object.__setattr__(
            self, "data_dir", _path("NodeConfig", "data_dir", self.data_dir, empty=False)
        )
        for name in ("secret_key_file", "trusted_keys_dir"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _path("NodeConfig", name, getattr(self, name)))
        if not isinstance(self.mdns, bool):
            raise ConfigError(f"NodeConfig.mdns must be true or false, got {self.mdns!r}")
        for name in ("interfaces", "seeds"):
            value = getattr(self, name)
            if isinstance(value, str | bytes):
                raise ConfigError(
                    f"NodeConfig.{name} must be a list of addresses, not a string: [{value!r}]"
                )
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"NodeConfig.{name} must be a list of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        _check_interfaces(self.interfaces)
        if self.mdns and "*" in self.interfaces:
            # (ZeroMQ's spelling: zeroconf takes addresses only, and the start would fail)
            raise ConfigError(
                "NodeConfig.interfaces: mDNS does not take '*'; write "
                "'0.0.0.0', or leave interfaces empty for all of them"
            )
        for seed in self.seeds:
            parse_seed(seed)
        _positive("NodeConfig", "heartbeat_interval_s", self.heartbeat_interval_s)
        _positive("NodeConfig", "dead_after_s", self.dead_after_s, finite=True)
        if self.heartbeat_interval_s < MIN_HEARTBEAT_S or self.dead_after_s > MAX_DEAD_AFTER_S:
            raise ConfigError(
                f"NodeConfig.heartbeat_interval_s must be at least {MIN_HEARTBEAT_S:g} s and "
                f"dead_after_s at most {MAX_DEAD_AFTER_S:,.0f} s (a day), got "
                f"{self.heartbeat_interval_s!r} and {self.dead_after_s!r}"
            )
        if self.dead_after_s <= self.heartbeat_interval_s:
            raise ConfigError(
                "NodeConfig.dead_after_s must be longer than heartbeat_interval_s "
                f"({self.dead_after_s} <= {self.heartbeat_interval_s})"
            )
        keys = _listed("NodeConfig", "trusted_keys", self.trusted_keys, "keys")
        for key in keys:
            if not isinstance(key, str):
                raise ConfigError(
                    f"NodeConfig.trusted_keys holds public keys as Z85 strings, got {key!r}"
                )
        object.__setattr__(self, "trusted_keys", keys)
        _integer(
            "NodeConfig", "drop_after_bad_frames", self.drop_after_bad_frames, 0, " (0: never)"
        )
        _integer(
            "NodeConfig",
            "ban_after_dropped_connections",
            self.ban_after_dropped_connections,
            0,
            " (0: never)",
        )
        _positive("NodeConfig", "ban_duration_s", self.ban_duration_s, allow_zero=True, finite=True)
        if not isinstance(self.ban_loopback, bool):
            raise ConfigError(
                f"NodeConfig.ban_loopback must be true or false, got {self.ban_loopback!r}"
            )
        if self.acl_file is not None:
            acl_file = _path("NodeConfig", "acl_file", self.acl_file, empty=False)
            if self.secret_key_file is None:
                raise ConfigError(
                    "NodeConfig.acl_file needs secret_key_file: permissions "
                    "are granted to CURVE keys, which an open mesh has none of"
                )
            object.__setattr__(self, "acl_file", acl_file)
        for name in ("max_outbox_messages", "map_size_bytes", "max_message_bytes"):
            _integer("NodeConfig", name, getattr(self, name), 1)
        grow = self.max_map_size_bytes
        _integer("NodeConfig", "max_map_size_bytes", grow, 0, " (0: never grow the map)")
        if max(self.map_size_bytes, grow) > MAX_MAP_SIZE_BYTES:
            raise ConfigError(
                f"NodeConfig.map_size_bytes and max_map_size_bytes must be at most "
                f"{MAX_MAP_SIZE_BYTES} (1 EiB), got {self.map_size_bytes} and {grow}"
            )
        if 0 < grow < self.map_size_bytes:
            raise ConfigError(
                f"NodeConfig.max_map_size_bytes ({grow}) must be 0 or at least "
                f"map_size_bytes ({self.map_size_bytes})"
            )
        if self.map_size_bytes < MIN_MAP_SIZE_BYTES:
            raise ConfigError(
                f"NodeConfig.map_size_bytes must be at least "
                f"{MIN_MAP_SIZE_BYTES} (1 MiB), got {self.map_size_bytes}"
            )
        largest_map = max(self.map_size_bytes, grow)
        if self.max_message_bytes > largest_map // MAP_SHARE_OF_ONE_MESSAGE:
            # A publish the map can never take would be held, and every publish after it.
            raise ConfigError(
                f"NodeConfig.max_message_bytes ({self.max_message_bytes}) must be at most an "
                f"eighth of the LMDB map ({largest_map} bytes): lower it, or raise "
                f"map_size_bytes or max_map_size_bytes"
            )
        _positive("NodeConfig", "publish_timeout_s", self.publish_timeout_s, allow_zero=True)
        _integer("NodeConfig", "memory_budget_bytes", self.memory_budget_bytes, 0)
        _positive("NodeConfig", "dedupe_window_s", self.dedupe_window_s)
        if not isinstance(self.topics, Mapping):
            raise ConfigError(
                f"NodeConfig.topics must map topic names to TopicConfig, got {self.topics!r}"
            )
        for topic, cfg in self.topics.items():
            check_subject("topic", topic, wildcards=True)
            if not isinstance(cfg, TopicConfig):
                raise ConfigError(f"NodeConfig.topics[{topic!r}] must be a TopicConfig")
            check_topic_config(topic, cfg)
        object.__setattr__(self, "topics", dict(self.topics))
        subs = _listed("NodeConfig", "subscriptions", self.subscriptions, "SubscriptionConfig")
        for sub in subs:
            if not isinstance(sub, SubscriptionConfig) or sub.topic is None or sub.handler is None:
                raise ConfigError(
                    "NodeConfig.subscriptions holds SubscriptionConfig with a "
                    "topic and a handler ('package.module:function')"
                )
        object.__setattr__(self, "subscriptions", subs)
        for name, kind in (("producers", ProducerConfig), ("relays", RelayConfig)):
            items = _listed("NodeConfig", name, getattr(self, name), f"{kind.__name__} objects")
            if not all(isinstance(i, kind) for i in items):
                raise ConfigError(f"NodeConfig.{name} holds {kind.__name__} objects")
            object.__setattr__(self, name, items)
        _check_relay_cycles(self.relays)
        for name in ("metrics_address", "http_address"):
            if getattr(self, name) is not None:
                parse_seed(getattr(self, name), what=name, allow_port_zero=True)
        if not isinstance(self.http_admin, bool):
            raise ConfigError(
                f"NodeConfig.http_admin must be true or false, got {self.http_admin!r}"
            )
        if not isinstance(self.replica_host, bool):
            raise ConfigError(
                f"NodeConfig.replica_host must be true or false, got {self.replica_host!r}"
            )
        if self.takeover_after_s is not None:
            _positive("NodeConfig", "takeover_after_s", self.takeover_after_s, finite=True)
            if self.takeover_after_s <= self.dead_after_s:
                raise ConfigError(
                    "NodeConfig.takeover_after_s must be longer than dead_after_s "
                    f"({self.takeover_after_s} <= {self.dead_after_s}): a replica would "
                    "take over from a producer that is only slow"
                )
        if self.http_admin and self.secret_key_file is not None:
            # (HTTP carries no CurveZMQ key: anyone who reaches the port would be admin)
            raise ConfigError(
                "NodeConfig.http_admin cannot be set on a secured node: HTTP "
                "carries no CurveZMQ key, so anyone reaching http_address could "
                "act. Run admin actions over the control socket with an admin "
                "key instead (zmesh dlq ..., zmesh web --admin with "
                "--secret-key-file)"
            )

    def replace(self, **changes: Any) -> NodeConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_toml(cls, path: str | Path) -> NodeConfig:
        """Read a node definition: a ``[node]`` table and ``[topics.NAME]`` tables."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read node definition: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "<config>") -> NodeConfig:
        """Build from parsed TOML; errors name the source and the offending key."""
        unknown = set(data) - {"node", "topics", "subscriptions", "producers", "relays"}
        if unknown:
            bridge = (
                "; a [bridge] table makes a Spark bridge: start it with "
                "zmesh.spark.Bridge.from_toml(path) or zmesh node run"
                if "bridge" in unknown
                else ""
            )
            raise ConfigError(
                f"{source}: unknown table(s) {sorted(unknown)}; a node "
                "definition has [node], [topics.NAME], [subscriptions.NAME], "
                f"[producers.NAME] and [relays.NAME] tables{bridge}"
            )
        node = _table(data.get("node", {}), f"{source}: [node]")
        topics_raw = _table(data.get("topics", {}), f"{source}: [topics]")
        topics = {}
        for topic, opts in topics_raw.items():
            where = f"{source}: [topics.{topic}]"
            try:
                check_subject("topic", topic, wildcards=True)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
            topics[topic] = build_config(TopicConfig, _table(opts, where), where)
        subs = []
        for name, opts in _table(
            data.get("subscriptions", {}), f"{source}: [subscriptions]"
        ).items():
            where = f"{source}: [subscriptions.{name}]"
            opts = _table(opts, where)
            for required in ("topic", "group", "handler"):
                if required not in opts:
                    raise ConfigError(
                        f"{where} needs {required} = ... (handler is "
                        "'package.module:function', called per message)"
                    )
            subs.append(build_config(SubscriptionConfig, opts, where))
        roles: dict[str, list[Any]] = {"producers": [], "relays": []}
        for table, kind in (("producers", ProducerConfig), ("relays", RelayConfig)):
            for name, opts in _table(data.get(table, {}), f"{source}: [{table}]").items():
                where = f"{source}: [{table}.{name}]"
                roles[table].append(build_config(kind, _table(opts, where), where))
        check_fields(
            cls,
            node,
            f"{source}: [node]",
            leave_out=("topics", "subscriptions", "producers", "relays"),
        )
        return build_config(
            cls,
            {
                **node,
                "topics": topics,
                "subscriptions": tuple(subs),
                "producers": tuple(roles["producers"]),
                "relays": tuple(roles["relays"]),
            },
            f"{source}: [node]",
        )


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table, got {value!r}")
    return value


def build_config(cls: Any, opts: Mapping[str, Any], where: str) -> Any:
    """``cls`` (a config dataclass) from the table ``opts`` of a definition; ConfigError
    naming ``where`` (file and table) for an unknown or missing key or a bad value."""
    check_fields(cls, opts, where)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in opts
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where} needs {' and '.join(missing)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()}
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def check_topic_config(name: str, cfg: TopicConfig) -> None:
    """What a topic's settings may not be for ``name`` (a topic, or a pattern of them)."""
    if cfg.replicas > 1 and is_pattern(name):
        raise ConfigError(
            f"replicas is set per topic, not for the pattern {name!r}: set it for each "
            "replicated topic"
        )


def _check_relay_cycles(relays: tuple[RelayConfig, ...]) -> None:
    """Relays with no transform that lead back to a topic they consume would republish
    each message for good (one with a transform may be a filter: its cycle may end)."""
    leads = {r.from_topic: r.to_topic for r in relays if r.transform is None}
    for start in leads:
        path, topic = [start], leads[start]
        while topic in leads and topic not in path:
            path.append(topic)
            topic = leads[topic]
        if topic == start:
            cycle = " -> ".join([*path, start])
            raise ConfigError(
                f"relays {cycle} republish each message for good: break the cycle, or give "
                "one of them a transform that ends it"
            )


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (not: lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_interfaces(interfaces: tuple[str, ...]) -> None:
    """Each an IPv4 address of this host, or one wildcard alone; none twice."""
    for iface in interfaces:
        if iface in _WILDCARDS:
            if len(interfaces) > 1:
                raise ConfigError(
                    f"NodeConfig.interfaces: {iface!r} binds every interface "
                    f"already; give it alone, not with others {list(interfaces)}"
                )
            continue
        if _ipv6(iface):
            raise ConfigError(
                f"NodeConfig.interfaces: {iface!r} is an IPv6 address; zmesh binds IPv4 only"
            )
        try:
            ipaddress.IPv4Address(iface)
        except ValueError:
            port = " without a port" if ":" in iface else ""
            raise ConfigError(
                f"NodeConfig.interfaces: {iface!r} is not an IPv4 address; give "
                f"this host's addresses{port} ('0.0.0.0' alone: all of "
                "them)"
            ) from None
    if len(set(interfaces)) < len(interfaces):
        twice = sorted({i for i in interfaces if interfaces.count(i) > 1})
        raise ConfigError(f"NodeConfig.interfaces names {twice} more than once")


def _ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def parse_seed(seed: str, *, what: str = "seed", allow_port_zero: bool = False) -> tuple[str, int]:
    """Split ``"host:port"`` (ZeroMQ's ``"tcp://host:port"`` too); raise ConfigError naming
    the address when it is not one.

    The host is a host name or an IPv4 address. A seed (``what="seed"``) names a node's
    control socket, which listens on IPv4 only: an IPv6 literal is refused there; another
    address (``metrics_address``) may be one, in brackets."""
    text = str(seed)
    host, sep, port = text.removeprefix("tcp://").rpartition(":")
    low = 0 if allow_port_zero else 1
    if not (sep and host and "/" not in host and port.isascii() and port.isdigit()) or not (
        low <= int(port) < 65536
    ):
        raise ConfigError(f"{what} {seed!r} must be 'host:port' with a port in {low}..65535")
    if _ipv6(host):
        if what == "seed":
            raise ConfigError(
                f"{what} {seed!r} is an IPv6 address; zmesh binds IPv4 only: "
                "give the node's IPv4 address or host name"
            )
        return host.strip("[]"), int(port)
    if not _HOST_RE.match(host):
        raise ConfigError(
            f"{what} {seed!r}: {host!r} is neither a host name nor an IPv4 "
            "address (letters, digits, '.', '-' and '_')"
        )
    if host.replace(".", "").isdigit():
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(f"{what} {seed!r}: {host!r} is not an IPv4 address") from None
    elif len(host) > 253 or not all(0 < len(x) < 64 for x in host.removesuffix(".").split(".")):
        raise ConfigError(  # (DNS's limits: such a name never resolves)
            f"{what} {seed!r}: {host!r} is not a host name (labels of 1..63 characters "
            "between the dots, 253 in all)"
        )
    return host, int(port)
