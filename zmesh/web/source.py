"""Where ``zmesh web`` reads the mesh: from a node of its own that joins it, or from a
running node's HTTP API. Both answer the same three questions with the HTTP API's shapes,
blocking (the server runs them on worker threads)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import urlencode

import zmq

from .._http.actions import GROUP_RM, HttpError, act, dead_letters, remove_group
from .._http.collect import collect_mesh
from .._http.views import drop_observer
from ..node import Node


class Source(Protocol):
    """What the web server needs from the mesh."""

    description: str

    def mesh(self) -> dict[str, Any]: ...

    def dead_letters(self, query: dict[str, str]) -> dict[str, Any]: ...

    def act(self, op: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def remove_group(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


class NodeSource:
    """The mesh as a node of the web's own sees it; that node is left out of the view."""

    def __init__(self, node: Node, timeout_s: float) -> None:
        self._node = node
        self._timeout_s = timeout_s
        self._ctx = zmq.Context()
        self.description = f"node {node.name} of mesh {node.config.mesh}"

    def mesh(self) -> dict[str, Any]:
        return drop_observer(collect_mesh(self._node._engine, self._ctx, self._timeout_s))

    def dead_letters(self, query: dict[str, str]) -> dict[str, Any]:
        return dead_letters(self._node._engine, self._ctx, query, self._timeout_s)

    def act(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        return act(self._node._engine, self._ctx, op, body)

    def remove_group(self, body: dict[str, Any]) -> dict[str, Any]:
        return remove_group(self._node._engine, self._ctx, body)

    def close(self) -> None:
        self._ctx.term()


class ApiSource:
    """The mesh as a running node's HTTP API (``http_address``) serves it; admin actions
    go to that node, which must allow them (``http_admin``)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._base = url.rstrip("/")
        self._timeout_s = timeout_s
        self.description = f"the HTTP API at {self._base}"

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self._base + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s + 10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                try:
                    message = json.loads(exc.read())["error"]
                except (ValueError, KeyError, TypeError):
                    message = exc.reason
            raise HttpError(HTTPStatus(exc.code), f"{self._base}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise HttpError(HTTPStatus.BAD_GATEWAY, f"{self._base}: {exc}") from None

    def mesh(self) -> dict[str, Any]:
        # (the API's node is a node of the mesh like any other: it stays in the view)
        return self._call(f"/api/mesh?timeout={self._timeout_s:g}")

    def dead_letters(self, query: dict[str, str]) -> dict[str, Any]:
        asked = urlencode({**query, "timeout": f"{self._timeout_s:g}"})
        return self._call(f"/api/dead-letters?{asked}")

    def act(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(f"/api/dead-letters/{op}", body)

    def remove_group(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(GROUP_RM, body)

    def close(self) -> None:
        pass
