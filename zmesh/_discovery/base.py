"""What every way of finding peers does: once started, it reports the control endpoints
it learns (``Found``) to the engine, which contacts them on its IO thread; each
heartbeat gives it a turn (``beat``); ``close`` stops it."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol


class Found(NamedTuple):
    """A control endpoint to contact: a peer's (``node_id`` when known), or a seed's."""

    endpoint: str
    node_id: bytes | None = None
    key: bytes = b""  # its CURVE public key (Z85), when known
    seed: bool = False  # contacted again whenever no live peer answers there


Report = Callable[[Found], None]


class Discovery(Protocol):
    """A way to find peers (mDNS, static seeds)."""

    def start(self, report: Report) -> None:
        """Begin; ``report`` may be called from any thread."""

    def beat(self) -> None:
        """A heartbeat of the node (IO thread)."""

    def close(self) -> None:
        """Stop; nothing is reported afterwards."""
