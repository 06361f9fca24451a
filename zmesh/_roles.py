"""Work a node definition gives a node besides subscriptions: periodic producers (a sensor
publishing readings) and relays (consume one topic, publish to another, in transactions).
Each runs on its own thread and stops when the node closes."""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .config import NodeConfig, ProducerConfig, RelayConfig
from .errors import ConfigError, ZMeshError

if TYPE_CHECKING:
    from ._receipt import Receipt
    from .subscription import Subscription
    from .transaction import Transaction

log = logging.getLogger(__name__)


def resolve(ref: str, what: str) -> Callable[..., Any]:
    """Import a ``package.module:function`` reference; ConfigError naming the module, the
    function and the module's file when it is not one."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{what}: {ref!r} is not 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: {ref!r}: cannot import module {module_name!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # (its code failed as it was imported)
        raise ConfigError(
            f"{what}: {ref!r}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        where = getattr(module, "__file__", None) or "no file"
        kind = type(fn).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        found = "no function" if fn is None else f"{article} {kind}, not a function,"
        raise ConfigError(
            f"{what}: {ref!r}: module {module_name} ({where}) has {found} named {attr!r}"
        )
    return fn


def _payload(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


class RoleNode(Protocol):
    """What the roles use of their node."""

    config: NodeConfig

    @property
    def name(self) -> str: ...

    def subscribe(self, topic: str, group: str | None = None) -> Subscription: ...

    def publish(self, topic: str, payload: bytes, *, key: str | None = None) -> Receipt: ...

    def transaction(self, timeout: float | None = None) -> Transaction: ...


class Roles:
    """The producer and relay threads of one node."""

    def __init__(self, node: RoleNode) -> None:
        self._node = node
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        cfg = node.config
        self._producers = [(p, resolve(p.source, f"producer {p.topic}")) for p in cfg.producers]
        self._relays = [
            (r, resolve(r.transform, f"relay {r.from_topic}") if r.transform else None)
            for r in cfg.relays
        ]

    def start(self) -> None:
        # Relays subscribe first: a producer of their from_topic on this node then owes
        # its first message to their group too.
        for r, transform in self._relays:
            sub = self._node.subscribe(r.from_topic, group=r.group)
            self._spawn(f"relay-{r.from_topic}", self._relay, r, sub, transform)
        for p, source in self._producers:
            self._spawn(f"producer-{p.topic}", self._produce, p, source)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(
            target=target, args=args, daemon=True, name=f"zmesh-{self._node.name}-{name}"
        )
        t.start()
        self._threads.append(t)

    def _produce(self, p: ProducerConfig, source: Callable[[], Any]) -> None:
        """Publish what ``source()`` returns every ``interval_s`` (None: nothing this time;
        a (key, value) tuple: keyed; a list: several messages)."""
        sent = 0
        while not self._stop.is_set() and (p.count is None or sent < p.count):
            try:
                value = source()
                for item in value if isinstance(value, list) else [value]:
                    if item is None:
                        continue
                    key, body = item if isinstance(item, tuple) else (p.key, item)
                    self._node.publish(p.topic, _payload(body), key=key)
                    sent += 1
            except ZMeshError as exc:
                log.error("producer %s: %s", p.topic, exc)
            except Exception:
                log.exception("producer %s: source %s raised", p.topic, p.source)
            self._stop.wait(min(p.interval_s, threading.TIMEOUT_MAX))

    def _relay(self, r: RelayConfig, sub: Any, transform: Callable[[Any], Any] | None) -> None:
        """Consume ``from_topic`` and publish to ``to_topic``, each message in one
        transaction with its ack: nothing lost, nothing twice, across crashes."""
        node = self._node
        while not self._stop.is_set():
            msg = sub.get(timeout=0.2)
            if msg is None:
                continue
            try:
                out = msg.payload if transform is None else transform(msg)
                if msg.settled:  # (the transform settled it: msg.fail parks what it cannot read)
                    continue
                with node.transaction() as tx:
                    if out is not None:
                        tx.publish(r.to_topic, _payload(out), key=msg.key, headers=msg.headers)
                    tx.ack(msg)
            except Exception:
                log.exception(
                    "relay %s -> %s failed on %s; nacking", r.from_topic, r.to_topic, msg.id
                )
                if not msg.settled:
                    msg.nack()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
