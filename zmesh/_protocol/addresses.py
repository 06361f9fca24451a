"""Endpoints as ZeroMQ names them (pure, no I/O)."""

from __future__ import annotations


def endpoint(host: str, port: int) -> str:
    """A tcp endpoint, bracketing IPv6 hosts."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"
