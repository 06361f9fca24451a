"""``zmesh pub``: a short-lived node that publishes, waits for the acks, and says how it
went in its exit code."""

from __future__ import annotations

import itertools
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import click
from click.core import ParameterSource

from ..config import check_name
from ..errors import ArgumentError, ConfigError, ZMeshError
from .audience import ephemeral_subscribers, not_served, owed_to_no_group, wait_serving
from .client import Interrupted, StopSignals
from .clientnode import NodeArgs, cli_node, node_options
from .output import CliError, note
from .pub_report import report, report_ephemeral, settle
from .settings import Number, source

# {{Count}} and friends in DATA, --key, --header values and --msg-id (as `nats pub`).
_TEMPLATE_RE = re.compile(r"\{\{\s*(\w+)\s*\}\}")
TEMPLATES: dict[str, Callable[[int], str]] = {
    "Count": str,  # (1 for the first message)
    "TimeStamp": lambda _n: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "Unix": lambda _n: str(int(time.time())),
    "UnixNano": lambda _n: str(time.time_ns()),
    "ID": lambda _n: uuid.uuid4().hex,
}


def _check_template(text: str | None, option: str) -> None:
    for name in _TEMPLATE_RE.findall(text or ""):
        if name not in TEMPLATES:
            raise click.BadParameter(
                f"unknown template {{{{{name}}}}}; known: "
                + ", ".join(f"{{{{{t}}}}}" for t in TEMPLATES),
                param_hint=option,
            )


def _fill(text: str, n: int) -> str:
    return _TEMPLATE_RE.sub(lambda m: TEMPLATES[m.group(1)](n), text)


def parse_headers(values: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint="--header")
        headers[key] = text
    return headers


def _payloads(
    data: str | None, file: BinaryIO | None, count: int | None, signals: StopSignals
) -> Iterator[bytes]:
    """Each payload: DATA (templates filled) ``count`` times, the whole of --file that
    many times, or each line of stdin (at most ``count``). A stop signal ends a read of
    stdin at once (nothing more is published)."""
    if file is not None:
        try:
            with signals.interruptible():
                body = file.read()
        except Interrupted:
            return
        for _ in range(count or 1):
            yield body
        return
    if data is not None and data != "-":
        for n in range(1, (count or 1) + 1):
            yield _fill(data, n).encode()
        return
    if sys.stdin.isatty():  # (else the command seems to hang, waiting for a terminal)
        note("reading lines from stdin; Ctrl-D to end")
    stdin = sys.stdin.buffer
    lines = itertools.count() if count is None else range(count)
    for _ in lines:
        try:
            with signals.interruptible():
                line = stdin.readline()
        except Interrupted:
            return
        if not line:
            return
        yield line.rstrip(b"\r\n")


@click.command(short_help="Publish DATA (a file, or stdin lines) to TOPIC; wait for acks.")
@click.argument("topic")
@click.argument("data", required=False)
@click.option(
    "--file",
    "file",
    type=click.File("rb", lazy=False),  # (opened first: a path that is not there is bad usage)
    metavar="PATH",
    help="Publish the whole of PATH as one message (- for all of stdin).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    help="Publish DATA (or --file) this many times; from stdin, at most this many "
    "lines. DATA may hold {{Count}} (1, 2, ...), {{TimeStamp}}, {{Unix}}, "
    "{{UnixNano}}, {{ID}}.",
)
@click.option("--key", help="Message key: messages of one key stay in order on one member.")
@click.option(
    "--header", "headers", multiple=True, metavar="KEY=VALUE", help="A header (repeatable)."
)
@click.option(
    "--priority",
    type=click.IntRange(0, 255),
    default=0,
    show_default=True,
    help="0 is the most urgent.",
)
@click.option(
    "--ttl",
    type=Number(min=0, min_open=True),
    metavar="SECONDS",
    help="Expire the message this long after publishing.",
)
@click.option(
    "--delay",
    type=Number(min=0),
    metavar="SECONDS",
    help="Deliver the message this long from now.",
)
@click.option(
    "--msg-id",
    metavar="ID",
    help="Idempotency id: a second publish of the same id within the dedupe "
    "window stores nothing (use {{Count}} with --count).",
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="GROUP",
    help="A group owed the messages even if none of its members is known yet "
    "(repeatable); publishing then waits for no peer.",
)
@node_options
@click.option(
    "--timeout",
    type=Number(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for every group's acks.",
)
@click.option(
    "--discovery-wait",
    type=Number(min=0),
    default=3.0,
    show_default=True,
    help="Seconds at most to wait for peers that consume TOPIC (a group's member, or an "
    "ephemeral subscriber), without --group.",
)
@click.option(
    "--wait-groups",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Without --group: publish once members of N groups of TOPIC "
    "are found, or with 1, no group's member but an ephemeral subscriber (or "
    "--discovery-wait has passed).",
)
def pub(
    topic: str,
    data: str | None,
    file: BinaryIO | None,
    count: int | None,
    key: str | None,
    headers: tuple[str, ...],
    priority: int,
    ttl: float | None,
    delay: float | None,
    msg_id: str | None,
    groups: tuple[str, ...],
    node: NodeArgs,
    timeout: float,
    discovery_wait: float,
    wait_groups: int,
) -> None:
    """Publish DATA to TOPIC (DATA `-` or absent, no --file: each line of stdin) and wait
    until every group acknowledged every message.

    With no group of TOPIC found but ephemeral subscribers (`zmesh sub` without --group),
    they are sent the messages, at most once, and nothing waits for acks (they do not
    ack).

    \b
    Exit codes: 0 every group acknowledged every message (or no group was owed them,
    and ephemeral subscribers were sent them); 1 some not acknowledged within
    --timeout (or an error); 3 settled, but some group did not acknowledge one
    (dead-lettered, expired, superseded or its group deleted: the per-group lines say
    which); 2 bad usage; 130 / 143 stopped by SIGINT / SIGTERM.
    """
    check_name("topic", topic)  # (before a node starts for nothing)
    for group in groups:
        check_name("group", group)
    if file is not None and data is not None:
        raise click.UsageError("give DATA or --file, not both")
    if groups and source("wait_groups") == ParameterSource.COMMANDLINE:
        raise click.UsageError(
            "--wait-groups waits for groups to be found; with --group the groups are named"
        )
    for text, option in (
        (data, "DATA"),
        (key, "--key"),
        (msg_id, "--msg-id"),
        *((h, "--header") for h in headers),
    ):
        _check_template(text, option)
    header_map = parse_headers(headers)
    options: dict[str, Any] = {"priority": priority, "ttl": ttl, "delay": delay}
    with StopSignals() as signals, cli_node("pub", node) as n:
        if groups:
            n.topic(topic, groups=list(groups))
        elif (
            not wait_serving(n, topic, discovery_wait, signals, wait_groups)
            and not signals.stop.is_set()
        ):
            note(not_served(n.status(), topic, wait_groups, discovery_wait))
        # (the ephemeral subscribers it publishes for: a later look may miss one a moment)
        audience = 0 if groups else ephemeral_subscribers(n.peers(), topic)
        receipts = []
        refused: ZMeshError | None = None  # (the message the node would not take)
        repeated_before = n.stats().get("duplicates_suppressed", 0)
        try:
            for i, payload in enumerate(_payloads(data, file, count, signals), start=1):
                if signals.stop.is_set():
                    break
                receipts.append(
                    n.publish(
                        topic,
                        payload,
                        key=key and _fill(key, i),
                        msg_id=msg_id and _fill(msg_id, i),
                        headers={k: _fill(v, i) for k, v in header_map.items()} or None,
                        **options,
                    )
                )
        except ZMeshError as exc:
            if not receipts:
                raise
            # (the ones published before it are settled and reported as any run's are:
            # dropped with the temporary data dir unsaid, a group's copy could be lost)
            refused = exc
            note(
                f"message {len(receipts) + 1} was not published: {exc}; nothing after it "
                f"is; waiting for the acks of the {len(receipts)} published before it"
            )
        if not receipts:
            if signals.signum is not None:
                raise CliError(
                    "interrupted before anything was published", exit_code=128 + signals.signum
                )
            note("nothing to publish")
            return
        if audience and not delay and owed_to_no_group(receipts, signals):
            # (a delayed message is for groups only)
            report_ephemeral(len(receipts), topic, audience, node.data_dir)
        else:
            outcome = settle(topic, receipts, timeout, signals)
            # (each repeat was counted as it was stored, before its receipt could settle)
            outcome.repeats = n.stats().get("duplicates_suppressed", 0) - repeated_before
            report(outcome, n, node.data_dir)
    if refused is not None:
        raise CliError(
            f"message {len(receipts) + 1} was not published: {refused}",
            exit_code=2 if isinstance(refused, (ArgumentError, ConfigError)) else 1,
        )
