"""The node: the one object an application holds.

This module is long because it is the public facade: every public method of Node lives
here with the docstring users read; each hands its work to a part (submit.py, the
engine, _requests.py, _last.py, replay.py)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack, cast

from ._engine.commands import Request, SetTopic
from ._engine.engine import Engine
from ._engine.outbox.publishes import AnyPublish, Publish
from ._handlers import awaits
from ._last import last_values
from ._protocol.checks import U63
from ._protocol.codec import MAX_KEY_CHARS, MAX_MSG_ID_BYTES
from ._receipt import MessageId, Receipt
from ._requests import (
    Ask,
    Delivery,
    Pending,
    Reply,
    check_timeout_s,
    serving,
)
from ._roles import Roles, resolve
from ._seeds import unresolved
from ._store.snapshot import check_path
from ._subjects import CACHED_TOPICS, TopicConfigs, check_subject, is_pattern
from ._waits import check_timeout
from .config import (
    MAX_SCHEDULE_AHEAD_S,
    NodeConfig,
    SubscriptionConfig,
    TopicConfig,
    check_delay,
    check_fields,
    check_name,
    check_topic_config,
    checked_headers,
    int_in,
    payload_bytes,
    utf8,
)
from .deadletters import DeadLetter
from .errors import ArgumentError, ConfigError, NodeStateError
from .replay import ReplayReader
from .subscription import Message, Subscription
from .transaction import Transaction

__all__ = ["Node"]

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = TopicConfig().partitions
# What Node.subscribe's arguments default to (group: None, none in the config).
_SUBSCRIBE_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(SubscriptionConfig)
    if f.default is not dataclasses.MISSING
}
# What publish_many must not take apart as a sequence of payloads or keys.
_ONE_VALUE = (str, bytes, bytearray, memoryview)
# Nor these: a mapping would give its keys, a set no order.
_UNORDERED = (Mapping, set, frozenset)


class PublishOptions(TypedDict, total=False):
    """The options of ``Node.publish`` beside ``key`` and ``timeout``, each keyword-only
    (a call that gives none takes the cheapest path)."""

    headers: Mapping[str, Any] | None
    priority: int
    ttl: float | None
    deliver_at: float | _dt.datetime | None
    delay: float | None
    msg_id: str | None


_PUBLISH_OPTIONS = frozenset(PublishOptions.__annotations__)
_NOT_AWAITED = (
    "{what} is a coroutine function, which zmesh.Node does not await: use zmesh.aio.Node "
    "(its handlers may be coroutine functions), or a plain function"
)


def _as_is(handler: Callable[[Message], Any]) -> Callable[[Message], Any]:
    return handler


class Node:
    """A zmesh node: discovers its mesh, publishes through its outbox, consumes by group.

    ``with zmesh.Node("sensor-1", mesh="plant", data_dir="var/sensor-1") as node:`` starts
    it and closes it cleanly; ``start()`` and ``close()`` do the same explicitly.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        mesh: str = "default",
        data_dir: str | os.PathLike[str] | None = None,
        interfaces: Sequence[str] | None = None,
        mdns: bool = True,
        seeds: Sequence[str] = (),
        config: NodeConfig | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            if name is None:
                raise ConfigError("Node needs a name (or config=NodeConfig(...))")
            if data_dir is None:
                raise ConfigError(f"Node {name!r} needs data_dir: where its outbox lives")
            check_fields(NodeConfig, options, "Node()", "setting")
            # (NodeConfig checks the values: a data_dir that is not a path, a string where
            # a list of addresses belongs)
            config = NodeConfig(
                name=name,
                mesh=mesh,
                data_dir=data_dir,  # type: ignore[arg-type]
                interfaces=_addresses(interfaces),
                mdns=mdns,
                seeds=_addresses(seeds),
                **options,
            )
        elif not isinstance(config, NodeConfig):
            raise ConfigError(f"Node config= must be a NodeConfig, got {type(config).__name__}")
        elif (
            name is not None
            or data_dir is not None
            or options
            or mesh != "default"
            or interfaces is not None
            or mdns is not True
            or seeds
        ):
            # (a setting beside config= was ignored)
            raise ConfigError("pass either config=NodeConfig(...) or keyword settings, not both")
        self.config = config
        self._topics = TopicConfigs(config.topics)  # (by topic name or by pattern)
        self._known_topics: set[str] = set()  # names that passed check_name
        # Of those, the partition count of each whose publishes may be plain (0: its
        # configuration sets a ttl); forgotten when the topic is configured again. Both
        # are caches of CACHED_TOPICS topics at most (topics come and go).
        self._plain_partitions: dict[str, int] = {}
        self._max_bytes = config.max_message_bytes
        self._metrics: Any = None
        self._http: Any = None
        self._roles: Roles | None = None
        self._readers: weakref.WeakSet[ReplayReader] = weakref.WeakSet()
        self._closer: threading.Thread | None = None  # (the thread closing it: close())
        self._close_lock = threading.Lock()
        self._closed = threading.Event()
        self._engine = Engine(config)
        self._queue = self._engine.queue  # (what application threads talk to)
        # What start() makes of a handler named in the config (zmesh.aio: one whose
        # awaitables it runs on its loop).
        self._wrap_handler: Callable[[Callable[[Message], Any]], Callable[[Message], Any]] = _as_is

    @classmethod
    def from_toml(cls, path: str | Path) -> Node:
        """A node from a TOML definition (see NodeConfig.from_toml)."""
        return cls(config=NodeConfig.from_toml(path))

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Node:
        """Bind sockets, reopen the outbox, start discovery, start the configured
        subscriptions, HTTP API and metrics endpoint; returns self."""
        try:
            wrap = self._wrap_handler
            handlers = [
                (sub, wrap(resolve(str(sub.handler), f"subscription {sub.topic}/{sub.group}")))
                for sub in self.config.subscriptions
            ]
            for sub, handler in handlers:
                if awaits(handler):
                    raise ConfigError(
                        f"subscription {sub.topic}/{sub.group}: "
                        + _NOT_AWAITED.format(what=f"handler {sub.handler!r}")
                    )
            roles = Roles(self)
        except BaseException:
            self._engine.close()
            raise
        for seed in self.config.seeds:
            why = unresolved(seed)
            if why is not None:  # (ZeroMQ resolves it again at each attempt)
                log.warning("seed %s: %s; it is tried until it resolves", seed, why)
        self._engine.start()
        try:
            for sub, handler in handlers:
                assert sub.topic is not None
                self.subscribe(sub.topic, config=sub, handler=handler)
            roles.start()
            self._roles = roles
            if self.config.metrics_address is not None or self.config.http_address is not None:
                from ._http.server import serve  # (http.server: imported when used)
            if self.config.metrics_address is not None:
                self._metrics = serve(
                    self._engine,
                    self.config.metrics_address,
                    what="metrics_address",
                    metrics_only=True,
                )
            if self.config.http_address is not None:
                self._http = serve(
                    self._engine,
                    self.config.http_address,
                    what="http_address",
                    admin=self.config.http_admin,
                )
        except BaseException:
            self.close()
            raise
        return self

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the Prometheus endpoint, when metrics_address is set."""
        return None if self._metrics is None else self._metrics.address

    @property
    def http_address(self) -> str | None:
        """``host:port`` of the HTTP API (port 0 in the config: the one chosen), when
        http_address is set."""
        return None if self._http is None else self._http.address

    def close(self) -> None:
        """Stop subscriptions (waiting for running handler calls to return), flush acks,
        say bye to peers, close sockets and the store.

        Called while another thread closes the node, it waits for that close to end; from
        a handler thread of the node, which that close waits for, it returns at once."""
        me = threading.current_thread()
        with self._close_lock:
            closer = self._closer = self._closer or me
        if closer is not me:
            if not any(sub._handles_on(me) for sub in self._queue.subscriptions()):
                self._closed.wait()
            return
        try:
            self._close()
        finally:
            self._closed.set()

    def _close(self) -> None:
        if self._roles is not None:
            self._roles.close()
            self._roles = None
        for reader in list(self._readers):
            reader.close()
        for sub in self._queue.subscriptions():
            if not sub.closed:
                sub._end(wait=False)  # gives what it still holds back to the producers
        for server in (self._http, self._metrics):
            if server is not None:
                server.close()
        self._http = self._metrics = None
        self._engine.close()

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- identity -----------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The stable node id (hex), persisted in the data dir."""
        return self._engine.node_id.hex()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def control_address(self) -> str:
        """``host:port`` of the control socket, usable as another node's seed; known once
        the node has started (NodeStateError before: its port is not bound yet)."""
        if not self._engine.ctrl_port:
            raise NodeStateError(
                f"node {self.name!r} has not started: its control address is known once it "
                "has (start(), or `with zmesh.Node(...)`)"
            )
        host = next((i for i in self.config.interfaces if i not in ("*", "0.0.0.0")), "127.0.0.1")
        return f"{host}:{self._engine.ctrl_port}"

    # -- producing ----------------------------------------------------------------------

    def topic(self, name: str, config: TopicConfig | None = None, **options: Any) -> TopicConfig:
        """Set how this node produces ``name`` (durability, partitions, ack timeout, ...).

        ``name`` may be a pattern (``plant.*.temp``): its settings apply to each topic it
        matches that has none of its own; of several patterns matching a topic, the most
        specific wins (token by token from the left, a literal token beats ``*``, which
        beats ``>``). Set a topic's partitions before its first publish: its lanes keep
        the count they were made with."""
        check_subject("topic", name, wildcards=True)
        if config is None:
            check_fields(TopicConfig, options, f"topic {name!r}", "option")
            cfg = TopicConfig(**options)
        elif not isinstance(config, TopicConfig):
            raise ConfigError(
                f"topic {name!r}: config must be a TopicConfig, got "
                f"{type(config).__name__} (or give options as keywords: "
                f"topic({name!r}, partitions=4))"
            )
        elif options:
            raise ConfigError("pass either a TopicConfig or keyword options, not both")
        else:
            cfg = config
        check_topic_config(name, cfg)
        self._queue.submit(SetTopic(name, cfg))
        self._topics[name] = cfg
        if is_pattern(name):
            self._plain_partitions.clear()
        else:
            self._plain_partitions.pop(name, None)
        return cfg

    def publish(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        *,
        key: str | None = None,
        timeout: float | None = None,
        **options: Unpack[PublishOptions],
    ) -> Receipt:
        """Store a message in the outbox for every known group of ``topic``.

        Returns at once with a Receipt (``wait_stored``, ``wait_acked``). Blocks only when
        the outbox is full, up to ``timeout`` (default ``NodeConfig.publish_timeout_s``),
        then raises OutboxFullError.

        ``options`` (``PublishOptions``): ``headers``, ``priority`` (0 most urgent, to
        255), ``ttl`` (seconds), ``deliver_at`` (a time) or ``delay`` (seconds), and
        ``msg_id``, which makes the publish idempotent: a second publish of the same id on
        this node within ``NodeConfig.dedupe_window_s`` stores nothing new, and its receipt
        follows the first message.

        ``key`` has at most 4,096 characters; ``headers`` has str keys and values msgpack
        packs (str keys in nested maps too), at most 64 KiB packed. ArgumentError otherwise.
        """
        partitions = self._plain_partitions.get(topic) if type(topic) is str else None
        if partitions is None:
            partitions = self._learn_topic(topic)
        if (
            not options
            and partitions
            and (key is None or (type(key) is str and len(key) <= MAX_KEY_CHARS and key.isascii()))
        ):
            # No option but key and timeout (the usual call): a place in a stretch.
            if type(payload) is not bytes:
                payload = payload_bytes(payload)
            if len(payload) <= self._max_bytes:  # (else _prepare says why)
                return self._queue.publish_one(
                    topic,
                    payload,
                    key,
                    partitions,
                    None if timeout is None else self._timeout(timeout),
                )
        unknown = options.keys() - _PUBLISH_OPTIONS
        if unknown:
            raise TypeError(f"publish() got an unexpected keyword argument {min(unknown)!r}")
        [pub] = self._prepare(
            topic,
            [payload],
            [key],
            options.get("headers"),
            options.get("priority", 0),
            options.get("ttl"),
            options.get("deliver_at"),
            options.get("delay"),
            options.get("msg_id"),
            timeout,
            submit=True,
        )
        return pub.receipt  # type: ignore[return-value]

    def _learn_topic(self, topic: str) -> int:
        """Check a topic's name (once); its partition count when its publishes may be
        plain, 0 when its configuration sets a ttl."""
        if type(topic) is not str or topic not in self._known_topics:
            check_name("topic", topic)
            if len(self._known_topics) >= CACHED_TOPICS:
                self._known_topics.clear()
                self._plain_partitions.clear()
            self._known_topics.add(topic)
        tcfg = self._topics.of(topic)
        partitions = (
            0
            if tcfg is not None and tcfg.ttl_s is not None
            else DEFAULT_PARTITIONS
            if tcfg is None
            else tcfg.partitions
        )
        self._plain_partitions[topic] = partitions
        return partitions

    def publish_many(
        self,
        topic: str,
        payloads: Sequence[bytes | bytearray | memoryview | str],
        *,
        keys: Sequence[str | None] | None = None,
        headers: Mapping[str, Any] | None = None,
        priority: int = 0,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> Receipt:
        """Publish a batch in one go: consecutive ids, stored in one commit, one receipt.

        ``keys`` (one per payload) route each message like ``publish(key=...)``;
        ``receipt.ids`` lists the message ids; ``wait_acked`` waits for every message.
        """
        if type(payloads) is not list:  # (a list, the usual call: none of these is)
            if isinstance(payloads, _ONE_VALUE):
                raise ArgumentError(
                    f"publish_many takes a list of payloads, got one "
                    f"{type(payloads).__name__} (use publish for one message)"
                )
            if not isinstance(payloads, Iterable) or isinstance(payloads, _UNORDERED):
                raise ArgumentError(
                    f"publish_many takes a list of payloads (bytes or str), got "
                    f"{type(payloads).__name__}"
                )
        payloads = list(payloads)
        if not payloads:
            raise ArgumentError("publish_many needs at least one payload")
        if keys is None:
            key_list: list[str | None] = [None] * len(payloads)
        else:
            if type(keys) is not list and (
                isinstance(keys, _ONE_VALUE)
                or not isinstance(keys, Iterable)
                or isinstance(keys, _UNORDERED)
            ):
                one = "one " if isinstance(keys, _ONE_VALUE) else ""
                raise ArgumentError(
                    f"publish_many takes a list of keys (one per payload), "
                    f"got {one}{type(keys).__name__}"
                )
            key_list = list(keys)
            if len(key_list) != len(payloads):
                raise ArgumentError(f"{len(key_list)} keys for {len(payloads)} payloads")
        pubs = self._prepare(
            topic, payloads, key_list, headers, priority, ttl, timeout=timeout, submit=True
        )
        assert pubs[0].receipt is not None
        return pubs[0].receipt

    def _prepare(
        self,
        topic: str,
        payloads: list[Any],
        keys: list[str | None],
        headers: Mapping[str, Any] | None = None,
        priority: int = 0,
        ttl: float | None = None,
        deliver_at: float | _dt.datetime | None = None,
        delay: float | None = None,
        msg_id: str | None = None,
        timeout: float | None = None,
        paced: bool = True,
        submit: bool = False,
    ) -> list[AnyPublish]:
        """Validate publishes and allocate their sequences (shared with transactions,
        which are not ``paced``: see Submitter.prepare); ``submit``: queue them too."""
        if type(topic) is not str or topic not in self._plain_partitions:
            self._learn_topic(topic)  # (its name checked once)
        limit = self.config.max_message_bytes
        # (all bytes within the limit, the usual batch: checked with no Python step each;
        # together within it, none is past it)
        nbytes = sum(map(len, payloads)) if set(map(type, payloads)) == {bytes} else -1
        plain = nbytes >= 0 and (nbytes <= limit or max(map(len, payloads)) <= limit)
        for i, payload in enumerate(() if plain else payloads):
            if type(payload) is not bytes:
                payloads[i] = payload = payload_bytes(payload)
            if len(payload) > limit:
                raise ArgumentError(
                    f"payload of {len(payload)} bytes exceeds max_message_bytes {limit}"
                )
        for key in () if keys.count(None) == len(keys) else keys:
            if key is None:
                continue
            if not isinstance(key, str):
                raise ArgumentError(f"key must be a str or None, got {type(key).__name__}")
            if len(key) > MAX_KEY_CHARS:
                raise ArgumentError(f"key of {len(key)} characters exceeds {MAX_KEY_CHARS}")
            if not key.isascii():
                utf8(key, "key")
        if headers is not None:
            headers = checked_headers(headers)
        if (
            type(priority) is not int
            and (isinstance(priority, bool) or not isinstance(priority, int))
            or not 0 <= priority <= 255
        ):
            raise ArgumentError(f"priority must be an int 0..255 (0 most urgent), got {priority!r}")
        tcfg = self._topics.of(topic)
        options_ttl = ttl
        if ttl is None and tcfg is not None:
            ttl = tcfg.ttl_s
        now = 0.0
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
                # (nan is not > 0; a bool would be taken for 1 s)
                raise ArgumentError(f"ttl must be a positive number of seconds, got {ttl!r}")
            try:
                ttl = float(ttl)
            except OverflowError:  # (an int past any float: as long as infinity)
                ttl = math.inf
            if ttl == math.inf:
                ttl = None  # never expires
            else:
                now = time.time()
        if deliver_at is not None or delay is not None:
            deliver_at = _deliver_at(deliver_at, delay)
            if ttl is not None and now + ttl <= deliver_at:
                whose = "the topic's ttl_s" if options_ttl is None else "ttl"
                raise ArgumentError(
                    f"{whose}={ttl:g} ends before the message is due ({deliver_at - now:g} s "
                    "from now): it would expire undelivered; give a longer ttl or an "
                    "earlier time"
                )
        if msg_id is not None and (
            not isinstance(msg_id, str) or not 0 < len(utf8(msg_id, "msg_id")) <= MAX_MSG_ID_BYTES
        ):
            raise ArgumentError(
                f"msg_id must be a non-empty str of at most {MAX_MSG_ID_BYTES} bytes in UTF-8"
            )
        return self._queue.prepare(
            topic,
            payloads,
            keys,
            headers,
            priority,
            None if ttl is None else now + ttl,
            deliver_at,
            DEFAULT_PARTITIONS if tcfg is None else tcfg.partitions,
            self._timeout(timeout),
            msg_id,
            paced,
            nbytes if plain else None,
            submit,
        )

    def _timeout(self, timeout: float | None) -> float:
        """A publish's timeout: None is NodeConfig.publish_timeout_s, infinity no end."""
        if timeout is None:
            return self.config.publish_timeout_s
        check_timeout(timeout)
        return timeout

    def transaction(self, timeout: float | None = None) -> Transaction:
        """Publish several messages and ack received ones atomically.

        ``with node.transaction() as tx: tx.publish(...); tx.ack(msg)`` commits all of it in
        one LMDB transaction when the block ends without an exception, and none of it
        otherwise: consume-transform-produce without loss or duplicates.
        """
        return Transaction(self._prepare, self._queue, self._timeout(timeout))

    # -- consuming ----------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        group: str | None = None,
        *,
        mode: str = _SUBSCRIBE_DEFAULTS["mode"],
        handler: Callable[[Message], Any] | None = None,
        max_in_flight: int = _SUBSCRIBE_DEFAULTS["max_in_flight"],
        batch_size: int = _SUBSCRIBE_DEFAULTS["batch_size"],
        concurrency: int = _SUBSCRIBE_DEFAULTS["concurrency"],
        deliver: str | None = None,
        config: SubscriptionConfig | None = None,
    ) -> Subscription:
        """Consume ``topic`` as a member of ``group``.

        Without ``handler`` returns a Subscription to iterate; with one, messages are
        handled on worker threads (acked when it returns, nacked when it raises).

        ``topic`` may be a pattern: ``*`` matches one token, ``>`` (last) one or more
        (``plant.*.temp``, ``plant.>``). The group is then one group across every topic
        the pattern matches, topics first published later included; ``msg.topic`` is the
        message's own topic.

        ``deliver="last_per_key"``: first the values each producer keeps of the matching
        topics (``TopicConfig.keep_last``), then live messages. A group gets them when a
        producer learns of it for the first time.

        Without ``group`` the subscription is ephemeral: it gets every message published
        while it is connected, at most once (a message it misses, or that a slow
        subscriber has no room for, is not sent again; counted in ``ephemeral_dropped``
        at the producer, or here when its queue holds ``max_in_flight`` messages or
        16 MiB), and no producer keeps anything for it; settling its
        messages does nothing. Messages scheduled for later (``deliver_at``, ``delay``)
        go to groups only.
        """
        check_subject("topic", topic, wildcards=True)
        if config is not None:
            if not isinstance(config, SubscriptionConfig):
                raise ArgumentError(
                    f"subscribe config= must be a SubscriptionConfig, got {type(config).__name__}"
                )
            if config.topic is not None and config.topic != topic:
                raise ArgumentError(
                    f"subscribe to {topic!r} got a config for topic {config.topic!r}"
                )
            # (an argument left at its default, or equal to config's, is not a clash)
            given = {
                "group": group,
                "mode": mode,
                "max_in_flight": max_in_flight,
                "batch_size": batch_size,
                "concurrency": concurrency,
                "deliver": deliver,
            }
            clash = [
                name
                for name, value in given.items()
                if value != _SUBSCRIBE_DEFAULTS.get(name) and value != getattr(config, name)
            ]
            if clash:
                raise ArgumentError(
                    f"subscribe takes config= or {'=, '.join(clash)}=, not "
                    f"both (config says {config!r})"
                )
        else:
            config = SubscriptionConfig(
                group=group,
                mode=mode,  # type: ignore[arg-type]
                max_in_flight=max_in_flight,
                batch_size=batch_size,
                concurrency=concurrency,
                deliver=deliver,  # type: ignore[arg-type]
            )
        if handler is not None and not callable(handler):
            raise ArgumentError("handler must be callable")
        if handler is not None and awaits(handler):
            raise ArgumentError(_NOT_AWAITED.format(what="handler"))
        if handler is None and config.concurrency != 1:
            # (concurrency is the number of handler threads: it does nothing without one)
            raise ArgumentError(
                f"concurrency={config.concurrency} needs handler=: it is how "
                "many threads call the handler; without one, the threads "
                "that call get/fetch/iterate consume"
            )
        sub = Subscription(self._queue, topic, config, handler)
        self._queue.subscribe(sub)
        sub._start_handlers(self.config.name)
        return sub

    # -- request/reply ------------------------------------------------------------------

    def request(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        *,
        timeout: float = 5.0,
        key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        delivery: Delivery = "at_most_once",
    ) -> Reply:
        """Ask the groups of ``topic`` and return the first reply (``zmesh.Reply``).

        The request is a message of ``topic`` (routed by ``key`` like any other, with a
        ttl of ``timeout``) that a member of each group answers (``serve``, or
        ``msg.reply``). NoRespondersError at once when no group of the topic has a live
        member; TimeoutError when no reply comes within ``timeout`` seconds; ReplyError
        when the responder's function raised. ``delivery="at_least_once"``: a request
        whose member died before answering is handled again by another (its function
        must be idempotent by ``msg.id``); at most once (the default) it is dropped.
        """
        ask = Ask.of(topic, payload, key, headers, delivery, timeout, self.config.max_message_bytes)
        return ask.reply(self._ask(ask))

    def request_many(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        *,
        count: int | None = None,
        timeout: float = 1.0,
        key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        delivery: Delivery = "at_most_once",
    ) -> list[Reply]:
        """Scatter/gather: ask the groups of ``topic`` (in a broadcast group, every
        member) and return the replies that came once ``count`` did (None: one per lane
        with a live member when it was sent: each member of a broadcast group, one of
        each shared group) or ``timeout`` passed, perhaps fewer and never more than
        ``count``, in arrival order.
        NoRespondersError at once when no group has a live member; a reply whose
        responder's function raised has ``ok`` False."""
        limit = self.config.max_message_bytes
        return self._ask(Ask.of(topic, payload, key, headers, delivery, timeout, limit, count))

    def _ask(self, ask: Ask) -> list[Reply]:
        pending = self._send_request(ask, ask.room_s(self.config.publish_timeout_s))
        try:
            return pending.wait(ask.count, ask.left_s())
        finally:
            pending.close()

    def _send_request(self, ask: Ask, publish_timeout: float | None = None) -> Pending:
        """Publish a request (if its topic has responders) and return what waits for its
        replies; the caller closes it."""
        topic = check_name("topic", ask.topic)
        [pub] = self._prepare(
            topic, [ask.payload], [ask.key], ask.headers, ttl=ask.timeout_s, timeout=publish_timeout
        )
        pending = self._engine.requests.open(topic, pub.seq, self.name)
        try:
            self._queue.submit(Request(cast(Publish, pub), pending))
        except BaseException:
            pending.close()
            raise
        return pending

    def serve(
        self,
        topic: str,
        group: str,
        fn: Callable[[Message], bytes | str | None],
        *,
        mode: str = "shared",
        concurrency: int = 1,
        max_in_flight: int = _SUBSCRIBE_DEFAULTS["max_in_flight"],
        batch_size: int = _SUBSCRIBE_DEFAULTS["batch_size"],
    ) -> Subscription:
        """Answer the requests of ``topic`` (a pattern too) as a member of ``group``:
        ``fn(msg)`` returns the reply (bytes or str; None: an empty one); what it raises,
        or returns that no reply can be (an int, more than max_message_bytes), is replied
        as an error (``ReplyError`` at the requester); the request is acked either way.
        A request delivered again is dropped unless it was sent ``at_least_once``; one its
        requester no longer waits for is dropped. ``mode`` ``"broadcast"``: every member
        answers (``request_many``). Returns the subscription (close it to stop serving)."""
        if group is None:  # (an ephemeral subscription: requests go to groups, never to it)
            raise ArgumentError("serve needs a group: requests are answered by groups' members")
        if not callable(fn):
            raise ArgumentError("serve needs a function: fn(msg) -> bytes | str | None")
        if awaits(fn):
            raise ArgumentError(_NOT_AWAITED.format(what="serve's function"))
        return self.subscribe(
            topic,
            group,
            mode=mode,
            handler=serving(fn, self._engine.counters),
            concurrency=concurrency,
            max_in_flight=max_in_flight,
            batch_size=batch_size,
        )

    # -- last values --------------------------------------------------------------------

    def last(self, topic: str, *, timeout: float = 5.0) -> list[Message]:
        """The values every live producer (this node too) keeps of the topics ``topic``
        (a pattern too) matches: per key the latest ``TopicConfig.keep_last`` messages,
        by topic, then producer, then publish order. A producer that does not answer
        within ``timeout`` seconds is left out. The messages settle nothing."""
        check_subject("topic", topic, wildcards=True)
        return last_values(self._engine, topic, check_timeout_s(timeout))

    # -- replay -------------------------------------------------------------------------

    def replay(
        self,
        topic: str,
        from_index: int = 0,
        *,
        follow: bool = True,
        partitions: Iterable[int] | None = None,
        producers: Iterable[str] | None = None,
        batch_size: int = 500,
    ) -> ReplayReader:
        """Read ``topic`` from each producer's stored history, starting at ``from_index``
        in every partition, then (``follow=True``) the messages published afterwards.

        Messages come in index order per producer and partition (``msg.index``). What a
        producer keeps depends on the topic's ``retention_s`` / ``retention_bytes``
        there; a topic without retention keeps no history for readers. Indexes no longer
        (or never) stored are skipped and counted in ``reader.gaps``. ``partitions``
        limits the partitions read; ``producers`` limits the producers (node ids or names)
        among this node and its live peers. Readers do not ack and do not affect groups;
        close the reader (or use it in ``with``) when done.
        """
        check_name("topic", topic)
        if not int_in(from_index, 0, U63):
            raise ArgumentError(f"from_index must be an int 0..2**63-1, got {from_index!r}")
        if not int_in(batch_size, 1, 10_000):
            raise ArgumentError(f"batch_size must be an int 1..10000, got {batch_size!r}")
        parts = None
        if partitions is not None:
            parts = list(_listed("partitions", partitions))
            if not all(
                isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 4096 for p in parts
            ):
                raise ArgumentError(f"partitions must be ints 0..4095, got {parts!r}")
        names = None
        if producers is not None:
            names = [str(p) for p in _listed("producers", producers)]
        reader = ReplayReader(
            self._engine,
            topic,
            from_index,
            follow=bool(follow),
            partitions=parts,
            producers=names,
            batch_size=batch_size,
        )
        self._readers.add(reader)
        return reader

    # -- inspection ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Topics, lanes, outbox depth, peers and counters, as a plain dict."""
        return self._queue.call(lambda _wb, _now: self._engine.status(), writes=False)

    def snapshot(self, dest: str | Path) -> Path:
        """Copy this node's store consistently, while it runs, into the new data dir ``dest``.

        A node started on ``dest`` resumes from the copy with the same node id: start it
        only in place of this one (after a loss), never beside it.
        """
        path = check_path(dest, "dest")
        if self._queue.state != "new":  # (before start() its store is open already)
            self._queue.check_running()
        self._engine.store.snapshot(path)
        return Path(path)

    # -- dead letters -------------------------------------------------------------------

    def dead_letters(self, topic: str, group: str, *, limit: int = 1000) -> list[DeadLetter]:
        """Messages of ``topic`` parked for ``group`` at this producer, oldest first (at
        most ``limit``)."""
        _check_lane(topic, group)
        if not int_in(limit, 1):
            raise ArgumentError(f"limit must be an int >= 1, got {limit!r}")
        dead = self._engine.outbox.dead
        return self._queue.call(lambda _wb, _now: dead.list(topic, group, limit))

    def replay_dead_letters(
        self, topic: str, group: str, ids: Iterable[MessageId | int] | None = None
    ) -> int:
        """Deliver parked messages to ``group`` again (all of them when ``ids`` is None)."""
        _check_lane(topic, group)
        dead = self._engine.outbox.dead
        seqs = _seqs(ids, self.id)
        return self._queue.call(lambda wb, now: dead.replay(topic, group, seqs, wb, now))

    def purge_dead_letters(
        self, topic: str, group: str, ids: Iterable[MessageId | int] | None = None
    ) -> int:
        """Delete parked messages for good (all of them when ``ids`` is None)."""
        _check_lane(topic, group)
        dead = self._engine.outbox.dead
        seqs = _seqs(ids, self.id)
        return self._queue.call(lambda wb, _now: dead.purge(topic, group, seqs, wb))

    # -- groups -------------------------------------------------------------------------

    def groups(self, topic: str | None = None) -> list[dict[str, Any]]:
        """The groups (lanes) this node, as a producer, owes messages of ``topic`` (or of
        every topic): group, mode, lane, pending, in_flight, members, last_seen (when it
        last had a member, wall clock), oldest_age_s, dead_letters, declared (never
        expires) and expires_after_s."""
        if topic is not None:
            check_subject("topic", topic, wildcards=True)
        groups = self._engine.outbox.groups
        return self._queue.call(lambda _wb, _now: groups.listing(topic, time.time()))

    def delete_group(self, topic: str, group: str) -> dict[str, int]:
        """Retire ``group`` of ``topic`` here and at every live peer: each producer drops
        the group's lanes and what they still owe, counted in ``dropped_group_deleted``
        (receipts say ``group_deleted``), and its dead letters. Members still subscribed
        belong to a new, empty lane of it at once. A producer that is offline now keeps
        the group until its ``group_inactive_expiry_s`` passes (or until this is done
        again while it is up). Returns ``{"dropped": messages dropped here, "peers_told":
        peers asked to do the same}``. A pattern deletes the group subscribed by that
        pattern, with its lanes of every topic the pattern matches."""
        check_subject("topic", topic, wildcards=True)
        check_name("group", group)
        engine = self._engine
        return self._queue.call(
            lambda wb, now: engine.delete_group(topic, group, wb, now, announce=True)
        )

    def peers(self) -> list[dict[str, Any]]:
        """Peers as discovered: id, name, addresses, liveness, subscriptions."""
        return self.status()["peers"]

    def stats(self) -> dict[str, int]:
        """Event counters (published, acked, redelivered, expired, ...)."""
        return self._engine.counters.snapshot()

    def __repr__(self) -> str:
        return f"<zmesh.Node {self.name} mesh={self.config.mesh} id={self.id[:12]}>"


def _addresses(value: Sequence[str] | None) -> tuple[str, ...]:
    """Node's ``interfaces`` or ``seeds`` as a tuple; a string (or what is not a list) as it
    is, for NodeConfig to refuse: ``tuple("127.0.0.1")`` would be its characters."""
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return value  # type: ignore[return-value]
    return tuple(value)


def _check_lane(topic: str, group: str) -> None:
    """The names a dead-letter call takes: a topic and a group."""
    check_name("topic", topic)
    check_name("group", group)


def _listed(what: str, values: object) -> Iterable[Any]:
    """``values`` when it is a list of them (any iterable but a str, bytes or mapping);
    ArgumentError naming ``what`` otherwise."""
    if not isinstance(values, Iterable) or isinstance(values, str | bytes | Mapping):
        raise ArgumentError(f"{what} must be a list, got {values!r:.80}")
    return values


def _seqs(ids: Iterable[MessageId | int] | None, producer: str) -> set[int] | None:
    if ids is None:
        return None
    out = set()
    for i in _listed("ids", ids):
        if isinstance(i, MessageId):
            if i.producer != producer:
                raise ArgumentError(f"message {i} was not published by this node")
            out.add(i.seq)
        elif int_in(i, 1, U63):
            out.add(i)
        elif isinstance(i, int) and not isinstance(i, bool):
            raise ArgumentError(f"a message's sequence is 1..2**63-1, got {i}")
        else:
            raise ArgumentError(f"ids must be MessageId or int sequences, got {i!r}")
    return out


def _deliver_at(deliver_at: float | _dt.datetime | None, delay: float | None) -> float:
    """When a scheduled publish is due, as a UNIX timestamp."""
    if deliver_at is not None and delay is not None:
        raise ArgumentError("pass deliver_at or delay, not both")
    now = time.time()
    if delay is not None:
        return now + check_delay("delay", delay)
    try:
        if isinstance(deliver_at, _dt.datetime):
            due = deliver_at.timestamp()
        elif isinstance(deliver_at, bool) or not isinstance(deliver_at, int | float):
            due = math.nan
        else:
            due = float(deliver_at)
    except (OverflowError, ValueError, OSError):  # (datetime.min, 10**400)
        due = math.nan
    if not math.isfinite(due):
        raise ArgumentError(
            f"deliver_at must be a datetime or a UNIX timestamp, got {deliver_at!r:.80}"
        )
    if due - now > MAX_SCHEDULE_AHEAD_S:
        raise ArgumentError(
            f"deliver_at={deliver_at!r} is more than ten years ahead: a "
            f"message is scheduled at most {MAX_SCHEDULE_AHEAD_S:,.0f} s "
            "from now"
        )
    return due
