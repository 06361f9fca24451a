"""``zmesh pub``: a short-lived node that publishes, waits for the acks, and says how it
went in its exit code."""

from __future__ import annotations

import itertools
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from .. import Node, Receipt
from ..config import check_name
from ..errors import TimeoutError
from .client import Interrupted, StopSignals
from .clientnode import NodeArgs, cli_node, node_options
from .output import CliError, err_console, note

PROGRESS_ABOVE = 100  # show a progress bar while waiting for more acks than this
SERVING_POLL_S = 0.005  # how often the node is asked whether a peer serves the topic
SIGNAL_CHECK_S = 0.1  # a wait for acks looks for a stop signal this often

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
    data: str | None, file: str | None, count: int | None, signals: StopSignals
) -> Iterator[bytes]:
    """Each payload: DATA (templates filled) ``count`` times, the whole of --file that
    many times, or each line of stdin (at most ``count``). A stop signal ends a read of
    stdin at once (nothing more is published)."""
    if file is not None:
        try:
            with click.open_file(file, "rb") as f, signals.interruptible():
                body = f.read()
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


def wait_serving(
    node: Node, topic: str, wait_s: float, signals: StopSignals, groups: int = 1
) -> bool:
    """Wait (up to ``wait_s``) until peers of ``groups`` groups that consume ``topic`` have
    said hello: lanes of the topic with a member. A message is owed to the groups its
    producer knows when it is stored (see Node.publish): one of a group found later is
    not owed to it."""
    deadline = time.monotonic() + wait_s
    while not signals.stop.is_set():
        serving = {
            ln["group"] for ln in node.status()["lanes"] if ln["topic"] == topic and ln["members"]
        }
        if len(serving) >= groups:
            return True
        if time.monotonic() >= deadline:
            return False
        signals.stop.wait(SERVING_POLL_S)
    return False


NOT_DELIVERED = 3  # the exit code of a run whose messages some group did not ack


@dataclass
class Outcome:
    """How a run of ``zmesh pub`` ended: what was published, what is settled, and per
    group how many of the settled messages ended in each outcome."""

    topic: str
    published: int
    settled: int  # every group is done with it (acked or not)
    timeout_s: float
    interrupted: int | None = None  # the signal that stopped the wait
    by_group: dict[str, Counter[str]] = field(default_factory=dict)

    delivered: int = 0  # acked by every group it was owed to

    def exit_code(self) -> int:
        """0: every message acked by every group; 130/143: stopped by SIGINT/SIGTERM;
        1: some not settled within --timeout; 3: settled, but some group did not ack
        (dead-lettered, expired, superseded, group deleted)."""
        if self.interrupted is not None:
            return 128 + self.interrupted
        if self.settled < self.published:
            return 1
        return 0 if self.delivered == self.published else NOT_DELIVERED


SAY_WAITING_S = 1.0  # a wait for acks this long is said on stderr


def _acked_by(receipt: Receipt, deadline: float, signals: StopSignals) -> bool:
    """Wait for ``receipt``'s acks until ``deadline`` or a stop signal (seen within
    SIGNAL_CHECK_S: a signal does not end a wait on a lock)."""
    while True:
        left = deadline - time.monotonic()
        try:
            receipt.wait_acked(max(0.0, min(left, SIGNAL_CHECK_S)))
            return True
        except TimeoutError:
            if left <= SIGNAL_CHECK_S or signals.stop.is_set():
                return False


def settle(topic: str, receipts: list[Receipt], timeout_s: float, signals: StopSignals) -> Outcome:
    """Wait for every receipt's acks (a progress bar when there are many), up to
    ``timeout_s`` or a stop signal: the one place a run's outcome is decided."""
    deadline = time.monotonic() + timeout_s
    # A wait longer than a moment says so, once: the messages are published by then.
    said_by = min(deadline, time.monotonic() + SAY_WAITING_S)
    if (
        not _acked_by(receipts[-1], said_by, signals)
        and not signals.stop.is_set()
        and time.monotonic() < deadline
    ):
        note(f"published {len(receipts)}; waiting up to {timeout_s:g}s for the groups' acks")
    with Progress(
        TextColumn("waiting for acks"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err_console,
        transient=True,
        disable=len(receipts) <= PROGRESS_ABOVE,
    ) as progress:
        task = progress.add_task("acks", total=len(receipts))
        for n, receipt in enumerate(receipts):
            if not _acked_by(receipt, deadline, signals):
                break
            progress.update(task, completed=n + 1)
    by_group: dict[str, Counter[str]] = {}
    settled = delivered = 0
    for r in receipts:
        if r.acked:
            settled += 1
            outcomes = r.outcomes
            delivered += all(o == "acked" for o in outcomes.values())
            for group, outcome in outcomes.items():
                by_group.setdefault(group, Counter())[str(outcome)] += r.count
    return Outcome(topic, len(receipts), settled, timeout_s, signals.signum, by_group, delivered)


def _unclaimed_hint(node: Node, topic: str) -> str:
    groups = [ln["group"] for ln in node.status()["lanes"] if ln["topic"] == topic and ln["lane"]]
    if groups:
        return f"groups owed: {', '.join(sorted(set(groups)))}"
    return (
        "no consumer group of this topic was found: check --mesh, --seed and "
        "--interface, or name the groups with --group"
    )


def _report(outcome: Outcome, node: Node, data_dir: str | None) -> None:
    click.echo(
        f"published {outcome.published}, acknowledged {outcome.delivered} (topic {outcome.topic})"
    )
    for group, counts in sorted(outcome.by_group.items()):
        click.echo(
            f"  {group}: "
            + ", ".join(
                f"{n} {how}"
                for how, n in sorted(counts.items(), key=lambda item: (item[0] != "acked", item[0]))
            )
        )
    code = outcome.exit_code()
    if code == 0:
        return
    if code == NOT_DELIVERED:
        kept = (
            f"`zmesh dlq list --topic {outcome.topic} --group G` at this node's address "
            "lists them while it runs"
            if data_dir
            else "dead letters are kept by the "
            "producer, this command's node: they are dropped with its temporary data "
            "dir; pass --data-dir to keep them"
        )
        raise CliError(
            f"{outcome.published - outcome.delivered} of {outcome.published} "
            f"messages were not acknowledged by every group (above, per group); "
            f"{kept}",
            exit_code=code,
        )
    left = outcome.published - outcome.settled
    where = (
        f"they stay in the outbox at {data_dir}"
        if data_dir
        else "they are dropped with the temporary data dir; pass --data-dir to keep them"
    )
    if outcome.interrupted is not None:
        raise CliError(
            f"interrupted with {left} of {outcome.published} messages not acknowledged; {where}",
            exit_code=code,
        )
    raise CliError(
        f"{left} of {outcome.published} messages not acknowledged within "
        f"{outcome.timeout_s:g}s ({_unclaimed_hint(node, outcome.topic)}); "
        f"{where}",
        exit_code=code,
    )


@click.command(short_help="Publish DATA (a file, or stdin lines) to TOPIC; wait for acks.")
@click.argument("topic")
@click.argument("data", required=False)
@click.option(
    "--file",
    "file",
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
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Expire the message this long after publishing.",
)
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
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
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for every group's acks.",
)
@click.option(
    "--discovery-wait",
    type=click.FloatRange(min=0),
    default=3.0,
    show_default=True,
    help="Seconds at most to wait for peers that consume TOPIC, without --group.",
)
@click.option(
    "--wait-groups",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Without --group: publish once members of N groups of TOPIC "
    "are found (or --discovery-wait has passed).",
)
def pub(
    topic: str,
    data: str | None,
    file: str | None,
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

    \b
    Exit codes: 0 every group acknowledged every message; 1 some not acknowledged within
    --timeout (or an error); 3 settled, but some group did not acknowledge one
    (dead-lettered, expired, superseded or its group deleted: the per-group lines say
    which); 2 bad usage; 130 / 143 stopped by SIGINT / SIGTERM.
    """
    check_name("topic", topic)  # (before a node starts for nothing)
    for group in groups:
        check_name("group", group)
    if file is not None and data is not None:
        raise click.UsageError("give DATA or --file, not both")
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
            note(
                f"members of {wait_groups} group(s) consuming {topic} not found within "
                f"{discovery_wait:g}s; publishing for the groups found"
            )
        receipts = []
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
        if not receipts:
            if signals.signum is not None:
                raise CliError(
                    "interrupted before anything was published", exit_code=128 + signals.signum
                )
            note("nothing to publish")
            return
        _report(settle(topic, receipts, timeout, signals), n, node.data_dir)
