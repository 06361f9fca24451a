"""``zmesh web``: a live web page of the mesh (needs the ``web`` extra: aiohttp)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator

import click

from .._http.collect import MESH_TIMEOUT_S
from ..config import parse_seed
from ..errors import ConfigError
from .clientnode import NodeArgs, cli_node, node_options, settle_peers
from .output import note
from .settings import Number, http_address

DISCOVERY_WAIT_S = 3.0


@contextlib.contextmanager
def _source(api: str | None, timeout: float, node_args: NodeArgs) -> Iterator[object]:
    from ..web.source import ApiSource, NodeSource

    if api is not None:
        yield ApiSource(api, timeout)
        return
    with cli_node("web", node_args) as node:
        settle_peers(node, DISCOVERY_WAIT_S)  # (so the first look sees the mesh)
        source = NodeSource(node, timeout)
        try:
            yield source
        finally:
            source.close()


def _api_url(api: str | None) -> str | None:
    """The HTTP API to read: --api, else ZMESH_HTTP_ADDRESS or the context's
    http_address (None: none, join the mesh); HOST:PORT is taken as http://HOST:PORT."""
    given = api or http_address()
    if not given:
        return None
    return given if "://" in given else f"http://{given}"


@click.command(short_help="Serve a live web page of the mesh.")
@node_options
@click.option(
    "--api",
    metavar="URL",
    help="Read a running node's HTTP API (its http_address, e.g. "
    "http://127.0.0.1:8222 or 127.0.0.1:8222) instead of joining the mesh with a node "
    "of its own [default: ZMESH_HTTP_ADDRESS, or the context's http_address].",
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    metavar="HOST:PORT",
    help="Where the page is served (port 0: any free port).",
)
@click.option(
    "--admin",
    is_flag=True,
    help="Offer dead-letter replay and purge and group removal on the page (off: they "
    "are refused).",
)
@click.option(
    "--interval",
    type=Number(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between two looks at the mesh.",
)
@click.option(
    "--timeout",
    type=Number(min=0.1, max=30),
    default=MESH_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for each node's reply.",
)
def web(
    node: NodeArgs, api: str | None, listen: str, admin: bool, interval: float, timeout: float
) -> None:
    """Serve a live page of the mesh: a map of its nodes and links, every topic and group
    with its backlog, rates and dead letters, charts of the last minutes, a page per node
    and per group's dead letters.

    By default a node of its own joins the mesh (by mDNS, or from --seed) and asks every
    node over its control socket; with --api (or an HTTP address set in ZMESH_HTTP_ADDRESS
    or the context) it reads a running node's HTTP API instead.
    On a secured mesh its node joins with --secret-key-file, and --admin actions go to the
    producers over their control sockets with that key (one they admit as an admin's).
    The page's address is printed on stdout. Needs `pip install 'zmesh[web]'`.
    """
    try:
        from ..web.app import serve
    except ImportError as exc:
        raise ConfigError(
            f"zmesh web needs the web extra ({exc.name} is missing): pip install 'zmesh[web]'"
        ) from exc
    host, port = parse_seed(listen, what="--listen", allow_port_zero=True)

    def ready(url: str) -> None:
        click.echo(f"zmesh web: {url} (from {source.description})")  # type: ignore[attr-defined]
        sys.stdout.flush()  # (a supervisor or a test reads the address from it)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(
            source,  # type: ignore[arg-type]
            host,
            port,
            admin=admin,
            interval_s=interval,
            stop=stop,
            ready=ready,
        )

    with _source(_api_url(api), timeout, node) as source:
        asyncio.run(run())
    note("zmesh web: stopped")
