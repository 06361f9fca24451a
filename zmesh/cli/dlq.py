"""``zmesh dlq list|replay|purge``: a producer's dead letters, over its control socket.

Dead letters live at the producer that published the messages: ADDRESS is that node's
control address (default: the first seed of ZMESH_SEED or of the context in use). A
replica host that serves the lanes of a producer gone (docs/replicas.md) holds that
producer's dead letters in its copy: ``--producer ID`` asks it for those. The node
answers AdminRequests (ops ``dead_letters``, ``replay``, ``purge``); an error it reports
is printed and exits 1.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from .._http.actions import count, payload_json
from .._protocol.checks import U63
from .client import add_curve_options, request_admin
from .names import group_name, topic_name
from .output import CliError, console, note
from .settings import Number, target

PREVIEW_BYTES = 40


def _where(fn: Any) -> Any:
    options = [
        click.argument("address", metavar="[HOST:PORT]", required=False),
        click.option(
            "--topic", required=True, callback=topic_name, help="Topic of the parked messages."
        ),
        click.option(
            "--group", required=True, callback=group_name, help="Consumer group that failed them."
        ),
        click.option(
            "--producer",
            metavar="ID",
            help="The dead letters of this producer (node id, or its first 4+ hex digits), "
            "held by the replica host at ADDRESS that serves its lanes (default: the node's "
            "own, or the producer an --id names).",
        ),
        click.option(
            "--timeout",
            type=Number(min=0.1),
            default=5.0,
            show_default=True,
            help="Seconds to wait for the node's reply.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _seq(value: str) -> int:
    """A dead letter's id: SEQ, or PRODUCER:SEQ as `dlq list` and message ids print it."""
    seq = count(value.rpartition(":")[2])
    if seq is None:
        raise click.BadParameter(
            f"{value!r} is not a message id (SEQ or PRODUCER:SEQ)", param_hint="--id"
        )
    return seq


def _args(
    topic: str, group: str, producer: str | None, ids: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A request's arguments: the producer is ``--producer``, or the one the ids name
    (PRODUCER:SEQ); ids naming another are refused."""
    named = {i.rpartition(":")[0].lower() for i in ids} - {""}
    if len(named) > 1:
        raise click.BadParameter("the ids name more than one producer", param_hint="--id")
    if named:
        (of,) = named
        given = (producer or of).lower()  # (either may be the first digits of the other)
        if not (of.startswith(given) or given.startswith(of)):
            raise click.BadParameter(
                f"the ids name producer {of}, not {producer}", param_hint="--id"
            )
        producer = producer or of
    args: dict[str, Any] = {"topic": topic, "group": group}
    if producer is not None:
        args["producer"] = producer
    if ids:
        args["seqs"] = sorted({_seq(i) for i in ids})
    return args


_ids = click.option(
    "--id",
    "ids",
    multiple=True,
    metavar="SEQ",
    help="Only this dead letter (repeatable; default: all of topic/group).",
)


def preview(payload: bytes, size: int = PREVIEW_BYTES) -> str:
    """The start of a payload, readable: text when it decodes, escapes otherwise."""
    head = payload[:size]
    try:
        text = head.decode()
        text = text if text.isprintable() else repr(text)[1:-1]
    except UnicodeDecodeError:
        text = repr(head)[2:-1]
    return text + ("…" if len(payload) > size else "")


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _jsonable(letter: dict[str, Any]) -> dict[str, Any]:
    """A dead letter in JSON: its payload as ``payload_json`` gives it (not as well)."""
    out = dict(letter)
    payload = out.pop("payload", b"") or b""
    return {**out, **payload_json(payload)}


def _bytes_default(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def letters_table(letters: list[dict[str, Any]], topic: str, group: str) -> Table:
    table = Table(title=f"dead letters of {escape(topic)} / {escape(group)}", title_justify="left")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("key", overflow="fold")
    table.add_column("reason", overflow="fold")
    table.add_column("attempts", justify="right")
    table.add_column("failed at", no_wrap=True)
    table.add_column("payload", overflow="fold")
    for d in letters:
        history = d.get("history") or ()
        reason = str(d.get("reason") or "-")
        if len(history) > 1:
            reason += f" (parked {len(history)} times)"
        table.add_row(
            str(d.get("seq", "?")),
            escape(str(d.get("key") or "-")),
            escape(reason),
            str(d.get("attempts", "?")),
            _stamp(float(d.get("failed_at") or 0)),
            escape(preview(d.get("payload") or b"")),
        )
    return table


@click.group()
def dlq() -> None:
    """Dead letters at a producer: list, replay, purge."""


@dlq.command("list")
@_where
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=U63),
    default=1000,
    show_default=True,
    help="At most this many dead letters.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print them as JSON (payload as payload_b64, and payload_text when UTF-8).",
)
def list_(
    address: str,
    topic: str,
    group: str,
    producer: str | None,
    timeout: float,
    limit: int,
    as_json: bool,
) -> None:
    """List the messages GROUP failed (or that ran out of attempts), oldest first."""
    address = target(address)
    args = {**_args(topic, group, producer), "limit": limit}
    letters = request_admin(address, "dead_letters", args, timeout)
    if not isinstance(letters, list):
        raise CliError(f"{address} answered dead_letters with {type(letters).__name__}")
    if as_json:
        click.echo(
            json.dumps(
                [_jsonable(d) for d in letters], indent=2, sort_keys=True, default=_bytes_default
            )
        )
        return
    if not letters:
        click.echo(f"no dead letters of {topic} / {group} at {address}")
        return
    console.print(letters_table(letters, topic, group))
    of = f" --producer {producer}" if producer else ""
    note(
        f"{len(letters)} dead letter(s); deliver again with `zmesh dlq replay {address} "
        f"--topic {topic} --group {group}{of} [--id SEQ]`, drop with `zmesh dlq purge ...`"
    )


def _count(result: Any, address: str, op: str) -> int:
    if type(result) is not int:
        raise CliError(f"{address} answered {op} with {result!r}")
    return result


def _missing(ids: tuple[str, ...], done: int) -> None:
    if ids and done < len(set(map(_seq, ids))):
        note(
            f"{len(set(map(_seq, ids))) - done} of the given ids were not parked there "
            "(already replayed or purged, or another topic/group): see `zmesh dlq list`"
        )


@dlq.command()
@_where
@_ids
def replay(
    address: str,
    topic: str,
    group: str,
    producer: str | None,
    timeout: float,
    ids: tuple[str, ...],
) -> None:
    """Deliver parked messages to GROUP again (every one of topic/group without --id)."""
    address = target(address)
    args = _args(topic, group, producer, ids)
    done = _count(request_admin(address, "replay", args, timeout), address, "replay")
    click.echo(f"replayed {done} dead letter(s) of {topic} / {group}")
    _missing(ids, done)


@dlq.command()
@_where
@_ids
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def purge(
    address: str,
    topic: str,
    group: str,
    producer: str | None,
    timeout: float,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Delete parked messages for good (every one of topic/group without --id)."""
    address = target(address)
    args = _args(topic, group, producer, ids)
    if not yes:
        what = f"dead letters {', '.join(map(str, args['seqs']))}" if ids else "ALL dead letters"
        try:
            ok = click.confirm(
                f"Purge {what} of {topic} / {group} at {address}"
                + (f" (producer {args['producer']})" if "producer" in args else "")
                + "? They cannot be recovered",
                default=False,
                err=True,
            )
        except click.exceptions.Abort:
            click.echo("", err=True)  # the question's line was left open
            ok = False
        if not ok:
            raise CliError("not confirmed; nothing purged (pass --yes to skip the question)")
    done = _count(request_admin(address, "purge", args, timeout), address, "purge")
    click.echo(f"purged {done} dead letter(s) of {topic} / {group}")
    _missing(ids, done)


for _cmd in (list_, replay, purge):
    add_curve_options(_cmd)
