"""The allocator thresholds a node sets for its process (zmesh/_malloc.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zmesh import _malloc

pytestmark = pytest.mark.skipif(
    not _malloc._is_glibc(), reason="the thresholds are glibc's; this C library has none"
)

# A process that starts a node, then allocates and frees what one commit of 256 KiB
# payloads does (16 blocks of 256 KiB, every page written), 50 times, and prints the page
# faults that took.
CHURN = """
import resource, sys, zmesh
node = zmesh.Node("n", data_dir=sys.argv[1], interfaces=["127.0.0.1"], mdns=False).start()
def commit():
    blocks = [bytearray(256 << 10) for _ in range(16)]
    del blocks
commit()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    commit()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
node.close()
"""


def _faults(data_dir: Path, **env: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHURN, str(data_dir)],
        env={**{k: v for k, v in os.environ.items() if k not in _malloc.OWN_SETTINGS}, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return int(out.split()[-1])


def test_a_node_keeps_freed_blocks_for_the_next_commit(tmp_path: Path) -> None:
    # 50 rounds of 4 MiB: 51,200 pages. glibc's own thresholds give most of them back
    # to the system after each round and fault them in again; a node's keep them.
    assert _faults(tmp_path / "tuned") < 1_000
    # An operator's own settings stand (these are glibc's at start): the same churn then
    # maps and faults in its blocks every time.
    left = _faults(tmp_path / "own", MALLOC_TRIM_THRESHOLD_=str(128 << 10))
    assert left > 40_000


@pytest.mark.parametrize(
    "environ",
    [{name: "1"} for name in _malloc.OWN_SETTINGS]
    + [{"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}],
)
def test_settings_of_the_environment_are_left_alone(environ: dict[str, str]) -> None:
    assert _malloc._set(environ) is False


def test_other_tunables_do_not_stop_it() -> None:
    assert _malloc._set({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}) is True
