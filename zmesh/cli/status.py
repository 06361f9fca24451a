"""``zmesh status`` and ``zmesh peers``: ask a running node over its control socket."""

from __future__ import annotations

import json

import click

from .client import request_status
from .output import console, peers_table, render_status
from .settings import Number, target

_address = click.argument("address", metavar="[HOST:PORT]", required=False)
_timeout = click.option(
    "--timeout",
    type=Number(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the reply.",
)
_json = click.option("--json", "as_json", is_flag=True, help="Print the raw reply as JSON.")


@click.command()
@_address
@_timeout
@_json
def status(address: str, timeout: float, as_json: bool) -> None:
    """Show a node's status: identity, lanes, peers and counters.

    HOST:PORT is the node's control address (printed by `zmesh node run`, usable as a
    --seed); without it, the first seed of ZMESH_SEED or of the context in use.
    """
    reply = request_status(target(address), timeout)
    if as_json:
        click.echo(json.dumps(reply, indent=2, sort_keys=True))
    else:
        render_status(reply)


@click.command()
@_address
@_timeout
@_json
def peers(address: str, timeout: float, as_json: bool) -> None:
    """List the peers a node knows, with liveness and subscriptions."""
    reply = request_status(target(address), timeout)
    if as_json:
        click.echo(json.dumps(reply.get("peers", []), indent=2, sort_keys=True))
    else:
        console.print(peers_table(reply))
