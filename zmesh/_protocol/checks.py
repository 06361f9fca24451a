"""The checks decoders make of each field: one type and bound each, failing with
DecodeError (shared by ``codec`` and ``swim``)."""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import DecodeError

NODE_ID_BYTES = 16
U63 = (1 << 63) - 1
_INT: frozenset[type] = frozenset({int})
# What ZeroMQ's connect takes (it refuses a host that does not start with a letter or a
# digit, such as "-" or "[.]", whose brackets go when its peer's endpoint is made again).
_ENDPOINT = re.compile(
    r"^tcp://(\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|[A-Za-z0-9][A-Za-z0-9.\-]*):([0-9]{1,5})\Z"
)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise DecodeError(what)


def node_id(value: Any) -> bytes:
    check(isinstance(value, bytes) and len(value) == NODE_ID_BYTES, "bad node id")
    return value


def text(value: Any, what: str, max_len: int = 256) -> str:
    check(isinstance(value, str) and len(value) <= max_len, f"bad {what}")
    return value


def integer(value: Any, what: str, lo: int = 0, hi: int = U63) -> int:
    check(type(value) is int and lo <= value <= hi, f"bad {what}")
    return value


def number(value: Any, what: str) -> float:
    check(type(value) in (int, float) and math.isfinite(value), f"bad {what}")
    return float(value)


def endpoint(value: Any) -> str:
    ep = text(value, "endpoint")
    m = _ENDPOINT.match(ep)
    check(m is not None and 0 < int(m.group(2)) < 65536, "bad endpoint")
    return ep


def producer(value: Any) -> bytes:
    """A producer's node id, or b"" (a settlement for the receiver's own lane)."""
    check(value == b"" or (type(value) is bytes and len(value) == NODE_ID_BYTES), "bad producer")
    return value


def column(value: Any, n: int, what: str, types: frozenset[type]) -> set[type]:
    """Check that ``value`` is an array of ``n`` elements of ``types``; its element types."""
    check(type(value) is list and len(value) == n, f"bad {what} column")
    present = set(map(type, value))
    check(present <= types, f"bad {what}")
    return present


def ints(value: Any, n: int, what: str, hi: int = U63) -> tuple[int, ...]:
    """An array of ``n`` ints in 0..``hi`` (not bools), as a tuple."""
    present = column(value, n, what, _INT)
    check(not present or (min(value) >= 0 and max(value) <= hi), f"bad {what}")
    return tuple(value)
