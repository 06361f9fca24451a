"""Where the command's common settings come from: a flag, else its environment variable,
else the context in use, else the default.

A context is a named set of settings (mesh, seeds, interfaces, mDNS, key files, the HTTP
address) kept in ``$XDG_CONFIG_HOME/zmesh/contexts.toml`` (``~/.config/zmesh`` without
it) and managed with ``zmesh context``. The one in use is the ``--context`` (or
``ZMESH_CONTEXT``) one, else the selected one, else none. Every common option has one
environment variable, the same for every subcommand (``ENV``).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from .._dirs import make_dir
from ..config import NodeConfig, check_name, parse_seed
from ..errors import ConfigError

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
FILE_NAME = "contexts.toml"
_NAME_META = "zmesh.context.name"  # (click's meta is shared by a command and its group)
_LOADED_META = "zmesh.context.loaded"


@dataclass(frozen=True, kw_only=True)
class Context:
    """One named set of settings; a field left None (or empty) is not set by it."""

    name: str
    mesh: str | None = None
    seeds: tuple[str, ...] = ()
    interfaces: tuple[str, ...] = ()
    mdns: bool | None = None
    secret_key_file: str | None = None
    trusted_keys_dir: str | None = None
    server_key: str | None = None
    http_address: str | None = None
    description: str = ""

    def settings(self) -> dict[str, Any]:
        """The fields it sets (its name and unset ones left out), in their order."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "name" and getattr(self, f.name) not in (None, (), "")
        }


def config_dir() -> Path:
    """The user's zmesh config directory (XDG_CONFIG_HOME honoured)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "zmesh"


@dataclass(frozen=True, slots=True)
class Invalid:
    """A context of the file that is not valid: kept as the file has it (``table``), listed
    as invalid (``why``), removable; a command that uses it fails, saying why."""

    name: str
    table: object
    why: str


@dataclass(frozen=True)
class Contexts:
    """The contexts file: every valid context, the invalid ones, and the selected one's
    name (which may name neither: ``active()`` says so when a command uses it)."""

    path: Path
    contexts: dict[str, Context]
    selected: str | None = None
    invalid: dict[str, Invalid] = dataclass_field(default_factory=dict)

    @classmethod
    def read(cls) -> Contexts:
        """The file's contexts; a file that cannot be read, or whose layout is wrong, is
        a ConfigError, but a context that is not valid is one only when it is used."""
        path = config_dir() / FILE_NAME
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the contexts file: {exc}") from exc
        tables = data.get("contexts", {})
        selected = data.get("selected")
        if (
            not isinstance(tables, dict)
            or set(data) - {"contexts", "selected"}
            or not isinstance(selected, str | None)
        ):
            raise ConfigError(
                f"{path}: holds 'selected' (a context's name) and [contexts.NAME] tables only"
            )
        contexts: dict[str, Context] = {}
        invalid: dict[str, Invalid] = {}
        for name, table in tables.items():
            try:
                contexts[name] = _parse(name, table)
            except ConfigError as exc:
                invalid[name] = Invalid(name, table, str(exc))
        return cls(path, contexts, selected, invalid)

    def names(self) -> set[str]:
        """Every context's name, valid or not."""
        return set(self.contexts) | set(self.invalid)

    def without(self, name: str) -> Contexts:
        """The file without context ``name`` (if it was selected, none is any more)."""
        return Contexts(
            self.path,
            {n: c for n, c in self.contexts.items() if n != name},
            None if self.selected == name else self.selected,
            {n: c for n, c in self.invalid.items() if n != name},
        )

    def write(self) -> None:
        """Replace the file at once (a reader never sees half of it); an invalid context
        is written back as the file had it."""
        make_dir(self.path.parent, "config directory", ConfigError)
        lines = ["# zmesh contexts: written by `zmesh context add/select/rm`."]
        if self.selected is not None:
            lines.append(f"selected = {_toml(self.selected)}")
        tables: dict[str, dict[str, Any]] = {n: c.settings() for n, c in self.contexts.items()}
        loose = {}  # (invalid ones that are not even a table: `[contexts]` x = 5)
        for name, bad in self.invalid.items():
            if isinstance(bad.table, dict):
                tables[name] = bad.table
            else:
                loose[name] = bad.table
        if loose:
            lines += ["", "[contexts]"]
            lines += [f"{_key(name)} = {_toml(value)}" for name, value in sorted(loose.items())]
        for name, table in sorted(tables.items()):
            lines += ["", f"[contexts.{_toml(name)}]"]
            lines += [f"{_key(key)} = {_toml(value)}" for key, value in table.items()]
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o600)
        os.replace(tmp, self.path)

    def with_selected(self, name: str | None) -> Contexts:
        return Contexts(self.path, self.contexts, name, self.invalid)


def _parse(name: str, table: object) -> Context:
    """The context a [contexts.NAME] table sets, checked; ConfigError saying what is wrong."""
    known = {f.name for f in fields(Context)} - {"name"}
    if not isinstance(table, dict):
        raise ConfigError(f"a context is a table of settings, got {table!r}")
    if unknown := set(table) - known:
        raise ConfigError(
            f"unknown setting {', '.join(sorted(unknown))}; a context may set "
            f"{', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
    try:
        return checked(Context(name=name, **values))
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml(key)


def _toml(value: object) -> str:
    """A value as TOML has it: a str, bool, number, date or time, list (or tuple) or
    table (what a contexts file may hold, valid or not)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # (inf and nan as TOML spells them)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    # JSON's escapes are TOML's, but for DEL, which TOML wants escaped too.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def checked(context: Context) -> Context:
    """``context`` with its values checked (ConfigError saying which is wrong); key files
    and directories made absolute, so the context works from any directory."""
    check_name("context", context.name)
    NodeConfig(
        name="check",
        data_dir="-",
        mesh=context.mesh or "default",
        seeds=context.seeds,
        interfaces=context.interfaces,
    )
    if context.mdns is not None and not isinstance(context.mdns, bool):
        raise ConfigError(f"mdns must be true or false, got {context.mdns!r}")
    paths: dict[str, Any] = {
        k: str(Path(v).expanduser().absolute())
        for k in ("secret_key_file", "trusted_keys_dir", "server_key")
        if isinstance(v := getattr(context, k), str) and (k != "server_key" or _key_file(v))
    }
    return replace(context, **paths)


def _key_file(server_key: str) -> bool:
    """Whether a --server-key names a file, not a Z85 key itself (as client.read_key
    reads it: a key is 40 characters, unless a file of that name exists)."""
    return len(server_key.strip()) != 40 or Path(server_key).is_file()


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
