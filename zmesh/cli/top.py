"""``zmesh top``: a node's status, refreshed live, with rates from counter deltas."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .client import add_curve_options, request_status
from .output import CliError, console, lanes_table, peers_table, subscriptions_table
from .settings import Number, target

# (label, counters summed): every redelivery starts as an ack timeout, a nack, or a member
# that died or left with messages in flight.
RATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("published/s", ("published",)),
    ("sent/s", ("sent",)),
    ("acked/s", ("acked",)),
    ("redelivered/s", ("ack_timeouts", "nacked", "redelivered_member_gone")),
    ("dead-lettered/s", ("dead_lettered",)),
    ("received/s", ("received",)),
    ("acked here/s", ("acked_local",)),
)


@dataclass(slots=True)
class Sample:
    at: float
    counters: dict[str, int]


def _total(counters: dict[str, int], names: tuple[str, ...]) -> int:
    return sum(int(counters.get(n, 0)) for n in names)


def rates_table(now: Sample, before: Sample | None) -> Table:
    table = Table(title="rates (from counter deltas)", title_justify="left")
    table.add_column("rate")
    table.add_column("per second", justify="right")
    table.add_column("total", justify="right")
    dt = now.at - before.at if before is not None else 0.0
    for label, names in RATES:
        total = _total(now.counters, names)
        if before is None or dt <= 0:
            rate = "-"
        else:
            rate = f"{(total - _total(before.counters, names)) / dt:,.1f}"
        table.add_row(label, rate, f"{total:,}")
    return table


def frame(
    address: str,
    status: dict[str, Any],
    now: Sample,
    before: Sample | None,
    error: str | None,
    refreshes: int,
) -> RenderableType:
    node = status.get("node", {})
    peers = status.get("peers", [])
    alive = sum(1 for p in peers if p.get("alive"))
    head = Text.from_markup(
        f"[bold]{escape(str(node.get('name', '?')))}[/] ({escape(str(node.get('id', ''))[:12])})"
        f" mesh {escape(str(node.get('mesh', '?')))} at {escape(address)}: "
        f"outbox {status.get('outbox', 0):,}, peers {alive} alive / {len(peers)}, "
        f"refresh {refreshes} at {time.strftime('%H:%M:%S')}"
    )
    parts: list[RenderableType] = [head]
    if error:
        parts.append(Text(f"last refresh failed: {error}", style="bold red"))
    parts.extend([rates_table(now, before), lanes_table(status)])
    if status.get("subscriptions"):
        parts.append(subscriptions_table(status))
    parts.append(peers_table(status))
    return Group(*parts)


@click.command()
@click.argument("address", metavar="[HOST:PORT]", required=False)
@click.option(
    "--interval",
    type=Number(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    help="Stop after this many refreshes (default: until Ctrl-C).",
)
@click.option(
    "--timeout",
    type=Number(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds to wait for each status reply.",
)
def top(address: str, interval: float, iterations: int | None, timeout: float) -> None:
    """Watch a node: rates (published/s, acked/s, redelivered/s, ...), lanes and peers,
    refreshed every --interval seconds until Ctrl-C or --iterations (off a terminal, each
    refresh is printed after the one before).

    redelivered/s counts ack timeouts, nacks and in-flight messages of members that left.
    Without HOST:PORT: the first seed of ZMESH_SEED or of the context in use.
    """
    address = target(address)
    status = request_status(address, timeout)  # fails before the live display starts
    sample = Sample(time.monotonic(), dict(status.get("counters", {})))
    before: Sample | None = None
    refreshes = 1
    error: str | None = None
    next_at = sample.at + interval
    shown = frame(address, status, sample, None, None, refreshes)
    # A live display draws on a terminal only (elsewhere it prints its last frame when
    # it ends): on a file or a pipe each frame is printed as it is made, for `| grep`.
    live = Live(shown, console=console, auto_refresh=False) if console.is_terminal else None
    try:
        with live or contextlib.nullcontext():
            if live is None:
                console.print(shown)
            while iterations is None or refreshes < iterations:
                wait = next_at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # the refresh period, not a synchronisation
                next_at = time.monotonic() + interval
                try:
                    status = request_status(address, timeout)
                    before, sample = (
                        sample,
                        Sample(time.monotonic(), dict(status.get("counters", {}))),
                    )
                    error = None
                except CliError as exc:
                    error = exc.format_message()
                refreshes += 1
                shown = frame(address, status, sample, before, error, refreshes)
                if live is None:
                    console.print(shown)
                else:
                    live.update(shown, refresh=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how top ends


add_curve_options(top)
