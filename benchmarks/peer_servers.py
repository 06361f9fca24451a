"""The peers' servers for ``--peers``: found or skipped, started on loopback, stopped by pid.

``nats-server`` (JetStream, file storage) and ``redis-server`` run from the PATH (Debian:
``apt-get install -y nats-server redis-server``), each on a free port found first, with its
data in the scenario's own directory. Zenoh runs in peer mode inside the two processes
and needs only its wheel. A peer whose server or Python client is missing is skipped with
the reason (``missing``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ._child import BenchError

PEERS = ("nats", "redis", "zenoh")
PEER_NAMES = {"nats": "NATS JetStream", "redis": "Redis Streams", "zenoh": "Zenoh peer"}
_BINARY = {"nats": "nats-server", "redis": "redis-server"}
_CLIENTS = {
    "nats": ("nats", "nats-py"),
    "redis": ("redis", "redis"),
    "zenoh": ("zenoh", "eclipse-zenoh"),
}
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 20.0  # (a server writing a large store out on SIGTERM)
_TICK_S = 0.002


def missing(peer: str) -> str:
    """Why ``peer`` cannot run here; empty if it can."""
    module, dist = _CLIENTS[peer]
    binary = _BINARY.get(peer)
    if binary and shutil.which(binary) is None:
        return f"{binary} is not installed (apt-get install -y {binary})"
    if importlib.util.find_spec(module) is None:
        return f"its Python client is not installed (pip install '.[bench]' or {dist})"
    return ""


def versions(peer: str) -> dict[str, str]:
    """The server's and the client's versions, for the machine description."""
    out = {f"{peer}_client": importlib.metadata.version(_CLIENTS[peer][1])}
    binary = _BINARY.get(peer)
    if binary:
        with suppress(OSError, subprocess.SubprocessError):
            text = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10
            ).stdout
            out[f"{peer}_server"] = text.strip()
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the servers take a port number, not port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(peer: str, port: int) -> bool:
    """The server accepts clients: NATS sends its INFO line, Redis answers PING with PONG
    (``-LOADING`` while it replays its append-only file counts as not yet)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            if peer == "redis":
                s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"INFO" if peer == "nats" else b"+PONG")
    except OSError:
        return False


class Server:
    """One peer server process on 127.0.0.1; ``start`` again reopens the same data."""

    def __init__(self, peer: str, workdir: Path) -> None:
        self.peer = peer
        self.port = free_port()
        self.data_dir = workdir / f"{peer}-data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{peer}-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"nats://127.0.0.1:{self.port}" if peer == "nats" else f"{self.port}"

    def _cmd(self) -> list[str]:
        port, data = str(self.port), str(self.data_dir)
        if self.peer == "nats":
            return ["nats-server", "-a", "127.0.0.1", "-p", port, "-js", "-sd", data]
        # The append-only file written to the OS on every event loop and never fsynced:
        # the durability of zmesh's ``process`` topics and of JetStream's file store.
        return [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            port,
            "--save",
            "",
            "--dir",
            data,
            "--appendonly",
            "yes",
            "--appendfsync",
            "no",
            "--daemonize",
            "no",
        ]

    def start(self, wait: bool = True) -> float:
        """Start the server; returns ``time.monotonic()`` just before its process started.
        ``wait``: return once it accepts clients."""
        with open(self.log_path, "ab") as log:
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                self._cmd(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        if wait:
            self.wait_ready()
        return t0

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(self.peer, self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"{self.peer} server did not start{self.tail()}")
            time.sleep(_TICK_S)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- log of the " + self.peer + " server ---\n" + "\n".join(text)

    def _status(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.proc is None:
            return out
        with suppress(OSError), open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = round(int(rest.split()[0]) / 1024.0, 1)
        return out

    def rss_mb(self) -> float:
        """The server's peak resident memory so far, MiB."""
        return self._status().get("VmHWM", 0.0)

    def rss_now_mb(self) -> float:
        return self._status().get("VmRSS", 0.0)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server has used so far."""
        if self.proc is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """SIGTERM (both write their store out and exit), then SIGKILL, by pid."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def server(peer: str, workdir: Path) -> Iterator[Server | None]:
    """The peer's server, started and ready (None for Zenoh: no server); always stopped."""
    if peer not in _BINARY:
        yield None
        return
    srv = Server(peer, workdir)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
