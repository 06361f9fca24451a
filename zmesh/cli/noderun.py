"""``zmesh node run FILE.toml``: a node from its definition, until SIGTERM or SIGINT."""

from __future__ import annotations

import sys

import click

from ..node import Node
from .client import StopSignals
from .output import note


@click.group()
def node() -> None:
    """Run nodes from their TOML definitions (see nodes/)."""


@node.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
def run(file: str) -> None:
    """Start the node FILE defines and run it until SIGTERM or SIGINT.

    FILE has a [node] table (name, mesh, data_dir, interfaces, mdns, seeds, ...) and
    [topics.NAME] tables. The node's control address is printed on stdout.
    """
    n = Node.from_toml(file)
    with StopSignals() as signals, n:
        click.echo(f"node {n.name} ({n.id[:12]}) of mesh {n.config.mesh}: "
                   f"control {n.control_address}")
        # Flushed at once so a supervisor reading stdout can seed other nodes from it.
        sys.stdout.flush()
        while not signals.stop.wait(1.0):
            pass
        note(f"node {n.name}: stopping")
    note(f"node {n.name}: closed")
