"""Node processes on namespace hosts, their files, and the checker of a message stream.

A ``Cluster`` places one producer and some consumers (each a member of one group) on the
hosts of a ``HostNet``, starts, kills and stops them, reads what they write (their info and
status files, the producer's progress, the consumers' logs) and, at the end, checks that
every index of the stream reached every group and counts the duplicates.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_until

from .hosts import Host, HostNet
from .node_worker import node_args

WORKER = str(Path(__file__).with_name("node_worker.py"))
PRODUCER = "producer"
START_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 15.0


class ConsumerLog:
    """Lines ``index seq attempt partition incarnation`` of one consumer, read as they grow."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[tuple[int, int, int, int, int]] = []
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
                index, seq, attempt, partition, incarnation = (int(x) for x in line.split())
                self.entries.append((index, seq, attempt, partition, incarnation))
        return len(self.entries)


@dataclass(frozen=True)
class Figures:
    """What a run did and what the checker found."""

    test: str
    hosts: int
    messages: int
    kills: int
    partitions: int
    duplicates: int
    lost: int
    seconds: float

    def line(self) -> str:
        return (
            f"netns {self.test}: hosts={self.hosts} messages={self.messages} "
            f"kills={self.kills} partitions={self.partitions} "
            f"duplicates={self.duplicates} lost={self.lost} time={self.seconds:.1f}s"
        )


class Cluster:
    """A producer and consumers on a host network; ``consumers`` maps name -> (host, group).

    With ``hold_last`` the producer stops before its last ``hold_last`` messages until
    ``release()``: a test that needs the stream still running at some point releases it
    only after that point. ``replicas`` maps name -> host of replica nodes (each only
    hosts copies); ``producer_args``, ``consumer_args`` and ``replica_args`` are more
    arguments of each role's worker.
    """

    def __init__(
        self,
        bed: HostNet,
        root: Path,
        *,
        producer_host: Host,
        consumers: dict[str, tuple[Host, str]],
        count: int,
        rate: float,
        hold_last: int = 0,
        replicas: dict[str, Host] | None = None,
        producer_args: tuple[str, ...] = (),
        consumer_args: tuple[str, ...] = (),
        replica_args: tuple[str, ...] = (),
    ) -> None:
        self.bed = bed
        self.root = root
        self.run_dir = root / "run"
        self.run_dir.mkdir()
        self.mesh = f"netns-{uuid.uuid4().hex[:12]}"
        self.producer_host = producer_host
        self.consumers = consumers
        self.groups: dict[str, list[str]] = {}
        for name, (_host, group) in consumers.items():
            self.groups.setdefault(group, []).append(name)
        self.count = count
        self.rate = rate
        self.hold_last = hold_last
        self.replicas = dict(replicas or {})
        self.producer_args, self.consumer_args = list(producer_args), list(consumer_args)
        self.replica_args = list(replica_args)
        self.procs: dict[str, subprocess.Popen] = {}
        self.history: list[tuple[str, subprocess.Popen, Path]] = []
        self.kills: list[str] = []
        self.logs = {name: ConsumerLog(self.run_dir / f"{name}.log") for name in consumers}
        self.t0 = time.monotonic()

    # -- processes ------------------------------------------------------------------------

    def _spawn(self, name: str, host: Host, args: list[str]) -> subprocess.Popen:
        info = self.run_dir / f"{name}.info.json"
        info.unlink(missing_ok=True)  # a restart writes it afresh
        nth = sum(1 for h in self.history if h[0] == name)
        out = self.root / f"{name}.{nth}.out"
        with open(out, "wb") as f:
            proc = self.bed.spawn(
                host,
                [WORKER, *args, *node_args(name, self.mesh, self.root, host.addr, self.run_dir)],
                f,
            )
        self.procs[name] = proc
        self.history.append((name, proc, out))
        return proc

    def start_producer(self) -> subprocess.Popen:
        return self._spawn(
            PRODUCER,
            self.producer_host,
            [
                "producer",
                "--count",
                str(self.count),
                "--rate",
                str(self.rate),
                "--groups",
                ",".join(self.groups),
                "--hold-last",
                str(self.hold_last),
                *self.producer_args,
            ],
        )

    def start_consumer(self, name: str) -> subprocess.Popen:
        host, group = self.consumers[name]
        return self._spawn(name, host, ["consumer", "--group", group, *self.consumer_args])

    def start_replica(self, name: str) -> subprocess.Popen:
        return self._spawn(name, self.replicas[name], ["replica", *self.replica_args])

    def wait_started(self, *names: str) -> None:
        def up() -> bool:
            self.check_running(*names)
            return all(self.info(n) is not None for n in names)

        wait_until(up, START_TIMEOUT_S, what=f"{', '.join(names)} to start")

    def start_all(self) -> None:
        """Start the producer, every consumer and replica node; wait until each has
        written its info."""
        self.start_producer()
        for name in self.consumers:
            self.start_consumer(name)
        for name in self.replicas:
            self.start_replica(name)
        self.wait_started(PRODUCER, *self.consumers, *self.replicas)

    def go(self) -> None:
        """Let the producer's stream begin."""
        (self.run_dir / "go").write_text("go\n")

    def release(self) -> None:
        """Let the producer publish its last ``hold_last`` messages (it waits for this
        before them), so that the stream can end."""
        (self.run_dir / "release").write_text("release\n")

    def kill9(self, name: str, detail: str = "") -> None:
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} exited (rc {proc.returncode}) before its kill"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(EXIT_TIMEOUT_S)
        self.kills.append(f"{name} (SIGKILL{'; ' + detail if detail else ''})")

    def terminate_consumers(self) -> None:
        """SIGTERM every consumer (and replica node still running); each must close
        cleanly and exit 0."""
        names = [*self.consumers, *(r for r in self.replicas if self.procs[r].poll() is None)]
        for name in names:
            os.kill(self.procs[name].pid, signal.SIGTERM)
        for name in names:
            rc = self.procs[name].wait(EXIT_TIMEOUT_S)
            assert rc == 0, f"{name} did not exit cleanly on SIGTERM (rc {rc})"

    def check_running(self, *names: str) -> None:
        for name in names:
            rc = self.procs[name].poll()
            if rc is not None:
                pytest.fail(f"{name} exited with {rc} unexpectedly\n{self.outputs()}")

    def wait_producer_done(self, timeout: float) -> None:
        """The producer published everything, drained its outbox and exited 0."""

        def done() -> bool:
            self.check_running(*self.consumers)
            self.poll_logs()
            return self.procs[PRODUCER].poll() is not None

        wait_until(
            done,
            timeout,
            interval=0.1,
            what="the producer to publish everything, drain its outbox and exit",
        )
        rc = self.procs[PRODUCER].returncode
        assert rc == 0, f"the producer exited with {rc}\n{self.outputs()}"

    def wait_all_logged(self, timeout: float = 10.0) -> None:
        """Consumers log (fsync'd) before they ack, so a drained outbox means complete
        logs; on a timeout the figures printed after it say what is missing."""
        everything = set(range(self.count))

        def logged() -> bool:
            self.poll_logs()
            return all(everything <= self.indexes(g) for g in self.groups)

        wait_until(logged, timeout, interval=0.1, what="every index in each group's logs")

    def outputs(self) -> str:
        parts = []
        for _name, proc, out in self.history:
            text = out.read_text(errors="replace") if out.exists() else ""
            parts.append(f"--- {out.name} (pid {proc.pid}, rc {proc.poll()}) ---\n{text[-4000:]}")
        return "\n".join(parts)

    # -- what the nodes write -----------------------------------------------------------

    def _json(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def info(self, name: str) -> dict | None:
        return self._json(self.run_dir / f"{name}.info.json")

    def status(self, name: str) -> dict | None:
        return self._json(self.run_dir / f"{name}.status.json")

    def node_id(self, name: str) -> str:
        info = self.info(name)
        assert info is not None, f"{name} has not started"
        return info["id"]

    def names_of(self, ids: list[str]) -> set[str]:
        names = {self.node_id(n): n for n in (PRODUCER, *self.consumers, *self.replicas)}
        return {names.get(i, f"?{i[:12]}") for i in ids}

    def lane_members(self, group: str) -> set[str] | None:
        """Members of ``group``'s lane as the producer's latest status lists them."""
        status = self.status(PRODUCER)
        if status is None:
            return None
        for lane in status["lanes"]:
            if lane["lane"] == group:
                return self.names_of(lane["members"])
        return None

    def assigned(self, group: str) -> dict[int, str]:
        """Which member each of the producer's partitions goes to in ``group``, as its
        latest status says (empty before it lists the lane)."""
        status = self.status(PRODUCER)
        for lane in status["lanes"] if status is not None else ():
            if lane["lane"] == group:
                names = {self.node_id(n): n for n in (PRODUCER, *self.consumers)}
                return {
                    p: names.get(member, f"?{member[:12]}")
                    for member, parts in zip(lane["members"], lane["assigned"], strict=True)
                    for p in parts
                }
        return {}

    def wait_members(self, group: str, members: set[str], timeout: float, what: str) -> float:
        """Wait until the producer lists exactly ``members`` in ``group``; the time it took."""
        t = time.monotonic()

        def right() -> bool:
            self.check_running(PRODUCER)
            return self.lane_members(group) == members

        wait_until(right, timeout, interval=0.05, what=what)
        return time.monotonic() - t

    def progress_index(self) -> int:
        path = self.run_dir / "progress"
        if not path.exists():
            return -1
        done = [int(x) for x in path.read_text().split("\n")[:-1] if x.isdigit()]
        return max(done, default=-1)

    def poll_logs(self) -> None:
        for log in self.logs.values():
            log.poll()

    def indexes(self, group: str) -> set[int]:
        return {e[0] for name in self.groups[group] for e in self.logs[name].entries}

    # -- the checker --------------------------------------------------------------------

    def group_report(self, group: str) -> dict[str, int]:
        entries = [e for name in self.groups[group] for e in self.logs[name].entries]
        per_index = Counter(e[0] for e in entries)
        per_msg = Counter(e[1] for e in entries)
        top_seq = max(per_msg, default=0)
        return {
            "deliveries": len(entries),
            "lost": len(set(range(self.count)) - per_index.keys()),
            "unexpected": len(per_index.keys() - set(range(self.count))),
            # Sequences are allocated and committed in order by one publishing thread and a
            # restarted producer resumes right after the highest stored one, so the stored
            # messages are exactly seqs 1..top: a gap is a stored message that never arrived.
            "stored_messages": top_seq,
            "stored_not_delivered": len(set(range(1, top_seq + 1)) - per_msg.keys()),
            # every handling beyond the first of an index, whatever the cause
            "duplicates": len(entries) - len(per_index),
            "redeliveries_same_id": sum(c - 1 for c in per_msg.values() if c > 1),
        }

    def summary(self, test: str) -> tuple[Figures, dict[str, dict[str, int]]]:
        """Print the run's figures and each group's report; return them."""
        self.poll_logs()
        reports = {g: self.group_report(g) for g in self.groups}
        figures = Figures(
            test=test,
            hosts=self.bed.count,
            messages=self.count,
            kills=len(self.kills),
            partitions=self.bed.partitions,
            duplicates=sum(r["duplicates"] for r in reports.values()),
            lost=sum(r["lost"] + r["stored_not_delivered"] for r in reports.values()),
            seconds=time.monotonic() - self.t0,
        )
        print(f"\n{figures.line()}")
        for kill in self.kills:
            print(f"  killed {kill}")
        for name, log in self.logs.items():
            host, group = self.consumers[name]
            print(f"  {name} ({group} on {host.addr}): {len(log.entries)} messages handled")
        for group, rep in reports.items():
            print(f"  {group}: " + ", ".join(f"{k}={v}" for k, v in rep.items()))
        return figures, reports

    def dump_on_failure(self, test: str) -> None:
        """The nodes' outputs and, when they can be made, the figures so far."""
        print(self.outputs(), file=sys.stderr)
        try:
            self.summary(f"{test} (failed)")
        except Exception as exc:  # the figures are a courtesy here; keep the real error
            print(f"no summary: {exc!r}", file=sys.stderr)

    def assert_complete(self, reports: dict[str, dict[str, int]]) -> None:
        for group, rep in reports.items():
            assert rep["lost"] == 0, f"{group} lost {rep['lost']} messages"
            assert rep["unexpected"] == 0, f"{group} got indexes outside 0..{self.count - 1}"
            assert rep["stored_not_delivered"] == 0, (
                f"{group} never got {rep['stored_not_delivered']} of the producer's stored "
                f"sequences 1..{rep['stored_messages']}"
            )
