"""``zmesh keys generate`` and ``zmesh snapshot``: an operator's files, no node involved."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import snapshot as snapshot_data_dir
from .._security import generate_keypair
from ..config import check_name
from ..errors import ConfigError
from .client import STOP_SIGNALS, StopSignals
from .output import CliError, console, err_console
from .partial import NewStore

PROGRESS_INTERVAL_S = 0.2  # how often a snapshot's progress is redrawn
OPEN_POLL_S = 0.01  # a stopped snapshot looks this often whether its copy opened its file


def _default_name() -> str:
    host = socket.gethostname().split(".")[0]
    try:
        return check_name("key", host)
    except ConfigError:
        return "node"


@click.group()
def keys() -> None:
    """CurveZMQ key pairs for secured meshes."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", help="Key name: writes NAME.key and NAME.pub (default: host name).")
def generate(directory: str, name: str | None) -> None:
    """Write a key pair into DIRECTORY: NAME.key (secret, mode 0600) and NAME.pub.

    A node uses its pair through secret_key_file in its [node] table; every node (and
    operator) that may connect to it needs its NAME.pub in the node's trusted_keys_dir.
    """
    name = check_name("key", _default_name() if name is None else name)
    d = Path(directory)
    existing = [p for p in (d / f"{name}.key", d / f"{name}.pub") if p.exists()]
    if existing:
        raise CliError(
            f"{existing[0]} exists; refusing to overwrite a key (pick another "
            "--name, or remove the old pair if it is really unused)"
        )
    key_path, pub_path = generate_keypair(d, name)
    public = pub_path.read_text().strip()
    click.echo(f"secret key: {key_path} (mode 0600: keep it on this host, never copy it)")
    click.echo(f"public key: {pub_path}")
    click.echo(public)
    click.echo("")
    click.echo("To use it on a node, set in its [node] table:")
    click.echo(f'  secret_key_file = "{key_path.resolve()}"')
    click.echo('  trusted_keys_dir = "/etc/zmesh/trusted"   # the .pub files it trusts')
    click.echo(
        f"To trust it: copy {pub_path.name} into every node's trusted_keys_dir (a "
        "running node reads it within a second, no restart), or add the public key above "
        "to their trusted_keys list and restart them; nodes without it refuse this key "
        "(counted as auth_denied)."
    )
    click.echo(
        f"Operators reach a secured node with: zmesh status HOST:PORT --server-key "
        f"NODE.pub --secret-key-file {key_path}"
    )


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.2f} MiB"


def _describe(store: Path) -> dict[str, object]:
    """Node id and record counts of a copied store (empty when it cannot be read)."""
    try:
        import lmdb

        env = lmdb.open(str(store), readonly=True, max_dbs=16, subdir=True, lock=False)
    except Exception:
        return {}
    out: dict[str, object] = {}
    try:
        with env.begin() as txn:
            for name, label in (
                (b"meta", None),
                (b"msgs", "outbox messages"),
                (b"pend", "pending entries"),
                (b"dead", "dead letters"),
                (b"acked", "dedupe window chunks"),
                (b"runs", "outbox batches (runs)"),
            ):
                db = env.open_db(name, txn=txn, create=False)
                if label is None:
                    node_id = txn.get(b"node_id", db=db)
                    if node_id:
                        out["node id"] = node_id.hex()
                else:
                    out[label] = txn.stat(db)["entries"]
    except Exception:
        pass
    finally:
        env.close()
    return out


def _copy_with_progress(data_dir: str, dest: str, written: Path, source: Path) -> None:
    """``snapshot_data_dir`` on a thread, with the bytes written so far shown on stderr
    (against the source's file, which the compacted copy does not exceed). A stop signal
    ends the command with the copy removed."""
    failure: list[BaseException] = []
    new = NewStore(dest)

    def copy() -> None:
        # (a stop signal goes to the main thread, which then wakes at once: one this
        # thread took would be handled there only when its wait next ended)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            snapshot_data_dir(data_dir, dest)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=copy, name="zmesh-snapshot", daemon=True)
    total = source.stat().st_size if source.is_file() else None
    with (
        StopSignals() as signals,
        Progress(
            TextColumn("copying the store"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        ) as progress,
    ):
        task = progress.add_task("copy", total=total)
        worker.start()
        while worker.is_alive():
            if signals.stop.wait(PROGRESS_INTERVAL_S) and worker.is_alive():
                # LMDB cannot stop a copy: its file is removed once the copy opened it
                # (at its start), and it writes into a file unlinked until this process
                # ends, moments later.
                while worker.is_alive() and not written.exists():
                    worker.join(OPEN_POLL_S)
                removed = new.remove()
                raise CliError(
                    f"interrupted: the copy into {dest} was "
                    + ("removed" if removed else "not finished"),
                    exit_code=signals.exit_code,
                )
            with contextlib.suppress(OSError):
                progress.update(task, completed=written.stat().st_size)
    if failure:
        raise failure[0]


@click.command()
@click.argument("data_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("dest", type=click.Path(file_okay=False))
def snapshot(data_dir: str, dest: str) -> None:
    """Copy the store of DATA_DIR into DEST consistently, even while its node runs.

    DEST must not hold a store yet. The copy is compacted (free pages are left out). A
    copy that fails leaves nothing behind (what it wrote, the directories it made).
    """
    src = Path(data_dir) / "store"
    before = _size(src) if src.is_dir() else 0
    target = Path(dest) / "store"
    _copy_with_progress(data_dir, dest, target / "data.mdb", (src / "data.mdb"))
    table = Table(title=f"snapshot of {escape(data_dir)}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("copied to", escape(str(target)))
    table.add_row("size", f"{_mib(_size(target))} (source files {_mib(before)})")
    for label, value in _describe(target).items():
        table.add_row(label, escape(f"{value:,}" if isinstance(value, int) else str(value)))
    console.print(table)
    click.echo(
        f"To restore: stop the node of {data_dir} if it still runs, then start it with "
        f'data_dir = "{Path(dest).resolve()}" (or put {dest} in place of '
        f"{data_dir}). The copy has the same node id: start it in place of the "
        "original, never beside it; peers would take the two for one node."
    )
