"""Plumbing shared by the commands: node options, short-lived nodes, status requests,
and stop signals.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click
import zmq

from .._engine.peers import endpoint
from .._protocol.codec import decode_control, encode_control
from .._protocol.frames import StatusReply, StatusRequest
from ..config import parse_seed
from ..errors import DecodeError
from ..node import Node
from .output import CliError


def node_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options every command that runs its own node shares."""
    options = [
        click.option("--mesh", default="default", show_default=True,
                     help="Mesh to join; nodes of other meshes are ignored."),
        click.option("--interface", "interfaces", multiple=True, metavar="IP",
                     help="Address to bind and to speak mDNS on (repeatable; "
                          "default: all interfaces)."),
        click.option("--seed", "seeds", multiple=True, metavar="HOST:PORT",
                     help="Control address of a peer to contact directly (repeatable)."),
        click.option("--no-mdns", is_flag=True, help="Do not use multicast discovery."),
        click.option("--data-dir", type=click.Path(file_okay=False),
                     help="Keep the node's outbox and dedupe window here "
                          "(default: a temporary dir removed on exit)."),
        click.option("--name", help="Node name (default: ROLE-PID)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@contextlib.contextmanager
def cli_node(role: str, *, mesh: str, interfaces: Sequence[str], seeds: Sequence[str],
             no_mdns: bool, data_dir: str | None, name: str | None) -> Iterator[Node]:
    """A started node for one command; a temporary data dir is removed after close."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix=f"zmesh-{role}-")
        data_dir = tmp
    try:
        node = Node(name or f"{role}-{os.getpid()}", mesh=mesh, data_dir=data_dir,
                    interfaces=list(interfaces), mdns=not no_mdns, seeds=list(seeds))
        with node:
            yield node
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def control_endpoint(address: str) -> str:
    """``host:port`` (or ``tcp://host:port``) as a tcp endpoint; usage error otherwise."""
    raw = address.removeprefix("tcp://")
    try:
        host, port = parse_seed(raw)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from exc
    return endpoint(host, port)


def request_status(address: str, timeout_s: float) -> dict:
    """Ask the node whose control socket is at ``address`` for its status."""
    ep = control_endpoint(address)
    token = secrets.randbits(62)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        sock.connect(ep)
        sock.send(encode_control(StatusRequest(token)))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sock.poll(max(1, int(remaining * 1000))):
                raise CliError(f"no status reply from {address} within {timeout_s:g}s: is a "
                               "zmesh node's control socket listening there?")
            try:
                reply = decode_control(sock.recv(zmq.NOBLOCK))
            except (DecodeError, zmq.Again):
                continue
            if isinstance(reply, StatusReply) and reply.token == token:
                return reply.status
    finally:
        sock.close(linger=0)
        ctx.term()


class StopSignals:
    """SIGINT and SIGTERM set an event instead of raising, while installed.

    A command that runs until stopped waits on ``stop`` and then closes its node cleanly.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum
        self.stop.set()

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
