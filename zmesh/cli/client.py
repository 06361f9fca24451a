"""Plumbing shared by the commands: node options, short-lived nodes, status requests,
and stop signals.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import zmq

from .._engine.peers import endpoint
from .._protocol.codec import decode_control, encode_control
from .._protocol.frames import AdminReply, AdminRequest, Control, StatusReply, StatusRequest
from .._security import _check_key
from ..config import NodeConfig, parse_seed
from ..errors import ConfigError, DecodeError
from ..node import Node
from .output import CliError
from .refusal import HandshakeWatch


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
        click.option("--max-message-bytes", type=click.IntRange(min=1),
                     default=NodeConfig.__dataclass_fields__["max_message_bytes"].default,
                     show_default=True,
                     help="Largest payload this node publishes or accepts (a consumer's "
                          "producers park larger ones as dead letters)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@contextlib.contextmanager
def cli_node(role: str, *, mesh: str, interfaces: Sequence[str], seeds: Sequence[str],
             no_mdns: bool, data_dir: str | None, name: str | None,
             max_message_bytes: int) -> Iterator[Node]:
    """A started node for one command; a temporary data dir is removed after close."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix=f"zmesh-{role}-")
        data_dir = tmp
    try:
        node = Node(name or f"{role}-{os.getpid()}", mesh=mesh, data_dir=data_dir,
                    interfaces=list(interfaces), mdns=not no_mdns, seeds=list(seeds),
                    max_message_bytes=max_message_bytes)
        with node:
            yield node
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def control_endpoint(address: str) -> str:
    """``host:port`` (or ``tcp://host:port``) as a tcp endpoint; usage error otherwise."""
    raw = address.removeprefix("tcp://")
    try:
        host, port = parse_seed(raw, what="address")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from exc
    if ":" in host:  # (parse_seed takes IPv6 literals in addresses other than seeds)
        raise click.BadParameter(f"address {address!r} is an IPv6 address; a node's control "
                                 "socket listens on IPv4 only: give its IPv4 address or host "
                                 "name", param_hint="ADDRESS")
    return endpoint(host, port)


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """What a client needs to reach a secured node: its public key and a trusted pair."""

    server: bytes
    public: bytes
    secret: bytes


_CURVE_META = "zmesh.curve"


def read_key(value: str, what: str) -> bytes:
    """A Z85 CurveZMQ key, given inline or as a file that holds it (NAME.pub, NAME.key)."""
    text = value
    path = Path(value)
    if len(value.strip()) != 40 or path.is_file():
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{what}: {value!r} is neither a 40-character Z85 key nor a "
                              f"readable key file ({exc.strerror})") from exc
    return _check_key(text, f"{what} {value}")


def load_curve(server_key: str | None, secret_key_file: str | None) -> CurveKeys | None:
    """The keys of --server-key and --secret-key-file (None when neither is given)."""
    if server_key is None and secret_key_file is None:
        return None
    if server_key is None or secret_key_file is None:
        raise click.UsageError("--server-key and --secret-key-file go together: the node's "
                               "public key and a key pair the node trusts")
    if secret_key_file.endswith(".pub"):
        raise click.UsageError(f"--secret-key-file {secret_key_file} looks like a public key; "
                               "pass the NAME.key beside it")
    secret = read_key(secret_key_file, "--secret-key-file")
    return CurveKeys(read_key(server_key, "--server-key"), zmq.curve_public(secret), secret)


def current_curve() -> CurveKeys | None:
    """The keys given to the running command, if any."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_CURVE_META)


def add_curve_options(cmd: click.Command) -> click.Command:
    """Give a command that talks to a node's control socket --server-key and
    --secret-key-file; its requests pick the keys up through ``current_curve()``."""
    cmd.params.extend([
        click.Option(["--server-key"], metavar="KEY|FILE",
                     help="The node's public key (its NAME.pub, or the 'pk' of its mDNS "
                          "record), for a node secured with CurveZMQ."),
        click.Option(["--secret-key-file"], metavar="FILE", type=click.Path(dir_okay=False),
                     help="Your secret key (NAME.key from `zmesh keys generate`); its "
                          "NAME.pub must be in the node's trusted_keys_dir."),
    ])
    callback = cmd.callback
    assert callback is not None

    @functools.wraps(callback)
    def with_keys(*args: Any, **kwargs: Any) -> Any:
        keys = load_curve(kwargs.pop("server_key"), kwargs.pop("secret_key_file"))
        click.get_current_context().meta[_CURVE_META] = keys
        return callback(*args, **kwargs)

    cmd.callback = with_keys
    return cmd


def _no_reply(address: str, what: str, timeout_s: float, keys: CurveKeys | None,
              why: str | None = None) -> CliError:
    if why is not None:
        return CliError(f"no {what} reply from {address} within {timeout_s:g}s: {why}")
    if keys is None:
        hint = ("It may be a secured node (CurveZMQ; secret_key_file in its [node] table): "
                "then pass --server-key (its NAME.pub) and --secret-key-file (a key pair "
                "whose .pub is in its trusted_keys_dir)")
    else:
        hint = ("With keys given: check that --server-key is this node's public key and that "
                "the .pub of --secret-key-file is in its trusted_keys_dir (the node counts "
                "refusals as auth_denied and handshakes_failed)")
    return CliError(f"no {what} reply from {address} within {timeout_s:g}s: is a zmesh "
                    f"node's control socket listening there? {hint}")


def request(address: str, msg: StatusRequest | AdminRequest, timeout_s: float,
            keys: CurveKeys | None = None, what: str = "status") -> Control:
    """Send one request to the control socket at ``address`` and return the matching
    reply; ``keys`` (default: the command's --server-key/--secret-key-file) for CURVE."""
    ep = control_endpoint(address)
    keys = keys or current_curve()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    watch = HandshakeWatch(sock)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        if keys is not None:
            sock.curve_serverkey = keys.server
            sock.curve_publickey = keys.public
            sock.curve_secretkey = keys.secret
        try:
            sock.connect(ep)
        except zmq.ZMQError as exc:  # an address ZeroMQ cannot parse ("a b:1")
            raise click.BadParameter(f"address {address!r}: ZeroMQ cannot connect to {ep} "
                                     f"({exc})", param_hint="ADDRESS") from exc
        sock.send(encode_control(msg))
        want = StatusReply if isinstance(msg, StatusRequest) else AdminReply
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sock.poll(max(1, int(remaining * 1000))):
                raise _no_reply(address, what, timeout_s, keys, watch.why(keys is not None))
            try:
                reply = decode_control(sock.recv(zmq.NOBLOCK))
            except (DecodeError, zmq.Again):
                continue
            if isinstance(reply, want) and reply.token == msg.token:
                return reply
    finally:
        sock.disable_monitor()
        watch.close()
        sock.close(linger=0)
        ctx.term()


def request_status(address: str, timeout_s: float, keys: CurveKeys | None = None) -> dict:
    """Ask the node whose control socket is at ``address`` for its status."""
    reply = request(address, StatusRequest(secrets.randbits(62)), timeout_s, keys)
    assert isinstance(reply, StatusReply)
    if "refused" in reply.status:  # (a banned address, a key not permitted)
        raise CliError(f"{address} refused the status request: {reply.status['refused']}")
    return reply.status


def request_admin(address: str, op: str, args: dict, timeout_s: float,
                  keys: CurveKeys | None = None) -> Any:
    """Run an operator's request (dead_letters, replay, purge) at the node; an error the
    node reports becomes a CliError (exit 1) with its message."""
    reply = request(address, AdminRequest(secrets.randbits(62), op, args), timeout_s, keys,
                    what=op)
    assert isinstance(reply, AdminReply)
    if not reply.ok:
        raise CliError(f"{address} refused {op}: {reply.error}")
    return reply.result


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
