"""Per-topic permissions of CurveZMQ keys: the ACL file a node reads (``acl_file``).

::

    # Keys are named by their .pub file in trusted_keys_dir ("sensor-1" is
    # sensor-1.pub), or given as the 40-character Z85 text; groups name several.
    [groups]
    sensors = ["sensor-1", "sensor-2"]
    operators = ["alice"]

    [[allow]]
    who = ["sensors"]                  # groups, key names, keys
    publish = ["metrics.>"]            # topics it may publish (its data is taken)

    [[allow]]
    who = ["agg-1"]
    subscribe = ["metrics.>", "alerts.*"]   # topics it may consume (and replay)

    [[allow]]
    who = ["operators"]
    admin = ["status", "dlq", "group"]      # or ["*"]

A topic pattern is dot-separated tokens, ``*`` standing for one token and ``>`` for one
or more at the end. With an ACL file, a key may do only what some ``[[allow]]`` grants
it; the node's own key may do everything (it is the node's own application). Whatever
else the file holds is an error that names the file and the entry.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._security import _check_key, read_key
from .errors import ConfigError

ADMIN_RIGHTS = frozenset({"status", "dlq", "group"})
# The operations of the control socket's admin requests, by the right they need.
ADMIN_OPS = {
    "dead_letters": "dlq",
    "replay": "dlq",
    "purge": "dlq",
    "groups": "group",
    "group_rm": "group",
}


def covers(pattern: str, topic: str) -> bool:
    """Whether ``pattern`` covers ``topic``, a topic name or itself a pattern (a
    subscription to ``metrics.*`` needs a grant that covers every topic it can match)."""
    tokens, want = pattern.split("."), topic.split(".")
    for i, token in enumerate(tokens):
        if token == ">":
            return i < len(want)
        if i >= len(want) or want[i] == ">" or token not in ("*", want[i]):
            return False
    return len(tokens) == len(want)


@dataclass(slots=True)
class Rights:
    """What one key may do."""

    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)
    admin: set[str] = field(default_factory=set)


class Acl:
    """The permissions of an ACL file, by key."""

    def __init__(self, path: str, rights: dict[bytes, Rights]) -> None:
        self.path = path
        self.rights = rights

    def may(self, key: bytes, action: str, what: str) -> bool:
        """Whether ``key`` may ``publish`` or ``subscribe`` topic ``what``, or use the
        admin right ``what`` (``admin``)."""
        rights = self.rights.get(key)
        if rights is None:
            return False
        if action == "admin":
            return what in rights.admin
        patterns = rights.publish if action == "publish" else rights.subscribe
        return any(covers(p, what) for p in patterns)

    @classmethod
    def load(cls, path: str, trusted_keys_dir: str | None) -> Acl:
        """Read the ACL file; ConfigError naming the file and what is wrong in it."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"acl_file {path}: cannot read it: {why}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"acl_file {path}: invalid TOML: {exc}") from exc
        unknown = set(data) - {"groups", "allow"}
        if unknown:
            raise ConfigError(
                f"acl_file {path}: unknown table(s) {sorted(unknown)}; it has "
                "[groups] and [[allow]] tables"
            )
        groups = data.get("groups", {})
        if not isinstance(groups, dict):
            raise ConfigError(f"acl_file {path}: [groups] must be a table of lists")
        names = _Names(path, trusted_keys_dir, groups)
        rights: dict[bytes, Rights] = {}
        allows = data.get("allow", [])
        if not isinstance(allows, list):
            raise ConfigError(f"acl_file {path}: allow must be [[allow]] tables")
        for i, allow in enumerate(allows):
            where = f"acl_file {path}: [[allow]] #{i + 1}"
            if not isinstance(allow, dict):
                raise ConfigError(f"{where} must be a table")
            bad = set(allow) - {"who", "publish", "subscribe", "admin"}
            if bad or "who" not in allow:
                raise ConfigError(
                    f"{where} has who (required), publish, subscribe and admin; got {sorted(allow)}"
                )
            publish = _patterns(allow.get("publish", []), f"{where} publish")
            subscribe = _patterns(allow.get("subscribe", []), f"{where} subscribe")
            admin = _admin(allow.get("admin", []), f"{where} admin")
            for key in names.keys(_strings(allow["who"], f"{where} who"), f"{where} who"):
                r = rights.setdefault(key, Rights())
                r.publish += publish
                r.subscribe += subscribe
                r.admin |= admin
        return cls(path, rights)


class _Names:
    """Resolving the names an ACL file gives keys."""

    def __init__(self, path: str, trusted_keys_dir: str | None, groups: dict[str, Any]) -> None:
        """``groups``: the [groups] table as TOML read it (its members checked here)."""
        self.path = path
        self.dir = Path(trusted_keys_dir) if trusted_keys_dir else None
        self.groups = {
            name: _strings(members, f"acl_file {path}: group {name!r}")
            for name, members in groups.items()
        }

    def keys(
        self, names: Iterable[str], where: str, seen: frozenset[str] = frozenset()
    ) -> set[bytes]:
        out: set[bytes] = set()
        for name in names:
            if name in self.groups:
                if name in seen:
                    raise ConfigError(f"{where}: group {name!r} contains itself")
                out |= self.keys(
                    self.groups[name], f"acl_file {self.path}: group {name!r}", seen | {name}
                )
            elif self.dir is not None and (self.dir / f"{name}.pub").is_file():
                pub = self.dir / f"{name}.pub"
                out.add(read_key(pub))
            elif len(name.strip()) == 40:
                out.add(_check_key(name, where))
            else:
                raise ConfigError(
                    f"{where}: {name!r} is neither a group, nor a key's name "
                    f"(NAME.pub in trusted_keys_dir), nor a 40-character key"
                )
        return out


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings, got {value!r}")
    return value


def _patterns(value: Any, where: str) -> list[str]:
    out = _strings(value, where)
    for p in out:
        tokens = p.split(".")
        if (
            not p
            or "" in tokens
            or ">" in tokens[:-1]
            or any(t not in ("*", ">") and any(c in t for c in "*>") for t in tokens)
        ):
            raise ConfigError(
                f"{where}: {p!r} is not a topic pattern (dot-separated "
                "tokens; '*' one token, '>' the rest, at the end)"
            )
    return out


def _admin(value: Any, where: str) -> set[str]:
    out = set(_strings(value, where))
    if "*" in out:
        return set(ADMIN_RIGHTS)
    if out - ADMIN_RIGHTS:
        raise ConfigError(
            f"{where}: unknown right(s) {sorted(out - ADMIN_RIGHTS)}; known: "
            f"{sorted(ADMIN_RIGHTS)} or '*'"
        )
    return out
