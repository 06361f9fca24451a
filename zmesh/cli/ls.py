"""``zmesh ls nodes|topics|groups``: the whole mesh in one table, from any seed or by mDNS.

A short-lived node joins the mesh (as ``zmesh pub`` does), waits for discovery to settle,
then asks every node it knows for its status over the control sockets, all at once with
one timeout (the same collection as the HTTP API's ``/api/mesh``). The asking node itself
is left out of what is shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import zmq
from rich.markup import escape
from rich.table import Table

from .._http.collect import MESH_TIMEOUT_S, collect_mesh
from .._http.views import drop_observer, groups_view, nodes_view, topics_view
from .clientnode import NodeArgs, cli_node, node_options, settle_peers
from .output import CliError, console, note, short
from .settings import Number

KINDS = ("nodes", "topics", "groups")


def age(seconds: float | None) -> str:
    """A message age for people: 4.2s, 3m10s, 2h05m, 3d4h (- for none)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _names(names: list[str]) -> str:
    return escape(", ".join(names)) or "-"


def nodes_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="nodes", title_justify="left")
    for col in ("name", "id", "control", "health"):
        table.add_column(col, overflow="fold")
    for col in ("outbox", "lanes", "subs", "peers", "rtt"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in sorted(rows, key=lambda r: r["name"]):
        if r["reachable"]:
            health = (
                "[green]ok[/]"
                if r["alive"] is not False
                else "[yellow]answers, but peers think it dead[/]"
            )
            table.add_row(
                escape(r["name"]),
                short(r["id"]),
                escape(r["control"]),
                health,
                f"{r['outbox']:,}",
                str(r["lanes"]),
                str(r["subscriptions"]),
                f"{r['peers_alive']}/{r['peers']}",
                f"{r['rtt_ms']:.1f}ms",
            )
        else:
            state = "dead" if r["alive"] is False else "alive per peers"
            table.add_row(
                escape(r["name"]),
                short(r["id"]),
                escape(r["control"]),
                f"[red]unreachable[/] ({state})",
                "-",
                "-",
                "-",
                "-",
                "-",
            )
    return table


def topics_table(view: dict[str, Any]) -> Table:
    table = Table(title="topics", title_justify="left")
    for col in ("topic", "producers", "groups", "subscribers"):
        table.add_column(col, overflow="fold")
    for col in ("pending", "in flight", "acked", "dead letters", "oldest"):
        table.add_column(col, justify="right", no_wrap=True)
    for t in view["topics"]:
        table.add_row(
            escape(t["topic"]),
            _names(t["producers"]),
            _names(t["groups"]),
            _names(t["subscribers"]),
            f"{t['pending']:,}",
            f"{t['in_flight']:,}",
            f"{t['acked']:,}",
            f"{t['dead_letters']:,}",
            age(t["oldest_age_s"]),
        )
    return table


def groups_table(view: dict[str, Any]) -> Table:
    table = Table(title="groups (summed over the producers that owe them)", title_justify="left")
    for col in ("topic", "group", "mode"):
        table.add_column(col, overflow="fold")
    for col in ("pending", "in flight", "acked", "dead letters", "oldest"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("members", overflow="fold")
    for g in view["groups"]:
        table.add_row(
            escape(g["topic"]),
            escape(g["group"]) if g["mode"] != "unclaimed" else "(no group yet)",
            g["mode"] or "-",
            f"{g['pending']:,}",
            f"{g['in_flight']:,}",
            f"{g['acked']:,}",
            f"{g['dead_letters']:,}",
            age(g["oldest_age_s"]),
            _names(g["members"]),
        )
    return table


# What each kind prints: its rows (as `--json` and the HTTP API give them), their table.
VIEWS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Table]]] = {
    "nodes": (nodes_view, nodes_table),
    "topics": (topics_view, topics_table),
    "groups": (groups_view, groups_table),
}


@click.command(name="ls", short_help="List the mesh's nodes, topics or groups.")
@click.argument("kind", type=click.Choice(KINDS))
@node_options
@click.option(
    "--wait",
    "wait_s",
    type=Number(min=0),
    default=3.0,
    show_default=True,
    help="Seconds at most to let discovery settle.",
)
@click.option(
    "--timeout",
    type=Number(min=0.1, max=30),
    default=MESH_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for each node's reply (all at once).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def ls(kind: str, node: NodeArgs, wait_s: float, timeout: float, as_json: bool) -> None:
    """List every node, topic or group of the mesh (like `nats stream ls`).

    Finds the mesh by mDNS, or from --seed HOST:PORT (any node's control address). Nodes
    that do not answer within --timeout are listed as unreachable (and their backlog is
    missing from the topic and group sums).

    \b
    Exit codes: 0 listed; 1 no node of the mesh found within --wait (with --json, the
    empty rows are printed first), or an error; 2 bad usage.
    """
    with cli_node("ls", node) as n:
        settle_peers(n, wait_s)
        ctx = zmq.Context()
        try:
            found = drop_observer(collect_mesh(n._engine, ctx, timeout))
        finally:
            ctx.term()
    view, table = VIEWS[kind]
    if as_json:  # (empty rows too: what reads them gets JSON, and the exit code)
        click.echo(json.dumps(view(found), indent=2, sort_keys=True))
    if not found["nodes"]:
        raise CliError(
            f"no node of mesh {node.mesh!r} found within {wait_s:g}s: check --mesh, --seed "
            "and --interface"
        )
    if not as_json:
        console.print(table(view(found)))
    gone = [n["name"] for n in found["nodes"] if not n["reachable"]]
    if gone:
        note(f"unreachable: {', '.join(sorted(gone))} (no reply within {timeout:g}s)")
