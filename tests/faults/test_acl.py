"""Per-topic permissions: an ACL denies a subscription at the producer and data at the
consumer, admin rights gate status and dead letters, and keys and permissions taken away
at run time end within 2 s, from a file change or SIGHUP."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import zmesh
from tests.conftest import read_line, reap, run_module, spawn, wait_members, wait_until
from tests.waiting import pause
from zmesh._security import generate_keypair

REVOKED_WITHIN_S = 2.0


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    d = tmp_path / "trusted"
    for name in ("prod", "cons", "ops", "viewer"):
        generate_keypair(d, name)
    return d


def node_kw(keys: Path, name: str, acl: Path | None = None) -> dict:
    kw: dict = dict(secret_key_file=str(keys / f"{name}.key"), trusted_keys_dir=str(keys))
    if acl is not None:
        kw["acl_file"] = str(acl)
    return kw


def write(path: Path, text: str) -> Path:
    """Write ``text`` and make its modification visible (a new mtime, whatever the
    clock's granularity)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        path.touch()
    return path


def take(sub: zmesh.Subscription, got: list[bytes]) -> int:
    for m in sub.fetch(1000, timeout=0.05):
        got.append(bytes(m.payload))
        m.ack()
    return len(got)


def members(node: zmesh.Node, topic: str) -> list[str]:
    return [m for lane in node.status()["lanes"] if lane["topic"] == topic for m in lane["members"]]


def test_an_acl_denies_a_subscription_and_data_and_allows_the_rest(
    make_node, keys, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="zmesh._engine.guard")
    prod_acl = write(
        tmp_path / "prod-acl.toml",
        '[[allow]]\nwho = ["cons"]\nsubscribe = ["allowed.>", "other"]\n',
    )
    cons_acl = write(
        tmp_path / "cons-acl.toml", '[[allow]]\nwho = ["prod"]\npublish = ["allowed.*"]\n'
    )
    prod = make_node("prod", **node_kw(keys, "prod", prod_acl))
    cons = make_node("cons", seeds=[prod.control_address], **node_kw(keys, "cons", cons_acl))
    subs = {t: cons.subscribe(t, group="g") for t in ("allowed.x", "secret", "other")}
    wait_members(prod, "allowed.x", "g", 1)
    wait_members(prod, "other", "g", 1)
    for topic in subs:
        for i in range(20):
            prod.publish(topic, f"{topic} {i}".encode())
    got: dict[str, list[bytes]] = {t: [] for t in subs}
    wait_until(lambda: take(subs["allowed.x"], got["allowed.x"]) >= 20, what="allowed.x")
    # The producer never made the consumer a member of "secret"; the consumer refuses the
    # producer's data of "other" (handed back: it stays owed at the producer).
    wait_until(lambda: cons.stats().get("acl_denied", 0) >= 1, what="data of other denied")
    pause(0.5)  # (what would have come by now, had it been let through)
    assert take(subs["secret"], got["secret"]) == 0
    assert take(subs["other"], got["other"]) == 0
    assert members(prod, "secret") == [] and members(prod, "other") == [cons.id]
    assert prod.stats()["acl_denied"] >= 1
    status = prod.status()
    owed = {lane["topic"]: lane["pending"] for lane in status["lanes"]}
    assert owed["other"] == 20 and owed["allowed.x"] == 0
    # Logged once per key and topic, however many hellos and batches were denied.
    told = [r.getMessage() for r in caplog.records if "may not" in r.getMessage()]
    assert len([t for t in told if "subscribe secret" in t]) == 1
    assert len([t for t in told if "publish other" in t]) == 1


def test_admin_rights_gate_status_and_dead_letters(make_node, keys, tmp_path):
    acl = write(
        tmp_path / "acl.toml",
        '[[allow]]\nwho = ["ops"]\nadmin = ["*"]\n'
        '[[allow]]\nwho = ["viewer"]\nadmin = ["status"]\n',
    )
    node = make_node("prod", **node_kw(keys, "prod", acl))
    server = ["--server-key", str(keys / "prod.pub")]

    def cli(who: str, *args: str) -> tuple[int, str]:
        return run_module(
            [
                "-m",
                "zmesh.cli",
                *args,
                node.control_address,
                *server,
                "--secret-key-file",
                str(keys / f"{who}.key"),
            ],
            30,
            str(tmp_path),
        )

    assert cli("ops", "status")[0] == 0
    assert cli("viewer", "status")[0] == 0
    code, out = cli("cons", "status")
    assert code == 1 and "may not use the admin right 'status'" in out, out
    code, out = run_module(
        [
            "-m",
            "zmesh.cli",
            "dlq",
            "list",
            node.control_address,
            *server,
            "--secret-key-file",
            str(keys / "viewer.key"),
            "--topic",
            "t",
            "--group",
            "g",
        ],
        30,
        str(tmp_path),
    )
    assert code == 1 and "may not use the admin right 'dlq'" in out, out
    code, out = run_module(
        [
            "-m",
            "zmesh.cli",
            "dlq",
            "list",
            node.control_address,
            *server,
            "--secret-key-file",
            str(keys / "ops.key"),
            "--topic",
            "t",
            "--group",
            "g",
        ],
        30,
        str(tmp_path),
    )
    assert code == 0, out
    # The group right: what `zmesh group ls` and `group rm` ask for (refused to every key
    # while its operations went by other names than the right's).
    node.topic("t", groups=["g"])
    group_ls = ["-m", "zmesh.cli", "group", "ls", "--address", node.control_address, *server]
    code, out = run_module(
        [*group_ls, "--secret-key-file", str(keys / "ops.key")], 30, str(tmp_path)
    )
    assert code == 0, out
    code, out = run_module(
        [*group_ls, "--secret-key-file", str(keys / "viewer.key")], 30, str(tmp_path)
    )
    assert code == 1 and "may not use the admin right 'group'" in out, out


def test_a_key_revoked_at_run_time_can_no_longer_publish_or_subscribe(
    make_node, keys, record_summary
):
    prod = make_node("prod", **node_kw(keys, "prod"))
    cons = make_node("cons", seeds=[prod.control_address], **node_kw(keys, "cons"))
    to_cons = cons.subscribe("t", group="g")
    from_cons = prod.subscribe("u", group="h")
    wait_members(prod, "t", "g", 1)
    wait_members(cons, "u", "h", 1)
    for i in range(10):
        prod.publish("t", b"before %d" % i)
        cons.publish("u", b"before %d" % i)
    got_cons: list[bytes] = []
    got_prod: list[bytes] = []
    wait_until(
        lambda: take(to_cons, got_cons) >= 10 and take(from_cons, got_prod) >= 10,
        what="both ways before",
    )
    (keys / "cons.pub").unlink()  # the producer no longer trusts cons
    start = time.monotonic()
    wait_until(
        lambda: (
            members(prod, "t") == []
            and all(p["id"] != cons.id or not p["alive"] for p in prod.status()["peers"])
        ),
        REVOKED_WITHIN_S,
        what="cons revoked at the producer",
    )
    took = time.monotonic() - start
    wait_until(  # (not contacted again at its next start)
        lambda: cons.id not in {k.hex() for k in prod._engine.store.known_peers()},
        what="cons gone from the producer's store",
    )
    for i in range(10):
        prod.publish("t", b"after %d" % i)
        cons.publish("u", b"after %d" % i)
    pause(1.0)  # (what would have come by now, had it been let through)
    take(to_cons, got_cons)
    take(from_cons, got_prod)
    assert [p for p in got_cons if p.startswith(b"after")] == []
    assert [p for p in got_prod if p.startswith(b"after")] == []
    record_summary(f"revoked key: no longer a member {took:.2f}s after its .pub was removed")


def test_a_nodes_own_key_pair_changed_at_run_time_is_kept_until_it_restarts(
    make_node, keys, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="zmesh._engine.guard")
    own = tmp_path / "own"
    own.mkdir()
    key_file = own / "prod.key"
    key_file.write_text((keys / "prod.key").read_text())
    prod = make_node("prod", secret_key_file=str(key_file), trusted_keys_dir=str(keys))
    public = prod._engine.keys.public
    # Another pair in its file (not trusted by anyone): its sockets were bound with the
    # first, so it keeps that one, rather than being one node to some peers and another
    # to the next.
    generate_keypair(tmp_path / "other", "prod")
    write(key_file, (tmp_path / "other" / "prod.key").read_text())
    wait_until(
        lambda: "keeps the one it started with until it restarts" in caplog.text,
        what="the changed key file noticed",
    )
    assert prod._engine.keys.public == public and public not in prod._engine.listener.guard.revoked
    # A node that meets it only now (new connections both ways) is still let in.
    cons = make_node("cons", seeds=[prod.control_address], **node_kw(keys, "cons"))
    sub = cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    for i in range(10):
        prod.publish("t", b"%d" % i)
    got: list[bytes] = []
    wait_until(lambda: take(sub, got) >= 10, what="the messages at the new node")


def test_a_permission_taken_away_ends_within_2_s(make_node, keys, tmp_path):
    acl = write(tmp_path / "acl.toml", '[[allow]]\nwho = ["cons"]\nsubscribe = ["t"]\n')
    prod = make_node("prod", **node_kw(keys, "prod", acl))
    cons = make_node("cons", seeds=[prod.control_address], **node_kw(keys, "cons"))
    cons.subscribe("t", group="g")
    wait_members(prod, "t", "g", 1)
    write(acl, '[[allow]]\nwho = ["cons"]\nsubscribe = ["other"]\n')
    wait_until(lambda: members(prod, "t") == [], REVOKED_WITHIN_S, what="the member gone")
    write(acl, '[[allow]]\nwho = ["cons"]\nsubscribe = [">"]\n')
    wait_members(prod, "t", "g", 1, timeout=REVOKED_WITHIN_S)
    # A file that is not a good ACL leaves the one in force.
    write(acl, '[[allow]]\nwho = ["nobody"]\n')
    pause(1.0)  # (two looks at the files)
    assert members(prod, "t") == [cons.id]


def test_sighup_reloads_a_running_node(tmp_path, keys, mesh_name):
    acl = write(tmp_path / "acl.toml", '[[allow]]\nwho = ["ops"]\nadmin = ["status"]\n')
    definition = tmp_path / "node.toml"
    definition.write_text(
        f'[node]\nname = "n"\nmesh = "{mesh_name}"\n'
        f'data_dir = "{tmp_path / "n"}"\ninterfaces = ["127.0.0.1"]\n'
        f'mdns = false\nsecret_key_file = "{keys / "prod.key"}"\n'
        f'trusted_keys_dir = "{keys}"\nacl_file = "{acl}"\n'
    )
    proc = spawn(
        ["-m", "zmesh.cli", "node", "run", str(definition)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "300"},
    )
    try:
        assert b"control 127.0.0.1:" in read_line(proc)
        proc.send_signal(signal.SIGHUP)
        assert proc.stderr is not None
        line = b""
        for _ in range(20):
            line += proc.stderr.readline()
            if b"reloaded the trusted keys" in line:
                break
        assert b"reloaded the trusted keys (4, 0 revoked) and the ACL file" in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        reap(proc)
        assert proc.stderr is not None
        proc.stderr.close()


def test_a_key_file_that_cannot_be_read_is_refused_and_a_running_node_keeps_its_keys(
    make_node, keys, tmp_path, caplog
):
    caplog.set_level(logging.ERROR, logger="zmesh._engine.guard")
    prod = make_node("prod", **node_kw(keys, "prod"))
    # A directory (or a file that is not text) named like a key: the reload that met it
    # stopped the node's IO thread.
    (keys / "new.pub").mkdir()
    wait_until(lambda: "new.pub: cannot read it" in caplog.text, what="the bad key file seen")
    prod.publish("t", b"still running").wait_stored(5)
    with pytest.raises(zmesh.ConfigError, match=r"new.pub: cannot read it"):
        make_node("cons", **node_kw(keys, "cons"))
    (keys / "new.pub").rmdir()
    (keys / "bin.pub").write_bytes(b"\xff\xfe" * 20)
    with pytest.raises(zmesh.ConfigError, match=r"bin.pub: cannot read it"):
        make_node("cons", **node_kw(keys, "cons"))
