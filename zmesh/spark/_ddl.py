"""``payloadSchema``: the fields a source decodes from each payload, a Spark DDL string
checked here on its own.

Spark parses the source's schema whole (its columns, then ``payloadSchema``), so a typo
there was reported at the source's own columns; a type the decoder cannot fill gave nulls
or wrong values, and a NOT NULL field one a payload lacks failed deep in the JVM. So the
user's DDL is parsed here, before Spark sees it: what it cannot take is refused naming the
option, and Spark is given the same fields back, each name quoted.
"""

from __future__ import annotations

import re

from ..errors import ArgumentError

# The types payloadSchema takes, each by its Spark names (decimal, string, array, map and
# struct are parsed apart).
SIMPLE = {
    "boolean": "boolean",
    "tinyint": "tinyint",
    "byte": "tinyint",
    "smallint": "smallint",
    "short": "smallint",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "long": "bigint",
    "float": "float",
    "real": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "binary": "binary",
}
DECIMALS = ("decimal", "dec", "numeric")
MAX_PRECISION = 38
TAKES = (
    "boolean, tinyint, smallint, int, bigint, float, double, decimal(p,s), string, binary, "
    "date, timestamp, timestamp_ntz, and array<...>, map<string,...>, struct<...> of them"
)
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<quoted>`(?:[^`]|``)*`)
    | (?P<text>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<word>\w+)
    | (?P<mark>[<>(),:])
    | (?P<other>\S)
    )""",
    re.VERBOSE | re.DOTALL,
)


def payload_ddl(text: str) -> str:
    """The fields of ``text`` (payloadSchema) as DDL for Spark; ArgumentError naming the
    option when it is not DDL of fields the source decodes."""
    return _Parser(text).fields()


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []  # (kind, token)
        pos = 0
        while (m := _TOKEN.match(text, pos)) and m.lastgroup:
            self.tokens.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.at = 0
        self.path = ""  # the last field's

    def fail(self, what: str) -> ArgumentError:
        return ArgumentError(f"option payloadSchema {self.text!r}: {what}")

    def peek(self) -> str:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else ""

    def take(self, token: str) -> bool:
        if self.peek().lower() == token:
            self.at += 1
            return True
        return False

    def expect(self, token: str, where: str) -> None:
        if not self.take(token):
            raise self.fail(f"expected {token!r} {where}, found {self._found()}")

    def _found(self) -> str:
        return repr(self.peek()) if self.peek() else "the end"

    def _next(self, kinds: tuple[str, ...], what: str) -> str:
        if self.at >= len(self.tokens) or self.tokens[self.at][0] not in kinds:
            raise self.fail(f"expected {what}, found {self._found()}")
        self.at += 1
        return self.tokens[self.at - 1][1]

    def fields(self) -> str:
        out = [self.field(None)]
        while self.take(","):
            out.append(self.field(None))
        if self.peek():
            raise self.fail(f"expected ',' after field {self.path}, found {self._found()}")
        return ", ".join(out)

    def field(self, parent: str | None) -> str:
        """One field, ``name type [COMMENT '...']`` (a struct's: ``name: type``), as DDL."""
        after = "a field name" if parent is None else f"a field name in {parent}"
        raw = self._next(("word", "quoted"), after)
        name = raw[1:-1].replace("``", "`") if raw.startswith("`") else raw
        path = name if parent is None else f"{parent}.{name}"
        self.take(":")
        typ = self.type(path)
        if self.take("not"):
            self.expect("null", f"after NOT in field {path}")
            raise self.fail(
                f"field {path} is NOT NULL, but a payload may lack it or not decode: every "
                "decoded field is nullable (drop NOT NULL)"
            )
        comment = ""
        if self.take("comment"):
            comment = " COMMENT " + self._next(("text",), f"a quoted comment for field {path}")
        self.path = path
        return f"{_quote(name)}{' ' if parent is None else ': '}{typ}{comment}"

    def type(self, path: str) -> str:
        word = self._next(("word",), f"a type for field {path}")
        low = word.lower()
        if low in SIMPLE:
            return SIMPLE[low]
        if low == "string":
            if self.take("collate"):
                return f"string collate {self._next(('word',), 'a collation name')}"
            return "string"
        if low in DECIMALS:
            return self.decimal(path)
        if low == "array":
            self.expect("<", f"after array in field {path}")
            item = self.type(path)
            self.expect(">", f"after array<{item} in field {path}")
            return f"array<{item}>"
        if low == "map":
            self.expect("<", f"after map in field {path}")
            key = self.type(path)
            if key.split()[0] != "string":
                raise self.fail(f"map<{key},...> of field {path}: a map's keys must be strings")
            self.expect(",", f"after map<{key} in field {path}")
            value = self.type(path)
            self.expect(">", f"after map<{key},{value} in field {path}")
            return f"map<{key},{value}>"
        if low == "struct":
            self.expect("<", f"after struct in field {path}")
            parts = [self.field(path)]
            while self.take(","):
                parts.append(self.field(path))
            self.expect(">", f"after the last field of struct {path}")
            return f"struct<{', '.join(parts)}>"
        raise self.fail(
            f"field {path} has type {word!r}, which payloadSchema does not take: {TAKES}"
        )

    def decimal(self, path: str) -> str:
        precision, scale = 10, 0  # (Spark's decimal)
        if self.take("("):
            precision = self.number(path)
            if self.take(","):
                scale = self.number(path)
            self.expect(")", f"after decimal({precision},{scale} in field {path}")
        if not (1 <= precision <= MAX_PRECISION and 0 <= scale <= precision):
            raise self.fail(
                f"decimal({precision},{scale}) of field {path}: the precision must be 1 to "
                f"{MAX_PRECISION} and the scale 0 to the precision"
            )
        return f"decimal({precision},{scale})"

    def number(self, path: str) -> int:
        word = self._next(("word",), f"a number in the decimal of field {path}")
        if not (word.isascii() and word.isdigit()):
            raise self.fail(f"expected a number in the decimal of field {path}, found {word!r}")
        return int(word)
