"""A node's HTTP API: its own state, the mesh's, and Prometheus metrics, on one port.

The standard library's ThreadingHTTPServer on a thread of its own, so the API needs no
extra installed. Handlers read the node through its IO thread (``Submitter.call``) and ask
other nodes over their control sockets with sockets of their own (collect.py); they never
touch the IO thread's sockets. Admin actions (POST) are served only when the node's
``http_admin`` is set, only with a JSON body (a browser sends a cross-origin JSON POST
only after a CORS preflight this server never grants) and only from this server's own
origin (origin.py: a page of another site cannot act, even through DNS rebinding).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qs, urlsplit

import zmq

from ..config import parse_seed
from ..errors import NodeClosedError, NodeStateError, ZMeshError
from . import views
from .actions import (
    ADMIN_OPS,
    DEAD_LETTER_ACTIONS,
    GROUP_RM,
    HttpError,
    act,
    count,
    dead_letters,
    remove_group,
)
from .collect import MESH_TIMEOUT_S, collect_mesh
from .origin import check_origin
from .prometheus import CONTENT_TYPE, render

if TYPE_CHECKING:
    from .._engine.engine import Engine

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
MAX_MESH_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 5.0  # a client this slow to send its request (or take the answer) is cut off
CLOSE_GRACE_S = 1.0  # what close() gives the requests being answered


class _Server(ThreadingHTTPServer):
    """A thread per connection (HTTP/1.0: one request each), each connection kept with
    its thread so that closing can cut them and join the threads (``HttpApi.close``)."""

    daemon_threads = True
    block_on_close = False  # (close joins the threads itself, once it cut their connections)
    api: HttpApi

    def __init__(self, address: tuple[str, int], name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._open: dict[socket.socket, threading.Thread] = {}
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"zmesh-http-{self._name}-request",
            daemon=True,
        )
        with self._lock:
            self._open[request] = thread
        thread.start()

    def close_request(self, request: Any) -> None:
        with self._lock:  # (not while cut goes through them)
            self._open.pop(request, None)
            super().close_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # (socketserver prints a traceback on stderr: a client that went away is no error
        # of the node's, and what else fails goes to the log as one record)
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("HTTP client %s went away: %s", client_address[0], exc)
        else:
            log.exception("HTTP request from %s failed", client_address[0])

    def cut(self, how: int) -> list[threading.Thread]:
        """Shut ``how`` of every open connection down; the threads serving them."""
        with self._lock:
            for request in self._open:
                with contextlib.suppress(OSError):  # (the client hung up first)
                    request.shutdown(how)
            return list(self._open.values())


class HttpApi:
    """The HTTP endpoint of one node. ``metrics_only`` serves ``/metrics`` alone (the
    node's ``metrics_address``); otherwise the JSON API too, and its admin POSTs when
    ``admin``."""

    def __init__(
        self,
        engine: Engine,
        address: str,
        *,
        what: str,
        metrics_only: bool = False,
        admin: bool = False,
    ) -> None:
        host, port = parse_seed(address, what=what, allow_port_zero=True)
        self.engine = engine
        self.host = host
        self.admin = admin
        self.metrics_only = metrics_only
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = None if metrics_only else zmq.Context()
        server_cls = (
            type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
            if ":" in host
            else _Server
        )
        try:
            self._server = server_cls((host, port), engine.config.name)
        except OSError as exc:
            self._term()
            raise ZMeshError(f"{what} {address}: cannot listen there ({exc.strerror})") from exc
        except BaseException:
            self._term()
            raise
        self._server.api = self
        bound = self._server.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        engine.http_endpoints[what] = self.address
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"zmesh-http-{engine.config.name}", daemon=True
        )
        self._thread.start()
        log.info(
            "node %s: %s at http://%s/",
            engine.config.name,
            "metrics" if metrics_only else "HTTP API",
            self.address,
        )

    def close(self) -> None:
        """Stop serving, whatever the clients do: idle connections and requests still
        arriving end at once, requests waiting on other nodes stop waiting (their context
        is terminated), and those being answered get ``CLOSE_GRACE_S`` to finish."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        threads = self._server.cut(socket.SHUT_RD)
        self._term()
        deadline = time.monotonic() + CLOSE_GRACE_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for thread in self._server.cut(socket.SHUT_RDWR):
            thread.join()

    def _term(self) -> None:
        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            ctx.term()

    # -- the routes ---------------------------------------------------------------------

    def get(self, path: str, query: dict[str, str]) -> tuple[str, bytes]:
        if path == "/metrics":
            return CONTENT_TYPE, render(
                self.engine.queue.call(lambda _wb, _now: self.engine.status())
            ).encode()
        if self.metrics_only or path not in GETS:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such resource: {path}")
        return "application/json", _json(GETS[path](self, query))

    def post(self, path: str, body: dict[str, Any], host: str | None, origin: str | None) -> bytes:
        op = path.removeprefix(DEAD_LETTER_ACTIONS)
        if self.metrics_only or (
            path != GROUP_RM and (op == path or op not in ADMIN_OPS)  # (op == path: no prefix)
        ):
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such action: {path}")
        if not self.admin:
            raise HttpError(
                HTTPStatus.FORBIDDEN,
                "admin actions are off on this node: set "
                "http_admin = true in its [node] table to allow them",
            )
        check_origin(host, origin, self.host)
        if path == GROUP_RM:
            return _json(remove_group(self.engine, self._ctx(), body))
        return _json(act(self.engine, self._ctx(), op, body))

    def _ctx(self) -> zmq.Context[zmq.Socket[bytes]]:
        ctx = self.ctx
        if ctx is None:
            raise NodeClosedError(self.engine.config.name, "its HTTP API is closing")
        return ctx

    def mesh(self, query: dict[str, str]) -> dict[str, Any]:
        return collect_mesh(self.engine, self._ctx(), _timeout(query))

    def node(self, _query: dict[str, str]) -> dict[str, Any]:
        return self.engine.queue.call(lambda _wb, _now: self.engine.status())

    def nodes(self, query: dict[str, str]) -> dict[str, Any]:
        mesh = self.mesh(query)
        return {
            "mesh": mesh["mesh"],
            "collected_at": mesh["collected_at"],
            "nodes": views.nodes_view(mesh),
            "links": mesh["links"],
        }

    def topics(self, query: dict[str, str]) -> dict[str, Any]:
        return views.topics_view(self.mesh(query))

    def groups(self, query: dict[str, str]) -> dict[str, Any]:
        return views.groups_view(self.mesh(query))

    def dead_letters(self, query: dict[str, str]) -> dict[str, Any]:
        return dead_letters(self.engine, self._ctx(), query, _timeout(query))


GETS: dict[str, Callable[[HttpApi, dict[str, str]], dict[str, Any]]] = {
    "/api/node": HttpApi.node,
    "/api/mesh": HttpApi.mesh,
    "/api/nodes": HttpApi.nodes,
    "/api/topics": HttpApi.topics,
    "/api/groups": HttpApi.groups,
    "/api/dead-letters": HttpApi.dead_letters,
}


def _target(path: str) -> SplitResult:
    """The request's target, split; 400 when it cannot be (``http://[/x``)."""
    try:
        return urlsplit(path)
    except ValueError as exc:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"bad request target: {exc}") from None


def _timeout(query: dict[str, str]) -> float:
    raw = query.get("timeout")
    if raw is None:
        return MESH_TIMEOUT_S
    try:  # (plain ASCII decimals: float() also takes "1_0" and other scripts' digits)
        value = float(raw) if raw.isascii() and "_" not in raw else -1.0
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_MESH_TIMEOUT_S:
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f"timeout must be seconds in (0, {MAX_MESH_TIMEOUT_S:g}], got {raw!r}",
        )
    return value


def _json(value: object) -> bytes:
    return json.dumps(value, default=_jsonable).encode()


def _jsonable(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, set | tuple):
        return list(value)
    return str(value)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S  # (each read and write of the connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802
        def get() -> tuple[str, bytes]:
            url = _target(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            return self.server.api.get(url.path, query)

        self._answer(get)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()  # (_send leaves the body out)

    def do_POST(self) -> None:  # noqa: N802
        if self.server.api.metrics_only:
            self._not_allowed()
            return

        def act() -> tuple[str, bytes]:
            kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            raw = self._body()
            if kind != "application/json":
                raise HttpError(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                    "actions take a JSON body (Content-Type: application/json)",
                )
            try:
                body = json.loads(raw or b"{}")
            except (ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
                raise HttpError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise HttpError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
            path = _target(self.path).path
            host, origin = self.headers.get("Host"), self.headers.get("Origin")
            return "application/json", self.server.api.post(path, body, host, origin)

        self._answer(act)

    def _not_allowed(self) -> None:
        def refuse() -> tuple[str, bytes]:
            self._body()  # (read: a connection closed on a body unread may be reset first)
            raise HttpError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{self.command} is not served here (only {self._allowed()})",
            )

        self._answer(refuse)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _allowed(self) -> str:
        return "GET, HEAD" if self.server.api.metrics_only else "GET, HEAD, POST"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # (the standard library's answer, to a bad request line or an unknown method, is
        # an HTML page)
        self.log_error("code %d, message %s", code, message)
        self._send(code, "application/json", _json({"error": message or HTTPStatus(code).phrase}))

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise HttpError(
                HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not chunked"
            )
        given = self.headers.get("Content-Length", "0")
        length = count(given)
        if length is None:
            raise HttpError(
                HTTPStatus.BAD_REQUEST, f"Content-Length must be a number of bytes, got {given!r}"
            )
        if length > MAX_BODY_BYTES:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            raise HttpError(
                HTTPStatus.REQUEST_TIMEOUT, f"the body did not come within {self.timeout:g}s"
            ) from None
        if len(raw) < length:
            raise HttpError(HTTPStatus.BAD_REQUEST, "the body ended before its Content-Length")
        return raw

    def _answer(self, make: Callable[[], tuple[str, bytes]]) -> None:
        try:
            kind, body = make()
            status = HTTPStatus.OK
        except HttpError as exc:
            status, kind, body = exc.status, "application/json", _json({"error": str(exc)})
        except ConnectionError:
            raise  # (the client went away while it sent its request: handle_error)
        except (NodeStateError, zmq.ContextTerminated) as exc:  # closing, or too busy
            status, kind = HTTPStatus.SERVICE_UNAVAILABLE, "application/json"
            body = _json({"error": str(exc)})
        except Exception as exc:
            log.exception("HTTP %s %s failed", self.command, self.path)
            status, kind = HTTPStatus.INTERNAL_SERVER_ERROR, "application/json"
            body = _json({"error": f"{type(exc).__name__}: {exc}"})
        self._send(status, kind, body)

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == HTTPStatus.METHOD_NOT_ALLOWED:
            self.send_header("Allow", self._allowed())
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def serve(
    engine: Engine, address: str, *, what: str, metrics_only: bool = False, admin: bool = False
) -> HttpApi:
    """Start the endpoint of ``engine``'s node at ``address`` (``host:port``, port 0 for
    any free one)."""
    return HttpApi(engine, address, what=what, metrics_only=metrics_only, admin=admin)
