"""The checks every decoder makes of what it reads (pure): each raises ``DecodeError``
naming what is wrong, and returns the value checked."""

from __future__ import annotations

import math
from typing import Any

from ..errors import DecodeError

NODE_ID_BYTES = 16
U63 = (1 << 63) - 1
_INT: frozenset[type] = frozenset({int})


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise DecodeError(what)


def _node_id(value: Any) -> bytes:
    _check(isinstance(value, bytes) and len(value) == NODE_ID_BYTES, "bad node id")
    return value


def _producer(value: Any) -> bytes:
    """A producer's node id, or b"" (a settlement for the receiver's own lane)."""
    _check(value == b"" or (type(value) is bytes and len(value) == NODE_ID_BYTES), "bad producer")
    return value


def _str(value: Any, what: str, max_len: int = 256) -> str:
    _check(isinstance(value, str) and len(value) <= max_len, f"bad {what}")
    return value


def _int(value: Any, what: str, lo: int = 0, hi: int = U63) -> int:
    _check(type(value) is int and lo <= value <= hi, f"bad {what}")
    return value


def _num(value: Any, what: str) -> float:
    _check(type(value) in (int, float) and math.isfinite(value), f"bad {what}")
    return float(value)


def _column(value: Any, n: int, what: str, types: frozenset[type]) -> set[type]:
    """Check that ``value`` is an array of ``n`` elements of ``types``; its element types."""
    _check(type(value) is list and len(value) == n, f"bad {what} column")
    present = set(map(type, value))
    _check(present <= types, f"bad {what}")
    return present


def _ints(value: Any, n: int, what: str, hi: int = U63) -> tuple[int, ...]:
    """An array of ``n`` ints in 0..``hi`` (not bools), as a tuple."""
    present = _column(value, n, what, _INT)
    _check(not present or (min(value) >= 0 and max(value) <= hi), f"bad {what}")
    return tuple(value)
