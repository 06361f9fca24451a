"""Stable hashing of keys to partitions and of partitions to members."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from zmesh._engine.routing import partition_for

# zlib.crc32 of the UTF-8 key, taken once and written down: a change of hash function (or
# a salted hash) moves keys between partitions across versions and machines.
CRC32 = {
    "line-4": 3467467807,
    "sensor-1": 1463541715,
    "": 0,
    "über": 3537962120,
    "a": 3904355907,
}


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        ("line-4", 16, 15),
        ("sensor-1", 16, 3),
        ("", 16, 0),
        ("über", 16, 8),
        ("a", 16, 3),
        ("line-4", 7, 6),
        ("über", 7, 0),
        ("a", 7, 4),
        ("line-4", 1, 0),
    ],
)
def test_partition_for_fixed_values(key: str, partitions: int, expected: int) -> None:
    assert partition_for(key, partitions, seq=123) == expected
    assert CRC32[key] % partitions == expected


def test_partition_for_ignores_seq_when_there_is_a_key() -> None:
    assert {partition_for("line-4", 16, seq) for seq in range(100)} == {15}


def test_partition_for_is_stable_across_processes() -> None:
    # Python's str hash is salted per process; crc32 is not. A fresh interpreter with a
    # different PYTHONHASHSEED must agree.
    code = (
        "from zmesh._engine.routing import partition_for;"
        "print([partition_for(f'k{i}', 16, 0) for i in range(50)])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.strip() == str([partition_for(f"k{i}", 16, 0) for i in range(50)])


@pytest.mark.parametrize("partitions", [4, 16, 64])
def test_partition_for_spreads_keys(partitions: int) -> None:
    keys = [f"sensor-{i}" for i in range(100 * partitions)]
    counts = Counter(partition_for(k, partitions, 0) for k in keys)
    assert set(counts) == set(range(partitions))  # every partition is used
    # 100 keys expected per partition: none gets less than half or more than double.
    assert min(counts.values()) > 50
    assert max(counts.values()) < 200


def test_partition_for_stays_in_range() -> None:
    for partitions in (1, 2, 3, 16, 4096):
        for i in range(200):
            assert 0 <= partition_for(f"key-{i}", partitions, i) < partitions


def test_partition_for_round_robins_without_key() -> None:
    assert [partition_for(None, 4, seq) for seq in range(10)] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [partition_for(None, 16, seq) for seq in range(100, 104)] == [4, 5, 6, 7]
    assert all(partition_for(None, 1, seq) == 0 for seq in range(10))
