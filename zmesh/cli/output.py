"""What the CLI prints: consoles, one-line errors, and the status tables."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

PIPE_WIDTH = 10_000  # columns of a console that is not a terminal: no row is ever folded
READER_GONE = 141  # the exit code of a command whose stdout's reader went away (as SIGPIPE's)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # (rich exits 1: a command whose reader went away exits as SIGPIPE's, like the
        # commands that write to stdout themselves, main.py)
        self.quiet = True
        drop_stdout()
        raise SystemExit(READER_GONE)


def _console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr): a terminal's width on a terminal; on a file or a
    pipe, wide enough that every table row stays one line (for grep and awk) whatever
    COLUMNS says."""
    out = _Console(stderr=stderr, highlight=False)
    return out if out.is_terminal else _Console(stderr=stderr, highlight=False, width=PIPE_WIDTH)


console = _console()
err_console = _console(stderr=True)


class CliError(click.ClickException):
    """A failure the user can act on: printed as one line, with an exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click reads it per instance

    def show(self, file: Any = None) -> None:
        print_error(self.format_message())


def drop_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone (`| head -1`), and Python's last
    flush at exit would otherwise report the broken pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_error(message: str) -> None:
    """``zmesh: error: ...`` on stderr."""
    err_console.print(f"[bold red]zmesh: error:[/] {escape(message)}", soft_wrap=True)


def note(message: str) -> None:
    """A progress or status line for humans, on stderr (stdout stays for data)."""
    err_console.print(escape(message), soft_wrap=True)


def short(node_id: str) -> str:
    return node_id[:12]


def _names(status: dict[str, Any]) -> dict[str, str]:
    """Node id -> name, for everyone this node knows (itself included)."""
    names = {p["id"]: p["name"] for p in status.get("peers", [])}
    node = status.get("node", {})
    if "id" in node:
        names[node["id"]] = node.get("name", "?")
    return names


def node_table(status: dict[str, Any]) -> Table:
    node = status.get("node", {})
    table = Table(title="node", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    served = [
        (label, f"http://{node[key]}{path}")
        for label, key, path in (
            ("http", "http_address", "/"),
            ("metrics", "metrics_address", "/metrics"),
        )
        if node.get(key) is not None
    ]
    for label, value in (
        ("name", node.get("name")),
        ("id", node.get("id")),
        ("mesh", node.get("mesh")),
        ("incarnation", node.get("incarnation")),
        ("control port", node.get("control_port")),
        ("data port", node.get("data_port")),
        *served,
        ("outbox", status.get("outbox")),
    ):
        table.add_row(label, escape(str(value)))
    return table


LANE_FIELDS = {
    "topic",
    "lane",
    "group",
    "mode",
    "members",
    "windows",
    "assigned",
    "partitions_moved",
    "pending",
    "ready",
    "in_flight",
}


def lanes_table(status: dict[str, Any]) -> Table:
    names = _names(status)
    lanes = sorted(status.get("lanes", []), key=lambda ln: (ln["topic"], ln["lane"]))
    # Per-lane event counts (acked, nacked, ack_timeouts, expired, ...) vary by version.
    counts = [
        {k: v for k, v in ln.items() if k not in LANE_FIELDS and isinstance(v, int)} for ln in lanes
    ]
    other = [", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k != "acked") for c in counts]
    table = Table(title="lanes (messages this node owes each group)", title_justify="left")
    table.add_column("topic", overflow="fold")
    table.add_column("group", overflow="fold")
    table.add_column("mode", no_wrap=True)
    for col in ("pending", "in flight", "acked"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("members", overflow="fold")
    if any(other):
        table.add_column("other counts", overflow="fold")
    for lane, count, extra in zip(lanes, counts, other, strict=True):
        windows = lane.get("windows") or [None] * len(lane.get("members", []))
        members = ", ".join(
            names.get(m, short(m)) + ("" if w is None else f" (window {w})")
            for m, w in zip(lane.get("members", []), windows, strict=True)
        )
        row = [
            escape(lane["topic"]),
            escape(lane.get("group") or "(none yet)"),
            lane.get("mode", ""),
            str(lane.get("pending", 0)),
            str(lane.get("in_flight", 0)),
            str(count.get("acked", 0)),
            escape(members) or "-",
        ]
        if any(other):
            row.append(escape(extra) or "-")
        table.add_row(*row)
    return table


def subscriptions_table(status: dict[str, Any]) -> Table:
    table = Table(title="subscriptions (what this node consumes)", title_justify="left")
    for col in ("topic", "group", "mode"):
        table.add_column(col)
    table.add_column("delivered", justify="right")
    table.add_column("queued", justify="right")
    for s in status.get("subscriptions", []):
        table.add_row(
            escape(s["topic"]),
            escape(s["group"]),
            s["mode"],
            str(s["delivered"]),
            str(s.get("queued", "-")),
        )
    return table


def peers_table(status: dict[str, Any]) -> Table:
    table = Table(title="peers", title_justify="left")
    table.add_column("name", overflow="fold")
    table.add_column("id")
    table.add_column("control", overflow="fold")
    table.add_column("alive")
    table.add_column("last seen", justify="right")
    table.add_column("subscriptions", overflow="fold")
    for p in sorted(status.get("peers", []), key=lambda p: p["name"]):
        subs = ", ".join(f"{t}/{g} ({m})" for t, g, m in p.get("subscriptions", []))
        table.add_row(
            escape(p["name"]),
            short(p["id"]),
            escape(p["control"].removeprefix("tcp://")),
            "[green]yes[/]" if p["alive"] else "[red]no[/]",
            f"{p['last_seen_s']:.1f}s",
            escape(subs) or "-",
        )
    return table


def replicas_table(status: dict[str, Any]) -> Table | None:
    """Replicas (docs/replicas.md): the node's replicated topics, its
    replica set and its lag; the copies it holds of other producers and the lanes it took
    over. None when there is none of it."""
    rep = status.get("replicas") or {}
    if not (rep.get("topics") or rep.get("copies") or rep.get("serving")):
        return None
    table = Table(title="replicas", title_justify="left")
    table.add_column("what")
    table.add_column("of", overflow="fold")
    table.add_column("state", overflow="fold")
    table.add_column("messages", justify="right")
    topics = ", ".join(f"{t} ({k})" for t, k in sorted(rep.get("topics", {}).items()))
    if topics:
        chosen = ", ".join(f"{m['name']} ({m['state']})" for m in rep.get("set", []))
        table.add_row(
            "replicated topics",
            escape(topics),
            escape(chosen) or "[red]no replica host[/]",
            f"{rep.get('lag', 0)} not on replicas yet",
        )
    for copy in rep.get("copies", []):
        table.add_row(
            "copy held",
            short(copy["producer"]),
            copy["state"],
            f"{copy['records']} records",
        )
    for served in rep.get("serving", []):
        state = "handing back" if served["handing_back"] else f"for {served['since_s']:.0f}s"
        table.add_row(
            "lanes taken over", short(served["producer"]), state, f"{served['owed']} owed"
        )
    return table


def counters_table(status: dict[str, Any]) -> Table:
    table = Table(title="counters", title_justify="left")
    table.add_column("counter")
    table.add_column("value", justify="right")
    for name, value in sorted(status.get("counters", {}).items()):
        table.add_row(escape(name), str(value))
    if not status.get("counters"):
        table.add_row("(nothing counted yet)", "")
    return table


def render_status(status: dict[str, Any], out: Console = console) -> None:
    """Every table of a status reply."""
    out.print(node_table(status))
    out.print(lanes_table(status))
    if status.get("subscriptions"):
        out.print(subscriptions_table(status))
    out.print(peers_table(status))
    replicas = replicas_table(status)
    if replicas is not None:
        out.print(replicas)
    out.print(counters_table(status))
