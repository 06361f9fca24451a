"""What ``zmesh demo`` measured: read the consumers' records and the producer's report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table


@dataclass(slots=True)
class GroupResult:
    """Deliveries one group's handlers saw."""

    group: str
    members: int
    deliveries: int = 0  # handler calls, duplicates included
    unique: int = 0  # distinct message indices
    redelivered: int = 0  # deliveries with attempt > 1
    malformed: int = 0  # record lines that could not be parsed
    latencies_s: list[float] = field(default_factory=list)  # first delivery of each message

    @property
    def duplicates(self) -> int:
        return self.deliveries - self.unique


@dataclass(slots=True)
class DemoResult:
    """The outcome of one demo run."""

    messages: int
    groups: list[GroupResult]
    completed: bool  # the producer saw every message acked by every group
    acked: int  # messages acked by every group, as the producer saw it
    elapsed_s: float | None
    producer_counters: dict[str, int]
    crash: str

    def lost(self, group: GroupResult) -> int:
        return self.messages - group.unique

    @property
    def lost_total(self) -> int:
        return sum(self.lost(g) for g in self.groups)

    @property
    def redelivered_by_producer(self) -> int:
        sent = self.producer_counters.get("sent", 0)
        return max(0, sent - self.messages * len(self.groups))


def read_group(group: str, members: int, files: list[Path], messages: int) -> GroupResult:
    """Fold the record files of one group's members (``index attempt sent received``)."""
    result = GroupResult(group, members)
    first: dict[int, float] = {}
    for path in files:
        if not path.exists():
            continue
        with path.open() as fh:
            for line in fh:
                try:
                    index_s, attempt_s, sent_s, recv_s = line.split()
                    index, attempt = int(index_s), int(attempt_s)
                    sent, received = float(sent_s), float(recv_s)
                except ValueError:
                    result.malformed += 1
                    continue
                if not 0 <= index < messages:
                    result.malformed += 1
                    continue
                result.deliveries += 1
                if attempt > 1:
                    result.redelivered += 1
                latency = received - sent
                if index not in first or latency < first[index]:
                    first[index] = latency
    result.unique = len(first)
    result.latencies_s = list(first.values())
    return result


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0..100), or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def result_table(result: DemoResult) -> Table:
    """The demo's summary as a rich table."""
    table = Table(title="zmesh demo", title_justify="left")
    table.add_column("measure", style="bold")
    table.add_column("value", justify="right")
    table.add_row("published", f"{result.messages:,}")
    for g in result.groups:
        plural = "s" if g.members != 1 else ""
        table.add_row(f"delivered to {g.group} ({g.members} member{plural})", f"{g.unique:,}")
    table.add_row("redelivered by the producer", f"{result.redelivered_by_producer:,}")
    dup = sum(g.duplicates for g in result.groups)
    detail = ", ".join(f"{g.group} {g.duplicates:,}" for g in result.groups)
    table.add_row("duplicates seen by handlers", f"{dup:,} ({detail})")
    lost = result.lost_total
    label = "lost" if result.completed else "not delivered in time"
    table.add_row(label, f"[green]{lost}[/]" if lost == 0 else f"[bold red]{lost:,}[/]")
    table.add_row("crash", result.crash)
    if result.elapsed_s:
        rate = result.messages / result.elapsed_s
        groups = f"{len(result.groups)} group{'s' if len(result.groups) != 1 else ''}"
        table.add_row(
            "throughput",
            f"{rate:,.0f} msgs/s ({result.messages:,} messages to "
            f"{groups} in {result.elapsed_s:.2f} s)",
        )
    latencies = [x for g in result.groups for x in g.latencies_s]
    table.add_row(
        "end-to-end latency p50 / p99",
        f"{_ms(percentile(latencies, 50))} / {_ms(percentile(latencies, 99))}",
    )
    malformed = sum(g.malformed for g in result.groups)
    if malformed:
        table.add_row("unreadable records", f"[yellow]{malformed}[/]")
    return table


def result_notes(result: DemoResult) -> list[str]:
    """What a reader might wonder about, in a sentence each."""
    notes = []
    if any(g.duplicates for g in result.groups):
        notes.append(
            "Duplicates are messages the killed consumer had handled but whose acks "
            "had not reached the producer when it died (the batch it held, and acks "
            "still in transit): at-least-once delivery gives them to the group "
            "again, and a handler (another member's, or the restarted one's) sees them a "
            "second time."
        )
    if result.redelivered_by_producer:
        notes.append(
            "Redelivered counts every send after the first one per group, including "
            "messages in flight to the killed consumer."
        )
    return notes
