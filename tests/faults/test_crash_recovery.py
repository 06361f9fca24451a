"""Crash recovery across real processes: kill -9 a consumer, then the producer, mid-stream.

One producer publishes N indexed messages to a topic with two shared groups (g1: c1 and
c2; g2: c3). Mid-run c1 is SIGKILLed and restarted on its data dir, then the producer is
SIGKILLed and restarted on its own, resuming from its last recorded index. Every index
must reach each group (consumers log before they ack); duplicates are counted, printed,
and bounded by what the configuration allows (CHECKPOINT, the consumers' MAX_IN_FLIGHT).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import spawn, wait_until
from tests.faults.crash_worker import MAX_IN_FLIGHT
from tests.waiting import until

N = 100_000
WORKER = str(Path(__file__).with_name("crash_worker.py"))
CONSUMERS = {"c1": "g1", "c2": "g1", "c3": "g2"}
GROUP_MEMBERS = {"g1": ("c1", "c2"), "g2": ("c3",)}
KILL_C1_AT = N // 5  # g1 has logged this many messages
KILL_PRODUCER_AT = N // 2  # the producer has recorded this index as stored
# The producer waits at this index until the restarted c1 is a member of g1 again: with
# a fast failure detector the rest of the stream could otherwise go to c2 before c1 is back.
HOLD_AT = 3 * N // 10
KILL_PRODUCER_LAG = 2000  # ... and g2 has handled this many more messages since
START_TIMEOUT_S = 20.0
# The phases wait on the stream's progress, not on a clock: a wait fails once nothing new
# was handled or recorded stored for STALL_S (a restart and its discovery take seconds, not
# tens of them), and the whole run fails past RUN_CAP_S (a run takes seconds), below the
# per-test timeout so that the failure says which wait it was.
STALL_S = 30.0
RUN_CAP_S = 270.0
POLL_S = 0.02
LOGGED_TIMEOUT_S = 10.0
EXIT_TIMEOUT_S = 15.0
# Duplicates have two causes, each bounded by the configuration: indexes the restarted
# producer publishes again (stored after its last progress record: at most a checkpoint
# and a batch), and messages a kill leaves handled but not known acked at the producer,
# which go to a member again (at most each member's window: c1's when c1 dies, every
# member's of the group when the producer dies).
CHECKPOINT = 1000  # the producer records its progress every this many messages


class ConsumerLog:
    """Lines ``index seq attempt`` of one consumer's log, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[tuple[int, int, int]] = []
        self._offset = 0
        self._tail = b""

    def poll(self) -> int:
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
            self._offset += len(data)
            lines = (self._tail + data).split(b"\n")
            self._tail = lines.pop()  # incomplete until its newline arrives
            for line in lines:
                index, seq, attempt = line.split()
                self.entries.append((int(index), int(seq), int(attempt)))
        return len(self.entries)


class Cluster:
    """The child processes of the test, their outputs and their files."""

    def __init__(self, root: Path, batch: int) -> None:
        self.root = root
        self.batch = batch
        self.mesh = f"crash-{uuid.uuid4().hex[:12]}"
        self.addr_dir = root / "addr"
        self.addr_dir.mkdir()
        self.progress = root / "progress"
        self.procs: dict[str, subprocess.Popen] = {}
        self.history: list[tuple[str, subprocess.Popen, Path]] = []
        self.logs = {name: ConsumerLog(root / f"{name}.log") for name in CONSUMERS}
        self.deadline = time.monotonic() + RUN_CAP_S

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        out = self.root / f"{name}.{sum(1 for h in self.history if h[0] == name)}.out"
        with open(out, "wb") as f:
            proc = spawn(
                [
                    WORKER,
                    *args,
                    "--mesh",
                    self.mesh,
                    "--data-dir",
                    str(self.root / f"data-{name}"),
                    "--addr-dir",
                    str(self.addr_dir),
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        self.history.append((name, proc, out))
        return proc

    def start_producer(self) -> subprocess.Popen:
        return self._spawn(
            "producer",
            [
                "producer",
                "--progress",
                str(self.progress),
                "--count",
                str(N),
                "--batch",
                str(self.batch),
                "--checkpoint",
                str(CHECKPOINT),
                "--hold-at",
                str(HOLD_AT),
                "--resume",
                str(self.root / "resume"),
                "--members",
                ",".join(f"{g}={n}" for g, n in Counter(CONSUMERS.values()).items()),
            ],
        )

    def start_consumer(self, name: str) -> subprocess.Popen:
        return self._spawn(
            name,
            [
                "consumer",
                "--name",
                name,
                "--group",
                CONSUMERS[name],
                "--log",
                str(self.root / f"{name}.log"),
            ],
        )

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} exited (rc {proc.returncode}) before its kill"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_TIMEOUT_S)

    def check_running(self, *names: str) -> None:
        for name in names:
            rc = self.procs[name].poll()
            if rc is not None:
                pytest.fail(f"{name} exited with {rc} unexpectedly\n{self.outputs()}")

    def progress_index(self) -> int:
        if not self.progress.exists():
            return -1
        done = [int(x) for x in self.progress.read_text().split("\n")[:-1] if x.isdigit()]
        return max(done, default=-1)

    def indexes(self, group: str) -> set[int]:
        return {e[0] for name in GROUP_MEMBERS[group] for e in self.logs[name].entries}

    def poll_logs(self) -> None:
        for log in self.logs.values():
            log.poll()

    def wait_progressing(self, done: Callable[[], object], what: str) -> None:
        """Wait until ``done()``; fail if the stream stalls (no message handled by any
        consumer and no new index recorded stored for STALL_S) or the run passes its cap."""
        mark: tuple[int, int] | None = None
        moved_at = time.monotonic()

        def done_or_moving() -> bool:
            nonlocal mark, moved_at
            if done():
                return True
            self.poll_logs()
            seen = (self.progress_index(), sum(len(log.entries) for log in self.logs.values()))
            if seen != mark:
                mark, moved_at = seen, time.monotonic()
            elif time.monotonic() - moved_at > STALL_S:
                pytest.fail(
                    f"no progress for {STALL_S:g}s (index {seen[0]} recorded stored, "
                    f"{seen[1]} handled) waiting for {what}"
                )
            return False

        if not until(done_or_moving, self.deadline - time.monotonic(), POLL_S):
            pytest.fail(f"the run passed its {RUN_CAP_S:g}s cap waiting for {what}")

    def outputs(self) -> str:
        parts = []
        for _name, proc, out in self.history:
            text = out.read_text(errors="replace") if out.exists() else ""
            parts.append(f"--- {out.name} (pid {proc.pid}, rc {proc.poll()}) ---\n{text[-4000:]}")
        return "\n".join(parts)

    def stop_all(self) -> None:
        """SIGTERM live children, SIGKILL those that do not exit; by pid, always."""
        for _name, proc, _out in self.history:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for _name, proc, _out in self.history:
            try:
                proc.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(EXIT_TIMEOUT_S)


def _group_report(cluster: Cluster, group: str) -> dict[str, int]:
    entries = [(name, e) for name in GROUP_MEMBERS[group] for e in cluster.logs[name].entries]
    per_index = Counter(e[0] for _n, e in entries)
    per_msg = Counter(e[1] for _n, e in entries)
    seqs_of_index: dict[int, set[int]] = {}
    for _n, (index, seq, _a) in entries:
        seqs_of_index.setdefault(index, set()).add(seq)
    handlers_of_msg: dict[int, set[str]] = {}
    for name, (_i, seq, _a) in entries:
        handlers_of_msg.setdefault(seq, set()).add(name)
    redelivered = {seq for seq, c in per_msg.items() if c > 1}
    top_seq = max(per_msg, default=0)
    return {
        "deliveries": len(entries),
        "lost": len(set(range(N)) - per_index.keys()),
        "unexpected": len(per_index.keys() - set(range(N))),
        # Sequences are allocated in order and committed in order by one publishing thread,
        # and a restarted producer resumes right after the highest stored one, so the stored
        # messages are exactly seqs 1..top: a gap is a stored message that never arrived
        # (one stored after the last progress record, which the index check cannot see).
        "stored_messages": top_seq,
        "stored_not_delivered": len(set(range(1, top_seq + 1)) - per_msg.keys()),
        # every handling beyond the first of an index, whatever the cause
        "duplicate_deliveries": len(entries) - len(per_index),
        "indexes_handled_twice_or_more": sum(1 for c in per_index.values() if c > 1),
        # the same message id (producer, seq) handed to a handler again
        "redeliveries_same_message": sum(per_msg[s] - 1 for s in redelivered),
        "redelivered_to_same_member": sum(1 for s in redelivered if len(handlers_of_msg[s]) == 1),
        "redelivered_across_members": sum(1 for s in redelivered if len(handlers_of_msg[s]) > 1),
        # an index published again under a new id by the restarted producer
        "republished_indexes": sum(1 for seqs in seqs_of_index.values() if len(seqs) > 1),
    }


def _summary(cluster: Cluster, kills: list[str], t0: float) -> dict[str, dict[str, int]]:
    """Print the run's figures; returns each group's report."""
    cluster.poll_logs()
    reports = {g: _group_report(cluster, g) for g in GROUP_MEMBERS}
    print(
        f"\ncrash recovery: {N} messages, groups g1 (c1, c2) and g2 (c3), "
        f"{time.monotonic() - t0:.1f}s"
    )
    for kill in kills:
        print(f"  killed {kill}")
    for name, log in cluster.logs.items():
        print(f"  {name}: {len(log.entries)} messages handled")
    for group, rep in reports.items():
        print(f"  {group}: " + ", ".join(f"{k}={v}" for k, v in rep.items()))
    return reports


@pytest.mark.slow
@pytest.mark.timeout(RUN_CAP_S + 30)
@pytest.mark.parametrize("batch", [1, 100], ids=["publish", "publish_many"])
def test_kill9_consumer_then_producer_loses_nothing(
    tmp_path: Path, record_summary: Callable[[str], None], batch: int
) -> None:
    # publish_many of 100: the outbox holds the batches as runs (one record each)
    t0 = time.monotonic()
    cluster = Cluster(tmp_path, batch)
    kills: list[str] = []
    try:
        cluster.start_producer()

        def producer_up() -> bool:
            cluster.check_running("producer")
            return (cluster.addr_dir / "producer.addr").exists()

        wait_until(producer_up, START_TIMEOUT_S, what="the producer's control address")
        for name in CONSUMERS:
            cluster.start_consumer(name)

        # Phase 1: the stream runs; kill -9 c1 while g1 is busy, restart it at once.
        def c1_busy() -> bool:
            cluster.check_running("producer", *CONSUMERS)
            cluster.poll_logs()
            c1, c2 = (len(cluster.logs[n].entries) for n in ("c1", "c2"))
            return c1 >= 1000 and c1 + c2 >= KILL_C1_AT

        cluster.wait_progressing(c1_busy, f"g1 to handle {KILL_C1_AT} messages")
        cluster.kill9("c1")
        c1_lines_at_kill = cluster.logs["c1"].poll()
        progress_at_c1_kill = cluster.progress_index()
        kills.append(
            f"c1 (SIGKILL after {c1_lines_at_kill} handled; producer at index "
            f"{progress_at_c1_kill})"
        )
        cluster.start_consumer("c1")
        (cluster.root / "resume").write_text("c1 2\n")  # (its second life)

        # Phase 2: the restarted c1 handles messages again; kill -9 the producer mid-publish.
        def producer_half_way() -> bool:
            cluster.check_running("producer", *CONSUMERS)
            cluster.poll_logs()
            return (
                len(cluster.logs["c1"].entries) > c1_lines_at_kill
                and cluster.progress_index() >= KILL_PRODUCER_AT
            )

        cluster.wait_progressing(
            producer_half_way,
            f"restarted c1 handling and the producer past index {KILL_PRODUCER_AT}",
        )
        # Not right at a checkpoint: let the stream move on, so that the kill lands at an
        # arbitrary point between two progress records (stored, unrecorded publishes are
        # then published again by the restarted producer).
        c3_mark = len(cluster.logs["c3"].entries) + KILL_PRODUCER_LAG

        def stream_moved_on() -> bool:
            cluster.check_running("producer", *CONSUMERS)
            cluster.poll_logs()
            return len(cluster.logs["c3"].entries) >= c3_mark

        cluster.wait_progressing(stream_moved_on, f"c3 to handle {c3_mark} messages")
        cluster.kill9("producer")
        progress_at_kill = cluster.progress_index()
        assert progress_at_kill < N - 1, (
            "the producer had finished publishing before its kill: the test did not crash "
            "it mid-run"
        )
        cluster.poll_logs()
        kills.append(
            f"producer (SIGKILL with index {progress_at_kill} recorded stored; "
            "consumers had handled "
            + ", ".join(f"{n}={len(log.entries)}" for n, log in cluster.logs.items())
            + ")"
        )
        cluster.start_producer()

        # Phase 3: the restarted producer resumes, drains its outbox and exits 0.
        def producer_done() -> bool:
            cluster.check_running(*CONSUMERS)
            cluster.poll_logs()
            return cluster.procs["producer"].poll() is not None

        cluster.wait_progressing(
            producer_done, "the restarted producer to drain its outbox and exit"
        )
        rc = cluster.procs["producer"].returncode
        assert rc == 0, f"restarted producer exited with {rc}\n{cluster.outputs()}"

        # Consumers log (fsync'd) before they ack, so an empty outbox means complete logs;
        # on a timeout here the summary printed below says what is missing.
        def all_logged() -> bool:
            cluster.poll_logs()
            return all(len(cluster.indexes(g) & set(range(N))) == N for g in GROUP_MEMBERS)

        wait_until(
            all_logged, LOGGED_TIMEOUT_S, interval=0.1, what="every index in each group's logs"
        )

        for name in CONSUMERS:
            os.kill(cluster.procs[name].pid, signal.SIGTERM)
        for name in CONSUMERS:
            rc = cluster.procs[name].wait(EXIT_TIMEOUT_S)
            assert rc == 0, f"{name} did not exit cleanly on SIGTERM (rc {rc})"
        reports = _summary(cluster, kills, t0)
        record_summary(f"{N} messages ({batch} per publish), kills: {'; '.join(kills)}")
        for group, rep in reports.items():
            record_summary(
                f"  {group}: lost={rep['lost']} duplicate_deliveries={rep['duplicate_deliveries']}"
            )
        for group, rep in reports.items():
            assert rep["lost"] == 0, f"{group} lost {rep['lost']} messages"
            assert rep["unexpected"] == 0, f"{group} got indexes outside 0..{N - 1}"
            assert rep["stored_not_delivered"] == 0, (
                f"{group} never got {rep['stored_not_delivered']} of the producer's stored "
                f"sequences 1..{rep['stored_messages']}"
            )
            assert rep["republished_indexes"] <= CHECKPOINT + batch, (
                f"{group}: {rep['republished_indexes']} indexes published again"
            )
            windows = (1 + len(GROUP_MEMBERS[group])) * MAX_IN_FLIGHT
            assert rep["redeliveries_same_message"] <= windows, (
                f"{group}: {rep['redeliveries_same_message']} messages delivered again, "
                f"more than the windows a kill can leave unacked ({windows})"
            )
    except BaseException:
        print(cluster.outputs(), file=sys.stderr)
        try:
            _summary(cluster, kills, t0)
        except Exception as exc:  # the figures are a courtesy here; keep the real error
            print(f"no summary: {exc!r}", file=sys.stderr)
        raise
    finally:
        cluster.stop_all()
