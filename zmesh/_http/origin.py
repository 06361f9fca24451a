"""Whether an admin request comes from this server's own pages (the node's HTTP API and
``zmesh web`` share the rule).

A JSON POST from a page of another site needs a CORS preflight, which is never granted;
but a site can make its own name point at this server's address (DNS rebinding), and its
page then posts to "its own" origin. The browser still names that site in ``Host`` and
``Origin``, so an action is refused unless ``Host`` is a name that cannot be rebound (an
IP address, ``localhost``) or the one the server was bound to, and ``Origin``, when sent,
is the server's own. The port is not compared: it tells nothing of who asks, and a tunnel
(``ssh -L``) changes it.
"""

from __future__ import annotations

import ipaddress
from http import HTTPStatus
from urllib.parse import urlsplit

from .actions import HttpError


def _hostname(netloc: str) -> str | None:
    """The host of ``netloc`` (``host:port``, ``[v6]:port``), lower case; None when it is
    not one."""
    try:
        split = urlsplit("//" + netloc)
        split.port  # noqa: B018  (raises for a port that is not one)
    except ValueError:
        return None
    if split.username is not None or split.password is not None or split.path:
        return None
    return split.hostname


def _trusted(hostname: str, bound_host: str) -> bool:
    if hostname in ("localhost", bound_host.lower().strip("[]")):
        return True
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        return False
    return True


def check_origin(host: str | None, origin: str | None, bound_host: str) -> None:
    """HttpError 403 unless ``host`` (the Host header, None when absent) names this server
    (bound to ``bound_host``) by a name that cannot be rebound, and ``origin`` (the Origin
    header), when sent, is ``http://`` or ``https://`` and that host."""
    if host is not None:
        hostname = _hostname(host)
        if hostname is None or not _trusted(hostname, bound_host):
            raise HttpError(
                HTTPStatus.FORBIDDEN,
                f"Host {host!r} is not this server: admin actions are taken only from a "
                "page reached by its IP address, localhost or the name it listens on",
            )
    if origin is not None:
        split = urlsplit(origin)
        same = host is not None and split.netloc.lower() == host.lower()
        if split.scheme not in ("http", "https") or not same:
            raise HttpError(
                HTTPStatus.FORBIDDEN,
                f"Origin {origin!r} is not this server's: admin actions are taken only "
                "from its own pages",
            )
