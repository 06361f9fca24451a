"""Where the command's common settings come from: a flag, else its environment variable,
else the context in use, else the default.

A context is a named set of settings (mesh, seeds, interfaces, mDNS, key files, the HTTP
address) kept in ``$XDG_CONFIG_HOME/zmesh/contexts.toml`` (``~/.config/zmesh`` without
it) and managed with ``zmesh context``. The one in use is the ``--context`` (or
``ZMESH_CONTEXT``) one, else the selected one, else none. Every common option has one
environment variable, the same for every subcommand (``ENV``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from ..config import NodeConfig, parse_seed
from ..errors import ConfigError
from .contexts import Context, Contexts

# The environment variable of each common setting.
ENV = {
    "context": "ZMESH_CONTEXT",
    "mesh": "ZMESH_MESH",
    "seeds": "ZMESH_SEED",
    "interfaces": "ZMESH_INTERFACE",
    "mdns": "ZMESH_MDNS",
    "secret_key_file": "ZMESH_SECRET_KEY_FILE",
    "trusted_keys_dir": "ZMESH_TRUSTED_KEYS_DIR",
    "server_key": "ZMESH_SERVER_KEY",
    "http_address": "ZMESH_HTTP_ADDRESS",
    "log_level": "ZMESH_LOG_LEVEL",
    "log_format": "ZMESH_LOG_FORMAT",
}
_NAME_META = "zmesh.context.name"  # (click's meta is shared by a command and its group)
_LOADED_META = "zmesh.context.loaded"


def active() -> Context | None:
    """The context of the running command: ``--context`` / ZMESH_CONTEXT, else the
    selected one, else None (read once per command)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    meta = ctx.meta
    if _LOADED_META not in meta:
        doc = Contexts.read()
        name = meta.get(_NAME_META) or doc.selected
        if name is not None and name in doc.invalid:
            raise ConfigError(
                f"{doc.path}: the context {name!r} in use is invalid: "
                f"{doc.invalid[name].why} (fix it with `zmesh context add {name} ... "
                f"--force`, or remove it with `zmesh context rm {name}`)"
            )
        if name is not None and name not in doc.contexts:
            known = ", ".join(sorted(doc.contexts)) or "none yet"
            raise click.UsageError(
                f"no context named {name!r} in {doc.path} (defined: "
                f"{known}; add one with `zmesh context add`)"
            )
        meta[_LOADED_META] = None if name is None else doc.contexts[name]
    return meta[_LOADED_META]


def _use_context(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_NAME_META] = value


def from_context(field: str, fallback: object = None) -> Callable[[], object]:
    """An option's default: the active context's ``field`` when it sets it, else
    ``fallback``."""

    def default() -> object:
        context = active()
        value = None if context is None else getattr(context, field)
        return fallback if value in (None, ()) else value

    return default


def source(name: str) -> ParameterSource | None:
    """Where the running command's parameter ``name`` came from (flag, env, default)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.get_parameter_source(name)


if TYPE_CHECKING:
    # click's parameter types are generic from click 8.4 on; subscripting them fails on the
    # 8.1 to 8.3 zmesh also runs with, so only the type checker sees their parameters.
    StrParamType = click.ParamType[str]
    StrChoice = click.Choice[str]
else:
    StrParamType = click.ParamType
    StrChoice = click.Choice


class Number(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN, which passes every bound (a timeout
    of NaN waited for good)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


class _Addresses(StrParamType):
    """``host:port`` or IPv4 addresses; an environment variable lists them separated by
    commas or spaces."""

    name = "address"

    def split_envvar_value(self, rv: str) -> list[str]:
        return [part for part in re.split(r"[,\s]+", rv) if part]


ADDRESSES = _Addresses()


def env_help(text: str, field: str) -> str:
    """An option's help, naming its environment variable (click's ``show_envvar`` would
    name it in the errors of a flag too)."""
    return f"{text} [env: {ENV[field]}]"


class EnvOption(click.Option):
    """An option whose bad value, when it came from its environment variable, is said to
    have come from there (click names the option alone: '--mesh', when the user set
    ZMESH_MESH)."""

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        try:
            return super().process_value(ctx, value)
        except click.BadParameter as exc:
            envvar = self.envvar if isinstance(self.envvar, str) else None
            if (
                envvar is None
                or self.name is None
                or ctx.get_parameter_source(self.name) != ParameterSource.ENVIRONMENT
            ):
                raise
            said = f"{exc.message.rstrip('.')} (set by the environment variable {envvar})"
            raise click.BadParameter(said, ctx, self) from None


def check_node_setting(field: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option's callback: its value checked as NodeConfig checks ``field`` (mesh,
    seeds, interfaces), a bad one a usage error when the command line is read (not when
    a node starts)."""

    def check(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value not in (None, ()):
            try:
                NodeConfig(name="check", data_dir="-", **{field: value})
            except ConfigError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return check


def _option(*decls: str, field: str, fallback: object = None, help: str, **kw: Any) -> Any:
    return click.option(
        *decls,
        cls=EnvOption,
        envvar=ENV[field],
        default=from_context(field, fallback),
        help=env_help(help, field),
        **kw,
    )


OPTIONS: dict[str, Callable[[Any], Any]] = {
    "context": click.option(
        "--context",
        "context_name",
        envvar=ENV["context"],
        metavar="NAME",
        is_eager=True,
        expose_value=False,
        callback=_use_context,
        help=env_help(
            "Take settings from this context instead of the selected one (flags "
            "and environment variables still come first).",
            "context",
        ),
    ),
    "mesh": _option(
        "--mesh",
        field="mesh",
        fallback="default",
        callback=check_node_setting("mesh"),
        help="Mesh to join; nodes of other meshes are ignored (default: 'default').",
    ),
    "seeds": _option(
        "--seed",
        "seeds",
        field="seeds",
        fallback=(),
        callback=check_node_setting("seeds"),
        multiple=True,
        type=ADDRESSES,
        metavar="HOST:PORT",
        help="Control address of a peer to contact directly (repeatable).",
    ),
    "interfaces": _option(
        "--interface",
        "interfaces",
        field="interfaces",
        fallback=(),
        callback=check_node_setting("interfaces"),
        multiple=True,
        type=ADDRESSES,
        metavar="IP",
        help="Address to bind and to speak mDNS on (repeatable; default: all interfaces).",
    ),
    "mdns": _option(
        "--mdns/--no-mdns",
        field="mdns",
        help="Find peers by multicast DNS (default: on, but off when a seed is given "
        "for pub, sub, request, reply, ls and web, which run a short-lived node of "
        "their own).",
    ),
    "secret_key_file": _option(
        "--secret-key-file",
        field="secret_key_file",
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help="Your CurveZMQ secret key (NAME.key from `zmesh keys generate`), for a secured mesh.",
    ),
    "trusted_keys_dir": _option(
        "--trusted-keys-dir",
        field="trusted_keys_dir",
        metavar="DIR",
        type=click.Path(file_okay=False),
        help="Directory of the .pub keys of the nodes to trust (with --secret-key-file).",
    ),
    "server_key": _option(
        "--server-key",
        field="server_key",
        metavar="KEY|FILE",
        help="The node's public key (its NAME.pub, or the 'pk' of its "
        "mDNS record), for a node secured with CurveZMQ.",
    ),
}


def common(*names: str) -> Callable[[Any], Any]:
    """Decorate a command with the common options ``names`` (in that order), and
    ``--context``."""

    def decorate(fn: Any) -> Any:
        for name in reversed(("context", *names)):
            fn = OPTIONS[name](fn)
        return fn

    return decorate


def target(address: str | None) -> str:
    """The control address a command talks to: the one given, else the first seed of
    ZMESH_SEED or of the context in use."""
    if address:
        return address
    env = ADDRESSES.split_envvar_value(os.environ.get(ENV["seeds"], ""))
    if env:
        try:
            parse_seed(env[0])
        except ConfigError as exc:
            raise click.UsageError(
                f"{exc} (set by the environment variable {ENV['seeds']})"
            ) from None
    context = active()
    seeds = env or (list(context.seeds) if context is not None else [])
    if not seeds:
        raise click.UsageError(
            "give the node's control address HOST:PORT (or set "
            f"{ENV['seeds']}, or use a context with a seed)"
        )
    return seeds[0]


def http_address() -> str | None:
    """The HTTP address of ZMESH_HTTP_ADDRESS or of the context in use (for commands
    that talk to a node's HTTP API)."""
    return os.environ.get(ENV["http_address"]) or from_context("http_address")()  # type: ignore[return-value]
