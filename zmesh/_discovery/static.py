"""Static seeds: control addresses contacted directly where multicast does not reach,
again at every heartbeat while no live peer answers there.

A seed given by host name is reported at the addresses the name resolves to, looked up
off the IO thread (at start, then every ``RESOLVE_BEATS`` heartbeats, so a name that
resolves later, or to another address, is followed): a node's hello comes from its
address, never from a name, so a contact of the name itself was never seen answered and
said hello every heartbeat for good (on a secured mesh through a DEALER per trusted key:
failed handshakes at the seed without end)."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterable

from .._protocol.addresses import endpoint
from ..config import parse_seed
from ..errors import ZMeshError
from .base import Found, Report

RESOLVE_BEATS = 10


def seed_endpoints(seeds: Iterable[str]) -> list[str]:
    """``"host:port"`` seeds as tcp endpoints."""
    return [endpoint(*parse_seed(s)) for s in seeds]


def _is_address(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def resolve(names: Iterable[tuple[str, int]]) -> list[Found]:
    """The seeds at the IPv4 addresses ``names`` (host, port) resolve to now (a name that
    does not resolve: none; said at start, node.py)."""
    found: list[Found] = []
    for host, port in names:
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        for info in infos:
            seed = Found(endpoint(str(info[4][0]), port), seed=True)
            if seed not in found:
                found.append(seed)
    return found


class StaticSeeds:
    """Reports the configured seeds at start and at every heartbeat."""

    def __init__(self, seeds: Iterable[str]) -> None:
        parsed = [parse_seed(s) for s in seeds]
        self._found = [Found(endpoint(h, p), seed=True) for h, p in parsed if _is_address(h)]
        self._names = [(h, p) for h, p in parsed if not _is_address(h)]
        self._resolved: list[Found] = []  # (replaced whole by the resolver thread)
        self._resolver: threading.Thread | None = None
        self._beats = 0
        self._report: Report | None = None

    def start(self, report: Report) -> None:
        self._report = report
        self.beat()

    def beat(self) -> None:
        if self._report is None:
            return
        for found in [*self._found, *self._resolved]:
            self._report(found)
        busy = self._resolver is not None and self._resolver.is_alive()
        if self._names and self._beats % RESOLVE_BEATS == 0 and not busy:
            # (a daemon: a look-up that hangs on a dead DNS server never holds up close)
            self._resolver = threading.Thread(target=self._resolve, daemon=True, name="zmesh-seeds")
            self._resolver.start()
        self._beats += 1

    def _resolve(self) -> None:
        self._resolved = found = resolve(self._names)
        report = self._report
        if report is None:
            return
        try:
            for seed in found:
                report(seed)
        except ZMeshError:
            pass  # (the node closed meanwhile)

    def close(self) -> None:
        self._report = None
