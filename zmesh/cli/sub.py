"""``zmesh sub``: a short-lived node that consumes, prints (or runs a command on) each
message, and acks it."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from typing import Any, BinaryIO

import click

from .. import Message
from .._subjects import check_subject
from ..config import SubscriptionConfig, check_name
from .client import StopSignals
from .clientnode import NodeArgs, cli_node, node_options
from .output import CliError, note
from .settings import Number
from .shell import run_shell
from .stopflag import StopFlag

WAIT_STEP_S = 0.5  # a wait for messages looks for a stop signal this often
_FIELDS = SubscriptionConfig.__dataclass_fields__
MAX_IN_FLIGHT: int = _FIELDS["max_in_flight"].default  # type: ignore[assignment]
BATCH_SIZE: int = _FIELDS["batch_size"].default  # type: ignore[assignment]


def payload_json(payload: bytes) -> dict[str, str]:
    """A payload as ``--json`` prints it: ``payload`` when it is UTF-8 text, else
    ``payload_b64``."""
    try:
        return {"payload": payload.decode()}
    except UnicodeDecodeError:
        return {"payload_b64": base64.b64encode(payload).decode()}


def message_json(msg: Message) -> dict[str, Any]:
    """What ``--json`` prints of a message."""
    return {
        "id": str(msg.id),
        "topic": msg.topic,
        "group": msg.group,
        "key": msg.key,
        "headers": msg.headers,
        "attempt": msg.attempt,
        "partition": msg.partition,
        "published_at": msg.published_at,
        **payload_json(msg.payload),
    }


def _write(out: BinaryIO, msg: Message, fmt: str) -> None:
    if fmt == "json":
        line = json.dumps(message_json(msg), ensure_ascii=False, default=repr)
        out.write(line.encode() + b"\n")
    elif fmt == "raw":
        out.write(msg.payload)
    else:
        out.write(msg.payload + b"\n")
    out.flush()


def _run_exec(cmd: str, msg: Message, timeout: float, stop: StopFlag) -> bool:
    env = dict(
        os.environ,
        ZMESH_TOPIC=msg.topic,
        ZMESH_GROUP=msg.group or "",
        ZMESH_KEY=msg.key or "",
        ZMESH_MESSAGE_ID=str(msg.id),
        ZMESH_ATTEMPT=str(msg.attempt),
    )
    ran = run_shell(cmd, msg.payload, timeout, stop, env=env)
    if ran.timed_out:
        note(f"--exec ran longer than {timeout:g}s on message {msg.id}; killed, nacked")
        return False
    if ran.returncode is None:
        note(f"--exec stopped on message {msg.id}; nacked")
        return False
    if ran.returncode != 0:
        note(f"--exec exited {ran.returncode} on message {msg.id}; nacked")
        return False
    return True


@click.command(short_help="Consume TOPIC: print or --exec each message (in a group: ack it).")
@click.argument("topic")
@click.option(
    "--group",
    help="Consumer group to join: its backlog is kept for it by every "
    "producer (until it is deleted, or expires). Without one the "
    "subscription is ephemeral: what is published while it runs, "
    "nothing kept for it.",
)
@click.option(
    "--mode",
    type=click.Choice(["shared", "broadcast"]),
    default="shared",
    show_default=True,
    help="With --group: shared: members compete; broadcast: own copy of all.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object a line: id, topic, group, key, headers, attempt, "
    "partition, published_at, and payload (UTF-8 text) or payload_b64.",
)
@click.option("--raw", is_flag=True, help="Payloads exactly as sent, nothing added between them.")
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="Ack what is printed; --no-ack leaves it to go back to its producers "
    "(redelivered to the group) when this command ends.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=MAX_IN_FLIGHT,
    show_default=True,
    help="Most unacked messages per producer at this member (1: one at a time, "
    "in the producer's order).",
)
@click.option(
    "--last-per-key",
    "last_per_key",
    is_flag=True,
    help="First the values producers keep of each key of the matching topics "
    "(TopicConfig.keep_last), then live messages.",
)
@node_options
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option(
    "--timeout",
    type=Number(min=0),
    help="Stop after this many seconds (with --count: fail if not all came).",
)
@click.option(
    "--exec",
    "exec_cmd",
    metavar="CMD",
    help="Run CMD (with sh) per message, payload on stdin: exit 0 acks, else nacks.",
)
@click.option(
    "--exec-timeout",
    type=Number(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds before a --exec command counts as failed: it is killed, with "
    "every process it started.",
)
def sub(
    topic: str,
    group: str | None,
    mode: str,
    as_json: bool,
    raw: bool,
    ack: bool,
    max_in_flight: int,
    last_per_key: bool,
    node: NodeArgs,
    count: int | None,
    timeout: float | None,
    exec_cmd: str | None,
    exec_timeout: float,
) -> None:
    """Consume TOPIC: print each payload on a line (or --json, --raw). With --group, as
    a member of that group, acking each; without one, ephemeral (like `nats sub`): every
    message published while it runs, at most once, and nothing left behind at the
    producers.

    \b
    Exit codes: 0 after --count messages, or at --timeout without --count; 1 fewer than
    --count within --timeout (or an error); 2 bad usage; 130 / 143 stopped by SIGINT /
    SIGTERM.
    """
    check_subject("topic", topic, wildcards=True)  # (before a node starts for nothing)
    if group is not None:
        check_name("group", group)
    elif mode == "broadcast":
        mode = "shared"  # (an ephemeral subscription gets every message: its own copy)
    elif not ack:
        raise click.UsageError(
            "--no-ack goes with --group: an ephemeral subscription's messages go to no "
            "one else, acked or not"
        )
    if as_json and raw:
        raise click.UsageError("--json and --raw print messages two ways: give one of them")
    fmt = "json" if as_json else "raw" if raw else None
    if exec_cmd is not None and fmt is not None:
        raise click.UsageError(
            f"--{fmt} prints messages and --exec hands them to a command: give one of them"
        )
    out = sys.stdout.buffer
    handled = 0
    with StopSignals() as signals, cli_node("sub", node) as n:
        subscription = n.subscribe(
            topic,
            group=group,
            mode=mode,
            max_in_flight=max_in_flight,
            batch_size=min(max_in_flight, BATCH_SIZE),
            deliver="last_per_key" if last_per_key else None,
        )
        note(
            f"node {n.name} of mesh {node.mesh}: control {n.control_address}; "
            f"consuming {topic} " + (f"as {group}" if group else "(ephemeral)")
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        while count is None or handled < count:
            wait = (
                WAIT_STEP_S if deadline is None else min(WAIT_STEP_S, deadline - time.monotonic())
            )
            if wait <= 0 or signals.stop.is_set():
                break
            msg = subscription.get(timeout=wait)
            if msg is None:
                continue
            if exec_cmd is not None:
                if not _run_exec(exec_cmd, msg, exec_timeout, signals.stop):
                    msg.nack()
                    continue
            else:
                try:
                    _write(out, msg, fmt or "lines")
                except BrokenPipeError:  # (the reader is gone, `| head -1`: exit 141)
                    msg.nack()  # (not printed: for another member, or this one again)
                    raise
            if ack:
                msg.ack()
            handled += 1
        subscription.close()
    if signals.signum is not None:
        raise CliError(f"interrupted after {handled} messages", exit_code=128 + signals.signum)
    if count is not None and handled < count:
        raise CliError(f"got {handled} of {count} messages within {timeout:g}s")
    note(f"{handled} messages handled")
