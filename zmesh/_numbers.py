"""Columns of numbers as little-endian bytes, the order the wire and the store keep them
in: a batch's partitions, attempts, publish times and indexes, a run's partitions and
indexes. An ``array`` goes in and out with no Python step per number."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

LITTLE = sys.byteorder == "little"
ITEM_BYTES = {code: array(code).itemsize for code in "BHIqd"}
assert ITEM_BYTES == {"B": 1, "H": 2, "I": 4, "q": 8, "d": 8}


def le_bytes(column: array[int] | array[float]) -> bytes:
    """``column``'s numbers as little-endian bytes (``column`` is left as it is)."""
    if LITTLE:
        return column.tobytes()
    swapped = array(column.typecode, column)
    swapped.byteswap()
    return swapped.tobytes()


def le_array(code: str, data: bytes) -> array[Any]:
    """The numbers of type ``code`` that ``data`` holds little-endian (its length a
    multiple of their size): ints, or floats for "d" (the code, known only when this
    runs, decides which)."""
    column = array(code, data)
    if not LITTLE:
        column.byteswap()
    return column


def fitting_array(codes: str, values: Sequence[int]) -> array[int]:
    """``values`` as an array of the first type of ``codes`` that holds every one of them
    (OverflowError when none does)."""
    for code in codes[:-1]:
        try:
            return array(code, values)
        except OverflowError:
            continue
    return array(codes[-1], values)


def le_column(data: bytes, n: int, codes: str) -> array[Any] | None:
    """``n`` numbers from ``data``, of the first type of ``codes`` whose size its length
    fits (ints, or floats for "d", as ``le_array``); None when none does."""
    for code in codes:
        if len(data) == n * ITEM_BYTES[code]:
            return le_array(code, data)
    return None
