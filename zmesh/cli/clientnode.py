"""A command's own short-lived node (``zmesh pub``, ``zmesh sub``): its options, the node,
and the check of its seeds."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click

from ..config import NodeConfig
from ..node import Node
from .client import STOP_SIGNALS
from .logs import quiet_open_mesh
from .settings import common

log = logging.getLogger(__name__)

_DEFAULT_MAX_BYTES = NodeConfig.__dataclass_fields__["max_message_bytes"].default


@dataclass(frozen=True, kw_only=True)
class NodeArgs:
    """What the command line says of the node (see ``node_options``)."""

    mesh: str
    seeds: tuple[str, ...]
    interfaces: tuple[str, ...]
    mdns: bool | None  # (None: on unless a seed is given)
    secret_key_file: str | None
    trusted_keys_dir: str | None
    data_dir: str | None
    name: str | None
    max_message_bytes: int


_FIELDS = tuple(NodeArgs.__dataclass_fields__)


def node_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a command that runs its own node, given to it as ``node: NodeArgs``."""

    @functools.wraps(fn)
    def with_node(*args: Any, **kwargs: Any) -> Any:
        node = NodeArgs(**{name: kwargs.pop(name) for name in _FIELDS})
        return fn(*args, node=node, **kwargs)

    options = [
        common("mesh", "seeds", "interfaces", "mdns", "secret_key_file", "trusted_keys_dir"),
        click.option(
            "--data-dir",
            type=click.Path(file_okay=False),
            help="Keep the node's outbox and dedupe window here "
            "(default: a temporary dir removed on exit).",
        ),
        click.option("--name", help="Node name (default: ROLE-PID)."),
        click.option(
            "--max-message-bytes",
            type=click.IntRange(min=1),
            default=_DEFAULT_MAX_BYTES,
            show_default=True,
            help="Largest payload this node publishes or accepts (a consumer's "
            "producers park larger ones as dead letters).",
        ),
    ]
    for option in reversed(options):
        with_node = option(with_node)
    return with_node


@contextlib.contextmanager
def cli_node(role: str, args: NodeArgs) -> Iterator[Node]:
    """A started node for one command; a temporary data dir is removed after close.

    mDNS is on unless turned off, or unless seeds are given and it was not asked for: a
    node that announced itself takes about two seconds to withdraw when it closes, and
    the seeds' hellos name the mesh's other nodes."""
    mdns = args.mdns if args.mdns is not None else not args.seeds
    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = data_dir = tempfile.mkdtemp(prefix=f"zmesh-{role}-")
    # A stop signal a command does not handle itself (it would end the process at once)
    # exits as it would, through the removal of the temporary data dir below.
    defaults = {
        sig: signal.signal(sig, _exit_as_signalled)
        for sig in STOP_SIGNALS[1:]
        if signal.getsignal(sig) is signal.SIG_DFL
    }
    try:
        with quiet_open_mesh():
            node = Node(
                args.name or f"{role}-{os.getpid()}",
                mesh=args.mesh,
                data_dir=data_dir,
                interfaces=list(args.interfaces),
                mdns=mdns,
                seeds=list(args.seeds),
                max_message_bytes=args.max_message_bytes,
                secret_key_file=args.secret_key_file,
                trusted_keys_dir=args.trusted_keys_dir,
                replica_host=False,  # (it goes away with its data dir: no copies here)
            )
            with node:
                yield node
    finally:
        for sig in defaults:
            signal.signal(sig, signal.SIG_DFL)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _exit_as_signalled(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


DISCOVERY_STABLE_S = 0.5


def settle_peers(node: Node, max_wait_s: float) -> None:
    """Wait until the live peers this node knows stop changing (up to ``max_wait_s``):
    a command that looks at the whole mesh (``ls``, ``web``) looks once it is found."""
    deadline = time.monotonic() + max_wait_s
    last: frozenset[str] | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        view = frozenset(p["id"] for p in node.peers() if p["alive"])
        now = time.monotonic()
        if view != last:
            last, since = view, now
        elif view and now - since >= DISCOVERY_STABLE_S:
            return
        time.sleep(0.05)
