"""``zmesh context add|ls|select|rm|show``: named settings, so that --mesh, --seed,
--interface and keys need not be repeated on every call (contexts.py holds the file,
settings.py the rules)."""

from __future__ import annotations

import json
import os
from typing import Any

import click
from click.core import ParameterSource
from rich.markup import escape
from rich.table import Table

from .contexts import Context, Contexts, checked
from .output import CliError, console, note
from .settings import ADDRESSES, ENV, active, common, http_address, source

# What `show` reports, and the option each comes from (the parameter name it has).
SHOWN = ("mesh", "seeds", "interfaces", "mdns", "secret_key_file", "trusted_keys_dir", "server_key")


@click.group()
def context() -> None:
    """Named settings (mesh, seeds, interfaces, key files, HTTP address) for every
    command: a flag wins over its environment variable, which wins over the context in
    use, which wins over the default.

    \b
    zmesh context add plant --mesh plant --seed 10.0.0.5:41000 --select
    zmesh pub readings 21.5          # joins plant through 10.0.0.5:41000
    zmesh --context lab status       # another context for one call
    """


def _row(name: str, c: Context, selected: str | None) -> list[str]:
    return [
        ("* " if name == selected else "  ") + name,
        c.mesh or "-",
        " ".join(c.seeds) or "-",
        " ".join(c.interfaces) or "-",
        "-" if c.mdns is None else ("on" if c.mdns else "off"),
        c.secret_key_file or "-",
        c.description or "",
    ]


@context.command("add")
@click.argument("name")
@click.option("--mesh", help="Mesh to join.")
@click.option(
    "--seed",
    "seeds",
    multiple=True,
    type=ADDRESSES,
    metavar="HOST:PORT",
    help="Control address of a peer (repeatable).",
)
@click.option(
    "--interface",
    "interfaces",
    multiple=True,
    type=ADDRESSES,
    metavar="IP",
    help="Address to bind and speak mDNS on (repeatable).",
)
@click.option("--mdns/--no-mdns", default=None, help="Use multicast discovery or not.")
@click.option(
    "--secret-key-file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Your CurveZMQ secret key, for a secured mesh.",
)
@click.option(
    "--trusted-keys-dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="The .pub keys of the nodes to trust.",
)
@click.option(
    "--server-key", metavar="KEY|FILE", help="Public key of the node status, top and dlq talk to."
)
@click.option("--http-address", metavar="HOST:PORT", help="A node's HTTP API.")
@click.option("--description", default="", help="A line saying what it is for.")
@click.option("--select", "select_it", is_flag=True, help="Also make it the selected one.")
@click.option("--force", is_flag=True, help="Replace a context of that name.")
def add(
    name: str,
    seeds: tuple[str, ...],
    interfaces: tuple[str, ...],
    select_it: bool,
    force: bool,
    **values: Any,
) -> None:
    """Save a context NAME (relative key paths are stored absolute)."""
    doc = Contexts.read()
    if name in doc.names() and not force:
        raise CliError(f"context {name!r} exists in {doc.path}; pass --force to replace it")
    new = checked(Context(name=name, seeds=seeds, interfaces=interfaces, **values))
    doc = doc.without(name)
    doc = Contexts(
        doc.path, {**doc.contexts, name: new}, name if select_it else doc.selected, doc.invalid
    )
    doc.write()
    click.echo(f"context {name} saved in {doc.path}" + (" and selected" if select_it else ""))


@context.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
def ls(as_json: bool) -> None:
    """List the contexts; * marks the selected one. An invalid one is listed as such,
    with why (a command that uses it fails; fix it with `add --force`, or `rm` it)."""
    doc = Contexts.read()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "selected": doc.selected,
                    "path": str(doc.path),
                    "contexts": {n: c.settings() for n, c in doc.contexts.items()},
                    "invalid": {n: bad.why for n, bad in doc.invalid.items()},
                },
                indent=2,
                sort_keys=True,
            )
        )
        return
    if not doc.names():
        click.echo(f"no contexts yet ({doc.path}); add one with `zmesh context add`")
        return
    table = Table(title=f"contexts ({escape(str(doc.path))})", title_justify="left")
    for col in ("name", "mesh", "seeds", "interfaces", "mdns", "secret key", "description"):
        table.add_column(col)
    rows = {n: list(map(escape, _row(n, c, doc.selected))) for n, c in doc.contexts.items()}
    for name, bad in doc.invalid.items():
        mark = "* " if name == doc.selected else "  "
        rows[name] = [escape(mark + name), *["-"] * 5, f"[red]invalid:[/] {escape(bad.why)}"]
    for _name, row in sorted(rows.items()):
        table.add_row(*row)
    console.print(table)


@context.command("select")
@click.argument("name", required=False)
@click.option("--none", "clear", is_flag=True, help="Select no context.")
def select(name: str | None, clear: bool) -> None:
    """Make NAME the context every command uses (without NAME: say which one it is)."""
    doc = Contexts.read()
    if clear:
        doc.with_selected(None).write()
        click.echo("no context selected")
        return
    if name is None:
        click.echo(doc.selected or "no context selected")
        return
    if name in doc.invalid:
        raise CliError(
            f"context {name!r} in {doc.path} is invalid: {doc.invalid[name].why}", exit_code=2
        )
    if name not in doc.contexts:
        raise CliError(f"no context named {name!r} in {doc.path}", exit_code=2)
    doc.with_selected(name).write()
    click.echo(f"context {name} selected")


@context.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Remove context NAME (if it was selected, none is any more)."""
    doc = Contexts.read()
    if name not in doc.names():
        raise CliError(f"no context named {name!r} in {doc.path}", exit_code=2)
    doc.without(name).write()
    click.echo(f"context {name} removed")


_WHERE = {ParameterSource.COMMANDLINE: "flag", ParameterSource.ENVIRONMENT: "env"}


@context.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
@common(*SHOWN)
def show(as_json: bool, **values: Any) -> None:
    """The settings a command would use now, and where each comes from (flag, env,
    context, default): try it with the flags and variables you mean to use."""
    in_use = active()
    out: dict[str, dict[str, Any]] = {}
    for name in SHOWN:
        where = _WHERE.get(source(name))  # type: ignore[arg-type]
        if where is None:
            by_context = in_use is not None and getattr(in_use, name) not in (None, ())
            where = f"context {in_use.name}" if in_use is not None and by_context else "default"
        value = values[name]
        out[name] = {"value": list(value) if isinstance(value, tuple) else value, "from": where}
    http = http_address()
    where = "env" if os.environ.get(ENV["http_address"]) else "default"
    if where == "default" and http is not None and in_use is not None:
        where = f"context {in_use.name}"
    out["http_address"] = {"value": http, "from": where}
    if as_json:
        click.echo(
            json.dumps(
                {"context": None if in_use is None else in_use.name, "settings": out}, indent=2
            )
        )
        return
    note(f"context in use: {in_use.name if in_use else 'none'}")
    for name, entry in out.items():
        value = entry["value"]
        text = " ".join(value) if isinstance(value, list) else "-" if value is None else str(value)
        click.echo(f"{name:<17} {text}  ({entry['from']}; {ENV[name]})")
