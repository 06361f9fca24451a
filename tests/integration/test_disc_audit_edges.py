"""Discovery at its edges: seed host names that can never resolve, node names too long
for an mDNS label, and a node bound to every interface ("0.0.0.0") announcing itself."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import zmq

import zmesh
from tests.conftest import LOOPBACK, wait_until
from tests.waiting import until


def peer_names(node: zmesh.Node) -> set[str]:
    return {p["name"] for p in node.peers() if p["alive"]}


@pytest.mark.parametrize(
    "seed",
    [
        "a..b:4000",  # an empty label
        "x" * 64 + ".example:4000",  # a label longer than DNS takes
        "a." * 127 + "b:4000",  # a name longer than DNS takes
    ],
)
def test_a_seed_host_that_can_never_resolve_is_a_config_error(seed, tmp_path, mesh_name):
    """Such a name used to pass the config, then fail start() with the idna codec's raw
    UnicodeError, leaving the data dir locked by the half-started node."""

    def node(seeds: list[str]) -> zmesh.Node:
        return zmesh.Node(
            "n",
            mesh=mesh_name,
            data_dir=str(tmp_path / "n"),
            interfaces=LOOPBACK,
            mdns=False,
            seeds=seeds,
        )

    with pytest.raises(zmesh.ConfigError, match="not a host name"):
        node([seed]).start().close()
    with node([]):  # (the data dir is free: it starts)
        pass


def test_a_node_with_a_long_name_is_found_over_mdns(make_node):
    """A node name may be 128 characters; its mDNS instance name is one DNS label (63
    bytes at most): a name past 50 characters failed the node's start with mDNS on."""
    long = "n" * 128
    a = make_node(long, mdns=True)
    b = make_node("b", mdns=True)
    wait_until(
        lambda: peer_names(b) == {long} and peer_names(a) == {"b"},
        20,
        what="the long-named node and b to meet over mDNS",
    )


def test_a_malformed_mdns_record_does_not_end_discovery(make_node, mesh_name):
    """Anyone on the LAN may announce ``_zmesh._tcp``: a record whose TXT value is not
    UTF-8 raised in zeroconf's browser thread, which ended, and with it the node's mDNS
    discovery: a node announced after it was never found (all on loopback here)."""
    import socket

    from zeroconf import IPVersion, ServiceInfo, Zeroconf

    from zmesh._discovery.mdns import SERVICE_TYPE
    from zmesh._protocol.frames import PROTOCOL_VERSION

    def record(name: str, port: int, **txt: bytes) -> ServiceInfo:
        return ServiceInfo(
            SERVICE_TYPE,
            f"{name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton("127.0.0.1")],
            port=port,
            properties={"v": str(PROTOCOL_VERSION).encode(), **txt},
            server=f"{name}.local.",
        )

    zc = Zeroconf(interfaces=LOOPBACK, ip_version=IPVersion.V4Only)
    try:
        a = make_node("a", mdns=True)
        # (announced while a browses, one after the other: the bad record first)
        zc.register_service(record(f"{mesh_name}-bad", 9, mesh=b"\xff\xfe", ctrl=b"9"))
        # c does no mDNS of its own: only a's browser can find it, from this record.
        c = make_node("c")
        ctrl = int(c.control_address.rsplit(":", 1)[1])
        txt = {"mesh": mesh_name.encode(), "id": c.id.encode(), "ctrl": str(ctrl).encode()}
        zc.register_service(record(f"{mesh_name}-c", ctrl, **txt))
        wait_until(
            lambda: peer_names(a) == {"c"} and peer_names(c) == {"a"},
            20,
            what="a to find c over mDNS after a malformed record",
        )
    finally:
        zc.close()  # (says goodbye for its records)


WILDCARD_NODE = textwrap.dedent("""
    import sys, threading, zmesh
    from tests.waiting import until
    name, mesh, data_dir = sys.argv[1:4]
    node = zmesh.Node(name, mesh=mesh, data_dir=data_dir, interfaces=["0.0.0.0"],
                      mdns=True, heartbeat_interval_s=0.2, dead_after_s=1.5).start()
    print("up", flush=True)
    met = until(lambda: [p["control"] for p in node.peers() if p["alive"]], 30)
    print("met", *(met or ["nobody"]), flush=True)
    threading.Event().wait()  # (killed by the test)
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nodes_bound_to_every_interface_find_each_other_over_mdns(tmp_path: Path, mesh_name):
    """``interfaces=["0.0.0.0"]`` means every interface, as an empty list does; its mDNS
    record announced 127.0.0.1 alone, so two such nodes on two hosts never met. Two
    network namespaces on a bridge are the hosts (mDNS stays inside them)."""
    from tests.faults.netns.hosts import HostNet, NetnsUnavailable, check_netns_available, ip

    try:
        check_netns_available()
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    bed = HostNet(2)
    outs = [tmp_path / f"h{host.index}.out" for host in bed.hosts]
    try:
        bed.create()
        procs = []
        for host, out in zip(bed.hosts, outs, strict=True):
            ip("-n", host.netns, "route", "add", "default", "dev", "eth0")  # (as hosts have)
            with open(out, "wb") as f:
                args = [f"h{host.index}", mesh_name, str(tmp_path / f"data-{host.index}")]
                procs.append(bed.spawn(host, ["-c", WILDCARD_NODE, *args], f))

        def met() -> list[str]:
            said = [out.read_text().split("\n") for out in outs]
            return [next((ln for ln in s if ln.startswith("met ")), "") for s in said]

        until(lambda: all(met()) or any(p.poll() is not None for p in procs), 60)
        a, b = bed.hosts
        said = [out.read_text() for out in outs]
        assert [m.rpartition(":")[0] for m in met()] == [
            f"met tcp://{b.addr}",
            f"met tcp://{a.addr}",
        ], said
    finally:
        problems = bed.close()
    assert not problems, f"host network teardown: {problems}"


def test_a_seed_named_by_host_name_is_let_go_once_its_node_answers(make_node, tmp_path):
    """A node answers from its address, never from a name: the contact of a seed given
    as ``localhost:PORT`` was never known to have been answered, and said hello every
    heartbeat for good, on a secured mesh through one DEALER per trusted key, so the
    seed counted (and warned of) a failed handshake for each wrong key, ever again."""
    from zmesh._security import generate_keypair

    keys = tmp_path / "keys"
    for name in ("hub", "a", "c", "d"):
        generate_keypair(keys, name)

    def secured(name: str) -> dict[str, str]:
        return {"secret_key_file": str(keys / f"{name}.key"), "trusted_keys_dir": str(keys)}

    hub = make_node("hub", **secured("hub"))
    port = hub.control_address.rsplit(":", 1)[1]
    a = make_node("a", seeds=[f"localhost:{port}"], **secured("a"))
    wait_until(lambda: peer_names(hub) == {"a"} and peer_names(a) == {"hub"}, what="a met")
    probes = a.stats().get("probes", 0)
    # Three contact renewals' worth of heartbeats (a probe each).
    wait_until(lambda: a.stats().get("probes", 0) >= probes + 30, what="30 heartbeats of a")
    # (the contacts of the wrong keys may fail their handshake once before a is met)
    assert hub.stats().get("handshakes_failed", 0) <= 3, hub.stats()


@pytest.mark.parametrize("named_again", [True, False])
def test_a_seed_address_is_kept_while_it_is_named(named_again):
    """A seed's contact is renewed while the seeds name its address (each heartbeat);
    one no longer named (its host name resolves elsewhere now) is let go."""
    from zmesh._engine.contacts import CONTACT_EXPIRY_BEATS, Contacts
    from zmesh._engine.stats import Counters

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    contacts = Contacts(ctx, Counters())
    ep = "tcp://127.0.0.1:9"  # (discard: nobody answers)
    try:
        contacts.add(ep, True, b"", None, b"hello")
        for _ in range(2 * CONTACT_EXPIRY_BEATS):
            if named_again:
                contacts.add(ep, True, b"", None, b"hello")
            contacts.beat(b"hello")
        assert bool(contacts) is named_again
    finally:
        contacts.close()
        ctx.term()
