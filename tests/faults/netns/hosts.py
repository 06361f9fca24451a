"""Test hosts as network namespaces on one bridge (the recipe of the project's TESTING.md).

A hub namespace holds the bridge ``br0``. Host ``i`` (1-based) is a namespace of its own
with a veth pair: ``eth0`` inside the host (``10.77.0.i/24``, up, with ``lo`` up too) and
the other end in the hub, enslaved to ``br0``. Taking that hub end down is a clean network
partition of the host; bringing it up heals it.

Every name carries a run token (this process's pid and a counter), so concurrent runs and
leftovers of a crashed run never collide, and the address plan can be the same in every
run: the namespaces keep each run's 10.77.0.0/24 (and its mDNS) to itself. Past ~30 hosts the
kernel's neighbour (ARP) table, shared by every namespace and capped at 1,024 entries that
may be collected, overflows and new links stop forming; a ``HostNet`` made with
``neighbours=True`` gives every host fixed MAC addresses and permanent neighbour entries
for all the others (never collected, so never counted against the cap), inside its own
namespaces: the machine's settings stay as they are. ``HostNet.close``
kills the processes it started (by pid) before it deletes the namespaces it created (by
name); it is safe to call after a partial setup and more than once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUBNET = "10.77.0"
PREFIX_LEN = 24
IP_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0
IFNAMSIZ = 15  # the kernel's limit on interface names (16 bytes with the NUL)
REPO_ROOT = Path(__file__).resolve().parents[3]

_counter = itertools.count(1)


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, no veth/bridge)."""


class IpCommandError(RuntimeError):
    """An ``ip`` command failed; carries the command line and what it printed."""

    def __init__(self, args: Sequence[str], returncode: int, output: str) -> None:
        super().__init__(f"{' '.join(args)} failed with {returncode}: {output.strip()}")
        self.command = list(args)
        self.returncode = returncode
        self.output = output


def ip(*args: str) -> str:
    """Run ``ip ARGS``; return its stdout or raise IpCommandError."""
    cmd = ["ip", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise IpCommandError(cmd, -1, f"timed out after {IP_TIMEOUT_S:g}s") from exc
    if done.returncode != 0:
        raise IpCommandError(cmd, done.returncode, done.stderr + done.stdout)
    return done.stdout


def ip_batch(netns: str, commands: Sequence[str]) -> None:
    """Run many ``ip`` commands inside ``netns`` with one process (``ip -batch``)."""
    cmd = ["ip", "-n", netns, "-batch", "-"]
    try:
        done = subprocess.run(
            cmd,
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise IpCommandError(cmd, -1, f"timed out after {IP_TIMEOUT_S:g}s") from exc
    if done.returncode != 0:
        raise IpCommandError(cmd, done.returncode, done.stderr + done.stdout)


def mac(index: int) -> str:
    """Host ``index``'s fixed MAC address (locally administered)."""
    return f"02:77:00:00:{index >> 8:02x}:{index & 0xFF:02x}"


def run_token() -> str:
    """A short token unique to this process and call: ``<pid hex><counter hex>``."""
    return f"{os.getpid():x}{next(_counter):x}"


def check_netns_available() -> None:
    """Raise NetnsUnavailable with the reason when this machine cannot run the host network.

    Needs root, the ``ip`` tool, and a kernel that makes namespaces, veth pairs and
    bridges; checked by building (and deleting) one namespace with one of each.
    """
    if os.geteuid() != 0:
        raise NetnsUnavailable(
            f"network-namespace tests need root (running as uid "
            f"{os.geteuid()}): 'ip netns add' is not permitted"
        )
    if shutil.which("ip") is None:
        raise NetnsUnavailable("network-namespace tests need the 'ip' tool (iproute2)")
    probe = f"zmt-{run_token()}-probe"
    try:
        ip("netns", "add", probe)
    except IpCommandError as exc:
        raise NetnsUnavailable(f"'ip netns add' failed: {exc.output.strip()}") from exc
    try:
        ip("-n", probe, "link", "add", "br0", "type", "bridge")
        ip("-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
    except IpCommandError as exc:
        raise NetnsUnavailable(
            f"cannot make a bridge and a veth pair in a namespace: {exc.output.strip()}"
        ) from exc
    finally:
        with contextlib.suppress(IpCommandError):
            ip("netns", "del", probe)


@dataclass
class Host:
    """One test host: a namespace, its address, and the hub end of its link."""

    index: int
    netns: str
    addr: str
    hub_veth: str
    link_up: bool = True


@dataclass
class HostNet:
    """``count`` hosts on one bridge, and the processes started on them."""

    count: int
    token: str = field(default_factory=run_token)
    hosts: list[Host] = field(default_factory=list)
    hub: str = ""
    _created: list[str] = field(default_factory=list)  # namespaces, in creation order
    _procs: list[subprocess.Popen] = field(default_factory=list)
    partitions: int = 0
    neighbours: bool = False  # permanent neighbour entries between all hosts

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 250:
            raise ValueError(f"a host network has 1..250 hosts, not {self.count}")
        self.hub = f"zmt-{self.token}-hub"
        for i in range(1, self.count + 1):
            veth = f"zv{self.token}h{i}"
            if len(veth) > IFNAMSIZ:
                raise ValueError(f"interface name {veth!r} is longer than {IFNAMSIZ}")
            self.hosts.append(Host(i, f"zmt-{self.token}-h{i}", f"{SUBNET}.{i}", veth))

    # -- building and tearing down ------------------------------------------------------

    def create(self) -> HostNet:
        """Build the hub, the bridge and every host; on failure remove what was made."""
        try:
            self._add_netns(self.hub)
            ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            ip("-n", self.hub, "link", "set", "br0", "up")
            for host in self.hosts:
                self._add_netns(host.netns)
                # Both ends are created straight in their namespaces: nothing of the
                # host network ever appears in the machine's own namespace.
                ip(
                    "-n",
                    self.hub,
                    "link",
                    "add",
                    host.hub_veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    host.netns,
                )
                ip("-n", self.hub, "link", "set", host.hub_veth, "master", "br0", "up")
                ip("-n", host.netns, "addr", "add", f"{host.addr}/{PREFIX_LEN}", "dev", "eth0")
                if self.neighbours:
                    ip("-n", host.netns, "link", "set", "eth0", "address", mac(host.index))
                ip("-n", host.netns, "link", "set", "eth0", "up")
                ip("-n", host.netns, "link", "set", "lo", "up")
            if self.neighbours:
                for host in self.hosts:
                    ip_batch(
                        host.netns,
                        [
                            f"neigh replace {other.addr} lladdr {mac(other.index)} "
                            "dev eth0 nud permanent"
                            for other in self.hosts
                            if other is not host
                        ],
                    )
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._created.append(name)

    def close(self) -> list[str]:
        """Kill the started processes (by pid), then delete our namespaces (by name).

        Returns the problems met (never raises), so a teardown can report them without
        hiding the test's own failure.
        """
        problems = self.stop_processes()
        for name in reversed(self._created):
            try:
                ip("netns", "del", name)
            except IpCommandError as exc:
                problems.append(str(exc))
        self._created.clear()
        return problems

    def stop_processes(self) -> list[str]:
        """SIGKILL every started process still running and reap all of them."""
        problems = []
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            try:
                proc.wait(KILL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                problems.append(f"process {proc.pid} did not die on SIGKILL")
        return problems

    def __enter__(self) -> HostNet:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults ---------------------------------------------------------------------------

    def partition(self, host: Host) -> None:
        """Cut ``host`` off the bridge: its hub-side veth goes down."""
        ip("-n", self.hub, "link", "set", host.hub_veth, "down")
        host.link_up = False
        self.partitions += 1

    def heal(self, host: Host) -> None:
        """Reconnect ``host``: its hub-side veth comes up again."""
        ip("-n", self.hub, "link", "set", host.hub_veth, "up")
        host.link_up = True

    # -- processes ------------------------------------------------------------------------

    def spawn(self, host: Host, args: Sequence[str], out: IO[bytes]) -> subprocess.Popen:
        """Run ``python ARGS`` inside ``host`` (``ip netns exec`` execs it: the pid is the
        Python process itself), with the repository on its path."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self._procs.append(proc)
        return proc

    def namespaces(self) -> list[str]:
        """The namespaces this host network created and has not deleted yet."""
        return list(self._created)


def existing_namespaces() -> set[str]:
    """Names of the machine's named network namespaces."""
    out = ip("netns", "list")
    return {line.split()[0] for line in out.splitlines() if line.strip()}
