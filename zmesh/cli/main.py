"""The ``zmesh`` click group and its entry point.

Exit codes, the same for every command:

\b
  0    success
  1    a zmesh error or a failed run: no reply from a node, no node found by `ls`,
       messages not acknowledged within `pub --timeout`, fewer than `sub --count`
       within `sub --timeout`, a doctor check failed, lost messages in `demo`
  2    bad usage or bad configuration (an option, a setting, a definition file, a
       context), which running again will not fix
  3    `pub`: every message settled, but some group did not acknowledge one (it was
       dead-lettered, expired, superseded, or its group deleted); `request`: the
       responder's function failed (with --many: some responder's)
  130  stopped by SIGINT (Ctrl-C); 143 stopped by SIGTERM (`pub`, `sub`, `request`,
       `reply`; `node run` exits 0 after either: that is how a service is stopped)
  141  the reader of its output went away (`zmesh sub t | head -1`): it ends quietly,
       as a command SIGPIPE killed
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from .. import __version__
from ..errors import ArgumentError, ConfigError, ZMeshError
from . import logs
from .bench import bench
from .client import add_curve_options
from .context import context
from .demo import demo
from .dlq import dlq
from .doctor import doctor
from .group import group
from .keys import keys, snapshot
from .ls import ls
from .noderun import node
from .output import READER_GONE, drop_stdout, print_error
from .pub import pub
from .request import reply, request
from .settings import ENV, OPTIONS, EnvOption, StrChoice, env_help
from .status import peers, status
from .store import store
from .sub import sub
from .top import top
from .web import web

LOG_LEVEL_ENV = ENV["log_level"]


class _Zmesh(click.Group):
    """The command group: a command whose stdout's reader went away (`zmesh sub t |
    head -1`) ends quietly with 141, as one a SIGPIPE killed (click would say nothing
    and exit 1: a failed run)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            drop_stdout()
            raise click.exceptions.Exit(READER_GONE) from None


EXAMPLES = """\b
Examples:
  zmesh demo                                 # a producer, two groups, a crash, no loss
  zmesh node run nodes/aggregator.toml       # a node from its definition
  zmesh context add plant --mesh plant --seed 10.0.0.5:41000 --select
  zmesh sub readings --group ops --json      # one JSON object per message
  zmesh pub readings '{"sensor": "line-4", "temp_c": {{Count}}}' --count 10 --key line-4
  zmesh status                               # the context's seed node: lanes, peers
  ZMESH_LOG_FORMAT=json zmesh node run nodes/sensor.toml 2>>sensor.log
"""


@click.group(cls=_Zmesh, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXAMPLES)
@click.option(
    "--log-level",
    type=StrChoice(logs.LEVELS, case_sensitive=False),
    cls=EnvOption,
    default="WARNING",
    show_default=True,
    envvar=LOG_LEVEL_ENV,
    help=env_help("Level of zmesh's own log lines (on stderr).", "log_level"),
)
@click.option(
    "--log-format",
    type=StrChoice(logs.FORMATS, case_sensitive=False),
    cls=EnvOption,
    default="auto",
    show_default=True,
    envvar=ENV["log_format"],
    help=env_help(
        "auto: rich on a terminal, else plain (one line a record); json: one object a line.",
        "log_format",
    ),
)
@OPTIONS["context"]
@click.version_option(__version__, prog_name="zmesh")
def cli(log_level: str, log_format: str) -> None:
    """zmesh: brokerless publish/subscribe with mDNS discovery and an LMDB outbox.

    Start with `zmesh demo`, which runs a producer and two consumer groups on loopback,
    crashes a consumer on purpose and shows that nothing is lost. Common settings come
    from a flag, else its ZMESH_* environment variable, else the context in use (`zmesh
    context`), else the default.
    """
    logs.setup(log_level, log_format.lower())


for _command in (
    demo,
    pub,
    sub,
    request,
    reply,
    add_curve_options(status),
    add_curve_options(peers),
    node,
    top,
    dlq,
    group,
    ls,
    web,
    context,
    keys,
    snapshot,
    store,
    doctor,
    bench,
):
    cli.add_command(_command)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code (errors become one line, no traceback)."""
    if sys.stdin is None:  # (started with stdin closed, `0<&-`: as if it were empty)
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's own, for its life
    if sys.stdout is None:  # (stdout closed, `1>&-`, as a supervisor may: as /dev/null)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the process's own, for its life
    try:
        rv = cli.main(
            args=list(argv) if argv is not None else None, prog_name="zmesh", standalone_mode=False
        )
    except click.exceptions.Abort:
        print_error("interrupted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (ConfigError, ArgumentError) as exc:
        print_error(str(exc))
        return 2
    except ZMeshError as exc:
        print_error(str(exc))
        return 1
    except OSError as exc:  # the last resort: a file or directory that could not be used
        where = f": {exc.filename}" if exc.filename else ""
        print_error(f"{exc.strerror or exc}{where}")
        return 1
    except UnicodeError as exc:  # (bad input too: an argument or a file that is no text)
        print_error(f"not valid text: {exc}")
        return 2
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
