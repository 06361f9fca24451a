"""Fixtures of the unit tests that need real sockets: a context, and the mesh of one node
on a real store (no IO thread: hellos are handed to it, what it sends is read where its
peers listen)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zmesh._engine.mesh import Mesh
from zmesh._engine.outbox.outbox import Outbox
from zmesh._engine.outbox.outcomes import Outcomes
from zmesh._engine.stats import Counters
from zmesh._store.store import Store
from zmesh.config import NodeConfig

ME = b"\x0c" * 16  # the node of the ``mesh`` fixture


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.term()


@pytest.fixture
def mesh(tmp_path: Path, ctx: zmq.Context[zmq.Socket[bytes]]) -> Iterator[Mesh]:
    store = Store(str(tmp_path / "me"), 1 << 24)
    config = NodeConfig(name="me", data_dir=str(tmp_path / "me"))
    outbox = Outbox(store, ME, 1, 1, {}, 1 << 20, 1 << 20, Counters(), Outcomes())
    mesh = Mesh(ctx, config, ME, 1, outbox, Counters(), list, None)
    mesh.ctrl_port = mesh.data_port = 1  # (what its hellos say: nobody dials it here)
    yield mesh
    mesh.close()
    store.close()
