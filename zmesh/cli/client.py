"""Plumbing shared by the commands that talk to a node's control socket (status,
operators' requests, CurveZMQ client keys), and stop signals.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import zmq
from click.core import ParameterSource

from .._protocol.addresses import endpoint
from .._protocol.codec import decode_control, encode_control
from .._protocol.frames import (
    AdminReply,
    AdminRequest,
    Control,
    StatusReply,
    StatusRequest,
    random_token,
)
from .._security import _check_key
from .._seeds import unresolved
from .._waits import poll_ms
from ..config import parse_seed
from ..errors import ConfigError, DecodeError
from .output import CliError
from .refusal import HandshakeWatch
from .settings import ENV, common, source
from .stopflag import StopFlag


def control_endpoint(address: str) -> str:
    """``host:port`` (or ``tcp://host:port``) as a tcp endpoint; usage error otherwise."""
    raw = address.removeprefix("tcp://")
    try:
        host, port = parse_seed(raw, what="address")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from exc
    if ":" in host:  # (parse_seed takes IPv6 literals in addresses other than seeds)
        raise click.BadParameter(
            f"address {address!r} is an IPv6 address; a node's control "
            "socket listens on IPv4 only: give its IPv4 address or host "
            "name",
            param_hint="ADDRESS",
        )
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
            raise ConfigError(
                f"{what}: {value!r} is neither a 40-character Z85 key nor a "
                f"readable key file ({exc.strerror})"
            ) from exc
    return _check_key(text, f"{what} {value}")


def load_curve(
    server_key: str | None, secret_key_file: str | None, secret_from_flag: bool = True
) -> CurveKeys | None:
    """The keys of --server-key and --secret-key-file (None when neither is given, or when
    only a secret key came from the environment or a context, where it serves the
    commands that join the mesh)."""
    if server_key is None and (secret_key_file is None or not secret_from_flag):
        return None
    if server_key is None or secret_key_file is None:
        raise click.UsageError(
            "--server-key and --secret-key-file go together: the node's "
            "public key and a key pair the node trusts"
        )
    if secret_key_file.endswith(".pub"):
        raise click.UsageError(
            f"--secret-key-file {secret_key_file} looks like a public key; "
            "pass the NAME.key beside it"
        )
    secret = read_key(secret_key_file, _named("secret_key_file", "--secret-key-file"))
    server = read_key(server_key, _named("server_key", "--server-key"))
    return CurveKeys(server, zmq.curve_public(secret), secret)


def _named(name: str, option: str) -> str:
    """How an error names a setting: its option, or its variable when it came from it."""
    return ENV[name] if source(name) == ParameterSource.ENVIRONMENT else option


def current_curve() -> CurveKeys | None:
    """The keys given to the running command, if any."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_CURVE_META)


def add_curve_options(cmd: click.Command) -> click.Command:
    """Give a command that talks to a node's control socket --server-key and
    --secret-key-file (and --context); its requests pick the keys up through
    ``current_curve()``."""
    callback = cmd.callback
    assert callback is not None

    @functools.wraps(callback)
    def with_keys(*args: Any, **kwargs: Any) -> Any:
        from_flag = source("secret_key_file") == ParameterSource.COMMANDLINE
        keys = load_curve(kwargs.pop("server_key"), kwargs.pop("secret_key_file"), from_flag)
        click.get_current_context().meta[_CURVE_META] = keys
        return callback(*args, **kwargs)

    common("server_key", "secret_key_file")(with_keys)
    cmd.params.extend(reversed(with_keys.__click_params__))  # type: ignore[attr-defined]
    cmd.callback = with_keys
    return cmd


def _no_reply(
    address: str, what: str, timeout_s: float, keys: CurveKeys | None, why: str | None = None
) -> CliError:
    if why is not None:
        return CliError(f"no {what} reply from {address} within {timeout_s:g}s: {why}")
    if keys is None:
        hint = (
            "It may be a secured node (CurveZMQ; secret_key_file in its [node] table): "
            "then pass --server-key (its NAME.pub) and --secret-key-file (a key pair "
            "whose .pub is in its trusted_keys_dir)"
        )
    else:
        hint = (
            "With keys given: check that --server-key is this node's public key and that "
            "the .pub of --secret-key-file is in its trusted_keys_dir (the node counts "
            "refusals as auth_denied and handshakes_failed)"
        )
    return CliError(
        f"no {what} reply from {address} within {timeout_s:g}s: is a zmesh "
        f"node's control socket listening there? {hint}"
    )


def _reply(
    sock: zmq.Socket[bytes],
    want: type[StatusReply] | type[AdminReply],
    token: int,
    timeout_s: float,
) -> Control | None:
    """The reply of kind ``want`` to the request ``token`` on ``sock`` within
    ``timeout_s`` (others are passed over); None when none came."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0 and sock.poll(poll_ms(left)):
        try:
            reply = decode_control(sock.recv(zmq.NOBLOCK))
        except (DecodeError, zmq.Again):
            continue
        if isinstance(reply, want) and reply.token == token:
            return reply
    return None


def request(
    address: str,
    msg: StatusRequest | AdminRequest,
    timeout_s: float,
    keys: CurveKeys | None = None,
    what: str = "status",
) -> Control:
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
            raise click.BadParameter(
                f"address {address!r}: ZeroMQ cannot connect to {ep} ({exc})", param_hint="ADDRESS"
            ) from exc
        sock.send(encode_control(msg))
        want = StatusReply if isinstance(msg, StatusRequest) else AdminReply
        reply = _reply(sock, want, msg.token, timeout_s)
        if reply is None:
            why = watch.why(keys is not None, ep) or unresolved(address)
            raise _no_reply(address, what, timeout_s, keys, why)
        return reply
    finally:
        sock.disable_monitor()
        watch.close()
        sock.close(linger=0)
        ctx.term()


def request_status(address: str, timeout_s: float, keys: CurveKeys | None = None) -> dict[str, Any]:
    """Ask the node whose control socket is at ``address`` for its status."""
    reply = request(address, StatusRequest(random_token()), timeout_s, keys)
    assert isinstance(reply, StatusReply)
    if "refused" in reply.status:  # (a banned address, a key not permitted)
        raise CliError(f"{address} refused the status request: {reply.status['refused']}")
    return reply.status


def request_admin(
    address: str, op: str, args: dict[str, Any], timeout_s: float, keys: CurveKeys | None = None
) -> Any:
    """Run an operator's request (dead_letters, replay, purge) at the node; an error the
    node reports becomes a CliError (exit 1) with its message."""
    reply = request(address, AdminRequest(random_token(), op, args), timeout_s, keys, what=op)
    assert isinstance(reply, AdminReply)
    if not reply.ok:
        raise CliError(f"{address} refused {op}: {reply.error}")
    return reply.result


class Interrupted(Exception):
    """A stop signal came while a ``StopSignals.interruptible()`` block was blocked."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) set a flag (``StopFlag``) instead of
    raising, while installed.

    A command that runs until stopped waits on ``stop`` and then closes its node cleanly.
    A read that would not return until data comes (stdin) runs in ``interruptible()``:
    there a stop signal raises ``Interrupted``, as Python retries a read a signal
    interrupts when its handler returns (PEP 475).
    """

    def __init__(self) -> None:
        self.stop = StopFlag()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self._raising = False

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum
        self.stop.set()
        if self._raising:
            self._raising = False  # (once: the code that handles it is not interrupted)
            raise Interrupted

    @property
    def exit_code(self) -> int:
        """A run a signal stopped exits 128 + its number: 130 (SIGINT), 143 (SIGTERM), 129
        (SIGHUP)."""
        return 128 + (self.signum or signal.SIGINT)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A block a stop signal ends with ``Interrupted`` (also when one came before):
        only for a blocking read, whose interrupted state nothing needs afterwards."""
        self._raising = True
        try:
            if self.stop.is_set():  # (a signal just before: its handler did not raise)
                raise Interrupted
            yield
        finally:
            self._raising = False

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
