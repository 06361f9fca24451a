"""The server of ``zmesh web`` (aiohttp): the page and its assets, a snapshot of the mesh
taken every interval and pushed to every open page as a server-sent event, the history
the page's charts start from, and the dead-letter actions. While the source fails, the
last snapshot is pushed again marked ``stale`` (with the error and its age), or the
failure alone (event ``failure``) if there is none yet.

Collecting the mesh blocks (ZeroMQ requests, or HTTP to a node's API), so it runs on a
worker thread while the event loop goes on serving; one collection at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web

from .._http.actions import ADMIN_OPS, GROUP_RM, HttpError
from .._http.origin import check_origin
from .._http.views import groups_view, nodes_view, topics_view, unreachable
from .history import History
from .source import Source

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
CLIENT_QUEUE = 4  # snapshots waiting for a slow page; past it the oldest is dropped


def _rates(lanes: list[dict[str, Any]], topic: str, group: str) -> dict[str, float | None]:
    mine = [ln for ln in lanes if ln["topic"] == topic and ln["group"] == group]
    out: dict[str, float | None] = {}
    for k in ("rate_in", "rate_out"):
        known = [ln[k] for ln in mine if ln[k] is not None]
        out[k] = round(sum(known), 3) if known else None
    return out


def snapshot(
    mesh: dict[str, Any],
    lanes: list[dict[str, Any]],
    *,
    source: str,
    admin: bool,
    interval_s: float,
) -> dict[str, Any]:
    """What a page shows at one moment (the views of the HTTP API, with rates)."""
    groups = [{**g, **_rates(lanes, g["topic"], g["group"])} for g in groups_view(mesh)["groups"]]
    return {
        "mesh": mesh["mesh"],
        "collected_at": mesh["collected_at"],
        "source": source,
        "admin": admin,
        "interval_s": interval_s,
        "nodes": nodes_view(mesh),
        "links": mesh["links"],
        "topics": topics_view(mesh)["topics"],
        "groups": groups,
        "lanes": lanes,
        "unreachable": unreachable(mesh),
        "statuses": {n["id"]: n["status"] for n in mesh["nodes"] if n["status"]},
        "stale": None,  # (while the source fails: the error, and the seconds since taken)
    }


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class WebApp:
    """One ``zmesh web`` server's state: the source, the history, the open pages."""

    def __init__(self, source: Source, *, host: str, admin: bool, interval_s: float) -> None:
        self.source = source
        self.host = host  # (as --listen gives it)
        self.admin = admin
        self.interval_s = interval_s
        self.history = History()
        self.latest: dict[str, Any] | None = None
        self.latest_at = 0.0  # (time.time() when it was taken)
        self.error: str | None = None  # (why the last look at the mesh failed)
        self._pages: set[asyncio.Queue[bytes]] = set()
        self._looked = asyncio.Event()

    def build(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.index)
        app.router.add_static("/static/", STATIC)
        app.router.add_get("/events", self.events)
        app.router.add_get("/api/snapshot", self.get_snapshot)
        app.router.add_get("/api/history", self.get_history)
        app.router.add_get("/api/dead-letters", self.get_dead_letters)
        app.router.add_post("/api/dead-letters/{op}", self.post_action)
        app.router.add_post(GROUP_RM, self.post_group_rm)
        app.cleanup_ctx.append(self._sampling)
        app.on_shutdown.append(self._end_pages)
        return app

    # -- sampling -----------------------------------------------------------------------

    async def _sampling(self, _app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(self._sample_forever())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _sample_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                mesh = await loop.run_in_executor(None, self.source.mesh)
                at = time.time()
                # (a mesh that is not one, from an --api that is no node's: a failure too)
                lanes = self.history.add(mesh, at)
                latest = snapshot(
                    mesh,
                    lanes,
                    source=self.source.description,
                    admin=self.admin,
                    interval_s=self.interval_s,
                )
            except Exception as exc:  # (a source's failure is shown, and tried again)
                why = (  # (what is no mesh fails as a lookup in it: say what it missed)
                    f"no mesh in its answer ({exc!r})"
                    if isinstance(exc, LookupError | TypeError | AttributeError)
                    else str(exc)
                )
                error = f"cannot read the mesh from {self.source.description}: {why}"
                if error != self.error:
                    log.warning("%s", error)
                self.error = error
            else:
                if self.error is not None:
                    log.info("reading the mesh from %s again", self.source.description)
                self.error = None
                self.latest_at, self.latest = at, latest
            self._looked.set()
            self._tell(self._told())
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    def _tell(self, told: bytes) -> None:
        """Queue ``told`` for every open page (b"": its stream ends)."""
        for queue in self._pages:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(told)

    async def _end_pages(self, _app: web.Application) -> None:
        # (the server stops: the streams end now rather than be cut off after its grace)
        self._tell(b"")

    # -- routes -------------------------------------------------------------------------

    async def index(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    def shown(self) -> dict[str, Any] | None:
        """The latest snapshot, marked stale while the source fails; None before one."""
        if self.latest is None or self.error is None:
            return self.latest
        age_s = round(time.time() - self.latest_at, 1)
        return {**self.latest, "stale": {"error": self.error, "age_s": age_s}}

    def _told(self) -> bytes:
        """What the pages are told after a look: the snapshot shown, or why there is
        none."""
        shown = self.shown()
        if shown is not None:
            return _sse("snapshot", shown)
        return _sse("failure", {"source": self.source.description, "error": self.error})

    async def _current(self) -> dict[str, Any]:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._looked.wait(), timeout=30)
        shown = self.shown()
        if shown is None:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, self.error or "no sample yet")
        return shown

    async def get_snapshot(self, _request: web.Request) -> web.Response:
        return await _answer(self._current)

    async def get_history(self, _request: web.Request) -> web.Response:
        async def points() -> dict[str, Any]:
            return {"lanes": self.history.points()}

        return await _answer(points)

    async def events(self, request: web.Request) -> web.StreamResponse:
        """After every look at the mesh, the snapshot shown as a server-sent event
        ``snapshot``, or ``failure`` while there is none."""
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        queue: asyncio.Queue[bytes] = asyncio.Queue(CLIENT_QUEUE)
        self._pages.add(queue)
        try:
            await resp.prepare(request)
            if self._looked.is_set():
                await resp.write(self._told())
            while told := await queue.get():
                await resp.write(told)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the page went away, or the server stops
        finally:
            self._pages.discard(queue)
        return resp

    async def get_dead_letters(self, request: web.Request) -> web.Response:
        """A group's dead letters: ``topic``, ``group``, and ``limit`` and ``node`` as the
        HTTP API takes them."""
        query = {
            k: request.query[k] for k in ("topic", "group", "limit", "node") if k in request.query
        }
        loop = asyncio.get_running_loop()

        async def listed() -> dict[str, Any]:
            if not query.get("topic") or not query.get("group"):
                raise HttpError(HTTPStatus.BAD_REQUEST, "topic and group are required")
            return await loop.run_in_executor(None, self.source.dead_letters, query)

        return await _answer(listed)

    async def post_action(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        if op not in ADMIN_OPS:
            return await _answer(_missing(op))
        return await self._admin(request, lambda body: self.source.act(op, body))

    async def post_group_rm(self, request: web.Request) -> web.Response:
        return await self._admin(request, self.source.remove_group)

    async def _admin(
        self, request: web.Request, run: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> web.Response:
        """An admin action: refused without --admin, without a JSON body (a form posted
        from another site) or from another origin (origin.py), else run on a worker
        thread."""
        loop = asyncio.get_running_loop()

        async def acted() -> dict[str, Any]:
            if not self.admin:
                raise HttpError(
                    HTTPStatus.FORBIDDEN,
                    "admin actions are off: start zmesh "
                    "web with --admin to replay or purge dead letters and "
                    "remove groups",
                )
            check_origin(request.headers.get("Host"), request.headers.get("Origin"), self.host)
            if request.content_type != "application/json":
                raise HttpError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "actions take a JSON body")
            try:
                body = await request.json()
            except web.HTTPRequestEntityTooLarge:
                raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large") from None
            except (ValueError, RecursionError, LookupError) as exc:  # (nested too deep; a
                # charset Python does not know)
                raise HttpError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise HttpError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
            return await loop.run_in_executor(None, run, body)

        return await _answer(acted)


def _missing(op: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def fail() -> dict[str, Any]:
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such action: {op}")

    return fail


async def _answer(make: Callable[[], Awaitable[dict[str, Any]]]) -> web.Response:
    try:
        return web.json_response(await make(), headers={"Cache-Control": "no-store"})
    except HttpError as exc:
        return web.json_response({"error": str(exc)}, status=exc.status)
    except Exception as exc:
        log.exception("zmesh web: a request failed")
        return web.json_response(
            {"error": f"{type(exc).__name__}: {exc}"}, status=HTTPStatus.INTERNAL_SERVER_ERROR
        )


async def serve(
    source: Source,
    host: str,
    port: int,
    *,
    admin: bool,
    interval_s: float,
    stop: asyncio.Event,
    ready: Callable[[str], None],
) -> None:
    """Serve until ``stop`` is set; ``ready(url)`` once listening."""
    app = WebApp(source, host=host, admin=admin, interval_s=interval_s).build()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        ready(f"http://{shown}:{bound_port}/")
        await stop.wait()
    finally:
        await runner.cleanup()
