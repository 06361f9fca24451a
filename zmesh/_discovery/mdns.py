"""mDNS announcement and browsing of ``_zmesh._tcp.local.`` with python-zeroconf.

zeroconf's callbacks only forward what they learn (a peer's control endpoint) to the IO
thread; all connecting happens there.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence

from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from .._protocol.addresses import endpoint
from .._protocol.frames import PROTOCOL_VERSION
from ..errors import ZMeshError
from .base import Found, Report

log = logging.getLogger(__name__)

SERVICE_TYPE = "_zmesh._tcp.local."
LOOKUP_TIMEOUT_MS = 3000
# An instance name is one DNS label (63 bytes): the node's name, cut to this, "-" and 12
# hex digits of its id.
MAX_NAME_IN_LABEL = 50
_EVERY = ("0.0.0.0", "*")  # an interface that binds them all


def _txt(props: dict[bytes, bytes | None], key: bytes) -> str:
    value = props.get(key)
    return value.decode() if value else ""


def local_addresses(interfaces: Sequence[str]) -> list[str]:
    """The IPv4 addresses to announce: the bound interfaces, or every local one (none
    named, or "0.0.0.0": every interface is bound)."""
    named = [a for a in interfaces if a not in _EVERY]
    if named:
        return named
    import ifaddr  # a zeroconf dependency

    addrs = [
        ip.ip
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if isinstance(ip.ip, str) and not ip.ip.startswith("127.")
    ]
    return addrs or ["127.0.0.1"]


class MdnsDiscovery:
    """Announces this node and reports peers of the same mesh to ``on_peer``."""

    def __init__(
        self,
        *,
        name: str,
        mesh: str,
        node_id: bytes,
        ctrl_port: int,
        data_port: int,
        interfaces: Sequence[str],
        public_key: bytes = b"",
    ) -> None:
        self.mesh = mesh
        self.node_id = node_id
        self._report: Report | None = None
        # ("0.0.0.0" binds every interface: mDNS speaks on every one too)
        self._interfaces = [a for a in interfaces if a not in _EVERY]
        self._closed = threading.Event()
        addrs = local_addresses(self._interfaces)
        self.info = ServiceInfo(
            SERVICE_TYPE,
            f"{name[:MAX_NAME_IN_LABEL]}-{node_id.hex()[:12]}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(a) for a in addrs],
            port=ctrl_port,
            properties={
                "v": str(PROTOCOL_VERSION),
                "mesh": mesh,
                "id": node_id.hex(),
                "ctrl": str(ctrl_port),
                "data": str(data_port),
                "pk": public_key.decode(),
            },
            server=f"zmesh-{node_id.hex()[:12]}.local.",
        )
        self._zc: Zeroconf | None = None
        self._browser: ServiceBrowser | None = None
        self._registrar: threading.Thread | None = None

    def start(self, report: Report) -> None:
        self._report = report
        if self._interfaces:
            self._zc = Zeroconf(interfaces=self._interfaces, ip_version=IPVersion.V4Only)
        else:
            self._zc = Zeroconf(ip_version=IPVersion.V4Only)
        self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._on_change])
        # Registration probes the name for about a second: do it off the caller's path.
        self._registrar = threading.Thread(
            target=self._register, daemon=True, name=f"zmesh-mdns-{self.node_id.hex()[:8]}"
        )
        self._registrar.start()

    def _register(self) -> None:
        try:
            assert self._zc is not None
            self._zc.register_service(self.info, allow_name_change=True)
        except Exception:
            if not self._closed.is_set():
                log.exception(
                    "mDNS registration failed; peers can still find this node "
                    "through seeds or gossip"
                )

    def _on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if state_change is ServiceStateChange.Removed or self._closed.is_set():
            return
        info = zeroconf.get_service_info(service_type, name, timeout=LOOKUP_TIMEOUT_MS)
        if info is None:
            return
        props = info.properties
        # (anyone on the LAN may announce this service: an exception here would end
        # zeroconf's browser thread, and this node's mDNS discovery with it)
        try:
            if _txt(props, b"mesh") != self.mesh or _txt(props, b"v") != str(PROTOCOL_VERSION):
                return
            peer_id = bytes.fromhex(_txt(props, b"id"))
            ctrl = int(_txt(props, b"ctrl"))
            key = _txt(props, b"pk").encode()
            if not 0 < ctrl < 65536:
                raise ValueError(ctrl)
        except ValueError:  # (a TXT value that is not UTF-8 too)
            log.debug("ignoring malformed mDNS record %s", name)
            return
        if peer_id == self.node_id or len(peer_id) != 16:
            return
        report = self._report
        try:
            for addr in info.parsed_addresses(IPVersion.V4Only):
                if report is not None:
                    report(Found(endpoint(addr, ctrl), peer_id, key))
        except ZMeshError:
            pass  # (the node closed meanwhile)

    def beat(self) -> None:
        pass  # (zeroconf reports as it learns)

    def close(self) -> None:
        self._closed.set()
        self._report = None
        if self._registrar is not None:
            self._registrar.join()
        if self._browser is not None:
            self._browser.cancel()
        if self._zc is not None:
            try:
                self._zc.unregister_all_services()
            finally:
                self._zc.close()
