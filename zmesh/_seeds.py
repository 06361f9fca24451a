"""Whether the host of a seed (or of an address a command is given) resolves now: a name
that does not is said at once, though ZeroMQ keeps trying it (and resolves it again at
each attempt)."""

from __future__ import annotations

import ipaddress
import socket

from .config import parse_seed
from .errors import ConfigError


def unresolved(address: str) -> str | None:
    """Why the host of ``address`` ([tcp://]HOST:PORT) does not resolve now; None when it
    does, or is an IP address (or ``address`` is none: ``parse_seed`` says so)."""
    try:
        host, port = parse_seed(address.removeprefix("tcp://"), what="address")
    except ConfigError:
        return None
    try:
        ipaddress.ip_address(host)
        return None  # (an address: nothing to resolve)
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return f"host {host!r} does not resolve ({exc.strerror or exc})"
    return None
