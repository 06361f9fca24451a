"""``zmesh group ls|rm``: the consumer groups the producers of a mesh owe messages to.

Each producer keeps a lane per group of each topic it publishes, with what it still owes
that group. ``ls`` asks a node (``--address``, default: the first seed of ZMESH_SEED or
of the context in use) and every live peer it knows (ops ``groups`` over their control
sockets) and adds their lanes up per topic and group; ``rm`` asks each live peer to
delete a group (op ``group_rm``), then the node, which tells every live peer to do the
same (a peer that did not answer too), and counts what each dropped.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from .client import add_curve_options, request_admin, request_status
from .ls import age
from .names import group_name, topic_or_pattern
from .output import CliError, console, note
from .settings import Number, target


def _nodes(address: str, timeout: float) -> list[tuple[str, str]]:
    """(name, address) of the node at ``address`` and of every live peer it knows."""
    status = request_status(address, timeout)
    nodes = [(status["node"]["name"], address)]
    nodes += [
        (p["name"], p["control"].removeprefix("tcp://")) for p in status["peers"] if p["alive"]
    ]
    return nodes


def gather(
    address: str, topic: str | None, timeout: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every producer's lanes (of ``topic``), each with its producer's name and address;
    and the nodes that did not answer."""
    nodes = _nodes(address, timeout)
    lanes: list[dict[str, Any]] = []
    unreachable: list[str] = []
    args: dict[str, Any] = {} if topic is None else {"topic": topic}
    for name, at in nodes:
        try:
            got = request_admin(at, "groups", args, timeout)
        except CliError:
            if at == address:
                raise  # (the node asked refused, or did not answer: it says why)
            unreachable.append(f"{name} ({at})")
            continue
        lanes.extend({**lane, "producer": name, "address": at} for lane in got)
    return lanes, unreachable


def summarize(lanes: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Lanes added up per (topic, group): pending and in flight summed, members joined,
    the latest last seen and the oldest message's age over the producers."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for lane in lanes:
        key = (lane["topic"], lane["group"])
        row = out.get(key)
        if row is None:
            row = out[key] = {
                "topic": key[0],
                "group": key[1],
                "mode": lane["mode"],
                "producers": 0,
                "pending": 0,
                "in_flight": 0,
                "dead_letters": 0,
                "members": set(),
                "last_seen": None,
                "oldest_age_s": None,
                "declared": False,
            }
        row["producers"] += 1
        for field in ("pending", "in_flight", "dead_letters"):
            row[field] += lane[field]
        row["members"].update(lane["members"])
        row["declared"] = row["declared"] or lane["declared"]
        if lane["last_seen"] is not None:
            row["last_seen"] = max(row["last_seen"] or 0.0, lane["last_seen"])
        if lane["oldest_age_s"] is not None:
            row["oldest_age_s"] = max(row["oldest_age_s"] or 0.0, lane["oldest_age_s"])
    rows = sorted(out.values(), key=lambda r: (r["topic"], r["group"]))
    for row in rows:
        row["members"] = sorted(row["members"])
        seen = row["last_seen"]
        row["last_seen_ago_s"] = None if seen is None else max(0.0, now - seen)
    return rows


@click.group()
def group() -> None:
    """Consumer groups of a mesh: list them, delete one."""


_address = click.option(
    "--address",
    "-a",
    metavar="HOST:PORT",
    help="A node's control address (default: the first seed of ZMESH_SEED "
    "or of the context in use).",
)


@group.command("ls")
@click.argument("topic", required=False, callback=topic_or_pattern)
@_address
@click.option(
    "--timeout",
    type=Number(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds to wait for each node's reply.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the groups as JSON.")
def ls(topic: str | None, address: str | None, timeout: float, as_json: bool) -> None:
    """The groups a node and its live peers owe messages of TOPIC (or of every topic) to:
    pending, in flight, members, last seen, oldest message's age."""
    address = target(address)
    lanes, unreachable = gather(address, topic, timeout)
    rows = summarize(lanes, time.time())
    if as_json:
        click.echo(
            json.dumps({"groups": rows, "unreachable": unreachable}, indent=2, sort_keys=True)
        )
    elif not rows:
        click.echo(f"no groups{'' if topic is None else f' of {topic}'} at {address} or its peers")
    else:
        table = Table(title="groups", title_justify="left")
        for name, justify in (
            ("topic", "left"),
            ("group", "left"),
            ("mode", "left"),
            ("producers", "right"),
            ("pending", "right"),
            ("in flight", "right"),
            ("members", "right"),
            ("last seen", "right"),
            ("oldest", "right"),
            ("dead letters", "right"),
        ):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for r in rows:
            seen = (
                "now"
                if r["members"]
                else age(r["last_seen_ago_s"])
                + (" ago" if r["last_seen_ago_s"] is not None else "")
            )
            table.add_row(
                escape(r["topic"]),
                escape(r["group"]) + (" (declared)" if r["declared"] else ""),
                r["mode"],
                str(r["producers"]),
                f"{r['pending']:,}",
                f"{r['in_flight']:,}",
                str(len(r["members"])),
                seen,
                age(r["oldest_age_s"]),
                str(r["dead_letters"]),
            )
        console.print(table)
    if unreachable:
        note(f"no answer from {', '.join(unreachable)}: their groups are not counted")


@group.command("rm")
@click.argument("topic", callback=topic_or_pattern)
@click.argument("name", metavar="GROUP", callback=group_name)
@_address
@click.option(
    "--timeout",
    type=Number(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the node's reply.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def rm(topic: str, name: str, address: str | None, timeout: float, yes: bool) -> None:
    """Delete GROUP of TOPIC: a node and every live peer of it drop what they still owe
    it (counted as dropped_group_deleted) and its dead letters. Members still subscribed
    start again with an empty group."""
    address = target(address)
    if not yes:
        try:
            ok = click.confirm(
                f"Delete group {name} of {topic} and every message the mesh's "
                "producers still owe it? They cannot be recovered",
                default=False,
                err=True,
            )
        except click.exceptions.Abort:
            click.echo("", err=True)  # the question's line was left open
            ok = False
        if not ok:
            raise CliError("not confirmed; nothing deleted (pass --yes to skip the question)")
    (me, _), *peers = _nodes(address, timeout)
    args = {"topic": topic, "group": name}
    # (each peer drops its own lanes and counts them; told first, it has nothing left to
    # drop when the node's word comes)
    dropped_at: list[tuple[str, int]] = []
    unreachable: list[str] = []
    for peer, at in peers:
        try:
            got = request_admin(at, "group_rm", {**args, "announce": False}, timeout)
        except CliError:
            unreachable.append(f"{peer} ({at})")
            continue
        dropped_at.append((peer, _dropped(got, at)))
    result = request_admin(address, "group_rm", args, timeout)
    dropped_at.insert(0, (me, _dropped(result, address)))
    total = sum(n for _, n in dropped_at)
    each = ", ".join(f"{peer} {n:,}" for peer, n in dropped_at)
    click.echo(
        f"deleted group {name} of {topic}: {total:,} pending message(s) dropped ({each}); "
        f"{result['peers_told']} peer(s) told"
    )
    if unreachable:
        note(f"no answer from {', '.join(unreachable)}: told by {me}, their drops not counted")
    note(
        f"producers offline now keep it until their group_inactive_expiry_s passes; "
        f"check with `zmesh group ls {escape(topic)} --address {address}`"
    )


def _dropped(result: Any, address: str) -> int:
    if not isinstance(result, dict) or type(result.get("dropped")) is not int:
        raise CliError(f"{address} answered group_rm with {result!r}")
    return result["dropped"]


for _cmd in (ls, rm):
    add_curve_options(_cmd)
