"""The command's log lines on stderr: for people on a terminal, one line per record for
files, pipes and journald, or JSON lines for log collectors.

``--log-format`` (ZMESH_LOG_FORMAT): ``auto`` (the default) is ``rich`` when stderr is a
terminal and ``plain`` otherwise; ``plain`` is ``TIME LEVEL LOGGER: MESSAGE`` with any
line break (a traceback's too) written as ``\\n``; ``json`` is one object a record with
``ts``, ``level``, ``logger``, ``msg`` and, for an exception, ``exc``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .output import err_console

FORMATS = ("auto", "plain", "json", "rich")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _stamp(record: logging.LogRecord) -> str:
    """The record's time in UTC, ISO 8601 to the millisecond."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class OneLine(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE`` on one line, whatever the message holds."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_stamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text.replace("\r", "\\r").replace("\n", "\\n")


class JsonLines(logging.Formatter):
    """One JSON object a record."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": _stamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup(level: str, fmt: str) -> None:
    """Send zmesh's records of ``level`` and above to stderr in format ``fmt``."""
    if fmt == "auto":
        fmt = "rich" if err_console.is_terminal else "plain"
    handler: logging.Handler
    if fmt == "rich":
        from rich.logging import RichHandler

        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler()  # (stderr, looked up when each record is written)
        handler.setFormatter(JsonLines() if fmt == "json" else OneLine())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def _not_open_mesh_warning(record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.WARNING and str(record.msg).startswith("mesh %r is open"))


@contextmanager
def quiet_open_mesh() -> Iterator[None]:
    """Leave out the engine's warning that a mesh has no keys while a command's own
    short-lived node runs: it would repeat on every `zmesh pub` and `zmesh sub` of an open
    mesh, where it tells nothing about the mesh's nodes (`zmesh node run` still says it)."""
    engine_log = logging.getLogger("zmesh._engine.engine")
    engine_log.addFilter(_not_open_mesh_warning)
    try:
        yield
    finally:
        engine_log.removeFilter(_not_open_mesh_warning)
