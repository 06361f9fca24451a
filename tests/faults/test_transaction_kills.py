"""Consume-transform-produce in transactions survives kill -9 at random points: B == A."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import spawn, wait_until

WORKER = str(Path(__file__).with_name("tx_worker.py"))
N = 3000
KILLS = 8


def read_log(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().splitlines() if line]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_transformer_killed_many_times_yields_b_equal_a(tmp_path, mesh_name):
    env = {**os.environ, "ZMESH_TEST_MESH": mesh_name}
    addr = tmp_path / "source.addr"
    sink_log = tmp_path / "sink.log"
    procs: list[subprocess.Popen] = []

    def start(role: str, *extra: str) -> subprocess.Popen:
        if role == "source":
            args = [WORKER, role, str(tmp_path / role), str(addr), *extra]
        else:
            args = [WORKER, role, str(tmp_path / role), str(sink_log), str(addr)]
        p = spawn(args, env=env)
        procs.append(p)
        return p

    rng = random.Random(20261121)
    kills = 0
    try:
        source = start("source", str(N))
        wait_until(addr.exists, 20, what="the source's address")
        sink = start("sink")
        xf = start("transformer")
        while kills < KILLS:
            # Let it work for a random while, then kill it mid-stream.
            target = len(read_log(sink_log)) + rng.randint(50, 300)
            wait_until(
                lambda t=target: len(read_log(sink_log)) >= t or len(read_log(sink_log)) >= N,
                60,
                what="transform progress",
            )
            if len(read_log(sink_log)) >= N:
                break
            os.kill(xf.pid, signal.SIGKILL)
            xf.wait(10)
            kills += 1
            xf = start("transformer")
        wait_until(lambda: len(read_log(sink_log)) >= N, 120, what="all of A in B")
        # Count only once nothing more can reach B: every message of A acked (the source
        # exits), every message of B acked (the transformer's outbox drained), and the sink
        # stopped. A late duplicate (a redelivery after an ack timeout) is then in the log.
        for proc in (source, xf, sink):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(150) == 0, f"{proc.args[2]} did not stop cleanly"
        got = Counter(read_log(sink_log))
        lost = N - len(got)
        dups = sum(c - 1 for c in got.values())
        print(f"\ntransaction kill test: messages={N} kills={kills} lost={lost} duplicates={dups}")
        assert kills >= 3, "the stream ended before the transformer was killed enough"
        assert set(got) == set(range(N)), f"{lost} messages of A missing from B"
        assert dups == 0, f"{dups} duplicates in B"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
