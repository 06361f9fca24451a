"""Subjects: topic names as dot-separated tokens, and patterns that match many of them.

A topic name is tokens joined by ``.`` (``plant.line4.temp``): each token one or more
ASCII letters, digits, ``_`` or ``-``, the first token starting with a letter or a digit, at
most 128 characters in all. A *pattern* (what a subscription, a topic setting or
``Node.last`` may name) may also hold ``*``, which matches exactly one token, and, as its
last token only, ``>``, which matches one or more: NATS's rules. ``plant.*.temp``
matches ``plant.line4.temp``, not ``plant.temp`` nor ``plant.line4.a.temp``;
``plant.>`` matches ``plant.line4`` and ``plant.line4.temp``, not ``plant``. A topic
that is published is never a pattern.

Matching many patterns against a topic walks a token trie (``SubjectTrie``): the cost
depends on the topic's tokens and on the wildcards met on the way, not on how many
patterns are held. ``SubjectMap`` adds names without wildcards (a dict) and a cache of
the answers per topic, so a topic asked about again costs one dict lookup. Caches per
topic hold ``CACHED_TOPICS`` topics at most, emptied when full: topics come and go (one
per device), and a cache of every topic ever asked about would grow without bound.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import TopicConfig

T = TypeVar("T")

MAX_SUBJECT_CHARS = 128
ONE = "*"  # matches exactly one token
REST = ">"  # matches one or more tokens, as a pattern's last token
CACHED_TOPICS = 4096
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]+\Z")
_FIRST_RE = re.compile(r"^[A-Za-z0-9*>]")


def is_pattern(name: str) -> bool:
    """Whether a (valid) name holds a wildcard."""
    return ONE in name or REST in name


def subject_error(kind: str, value: object, wildcards: bool) -> str | None:
    """Why ``value`` is not a valid topic name (``wildcards``: or pattern); None if it is."""
    if not isinstance(value, str) or not value:
        return "it is not a non-empty string"
    if len(value) > MAX_SUBJECT_CHARS:
        return f"it has {len(value)} characters, more than {MAX_SUBJECT_CHARS}"
    if not _FIRST_RE.match(value):
        return "it must start with a letter or a digit (ASCII)"
    tokens = value.split(".")
    for i, token in enumerate(tokens):
        if token in (ONE, REST):
            if not wildcards:
                return f"{token!r} is a wildcard: a {kind} that is published names one topic"
            if token == REST and i != len(tokens) - 1:
                return "'>' may only be its last token"
        elif not token:
            return "it has an empty token (two dots in a row, or a dot at an end)"
        elif not _TOKEN_RE.match(token):
            return (
                f"token {token!r} holds a character other than ASCII letters, digits, '_' and '-'"
            )
    return None


def check_subject(kind: str, value: object, *, wildcards: bool = False) -> str:
    """``value`` if it is a valid topic name (``wildcards``: or pattern); ConfigError
    saying why not otherwise."""
    why = subject_error(kind, value, wildcards)
    if why is not None:
        allowed = " ('*' for one token, '>' for the rest)" if wildcards else ""
        raise ConfigError(
            f"{kind} name {value!r} is invalid: {why}. Use tokens of ASCII letters, digits, '_' "
            f"and '-' joined by '.'{allowed}, at most {MAX_SUBJECT_CHARS} characters, "
            "starting with a letter or a digit"
        )
    return value  # type: ignore[return-value]


def specificity(pattern: str) -> tuple[int, ...]:
    """A key that orders the patterns matching one topic, most specific last: token by
    token from the left, a literal beats ``*``, which beats ``>``."""
    return tuple(0 if t == REST else 1 if t == ONE else 2 for t in pattern.split("."))


class _Node(Generic[T]):
    __slots__ = ("children", "values")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.values: list[T] = []


class SubjectTrie(Generic[T]):
    """Values under patterns (or plain names), found by the topics they match."""

    def __init__(self) -> None:
        self._root: _Node[T] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, pattern: str, value: T) -> None:
        node = self._root
        for token in pattern.split("."):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            node = child
        node.values.append(value)
        self._count += 1

    def remove(self, pattern: str, value: T) -> bool:
        """Take one ``value`` off ``pattern``; False when it was not there."""
        path = [self._root]
        tokens = pattern.split(".")
        for token in tokens:
            child = path[-1].children.get(token)
            if child is None:
                return False
            path.append(child)
        if value not in path[-1].values:
            return False
        path[-1].values.remove(value)
        self._count -= 1
        for depth in range(len(tokens), 0, -1):  # (empty branches go)
            node = path[depth]
            if node.values or node.children:
                break
            del path[depth - 1].children[tokens[depth - 1]]
        return True

    def match(self, topic: str) -> list[T]:
        """The values of every pattern that matches ``topic``."""
        tokens = topic.split(".")
        n = len(tokens)
        out: list[T] = []
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == n:
                out.extend(node.values)
                continue
            children = node.children
            rest = children.get(REST)
            if rest is not None:
                out.extend(rest.values)
            literal = children.get(tokens[i])
            if literal is not None:
                stack.append((literal, i + 1))
            one = children.get(ONE)
            if one is not None:
                stack.append((one, i + 1))
        return out


def matcher(pattern: str) -> Callable[[str], bool]:
    """A test of whether ``pattern`` (or a plain name) matches a topic."""
    trie: SubjectTrie[bool] = SubjectTrie()
    trie.add(pattern, True)
    return lambda topic: bool(trie.match(topic))


class SubjectMap(Generic[T]):
    """Values under topic names and patterns; ``match(topic)`` gives those of the name
    itself and of every pattern matching it, cached per topic until the map changes."""

    def __init__(self, items: Iterable[tuple[str, T]] = ()) -> None:
        self._exact: dict[str, list[T]] = {}
        self._trie: SubjectTrie[T] = SubjectTrie()
        self._cache: dict[str, tuple[T, ...]] = {}
        for subject, value in items:
            self.add(subject, value)

    def __bool__(self) -> bool:
        return bool(self._exact) or bool(len(self._trie))

    def add(self, subject: str, value: T) -> None:
        if is_pattern(subject):
            self._trie.add(subject, value)
            self._cache.clear()
        else:
            self._exact.setdefault(subject, []).append(value)
            self._cache.pop(subject, None)

    def match(self, topic: str) -> tuple[T, ...]:
        found = self._cache.get(topic)
        if found is None:
            if len(self._cache) >= CACHED_TOPICS:
                self._cache.clear()
            found = self._cache[topic] = (*self._exact.get(topic, ()), *self._trie.match(topic))
        return found


class TopicConfigs(Mapping[str, "TopicConfig"]):
    """Per-topic settings set by topic name or by pattern. A topic's settings are its
    own, else those of the most specific pattern matching it (``specificity``), else
    None. As a mapping: the names and patterns set, with what was set for each."""

    def __init__(self, configs: Mapping[str, TopicConfig] | None = None) -> None:
        self._set: dict[str, TopicConfig] = {}
        self._patterns: SubjectTrie[str] = SubjectTrie()
        self._resolved: dict[str, TopicConfig | None] = {}
        for name, cfg in (configs or {}).items():
            self[name] = cfg

    def __setitem__(self, name: str, cfg: TopicConfig) -> None:
        if is_pattern(name):
            if name not in self._set:
                self._patterns.add(name, name)
            self._resolved.clear()  # (it may now win for any topic)
        else:
            self._resolved[name] = cfg
        self._set[name] = cfg

    def __getitem__(self, name: str) -> TopicConfig:
        return self._set[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._set)

    def __len__(self) -> int:
        return len(self._set)

    def of(self, topic: str) -> TopicConfig | None:
        """The settings that apply to ``topic`` (None: none were set for it)."""
        try:
            return self._resolved[topic]
        except KeyError:
            pass
        cfg = self._set.get(topic)
        if cfg is None:
            found = self._patterns.match(topic)
            if found:
                cfg = self._set[max(found, key=specificity)]
        if len(self._resolved) >= CACHED_TOPICS:
            self._resolved.clear()
        self._resolved[topic] = cfg
        return cfg

    def patterns_matching(self, topic: str) -> list[str]:
        """The patterns set that match ``topic``."""
        return self._patterns.match(topic)
