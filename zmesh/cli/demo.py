"""``zmesh demo``: a producer and two consumer groups on loopback, one consumer crashed on
purpose, and proof that every message reached every group.

The node processes are ``python -m zmesh.cli.demo_worker`` children (see demo_worker.py).
They find each other over mDNS bound to 127.0.0.1, with the producer's control address as
a static seed so the demo does not depend on multicast. Everything lives in one temporary
dir, removed at the end; every child is stopped by pid in a ``finally``, Ctrl-C included.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import check_name
from ..errors import ConfigError
from .demo_fleet import Fleet
from .demo_report import DemoResult, read_group, result_notes, result_table
from .output import CliError, console
from .settings import Number

STARTUP_TIMEOUT_S = 30.0
STOP_GRACE_S = 20.0
IDLE_KILL_S = 10.0  # the producer paused and the victim never reached its crash point


def parse_consumers(spec: str) -> dict[str, int]:
    """``"workers:2,audit:1"`` -> {"workers": 2, "audit": 1}."""
    groups: dict[str, int] = {}
    for part in spec.split(","):
        group, sep, count = part.strip().partition(":")
        try:
            check_name("group", group)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--consumers") from exc
        if not sep or not count.isdigit() or not 1 <= int(count) <= 8 or group in groups:
            raise click.BadParameter(
                f"{part!r}: use GROUP:N with N in 1..8, each group once", param_hint="--consumers"
            )
        groups[group] = int(count)
    if sum(groups.values()) > 12:
        raise click.BadParameter("at most 12 consumers", param_hint="--consumers")
    return groups


class Demo:
    """One run: start the fleet, publish, crash a consumer, wait, report."""

    def __init__(
        self,
        root: Path,
        messages: int,
        groups: dict[str, int],
        kill: bool,
        timeout_s: float,
        log_level: str,
    ) -> None:
        self.root = root
        self.messages = messages
        self.groups = groups
        self.timeout_s = timeout_s
        self.mesh = f"demo-{uuid.uuid4().hex[:10]}"
        self.fleet = Fleet(root, log_level)
        self.members = [(f"{g}-{i}", g) for g, n in groups.items() for i in range(1, n + 1)]
        # The victim: a member of a shared group with company, so its partitions move.
        crowded = [g for g, n in groups.items() if n > 1] or list(groups)
        self.victim = f"{crowded[0]}-{groups[crowded[0]]}" if kill else None
        # The producer holds back the second half until the victim crashed and restarted;
        # the victim crashes a third of the way into its expected share of the first half.
        self.pause_at = messages // 2 if kill else 0
        self.crash_after = max(1, self.pause_at // groups[crowded[0]] // 3)
        self.crash = "none (--no-kill)" if not kill else "not reached"
        self.crashed = False
        self.paused_at: float | None = None
        self.done: dict[str, Any] | None = None
        self.seed = ""

    def consumer_args(self, name: str, group: str, crash_after: int) -> list[str]:
        return [
            "consumer",
            "--mesh",
            self.mesh,
            "--data-dir",
            str(self.root / name),
            "--name",
            name,
            "--group",
            group,
            "--seed",
            self.seed,
            "--records",
            str(self.root / f"{name}.records"),
            "--crash-after",
            str(crash_after),
        ]

    def _next(self, deadline: float, what: str) -> tuple[str, dict[str, Any]]:
        """The next event of a worker; ("", {}) after half a second without one."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CliError(f"demo timed out waiting for {what}")
        try:
            name, pid, event = self.fleet.events.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            return "", {}
        kind = event.get("event")
        if kind == "error":
            raise CliError(f"{name}: {event.get('message')}\n{self.fleet.tail(name)}")
        if kind == "exit" and not self.fleet.is_expected(name, pid):
            raise CliError(f"{name} exited unexpectedly\n{self.fleet.tail(name)}")
        return name, event

    def run(self) -> DemoResult:
        fleet = self.fleet
        fleet.start(
            "producer",
            [
                "producer",
                "--mesh",
                self.mesh,
                "--data-dir",
                str(self.root / "producer"),
                "--groups",
                ",".join(f"{g}:{n}" for g, n in self.groups.items()),
                "--messages",
                str(self.messages),
                "--pause-at",
                str(self.pause_at),
                "--join-timeout",
                str(STARTUP_TIMEOUT_S),
                "--timeout",
                str(self.timeout_s),
            ],
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.seed:
            name, event = self._next(deadline, "the producer to start")
            if name == "producer" and event["event"] == "up":
                self.seed = event["control"]
        console.print(
            f"mesh [bold]{self.mesh}[/] on 127.0.0.1: producer at {self.seed}; "
            f"groups {', '.join(f'{g} x{n}' for g, n in self.groups.items())}"
        )
        for name, group in self.members:
            fleet.start(
                name,
                self.consumer_args(name, group, self.crash_after if name == self.victim else 0),
            )
        self._watch()
        fleet.stop([n for n, _ in self.members], STOP_GRACE_S)
        return self._result()

    def _watch(self) -> None:
        columns = (
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        total_members = len(self.members)
        deadline = time.monotonic() + 2 * STARTUP_TIMEOUT_S + self.timeout_s
        with Progress(*columns, console=console) as progress:
            joined = progress.add_task("consumers joined", total=total_members)
            published = progress.add_task("published", total=self.messages)
            acked = progress.add_task("acked by every group", total=self.messages)
            while self.done is None:
                name, event = self._next(deadline, "every message to be acked")
                kind = event.get("event")
                if (
                    self.paused_at is not None
                    and not self.crashed
                    and time.monotonic() - self.paused_at > IDLE_KILL_S
                ):
                    self._crash({"handled": 0, "unacked": 0, "idle": True}, progress)
                if name == "producer" and kind == "paused":
                    self.paused_at = time.monotonic()
                elif name == "producer" and kind == "joining":
                    progress.update(
                        joined, completed=min(total_members, sum(event["members"].values()))
                    )
                elif name == "producer" and kind == "progress":
                    progress.update(joined, completed=total_members)
                    progress.update(published, completed=event["published"])
                    progress.update(acked, completed=event["acked"])
                elif name == "producer" and kind in ("done", "timeout"):
                    progress.update(published, completed=event["published"])
                    progress.update(acked, completed=event["acked"])
                    self.done = event
                elif name == self.victim and kind == "crash-point" and not self.crashed:
                    self._crash(event, progress)

    def _crash(self, event: dict[str, Any], progress: Progress) -> None:
        """Kill the victim as a crash would, restart it on its data dir, resume publishing."""
        assert self.victim is not None
        self.crashed = True
        self.fleet.kill(self.victim)
        group = self.victim.rsplit("-", 1)[0]
        if event.get("idle"):
            self.crash = (
                f"{self.victim} killed (SIGKILL) while idle (no messages came its "
                "way); restarted on its data dir"
            )
        else:
            self.crash = (
                f"{self.victim} killed (SIGKILL) with {event['unacked']} messages "
                f"handled but not acked; restarted on its data dir"
            )
        progress.console.print(
            f"[yellow]crash:[/] {self.victim} killed with SIGKILL after "
            f"handling {event['handled']} messages "
            f"({event['unacked']} not yet acked); restarting it"
        )
        self.fleet.start(self.victim, self.consumer_args(self.victim, group, 0))
        self.fleet.send("producer", "go")

    def _result(self) -> DemoResult:
        assert self.done is not None
        groups = [
            read_group(
                g, n, [self.root / f"{g}-{i}.records" for i in range(1, n + 1)], self.messages
            )
            for g, n in self.groups.items()
        ]
        completed = self.done["event"] == "done"
        elapsed = self.done["finished"] - self.done["started"] if completed else None
        return DemoResult(
            self.messages,
            groups,
            completed,
            self.done["acked"],
            elapsed,
            self.done["counters"],
            self.crash,
        )


@click.command(short_help="Local demo: producer, two groups, a crashed consumer, no loss.")
@click.option(
    "--messages",
    type=click.IntRange(min=1, max=5_000_000),
    default=20000,
    show_default=True,
    help="How many messages the producer publishes.",
)
@click.option(
    "--consumers",
    default="workers:2,audit:1",
    show_default=True,
    help="Consumer groups and members per group, as GROUP:N,...",
)
@click.option(
    "--kill/--no-kill",
    default=True,
    show_default=True,
    help="Crash a consumer with SIGKILL mid-run and restart it.",
)
@click.option(
    "--timeout",
    type=Number(min=1),
    default=120.0,
    show_default=True,
    help="Seconds allowed for every message to be acked once published.",
)
@click.option(
    "--keep",
    is_flag=True,
    hidden=True,
    help="Keep the temporary dir (data dirs, records, logs) for debugging.",
)
@click.pass_context
def demo(
    ctx: click.Context, messages: int, consumers: str, kill: bool, timeout: float, keep: bool
) -> None:
    """Run a producer and consumer groups on loopback, crash one consumer, count losses.

    Exits 0 only when every message reached every group (lost == 0).
    """
    groups = parse_consumers(consumers)
    log_level = (ctx.find_root().obj or {}).get("log_level", "WARNING")
    root = Path(tempfile.mkdtemp(prefix="zmesh-demo-"))
    run = Demo(root, messages, groups, kill, timeout, log_level)
    finished = False
    try:
        result = run.run()
        finished = True
        console.print(result_table(result))
        for line in result_notes(result):
            console.print(line, style="dim")
    finally:
        run.fleet.close(STOP_GRACE_S if finished else 5.0)
        if keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if not result.completed:
        raise CliError(
            f"only {result.acked:,} of {messages:,} messages were acked by every "
            f"group within {timeout:g}s of publishing"
        )
    lost = result.lost_total
    if lost:
        per_group = ", ".join(f"{g.group} {result.lost(g)}" for g in result.groups)
        raise CliError(f"lost {lost} messages ({per_group}): at-least-once delivery failed")
    console.print(
        f"[bold green]lost 0[/]: all {messages:,} messages reached every group "
        f"({', '.join(groups)})"
    )
