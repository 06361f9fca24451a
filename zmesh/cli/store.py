"""``zmesh store check`` and ``zmesh store salvage``: a node's store on disk, its node
stopped (or running: both only read the store's file)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from .._store.check import check_store
from .._store.damage import remedy
from .._store.salvage import salvage as salvage_store
from .client import Interrupted, StopSignals
from .output import CliError, console, err_console
from .partial import NewStore

SHOWN_PROBLEMS = 20  # problems printed by check (the rest counted)


def _store_dir(data_dir: str) -> Path:
    store = Path(data_dir) / "store"
    if not (store / "data.mdb").is_file():
        raise CliError(
            f"{store / 'data.mdb'} does not exist: DATA_DIR is a node's data dir "
            "(data_dir in its [node] table), which holds store/data.mdb"
        )
    return store


@click.group()
def store() -> None:
    """Check a node's store for damage, or copy what can be read of a damaged one."""


@store.command("check")
@click.argument("data_dir", type=click.Path(file_okay=False, exists=True))
def check(data_dir: str) -> None:
    """Walk every page of every database of DATA_DIR's store and report what is damaged.

    The walk runs in a child process and never opens the file through LMDB, so damage
    cannot stop it; it only reads. Exit 0: sound; 1: damaged (the remedies follow).
    """
    store_dir = _store_dir(data_dir)
    with err_console.status(f"checking {escape(str(store_dir))}"):
        report = check_store(store_dir)
    size = f"{report.size_bytes / (1 << 20):,.1f} MiB"
    if report.sound:
        click.echo(
            f"{report.data_file} ({size}) is sound: every page of every database "
            f"was read and checked in {report.seconds:.1f}s"
        )
        return
    click.echo(
        f"{report.data_file} ({size}) is damaged: {len(report.problems)} problem(s) "
        f"in {', '.join(report.damaged())}"
    )
    for problem in report.problems[:SHOWN_PROBLEMS]:
        click.echo(f"  {problem}")
    if len(report.problems) > SHOWN_PROBLEMS:
        click.echo(f"  ... and {len(report.problems) - SHOWN_PROBLEMS} more")
    raise CliError(f"{report.data_file} is damaged: {remedy(store_dir)}")


@store.command("salvage")
@click.argument("data_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("dest", type=click.Path(file_okay=False))
def salvage(data_dir: str, dest: str) -> None:
    """Copy every record that can be read of DATA_DIR's store into a new data dir DEST.

    DATA_DIR is only read, never opened through LMDB, and left as it is (set aside for
    a post-mortem). Run the node on DEST afterwards: it has the same node id; what could
    not be read is lost (a pending message whose record was lost is counted in
    lost_records at its start).
    """
    _store_dir(data_dir)
    new = NewStore(dest)
    with StopSignals() as signals:
        try:
            with (
                signals.interruptible(),
                err_console.status(f"copying what can be read of {escape(data_dir)}"),
            ):
                report = salvage_store(data_dir, dest)
        except Interrupted:
            # (left, the store would be sound but hold part of the records: a node run
            # on it, as advised below, would take them for all there is)
            removed = new.remove()
            raise CliError(
                f"interrupted: the salvage into {dest} was "
                + ("removed" if removed else "not finished"),
                exit_code=signals.exit_code,
            ) from None
    table = Table(title=f"salvage of {escape(report.source)}", title_justify="left")
    for name in ("database", "records", "copied", "lost"):
        table.add_column(name, justify="left" if name == "database" else "right")
    lost = report.lost()
    for db in sorted(set(report.expected) | set(report.copied)):
        had = report.expected.get(db)
        table.add_row(
            db, "?" if had is None else f"{had:,}", f"{report.copied[db]:,}", f"{lost.get(db, 0):,}"
        )
    console.print(table)
    if report.meta:
        click.echo(f"started from {report.meta}")
    found = sum(report.orphans.values())
    if found:
        click.echo(
            f"{found:,} of the records copied were found in pages nothing reached any "
            "more (under a damaged branch page)"
        )
    click.echo(
        f"{len(report.problems)} problem(s) met on the way"
        + (f", the first: {report.problems[0]}" if report.problems else "")
    )
    click.echo(
        f"copied into {report.dest}; {data_dir} is left as it was. To use the copy: "
        f"stop the node if it runs, then start it with data_dir = "
        f'"{Path(dest).resolve()}" (it keeps its node id).'
    )
