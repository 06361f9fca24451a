"""The bridge: a node role that turns mesh topics into a replayable, offset-addressed log.

One thread owns the bridge's ROUTER socket and does every write to its LMDB log. Each loop
iteration takes what the subscriptions delivered, appends it in one transaction (dropping
message ids already logged), and acks upstream only after that commit; then it answers
readers (stream bounds, offset ranges) and sink writers (``_service.py``), and prunes on a
timer.

This module is long because the bridge thread's loop, its readers' requests and its acks
upstream share the thread's state; the log is in _log.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import zmq

from .._definition import read_definition
from .._engine.stats import Counters
from ..config import NodeConfig
from ..errors import ArgumentError, ConfigError, NodeStateError, ZMeshError
from ..node import Node
from ..subscription import Message, Subscription
from ._config import BridgeConfig
from ._errors import BridgeError, LogFullError
from ._ingest import runs_of
from ._log import BridgeLog
from ._service import Service

__all__ = ["Bridge"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 15.0
FULL_BACKOFF_S = 1.0
PRUNE_ROUNDS = 32
PUBLISH_POLL_S = 0.001  # how soon the bridge looks again while publishes wait for the node


class _Call:
    __slots__ = ("fn", "done", "result", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


# What other threads ask of the bridge thread: stop, or run a call.
_Command = tuple[Literal["stop"]] | tuple[Literal["call"], _Call]


class Bridge:
    """Joins ``group`` on ``topics``, logs every message with a per-partition offset before
    acking it, and serves offset ranges and sink publishes on a ROUTER at ``endpoint``.

    ``Bridge(node, topics=["metrics"], log_dir="var/bridge-log")`` uses a running node;
    given a NodeConfig instead, the bridge starts and closes a node of its own.
    """

    def __init__(
        self, node: Node | NodeConfig, config: BridgeConfig | None = None, **options: Any
    ) -> None:
        if config is None:
            config = BridgeConfig(**options)
        elif options:
            raise ConfigError("pass either config=BridgeConfig(...) or keyword settings")
        if isinstance(node, NodeConfig):
            self.node, self._owns_node = Node(config=node), True
        elif isinstance(node, Node):
            self.node, self._owns_node = node, False
        else:
            raise ArgumentError(f"Bridge needs a zmesh.Node or NodeConfig, got {node!r}")
        self.config = config
        self.counters = Counters()
        self._log: BridgeLog | None = None
        self._service: Service | None = None
        self._subs: tuple[Subscription, ...] = ()
        self._cmds: deque[_Command] = deque()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._wake_tx: zmq.Socket[bytes] | None = None
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._state = "new"
        self._endpoint = ""
        self._busy = False
        self._paused_until = 0.0
        self._next_prune = 0.0

    @classmethod
    def from_toml(cls, path: str | Path) -> Bridge:
        """A bridge and its own node from a definition with ``[node]``, ``[topics.*]`` and
        ``[bridge]`` tables (see docs/spark.md)."""
        node_cfg, table = read_definition(path)
        if table is None:
            raise ConfigError(f"{path}: a bridge definition needs a [bridge] table")
        return cls(node_cfg, BridgeConfig.from_mapping(table, source=str(path)))

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Where readers and sink writers connect (``tcp://host:port``)."""
        return self._endpoint

    @property
    def log_id(self) -> str:
        """The id of the bridge's log: a source reading several bridges names this one's
        streams ``"<log id>:topic/partition"``."""
        return self._require_log().log_id

    def start(self) -> Bridge:
        """Open the log, bind the ROUTER, start the thread, then subscribe; returns self."""
        if self._state != "new":
            raise NodeStateError("bridge was already started")
        self._state = "running"
        try:
            if self._owns_node:
                self.node.start()
            self._log = BridgeLog(
                self.config.log_dir,
                map_size_bytes=self.config.map_size_bytes,
                max_log_bytes=self.config.max_log_bytes,
            )
            self._log.register()
            self._service = Service(
                self._log,
                self.node,
                self.counters,
                self.config.topics,
                self.config.publish_timeout_s,
            )
            self._ctx = zmq.Context()
            self._thread = threading.Thread(
                target=self._run, daemon=True, name=f"zmesh-bridge-{self.node.name}"
            )
            self._thread.start()
            if not self._ready.wait(START_TIMEOUT_S):
                raise BridgeError(f"bridge thread did not start within {START_TIMEOUT_S:g}s")
            if self._failure is not None:
                raise BridgeError(f"bridge failed to start: {self._failure}") from self._failure
            tx = self._ctx.socket(zmq.PAIR)
            tx.setsockopt(zmq.LINGER, 0)
            tx.connect(f"inproc://zmesh-bridge-{id(self)}")
            self._wake_tx = tx
            cfg = self.config
            for topic in cfg.topics:
                sub = self.node.subscribe(
                    topic,
                    cfg.group,
                    mode=cfg.mode,
                    max_in_flight=cfg.max_in_flight,
                    batch_size=cfg.batch_size,
                )
                sub._add_listener(self._wake)
                self._subs = (*self._subs, sub)
            self._wake()
        except BaseException:
            self.close()
            raise
        log.info(
            "bridge on %s: %s/%s logged in %s, serving %s",
            self.node.name,
            ",".join(self.config.topics),
            self.config.group,
            self.config.log_dir,
            self._endpoint,
        )
        return self

    def close(self) -> None:
        """Finish the batch in hand, stop serving, release what is queued, close the log."""
        if self._state == "closed":
            return
        self._state = "closing"
        if self._thread is not None and self._thread.is_alive():
            self._cmds.append(("stop",))
            self._wake(force=True)
            self._thread.join()
        for sub in self._subs:
            sub.close()
        with self._wake_lock:
            if self._wake_tx is not None:
                self._wake_tx.close(linger=0)
                self._wake_tx = None
        if self._ctx is not None:
            self._ctx.term()
        if self._log is not None:
            self._log.close()
        if self._owns_node:
            self.node.close()
        self._state = "closed"

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inspection -----------------------------------------------------------------------

    def streams(self) -> dict[str, tuple[int, int]]:
        """``topic/partition`` -> (head, end): the retained offsets are [head, end)."""
        return self._require_log().streams()

    def readers(self) -> dict[str, dict[str, Any]]:
        """Registered streaming readers: their topics, watermarks and when last seen."""
        return self._require_log().readers()

    def stats(self) -> dict[str, int]:
        """Counters (appended, duplicates, fetches, records_served, published,
        publish_duplicates, pruned, log_write_failures, ...) and log entry counts."""
        return {**self.counters.snapshot(), **self._require_log().stat()}

    def drop_reader(self, name: str) -> bool:
        """Forget a streaming reader so retention stops waiting for it."""
        return bool(self._call(lambda: self._require_log().drop_reader(name)))

    def prune(self) -> int:
        """Run retention now (it also runs every ``prune_interval_s``)."""
        return int(self._call(lambda: self._prune(time.time())))

    def _require_log(self) -> BridgeLog:
        if self._log is None or self._state != "running":
            raise NodeStateError(f"bridge is {self._state}; use it after start()")
        return self._log

    def _call(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        self._require_log()
        if self._thread is None or not self._thread.is_alive():
            raise BridgeError(f"the bridge thread has stopped: {self._failure!r}")
        call = _Call(fn)
        self._cmds.append(("call", call))
        self._wake(force=True)
        if not call.done.wait(timeout_s):
            raise BridgeError(f"bridge did not answer within {timeout_s:g}s")
        if call.error is not None:
            raise call.error
        return call.result

    # -- thread side ----------------------------------------------------------------------

    def _wake(self, force: bool = False) -> None:
        if self._wake_pending and not force:
            return
        self._wake_pending = True
        with self._wake_lock:
            if self._wake_tx is not None:
                with contextlib.suppress(zmq.ZMQError):  # a wake-up is already queued
                    self._wake_tx.send(b"", zmq.NOBLOCK)

    def _run(self) -> None:
        assert self._ctx is not None
        wake = self._ctx.socket(zmq.PAIR)
        router = self._ctx.socket(zmq.ROUTER)
        for sock in (wake, router):
            sock.setsockopt(zmq.LINGER, 0)
        try:
            wake.bind(f"inproc://zmesh-bridge-{id(self)}")
            router.bind(self.config.bind)
            self._endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._failure = BridgeError(f"cannot bind {self.config.bind}: {exc}")
            wake.close()
            router.close()
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(wake, zmq.POLLIN)
        poller.register(router, zmq.POLLIN)
        try:
            while self._loop_once(poller, wake, router):
                pass
        except BaseException as exc:
            log.exception("bridge thread of %s stopped on an internal error", self.node.name)
            self._failure = exc
        finally:
            wake.close()
            router.close()

    def _loop_once(
        self, poller: zmq.Poller, wake: zmq.Socket[bytes], router: zmq.Socket[bytes]
    ) -> bool:
        assert self._service is not None
        mono = time.monotonic()
        wait_s = 0.0 if self._busy else max(0.0, min(self._next_prune - mono, 1.0))
        if self._service.busy:  # (publishes wait for the node: look again soon)
            wait_s = min(wait_s, PUBLISH_POLL_S)
        events = dict(poller.poll(int(wait_s * 1000)))
        if wake in events:
            try:
                while True:
                    wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                pass
            # Re-arm only after draining: a wake-up sent before this point is drained, but
            # what it announced is handled below; one sent after it wakes the next poll.
            self._wake_pending = False
        while self._cmds:
            cmd = self._cmds.popleft()
            if cmd[0] == "stop":
                self._ingest()
                self._finish_publishes(router)
                return False
            call: _Call = cmd[1]
            try:
                call.result = call.fn()
            except BaseException as exc:
                call.error = exc
            call.done.set()
        self._busy = self._ingest()
        if router in events:
            self._service.serve(router)
        if self._service.busy:
            self._service.finish(router)
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + self.config.prune_interval_s
            self._prune(time.time())
        return True

    def _finish_publishes(self, router: zmq.Socket[bytes]) -> None:
        """On the way out: answer the publishes under way once the node stores them (it
        gives up on them after ``publish_timeout_s``, and answers with an error)."""
        assert self._service is not None
        while self._service.busy:
            router.poll(int(PUBLISH_POLL_S * 1000))
            self._service.finish(router)

    def _ingest(self) -> bool:
        """Append what the subscriptions hold, then ack it; True if more may be waiting."""
        if time.monotonic() < self._paused_until:
            return False
        budget = self.config.ingest_batch_max
        taken: list[tuple[Subscription, list[Message]]] = []
        for sub in self._subs:
            got = sub.fetch(budget, timeout=0) if budget > 0 else []
            if got:
                taken.append((sub, got))
                budget -= len(got)
        if not taken:
            return False
        msgs = taken[0][1] if len(taken) == 1 else [m for _s, got in taken for m in got]
        done, added, dups, error = self._append(msgs)
        self.counters.add("appended", added)  # (before the acks, which others may wait on)
        self.counters.add("duplicates", dups)
        for sub, got in taken:  # the first ``done`` of ``msgs``, in the order fetched
            if done >= len(got):
                sub.ack_many(got)  # (the list fetch returned: acked as its batches)
            elif done > 0:
                sub.ack_many(got[:done])
            done -= len(got)
        if error is not None:
            # Not logged, so not acked: the producers keep the messages and redeliver.
            left = [m for m in msgs if not m.settled]
            self.counters.add("log_write_failures", 1)
            self._paused_until = time.monotonic() + FULL_BACKOFF_S
            if isinstance(error, LogFullError) or self.counters.get("log_write_failures") == 1:
                log.warning("%s; %d messages go back to their producers", error, len(left))
            for m in left:
                m.nack(FULL_BACKOFF_S)
            return False
        return budget <= 0

    def _append(self, msgs: list[Message]) -> tuple[int, int, int, BridgeError | None]:
        """Append as much of ``msgs`` as fits, from the first on, in one transaction (in
        fewer, each half the last, when the log cannot take them all). Returns (messages
        done, appended, duplicates, and the error that stopped it, if any)."""
        assert self._log is not None
        done = added = dups = 0
        size = len(msgs)
        while done < len(msgs):
            chunk = msgs[done : done + size]
            try:
                a, d = self._log.append(runs_of(chunk), time.time())
                if self.config.fsync:
                    self._log.sync()
            except LogFullError as exc:
                if size == 1:
                    return done, added, dups, exc
                size //= 2
                continue
            except BridgeError as exc:
                return done, added, dups, exc
            done += len(chunk)
            added += a
            dups += d
        return done, added, dups, None

    def _prune(self, now: float) -> int:
        assert self._log is not None
        cfg = self.config
        try:
            self._log.env.reader_check()
            n = 0
            for _ in range(PRUNE_ROUNDS):
                got = self._log.prune(
                    now,
                    retain_s=cfg.retain_s,
                    retain_records=cfg.retain_records,
                    reader_ttl_s=cfg.reader_ttl_s,
                )
                n += got
                if not got:
                    break
            self._log.sink_prune(now, cfg.sink_window_s)
        except ZMeshError:
            log.exception("bridge retention failed; trying again in %gs", cfg.prune_interval_s)
            return 0
        except Exception as exc:  # lmdb.Error from reader_check
            log.warning("bridge retention failed: %s", exc)
            return 0
        self.counters.add("pruned", n)
        return n
