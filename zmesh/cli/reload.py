"""SIGHUP for ``zmesh node run``: read the node's trusted keys and ACL file again now (a
node also does by itself when those files change, within a heartbeat)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from ..node import Node
from .output import note


@contextlib.contextmanager
def reload_on_sighup(node: Node) -> Iterator[None]:
    """While in the block, SIGHUP makes ``node`` reload its keys and permissions (on a
    thread of its own: a signal handler must not wait for the node's IO thread)."""
    wanted = threading.Event()
    done = threading.Event()
    engine = node._engine

    def reloader() -> None:
        while wanted.wait() and not done.is_set():
            wanted.clear()
            try:
                engine.queue.call(lambda wb, now: engine.listener.guard.reload(wb, now))
            except Exception as exc:  # (the node is closing, or failed: nothing to reload)
                note(f"node {node.name}: reload failed: {exc}")

    previous = signal.signal(signal.SIGHUP, lambda _sig, _frame: wanted.set())
    thread = threading.Thread(target=reloader, name="zmesh-sighup", daemon=True)
    thread.start()
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
        done.set()
        wanted.set()
        thread.join()
