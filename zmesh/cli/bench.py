"""``zmesh bench``: a quick throughput and latency run of this installation.

A producer and a consumer node run as two ``python -m zmesh.cli.bench_worker`` processes
on 127.0.0.1 (mDNS off, the consumer's control address as the producer's seed). The full
comparison against raw ZeroMQ lives in the source checkout: ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from .output import CliError, console, err_console
from .settings import Number

STARTUP_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
TAIL_LINES = 10


class Worker:
    """One bench process; its JSON lines become events on a shared queue."""

    def __init__(
        self,
        role: str,
        args: list[str],
        root: Path,
        events: queue.Queue[tuple[str, dict[str, Any]]],
        env: dict[str, str],
    ) -> None:
        self.role = role
        self.log = root / f"{role}.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "zmesh.cli.bench_worker", role, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )  # Ctrl-C reaches bench, which stops the workers
        threading.Thread(
            target=self._read, args=(events,), daemon=True, name=f"bench-read-{role}"
        ).start()

    def _read(self, events: queue.Queue[tuple[str, dict[str, Any]]]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                events.put((self.role, json.loads(line)))
            except ValueError:
                continue
        events.put((self.role, {"event": "exit"}))

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-TAIL_LINES:])

    def stop(self) -> None:
        """Ask it to stop, then kill it by pid if it does not."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_GRACE_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Run:
    """The two workers and the events they send, with deadlines."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.workers: dict[str, Worker] = {}
        self.backlog: list[tuple[str, dict[str, Any]]] = []
        self.finished: set[str] = set()  # roles whose exit is expected now
        pkg_root = str(Path(__file__).resolve().parents[2])
        self.env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            PYTHONPATH=pkg_root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )

    def start(self, role: str, args: list[str]) -> None:
        self.workers[role] = Worker(role, args, self.root, self.events, self.env)

    def _fail(self, role: str, message: str) -> CliError:
        tail = self.workers[role].tail() if role in self.workers else ""
        return CliError(f"bench {role}: {message}" + (f"\n{tail}" if tail else ""))

    def expect(
        self,
        role: str,
        event: str,
        timeout: float,
        on_progress: Any = None,
    ) -> dict[str, Any]:
        """The next ``event`` of ``role``; progress events go to ``on_progress``, other
        events wait in a backlog for their own ``expect``."""
        for i, (who, ev) in enumerate(self.backlog):
            if who == role and ev.get("event") == event:
                del self.backlog[i]
                return ev
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(role, f"no {event!r} within {timeout:.0f}s")
            try:
                who, ev = self.events.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            kind = ev.get("event")
            if kind == "error":
                raise self._fail(who, str(ev.get("message")))
            if kind == "exit" and who not in self.finished:
                code = self.workers[who].proc.wait(timeout=STOP_GRACE_S)
                raise self._fail(who, f"exited ({code}) before {event!r}")
            if who == role and kind == event:
                return ev
            if kind == "progress":
                if on_progress is not None:
                    on_progress(who, ev)
            elif kind != "exit":
                self.backlog.append((who, ev))

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()


def _table(
    messages: int, size: int, durability: str, thr: dict[str, Any], res: dict[str, Any], rate: float
) -> Table:
    table = Table(
        title="zmesh bench: producer -> consumer, two processes on 127.0.0.1", title_justify="left"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("payload", f"{size} bytes, {durability} durability")
    table.add_row("API", "one publish() and one ack() each")
    seconds = float(thr["seconds"])
    table.add_row("messages (acked end to end)", f"{messages:,}")
    table.add_row("seconds", f"{seconds:.2f}")
    table.add_row("throughput msgs/s", f"{messages / seconds:,.0f}")
    table.add_row(f"latency p50 ms (at {rate:,.0f} msgs/s)", f"{res['p50_ms']:.3f}")
    table.add_row(f"latency p99 ms (at {rate:,.0f} msgs/s)", f"{res['p99_ms']:.3f}")
    table.add_row("latency max ms", f"{res['max_ms']:.3f}")
    table.add_row("latency samples", f"{res['samples']:,}")
    table.add_row("duplicates seen by the consumer", f"{res['duplicates']:,}")
    return table


def suite_root() -> Path | None:
    """The source checkout holding ``benchmarks/``: the working directory or the one this
    zmesh was installed from (an editable install)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "benchmarks" / "__main__.py").is_file() and (root / "zmesh").is_dir():
            return root
    return None


def run_suite(args: tuple[str, ...]) -> None:
    """``python -m benchmarks ARGS`` in the source checkout: zmesh against raw pyzmq."""
    root = suite_root()
    if root is None:
        raise CliError(
            "--suite runs the benchmark suite of a source checkout (benchmarks/ "
            "beside zmesh/); run it there, or from an editable install "
            "(pip install -e .)"
        )
    # Run from the caller's directory (its relative --json, --results-dir and --profile
    # paths are its own), with the checkout on the path.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    code = subprocess.call([sys.executable, "-m", "benchmarks", *args], env=env)
    if code:
        raise click.exceptions.Exit(code)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--suite",
    is_flag=True,
    help="Run the full benchmark suite instead (zmesh against raw pyzmq, every "
    "durability, batch API, latency, fan-out, backlog, restart); arguments "
    "after it go to `python -m benchmarks`, e.g. --quick or --only NAME.",
)
@click.argument("suite_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--messages",
    type=click.IntRange(min=1),
    default=20_000,
    show_default=True,
    help="Messages of the throughput run.",
)
@click.option(
    "--size",
    type=click.IntRange(min=9, max=1 << 20),
    default=100,
    show_default=True,
    help="Payload bytes.",
)
@click.option(
    "--durability",
    type=click.Choice(["process", "fsync", "memory"]),
    default="process",
    show_default=True,
    help="The topic's durability.",
)
@click.option(
    "--latency-messages",
    type=click.IntRange(min=1),
    help="Messages of the paced latency run (default: min(1000, --messages)).",
)
@click.option(
    "--rate",
    type=Number(min=1),
    default=1000.0,
    show_default=True,
    help="Messages per second of the latency run.",
)
@click.option(
    "--timeout",
    type=Number(min=1),
    default=300.0,
    show_default=True,
    help="Seconds before the run is abandoned.",
)
def bench(
    suite: bool,
    suite_args: tuple[str, ...],
    messages: int,
    size: int,
    durability: str,
    latency_messages: int | None,
    rate: float,
    timeout: float,
) -> None:
    """Measure this installation: msgs/s with a publish and an ack per message, then
    p50/p99 end-to-end latency at a paced rate; two node processes on 127.0.0.1.

    The full comparison against raw ZeroMQ is `zmesh bench --suite` (`python -m benchmarks`
    in a source checkout).
    """
    if suite:
        run_suite(suite_args)
        return
    if suite_args:
        raise click.UsageError(
            f"unexpected arguments {' '.join(suite_args)!r} (they go to "
            "the benchmark suite only with --suite)"
        )
    latency = latency_messages or min(1000, messages)
    warmup = min(200, messages)
    root = Path(tempfile.mkdtemp(prefix="zmesh-bench-"))
    mesh = f"bench-{uuid.uuid4().hex[:10]}"
    common = [
        "--mesh",
        mesh,
        "--messages",
        str(messages),
        "--latency-messages",
        str(latency),
        "--size",
        str(size),
        "--max-seconds",
        str(timeout),
    ]
    run = Run(root)
    deadline = time.monotonic() + timeout
    try:
        run.start("consumer", [*common, "--data-dir", str(root / "consumer")])
        control = run.expect("consumer", "up", STARTUP_TIMEOUT_S)["control"]
        run.start(
            "producer",
            [
                *common,
                "--data-dir",
                str(root / "producer"),
                "--seed",
                control,
                "--warmup",
                str(warmup),
                "--rate",
                str(rate),
                "--durability",
                durability,
            ],
        )
        run.expect("producer", "ready", STARTUP_TIMEOUT_S)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err_console,
            transient=True,
        ) as progress:
            tasks = {
                "throughput": progress.add_task("throughput: acked", total=messages),
                "latency": progress.add_task("latency: acked", total=latency),
            }

            def show(_who: str, ev: dict[str, Any]) -> None:
                task = tasks.get(str(ev.get("phase")))
                if task is not None and "acked" in ev:
                    progress.update(task, completed=int(ev["acked"]))

            left = max(1.0, deadline - time.monotonic())
            thr = run.expect("producer", "throughput", left, show)
            run.expect("producer", "done", max(1.0, deadline - time.monotonic()), show)
            run.finished.add("producer")
        res = run.expect("consumer", "result", max(1.0, deadline - time.monotonic()))
    finally:
        run.close()
        shutil.rmtree(root, ignore_errors=True)
    console.print(_table(messages, size, durability, thr, res, rate))
    click.echo(
        f"{messages / float(thr['seconds']):,.0f} msgs/s; latency p50 "
        f"{res['p50_ms']:.3f} ms, p99 {res['p99_ms']:.3f} ms"
    )
    click.echo(
        "A quick local run, not a benchmark suite: the full comparison against raw "
        "ZeroMQ (PUSH/PULL, DEALER/ROUTER with acks, LMDB) is `zmesh bench --suite` "
        "in a source checkout (make bench; see docs/performance.md)."
    )
