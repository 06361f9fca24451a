"""``zmesh node run FILE.toml``: a node from its definition, until SIGTERM or SIGINT."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .._definition import read_definition
from ..config import NodeConfig
from ..node import Node
from .client import StopSignals
from .output import note
from .reload import reload_on_sighup

if TYPE_CHECKING:
    from ..spark import Bridge, BridgeConfig


def build(node_cfg: NodeConfig, bridge_cfg: BridgeConfig | None) -> Node | Bridge:
    """A node, or a bridge with its own node, not yet started."""
    if bridge_cfg is None:
        return Node(config=node_cfg)
    from ..spark import Bridge

    return Bridge(node_cfg, bridge_cfg)


@click.group()
def node() -> None:
    """Run nodes from their TOML definitions (see nodes/)."""


@node.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
def run(file: str) -> None:
    """Start the node FILE defines and run it until SIGTERM or SIGINT.

    FILE has a [node] table (name, mesh, data_dir, interfaces, mdns, seeds, ...) and
    [topics.NAME], [subscriptions.NAME], [producers.NAME], [relays.NAME] tables; with a
    [bridge] table the node is a Spark bridge. The node's control address (and a
    bridge's endpoint) is printed on stdout. SIGHUP reads its trusted keys and acl_file
    again (it also does when they change).
    """
    runner = build(*read_definition(file))
    n = runner if isinstance(runner, Node) else runner.node
    with StopSignals() as signals, runner:
        line = (f"node {n.name} ({n.id[:12]}) of mesh {n.config.mesh}: "
                f"control {n.control_address}")
        if not isinstance(runner, Node):
            line += f" bridge {runner.endpoint}"
        click.echo(line)
        # Flushed at once so a supervisor reading stdout can seed other nodes from it.
        sys.stdout.flush()
        with reload_on_sighup(n):
            while not signals.stop.wait(1.0):
                pass
        note(f"node {n.name}: stopping")
    note(f"node {n.name}: closed")
