"""The bridge's configuration: a frozen keyword-only dataclass a ``[bridge]`` TOML table fills."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._subjects import subject_error
from ..config import build_config, check_name, int_in
from ..errors import ConfigError

__all__ = ["BridgeConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BridgeConfig:
    """How a bridge consumes, keeps and serves its log.

    topics: topics to consume as a member of ``group`` (``mode`` shared or broadcast).
    log_dir: the bridge's own LMDB log (not the node's data dir).
    bind: where the ROUTER serving readers and sink writers binds (``tcp://host:port``;
    port ``*`` picks a free one; read the real one from ``Bridge.endpoint``).
    retain_s: time floor: every record stays at least this long, even once read.
    retain_records: size floor: the last N records of each partition always stay.
    reader_ttl_s: forget a streaming reader silent this long (None: never); retention
    then stops waiting for it.
    max_log_bytes: the log's budget (default: half of ``map_size_bytes``, leaving LMDB room
    to prune); when it is reached the bridge stops acking and producers hold the rest.
    sink_window_s: how long published sink row ids are remembered for dedupe.
    publish_timeout_s: how long a sink publish waits for room in the node's outbox (the
    bridge thread waits, serving nothing else), then for its rows to be stored; at most
    half the writer's request timeout, so that its error reaches the writer.
    """

    topics: tuple[str, ...]
    log_dir: str
    group: str = "spark"
    mode: Literal["shared", "broadcast"] = "shared"
    bind: str = "tcp://127.0.0.1:*"
    retain_s: float = 3600.0
    retain_records: int = 0
    reader_ttl_s: float | None = None
    map_size_bytes: int = 1 << 30
    max_log_bytes: int | None = None
    fsync: bool = False
    sink_window_s: float = 86_400.0
    # (the subscription's as a node's defaults are; a loop logs up to ingest_batch_max)
    max_in_flight: int = 8000
    batch_size: int = 1000
    ingest_batch_max: int = 8000
    prune_interval_s: float = 1.0
    publish_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):
            raise ConfigError("BridgeConfig.topics must be a list of topic names, not a string")
        for topic in self.topics:
            if subject_error("topic", topic, wildcards=False) is None:
                continue
            if subject_error("topic", topic, wildcards=True) is None:
                raise ConfigError(
                    f"BridgeConfig.topics holds the pattern {topic!r}: a bridge consumes "
                    "topics by name (each one's partitions are streams of its log); list them"
                )
            try:
                check_name("topic", topic)
            except ConfigError as exc:
                raise ConfigError(f"BridgeConfig.topics: {exc}") from None
        object.__setattr__(self, "topics", tuple(self.topics))
        if not self.topics:
            raise ConfigError("BridgeConfig.topics must name at least one topic")
        check_name("group", self.group)
        if self.mode not in ("shared", "broadcast"):
            raise ConfigError(
                f"BridgeConfig.mode must be 'shared' or 'broadcast', got {self.mode!r}"
            )
        log_dir = os.fspath(self.log_dir) if isinstance(self.log_dir, os.PathLike) else None
        if log_dir is None and (not isinstance(self.log_dir, str) or not self.log_dir):
            raise ConfigError(f"BridgeConfig.log_dir must be a path, got {self.log_dir!r}")
        object.__setattr__(self, "log_dir", str(log_dir or self.log_dir))
        if not isinstance(self.bind, str) or not self.bind.startswith(("tcp://", "ipc://")):
            raise ConfigError(
                f"BridgeConfig.bind must be 'tcp://host:port' or 'ipc://path', got {self.bind!r}"
            )
        for name in ("retain_s", "sink_window_s", "prune_interval_s", "publish_timeout_s"):
            _number(name, getattr(self, name), allow_zero=name == "retain_s")
        if self.reader_ttl_s is not None:
            _number("reader_ttl_s", self.reader_ttl_s)
        for name in ("retain_records",):
            _int(name, getattr(self, name), minimum=0)
        for name in ("map_size_bytes", "max_in_flight", "batch_size", "ingest_batch_max"):
            _int(name, getattr(self, name), minimum=1)
        if self.max_log_bytes is not None:
            _int("max_log_bytes", self.max_log_bytes, minimum=1)
            if self.max_log_bytes >= self.map_size_bytes:
                raise ConfigError(
                    "BridgeConfig.max_log_bytes must be below map_size_bytes, "
                    "leaving LMDB room to prune"
                )
        if not isinstance(self.fsync, bool):
            raise ConfigError(f"BridgeConfig.fsync must be true or false, got {self.fsync!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "<config>") -> BridgeConfig:
        """Build from a parsed ``[bridge]`` table; errors name the source and the key, as a
        node definition's do."""
        return build_config(cls, data, f"{source}: [bridge]")


def _number(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"BridgeConfig.{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(
            f"BridgeConfig.{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}"
        )


def _int(name: str, value: object, *, minimum: int) -> None:
    if not int_in(value, minimum):
        raise ConfigError(f"BridgeConfig.{name} must be an int >= {minimum}, got {value!r}")
