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
    """A reader asked for log offsets that retention has already removed."""

    def __init__(self, stream: str, start: int, head: int) -> None:
        super().__init__(
            f"offsets {start}..{head - 1} of {stream} are no longer in the bridge log "
            f"(it now starts at {head}); give each streaming query its own 'reader' name so "
            "retention waits for it, or set failOnDataLoss=false to skip the gap"
        )
        self.stream = stream
        self.start = start
        self.head = head


class LogFullError(BridgeError):
    """The bridge log reached its size limit; the bridge stops acking until space frees."""

    def __init__(self, path: str, limit_bytes: int) -> None:
        super().__init__(
            f"bridge log {path} is full ({limit_bytes} bytes); raise max_log_bytes and "
            "map_size_bytes, shorten retain_s, or let slow readers catch up"
        )
        self.path = path
        self.limit_bytes = limit_bytes
