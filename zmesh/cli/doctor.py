"""``zmesh doctor``: why nodes do not find each other, one check at a time.

Each check prints OK, WARN, FAIL (or N/A) with what to do. Exit 1 when any check failed.
mDNS speaks only on the interfaces given with --interface (all of them otherwise).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import click
from rich.markup import escape

from .._discovery.mdns import SERVICE_TYPE
from .._protocol.frames import PROTOCOL_VERSION
from ..config import parse_seed
from .client import CurveKeys, read_key, request_status
from .output import CliError, console
from .settings import ENV, Number, common, env_help, from_context

RESOLVE_TIMEOUT_MS = 1500
STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "N/A": "dim"}
NO_MDNS_FIX = (
    "multicast does not cross routers and is often dropped in containers and "
    'clouds: give nodes seeds = ["host:port"] (a control address) instead'
)


@dataclass(slots=True)
class Report:
    """The checks so far; printed as they are made."""

    failed: int = 0
    warned: int = 0

    def add(self, level: str, check: str, result: str, fix: str = "") -> None:
        self.failed += level == "FAIL"
        self.warned += level == "WARN"
        console.print(
            f"[{STYLE[level]}]{level:<5}[/] [bold]{escape(check)}[/]: {escape(result)}",
            soft_wrap=True,
        )
        if fix:
            console.print(f"      -> {escape(fix)}", soft_wrap=True)


@dataclass(slots=True)
class Found:
    """One zmesh service seen over mDNS."""

    name: str
    props: dict[str, str]
    addresses: list[str]
    port: int

    @property
    def label(self) -> str:
        return self.name.removesuffix("." + SERVICE_TYPE)


@dataclass(slots=True)
class Target:
    """A control address to probe: a node found over mDNS, or a --seed."""

    label: str
    host: str
    port: int
    mesh: str | None = None
    public_key: str = ""
    data_port: int | None = None
    notes: list[str] = field(default_factory=list)


def check_interfaces(report: Report, interfaces: tuple[str, ...]) -> bool:
    import ifaddr  # installed with zeroconf

    v4 = [
        (a.nice_name, ip.ip, ip.network_prefix)
        for a in ifaddr.get_adapters()
        for ip in a.ips
        if isinstance(ip.ip, str)
    ]
    listing = ", ".join(f"{n} {ip}/{p}" for n, ip, p in v4) or "none"
    report.add(
        "OK" if v4 else "FAIL",
        "interfaces",
        f"IPv4 addresses: {listing}",
        "" if v4 else "this host has no IPv4 address; zmesh discovery speaks IPv4",
    )
    local = {ip for _n, ip, _p in v4}
    ok = True
    for iface in interfaces:
        if iface in ("0.0.0.0", "*") or iface in local:
            continue
        ok = False
        report.add(
            "FAIL",
            "interfaces",
            f"--interface {iface} is not an address of this host",
            f"pick one of {', '.join(sorted(local)) or 'none'}; a node's interfaces "
            "must be addresses it can bind",
        )
    routable = [ip for ip in local if not ip.startswith("127.")]
    if interfaces and all(i.startswith("127.") for i in interfaces):
        report.add(
            "OK",
            "interfaces",
            "loopback only: finds nodes of this host whose interfaces include 127.0.0.1",
            "",
        )
    elif not routable:
        report.add(
            "WARN",
            "interfaces",
            "only loopback is up: nodes on other hosts cannot be reached",
            "connect this host to the LAN the other nodes are on",
        )
    return ok


def open_mdns(report: Report, interfaces: tuple[str, ...]) -> object | None:
    from zeroconf import IPVersion, Zeroconf

    where = ", ".join(interfaces) if interfaces else "all interfaces"
    try:
        if interfaces:
            zc = Zeroconf(interfaces=list(interfaces), ip_version=IPVersion.V4Only)
        else:
            zc = Zeroconf(ip_version=IPVersion.V4Only)
    except Exception as exc:  # zeroconf raises OSError and its own errors alike
        report.add(
            "FAIL",
            "mdns socket",
            f"cannot open an mDNS socket on {where}: {type(exc).__name__}: {exc}",
            "another program may hold UDP 5353 without sharing it, the interface may "
            "have no multicast route (ip route add 224.0.0.0/4 dev IFACE), or "
            f"multicast is not permitted; {NO_MDNS_FIX}",
        )
        return None
    report.add("OK", "mdns socket", f"UDP 5353, group 224.0.0.251, on {where}")
    return zc


def browse(zc: object, timeout: float) -> list[Found]:
    from zeroconf import IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf

    assert isinstance(zc, Zeroconf)
    names: set[str] = set()
    lock = threading.Lock()

    def on_change(
        zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        with lock:
            if state_change is ServiceStateChange.Removed:
                names.discard(name)
            else:
                names.add(name)

    browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[on_change])
    try:
        threading.Event().wait(timeout)  # the browse window the user asked for
    finally:
        browser.cancel()
    found = []
    with lock:
        seen = sorted(names)
    deadline = time.monotonic() + max(2.0, timeout)
    for name in seen:
        wait_ms = min(RESOLVE_TIMEOUT_MS, int((deadline - time.monotonic()) * 1000))
        info = zc.get_service_info(SERVICE_TYPE, name, timeout=max(1, wait_ms))
        if info is None:
            continue  # gone, or its records did not come in time
        props = {
            k.decode(errors="replace"): (v or b"").decode(errors="replace")
            for k, v in info.properties.items()
        }
        found.append(Found(name, props, info.parsed_addresses(IPVersion.V4Only), info.port or 0))
    return found


def judge(
    report: Report,
    found: list[Found],
    mesh: str | None,
    timeout: float,
    interfaces: tuple[str, ...],
    have_secret: bool,
) -> list[Target]:
    """Report what the browse found; return the nodes worth probing."""
    where = ", ".join(interfaces) if interfaces else "all interfaces"
    if not found:
        report.add(
            "FAIL",
            "mdns browse",
            f"no zmesh node answered on {where} within {timeout:g}s",
            "nodes need mdns = true and an interface on this network (their "
            "interfaces list); UDP 5353 must pass the firewall; answers can take over a "
            "second, so try a longer --timeout; " + NO_MDNS_FIX,
        )
        return []
    report.add("OK", "mdns browse", f"{len(found)} zmesh service(s) on {where}")
    targets: list[Target] = []
    ids: dict[str, str] = {}
    for f in found:
        p = f.props
        node_mesh, version, pk = p.get("mesh", "?"), p.get("v", "?"), p.get("pk", "")
        desc = (
            f"{f.label}: mesh {node_mesh}, id {p.get('id', '?')[:12]}, control "
            f"{', '.join(f.addresses) or '?'}:{p.get('ctrl', '?')}, protocol v{version}"
            + (", secured" if pk else "")
        )
        if p.get("id") in ids:
            report.add(
                "FAIL",
                "node",
                f"{desc}: the same node id as {ids[p['id']]}",
                "two nodes run on copies of one data dir (a snapshot restored beside "
                "its original?): stop one; give the other a fresh data dir",
            )
        ids.setdefault(p.get("id", ""), f.label)
        if version != str(PROTOCOL_VERSION):
            report.add(
                "WARN",
                "node",
                f"{desc}: another protocol version (this zmesh speaks "
                f"v{PROTOCOL_VERSION}); it is ignored",
                "upgrade every node of the mesh to one zmesh release (rolling: nodes "
                "of two versions never talk, so upgrade consumers with producers)",
            )
            continue
        if mesh is not None and node_mesh != mesh:
            report.add(
                "WARN",
                "node",
                f"{desc}: another mesh (looking for {mesh}); nodes of other meshes never talk",
                f'if it should join, set mesh = "{mesh}" in its [node] table',
            )
            continue
        level, fix = "OK", ""
        if pk and not have_secret:
            level = "WARN"
            fix = (
                "a secured node: probe it with --secret-key-file (a key pair whose .pub "
                "is in its trusted_keys_dir); its server key is taken from its record"
            )
        report.add(level, "node", desc, fix)
        try:
            ctrl = int(p.get("ctrl", f.port))
            data = int(p["data"]) if p.get("data", "").isdigit() else None
        except ValueError:
            continue
        for addr in f.addresses[:1]:
            targets.append(Target(f.label, addr, ctrl, node_mesh, pk, data))
    if mesh is not None and not targets:
        meshes = sorted({f.props.get("mesh", "?") for f in found})
        report.add(
            "FAIL",
            "mdns browse",
            f"no node of mesh {mesh} (found: {', '.join(meshes)})",
            "check the mesh name in every [node] table (it is case-sensitive)",
        )
    return targets


def tcp(report: Report, target: Target, port: int, what: str, timeout: float) -> bool:
    try:
        with socket.create_connection((target.host, port), timeout=timeout):
            pass
    except OSError as exc:
        report.add(
            "FAIL",
            f"{target.label} {what}",
            f"TCP {target.host}:{port}: {exc.strerror or exc}",
            "the node is down, bound to other interfaces, or a firewall drops the "
            "connection: allow TCP between mesh hosts (zmesh ports are ephemeral)",
        )
        return False
    report.add("OK", f"{target.label} {what}", f"TCP {target.host}:{port} accepts connections")
    return True


def probe(
    report: Report,
    target: Target,
    mesh: str | None,
    timeout: float,
    secret: bytes | None,
    server: bytes | None,
) -> None:
    if not tcp(report, target, target.port, "control port", timeout):
        return
    key = server if server is not None else (target.public_key.encode() or None)
    if target.public_key and secret is None:
        report.add(
            "WARN",
            f"{target.label} status",
            "skipped: the node is secured",
            "pass --secret-key-file with a key pair the node trusts",
        )
        return
    keys = None
    if key is not None and secret is not None:
        import zmq

        keys = CurveKeys(key, zmq.curve_public(secret), secret)
    address = f"{target.host}:{target.port}"
    try:
        status = request_status(address, timeout, keys)
    except CliError as exc:
        report.add("FAIL", f"{target.label} status", exc.format_message())
        return
    node = status.get("node", {})
    peers = status.get("peers", [])
    alive = sum(1 for p in peers if p.get("alive"))
    result = (
        f"node {node.get('name')} of mesh {node.get('mesh')}, knows {len(peers)} "
        f"peer(s), {alive} alive"
    )
    if mesh is not None and node.get("mesh") != mesh:
        report.add(
            "WARN",
            f"{target.label} status",
            result + f" (not mesh {mesh})",
            f'set mesh = "{mesh}" in its [node] table if it should join',
        )
    else:
        report.add("OK", f"{target.label} status", result)
    data = target.data_port or node.get("data_port")
    if isinstance(data, int) and data:
        tcp(report, target, data, "data port", timeout)


@click.command()
@common("interfaces", "seeds", "mdns", "server_key", "secret_key_file")
@click.option(
    "--mesh",
    envvar=ENV["mesh"],
    default=from_context("mesh"),
    help=env_help("The mesh you expect to find (flags nodes of other meshes).", "mesh"),
)
@click.option(
    "--timeout",
    type=Number(min=0.1),
    default=3.0,
    show_default=True,
    help="Seconds to browse for nodes (and to wait for each probe).",
)
def doctor(
    interfaces: tuple[str, ...],
    seeds: tuple[str, ...],
    mdns: bool | None,
    server_key: str | None,
    secret_key_file: str | None,
    mesh: str | None,
    timeout: float,
) -> None:
    """Explain why nodes do not find each other: interfaces, the mDNS socket, what an mDNS
    browse finds (other meshes, other versions, secured nodes), and per node a TCP
    connect and a status request. Exit 1 when a check failed.
    """
    secret = read_key(secret_key_file, "--secret-key-file") if secret_key_file else None
    server = read_key(server_key, "--server-key") if server_key else None
    for seed in seeds:
        parse_seed(seed)
    report = Report()
    check_interfaces(report, interfaces)
    targets: list[Target] = []
    if mdns is not False:
        zc = open_mdns(report, interfaces)
        if zc is not None:
            try:
                found = browse(zc, timeout)
            finally:
                zc.close()  # type: ignore[attr-defined]
            targets = judge(report, found, mesh, timeout, interfaces, secret is not None)
    for target in targets:
        probe(report, target, mesh, min(timeout, 5.0), secret, None)
    for seed in seeds:
        host, port = parse_seed(seed)
        probe(report, Target(f"seed {seed}", host, port), mesh, min(timeout, 5.0), secret, server)
    report.add(
        "N/A",
        "clock skew",
        "status replies carry no wall-clock time, so skew between hosts is not measured here",
        "compare clocks on each host (timedatectl, chronyc tracking): ttl_s, "
        "deliver_at and the publish-id dedupe window use wall time",
    )
    summary = f"{report.failed} failed, {report.warned} warning(s)"
    if report.failed:
        raise CliError(f"doctor: {summary}")
    console.print(f"doctor: {summary}", soft_wrap=True)
