"""How a run of ``zmesh pub`` ends: the wait for the groups' acks (a progress bar when
there are many), what each group made of the messages, and the exit code that says it."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from .. import MessageId, Node, Receipt
from ..errors import TimeoutError
from .client import StopSignals
from .output import CliError, err_console, note

PROGRESS_ABOVE = 100  # show a progress bar while waiting for more acks than this
SIGNAL_CHECK_S = 0.1  # a wait for acks looks for a stop signal this often


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
    # Publishes whose msg_id was published before (the ``duplicates_suppressed`` counter):
    # the message it names is their outcome, counted once in ``by_group``.
    repeats: int = 0

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
    counted: set[MessageId] = set()  # (a repeated msg_id's receipt is its first's message)
    for r in receipts:
        if r.acked:
            settled += 1
            outcomes = r.outcomes
            delivered += all(o == "acked" for o in outcomes.values())
            if r.id in counted:
                continue
            counted.add(r.id)
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


def report_ephemeral(published: int, topic: str, subscribers: int, data_dir: str | None) -> None:
    """The messages owed to no group went to ``subscribers`` ephemeral subscribers: at
    most once, with no ack to wait for (exit 0, as `nats pub`)."""
    click.echo(f"published {published}, acknowledged 0 (topic {topic})")
    click.echo(f"  ephemeral subscribers: {subscribers}, sent at most once (they do not ack)")
    kept = (
        f"; they stay in the outbox at {data_dir} for the first group to come" if data_dir else ""
    )
    note(f"no consumer group of {topic} was found: no acks to wait for{kept}")


def report(outcome: Outcome, node: Node, data_dir: str | None) -> None:
    click.echo(
        f"published {outcome.published}, acknowledged {outcome.delivered} (topic {outcome.topic})"
    )
    if outcome.repeats:
        click.echo(
            f"  {outcome.repeats} repeated a msg_id published before: not stored again, "
            "each has that message's outcome"
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
