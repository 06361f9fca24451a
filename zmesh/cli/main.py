"""The ``zmesh`` click group and its entry point.

Exit codes: 0 success; 1 a zmesh error or a failed run (no reply, unacked messages, lost
messages); 2 bad usage or bad configuration; 130 interrupted.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import click
from click.core import ParameterSource

from .. import __version__
from ..errors import ArgumentError, ConfigError, ZMeshError
from .bench import bench
from .client import add_curve_options
from .demo import demo
from .dlq import dlq
from .doctor import doctor
from .keys import keys, snapshot
from .noderun import node
from .output import err_console, print_error
from .pubsub import pub, sub
from .status import peers, status
from .store import store
from .top import top

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_ENV = "ZMESH_LOG_LEVEL"


class _LogLevel(click.Choice):
    """A log level; a bad one says whether it came from --log-level or ZMESH_LOG_LEVEL."""

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> object:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            if ctx is None or param is None or param.name is None or \
                    ctx.get_parameter_source(param.name) != ParameterSource.ENVIRONMENT:
                raise
            self.fail(f"{exc.message.rstrip('.')} (set by the environment variable "
                      f"{LOG_LEVEL_ENV})", param, ctx)


def _setup_logging(level: str) -> None:
    from rich.logging import RichHandler

    handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False)
    logging.basicConfig(level=level.upper(), handlers=[handler], format="%(message)s",
                        force=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", type=_LogLevel(LOG_LEVELS, case_sensitive=False),
              default="WARNING", show_default=True, envvar=LOG_LEVEL_ENV,
              help=f"Level of zmesh's own log lines (written to stderr; or set {LOG_LEVEL_ENV}).")
@click.version_option(__version__, prog_name="zmesh")
@click.pass_context
def cli(ctx: click.Context, log_level: str) -> None:
    """zmesh: brokerless publish/subscribe with mDNS discovery and an LMDB outbox.

    Start with `zmesh demo`, which runs a producer and two consumer groups on loopback,
    crashes a consumer on purpose and shows that nothing is lost.
    """
    ctx.ensure_object(dict)
    ctx.obj["log_level"] = log_level.upper()
    _setup_logging(log_level)


cli.add_command(demo)
cli.add_command(pub)
cli.add_command(sub)
cli.add_command(add_curve_options(status))
cli.add_command(add_curve_options(peers))
cli.add_command(node)
cli.add_command(top)
cli.add_command(dlq)
cli.add_command(keys)
cli.add_command(snapshot)
cli.add_command(store)
cli.add_command(doctor)
cli.add_command(bench)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code (errors become one line, no traceback)."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="zmesh",
                      standalone_mode=False)
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
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
