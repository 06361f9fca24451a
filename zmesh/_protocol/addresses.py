"""Endpoints as ZeroMQ names them (pure, no I/O)."""

from __future__ import annotations


def endpoint(host: str, port: int) -> str:
    """A tcp endpoint, bracketing IPv6 hosts."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def split_endpoint(ep: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` as (host, port), the brackets of an IPv6 host removed."""
    host, port = ep.removeprefix("tcp://").rsplit(":", 1)
    return host.removeprefix("[").removesuffix("]"), int(port)
