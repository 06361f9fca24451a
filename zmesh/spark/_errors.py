"""Errors of zmesh.spark; all derive from zmesh.ZMeshError.

The tree::

    ZMeshError
    └── BridgeError                 a bridge request failed or the bridge is unreachable
        ├── DataLossError           requested offsets are no longer retained in the log
        └── LogFullError            the bridge log reached its size limit
"""

from __future__ import annotations

from ..errors import ZMeshError

__all__ = ["BridgeError", "DataLossError", "LogFullError"]


class BridgeError(ZMeshError):
    """A request to a bridge failed, timed out, or was refused."""


class DataLossError(BridgeError):
    """A reader asked for log offsets that retention has already removed (``reader``: the
    streaming query's name at the bridge; None for a batch read)."""

    def __init__(self, stream: str, start: int, head: int, reader: str | None = None) -> None:
        why = (
            "startingOffsets is below the log's start, or retention removed them after "
            "the read was planned"
            if reader is None
            else f"retention waits for the query's reader {reader!r} only while the bridge "
            "keeps it (was it dropped, by drop_reader or reader_ttl_s, or is its name "
            "another query's too?)"
        )
        super().__init__(
            f"offsets {start}..{head - 1} of {stream} are no longer in the bridge log "
            f"(it now starts at {head}): {why}; set failOnDataLoss=false to skip the gap"
        )
        self.stream = stream
        self.start = start
        self.head = head
        self.reader = reader


class LogFullError(BridgeError):
    """The bridge log reached its size limit; the bridge stops acking until space frees."""

    def __init__(self, path: str, limit_bytes: int) -> None:
        super().__init__(
            f"bridge log {path} is full ({limit_bytes} bytes); raise max_log_bytes and "
            "map_size_bytes, shorten retain_s, or let slow readers catch up"
        )
        self.path = path
        self.limit_bytes = limit_bytes
