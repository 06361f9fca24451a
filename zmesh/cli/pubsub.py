"""``zmesh pub`` and ``zmesh sub``: a short-lived node that publishes or consumes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from .. import Message, Node, Receipt
from ..config import check_name
from .client import StopSignals, cli_node, node_options
from .output import CliError, err_console, note

PROGRESS_ABOVE = 100  # show a progress bar while waiting for more acks than this
DISCOVERY_STABLE_S = 0.5


def _payloads(data: str, count: int | None) -> Iterator[bytes]:
    if data != "-":
        for _ in range(1 if count is None else count):
            yield data.encode()
        return
    if sys.stdin.isatty():  # (else the command seems to hang, waiting for a terminal)
        note("reading lines from stdin; Ctrl-D to end")
    for n, line in enumerate(sys.stdin.buffer):
        if count is not None and n >= count:
            return
        yield line.rstrip(b"\r\n")


def _wait_acked(receipts: list[Receipt], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    show = len(receipts) > PROGRESS_ABOVE
    with Progress(TextColumn("waiting for acks"), BarColumn(), MofNCompleteColumn(),
                  console=err_console, transient=True, disable=not show) as progress:
        task = progress.add_task("acks", total=len(receipts))
        for n, receipt in enumerate(receipts):
            try:
                receipt.wait_acked(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            progress.update(task, completed=n + 1)
    return sum(1 for r in receipts if r.acked)


def _settle_discovery(node: Node, topic: str, max_wait_s: float) -> None:
    """Wait until the peers and groups this node knows stop changing (up to ``max_wait_s``).

    A message is owed to the groups its producer knows when it is published (or, before any
    is known, to the first ones found), so a one-shot publisher looks around first.
    """
    deadline = time.monotonic() + max_wait_s
    last: tuple[frozenset[str], frozenset[str]] | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        status = node.status()
        view = (frozenset(p["id"] for p in status["peers"] if p["alive"]),
                frozenset(ln["lane"] for ln in status["lanes"] if ln["topic"] == topic))
        now = time.monotonic()
        if view != last:
            last, since = view, now
        elif view[0] and now - since >= DISCOVERY_STABLE_S:
            return
        time.sleep(0.05)


def _unclaimed_hint(node: Node, topic: str) -> str:
    groups = [ln["group"] for ln in node.status()["lanes"]
              if ln["topic"] == topic and ln["lane"]]
    if groups:
        return f"groups owed: {', '.join(sorted(set(groups)))}"
    return ("no consumer group of this topic was found: check --mesh, --seed and "
            "--interface, or name the groups with --group")


@click.command(short_help="Publish DATA (or stdin lines) to TOPIC and wait for acks.")
@click.argument("topic")
@click.argument("data", required=False, default="-")
@node_options
@click.option("--key", help="Message key: messages of one key stay in order on one member.")
@click.option("--group", "groups", multiple=True, metavar="GROUP",
              help="A group that must get the messages even if none of its members is "
                   "known yet (repeatable).")
@click.option("--count", type=click.IntRange(min=1),
              help="Publish DATA this many times (with -: at most this many lines).")
@click.option("--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for every group's acks.")
@click.option("--discovery-wait", type=click.FloatRange(min=0), default=3.0,
              show_default=True,
              help="Seconds at most to look for peers and their groups before publishing.")
def pub(topic: str, data: str, mesh: str, interfaces: tuple[str, ...],
        seeds: tuple[str, ...], no_mdns: bool, data_dir: str | None, name: str | None,
        max_message_bytes: int, key: str | None, groups: tuple[str, ...], count: int | None,
        timeout: float, discovery_wait: float) -> None:
    """Publish DATA to TOPIC (DATA `-` or absent: each line of stdin) and wait for acks.

    Exits 0 when every message was acknowledged by every group within --timeout.
    """
    check_name("topic", topic)  # (before a node starts for nothing)
    for group in groups:
        check_name("group", group)
    with cli_node("pub", mesh=mesh, interfaces=interfaces, seeds=seeds, no_mdns=no_mdns,
                  data_dir=data_dir, name=name, max_message_bytes=max_message_bytes) as node:
        if groups:
            node.topic(topic, groups=list(groups))
        _settle_discovery(node, topic, discovery_wait)
        receipts = [node.publish(topic, payload, key=key) for payload in _payloads(data, count)]
        if not receipts:
            note("nothing to publish")
            return
        acked = _wait_acked(receipts, timeout)
        click.echo(f"published {len(receipts)}, acknowledged {acked} (topic {topic})")
        if acked < len(receipts):
            where = (f"they stay in the outbox at {data_dir}" if data_dir else
                     "they are dropped with the temporary data dir; pass --data-dir to keep "
                     "them")
            raise CliError(f"{len(receipts) - acked} of {len(receipts)} messages not "
                           f"acknowledged within {timeout:g}s ({_unclaimed_hint(node, topic)}); "
                           f"{where}")


def _run_exec(cmd: str, msg: Message, timeout: float) -> bool:
    env = dict(os.environ, ZMESH_TOPIC=msg.topic, ZMESH_GROUP=msg.group or "",
               ZMESH_KEY=msg.key or "", ZMESH_MESSAGE_ID=str(msg.id),
               ZMESH_ATTEMPT=str(msg.attempt))
    try:
        done = subprocess.run(cmd, shell=True, input=msg.payload, env=env, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        note(f"--exec ran longer than {timeout:g}s on message {msg.id}; nacked")
        return False
    if done.returncode != 0:
        note(f"--exec exited {done.returncode} on message {msg.id}; nacked")
        return False
    return True


@click.command(short_help="Consume TOPIC in a group: print or --exec each message, ack it.")
@click.argument("topic")
@click.option("--group", required=True, help="Consumer group to join.")
@click.option("--mode", type=click.Choice(["shared", "broadcast"]), default="shared",
              show_default=True, help="shared: members compete; broadcast: own copy of all.")
@node_options
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Stop after this many seconds (with --count: fail if not all came).")
@click.option("--exec", "exec_cmd", metavar="CMD",
              help="Run CMD (with sh) per message, payload on stdin: exit 0 acks, else nacks.")
@click.option("--exec-timeout", type=click.FloatRange(min=0.1), default=60.0,
              show_default=True, help="Seconds before a --exec command counts as failed.")
def sub(topic: str, group: str, mode: str, mesh: str, interfaces: tuple[str, ...],
        seeds: tuple[str, ...], no_mdns: bool, data_dir: str | None, name: str | None,
        max_message_bytes: int, count: int | None, timeout: float | None, exec_cmd: str | None,
        exec_timeout: float) -> None:
    """Consume TOPIC as a member of --group: print each payload on a line, and ack it."""
    check_name("topic", topic)  # (before a node starts for nothing)
    check_name("group", group)
    out = sys.stdout.buffer
    handled = 0
    with StopSignals() as signals, cli_node(
            "sub", mesh=mesh, interfaces=interfaces, seeds=seeds, no_mdns=no_mdns,
            data_dir=data_dir, name=name, max_message_bytes=max_message_bytes) as node:
        subscription = node.subscribe(topic, group=group, mode=mode)
        note(f"node {node.name} of mesh {mesh}: control {node.control_address}; "
             f"consuming {topic} as {group}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while count is None or handled < count:
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0 or signals.stop.is_set():
                break
            msg = subscription.get(timeout=wait)
            if msg is None:
                continue
            if exec_cmd is not None:
                if not _run_exec(exec_cmd, msg, exec_timeout):
                    msg.nack()
                    continue
            else:
                try:
                    out.write(msg.payload + b"\n")
                    out.flush()
                except BrokenPipeError:
                    msg.nack()
                    break
            msg.ack()
            handled += 1
        subscription.close()
    if signals.stop.is_set() and count is not None and handled < count:
        raise CliError(f"interrupted after {handled} of {count} messages", exit_code=130)
    if count is not None and handled < count:
        raise CliError(f"got {handled} of {count} messages within {timeout:g}s")
    note(f"{handled} messages handled")
