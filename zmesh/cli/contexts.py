"""The contexts file, ``$XDG_CONFIG_HOME/zmesh/contexts.toml`` (``~/.config/zmesh``
without it): named sets of settings (mesh, seeds, interfaces, mDNS, key files, the HTTP
address) that ``zmesh context`` manages. Only the context a command uses is judged: one
that is not valid is kept, listed as invalid and removable (settings.py reads the one
in use).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .._dirs import make_dir
from ..config import NodeConfig, check_name
from ..errors import ConfigError

FILE_NAME = "contexts.toml"


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
    invalid: dict[str, Invalid] = field(default_factory=dict)

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
