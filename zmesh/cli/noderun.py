"""``zmesh node run FILE.toml``: a node from its definition, until SIGTERM or SIGINT."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from .._definition import read_definition
from .._dirs import make_dir
from .._security import load_keys
from ..config import NodeConfig
from ..errors import ConfigError
from ..node import Node
from .client import StopSignals
from .output import note
from .reload import reload_on_sighup
from .settings import ADDRESSES, ENV, EnvOption, check_node_setting, env_help, source

if TYPE_CHECKING:
    from ..spark import Bridge


def build(
    node_cfg: NodeConfig, bridge_table: dict[str, Any] | None, source: str = ""
) -> Node | Bridge:
    """A node, or (a ``[bridge]`` table) a Spark bridge with its own node, not yet
    started."""
    if bridge_table is None:
        return Node(config=node_cfg)
    from ..spark import Bridge, BridgeConfig

    return Bridge(node_cfg, BridgeConfig.from_mapping(bridge_table, source=source))


def check_on_host(node_cfg: NodeConfig, file: str) -> None:
    """What of a definition only this host can judge, checked before the node starts, so
    that it is a definition error (exit 2: a restart will not fix it, and systemd's
    RestartPreventExitStatus=2 stops the loop), not a failed start: the data dir can be
    a directory here, each interface is an address of this host, and the key files
    can be read."""
    for iface in node_cfg.interfaces:
        if iface in ("*", "0.0.0.0"):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((iface, 0))  # (a port of its own, let go at once)
            except OSError as exc:
                where = {
                    ParameterSource.COMMANDLINE: "--interface",
                    ParameterSource.ENVIRONMENT: ENV["interfaces"],
                }.get(source("interfaces"), f"{file}: [node] interfaces")  # type: ignore[arg-type]
                raise ConfigError(
                    f"{where}: {iface} is not an address of this host ({exc.strerror})"
                ) from None
    try:
        load_keys(node_cfg.secret_key_file, node_cfg.trusted_keys_dir, node_cfg.trusted_keys)
    except ConfigError as exc:
        raise ConfigError(f"{file}: [node] {exc}") from None
    make_dir(  # (last: a definition refused leaves no directory behind)
        Path(node_cfg.data_dir),
        "data_dir",
        lambda message: ConfigError(f"{file}: [node] {message}"),
    )


@click.group()
def node() -> None:
    """Run nodes from their TOML definitions (see nodes/)."""


@node.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--interface",
    "interfaces",
    cls=EnvOption,
    callback=check_node_setting("interfaces"),
    multiple=True,
    type=ADDRESSES,
    envvar=ENV["interfaces"],
    metavar="IP",
    help=env_help(
        "Bind and speak mDNS on this address instead of the file's "
        "interfaces (repeatable; 0.0.0.0 for all).",
        "interfaces",
    ),
)
def run(file: str, interfaces: tuple[str, ...]) -> None:
    """Start the node FILE defines and run it until SIGTERM or SIGINT (exit 0 then).

    FILE has a [node] table (name, mesh, data_dir, interfaces, mdns, seeds, ...) and
    [topics.NAME], [subscriptions.NAME], [producers.NAME], [relays.NAME] tables; with a
    [bridge] table the node is a Spark bridge. The node's control address (and a
    bridge's endpoint) is printed on stdout. Contexts do not apply: the file is the
    node's whole definition, but for --interface (or ZMESH_INTERFACE). SIGHUP reads its
    trusted keys and acl_file again (it also does when they change).
    """
    node_cfg, bridge_table = read_definition(file)
    if interfaces:
        try:
            node_cfg = node_cfg.replace(interfaces=tuple(interfaces))
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--interface") from None
    check_on_host(node_cfg, file)
    runner = build(node_cfg, bridge_table, file)
    n = runner if isinstance(runner, Node) else runner.node
    with StopSignals() as signals:
        try:
            runner.start()
        except ConfigError as exc:  # (a handler, source or transform that is not there)
            raise ConfigError(f"{file}: {exc}") from None
        try:
            with reload_on_sighup(n):
                line = (
                    f"node {n.name} ({n.id[:12]}) of mesh {n.config.mesh}: "
                    f"control {n.control_address}"
                )
                if not isinstance(runner, Node):
                    line += f" bridge {runner.endpoint}"
                if n.http_address is not None:
                    line += f" http http://{n.http_address}/"
                if n.metrics_address is not None:
                    line += f" metrics http://{n.metrics_address}/metrics"
                click.echo(line)
                # Flushed at once so a supervisor reading stdout can seed other nodes from
                # it (SIGHUP is handled already: it may send one as soon as it reads it).
                sys.stdout.flush()
                while not signals.stop.wait(1.0):
                    pass
            note(f"node {n.name}: stopping")
        finally:
            runner.close()
    note(f"node {n.name}: closed")
