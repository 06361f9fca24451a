"""The operator's commands (keys, dlq, top, snapshot, doctor, bench, CURVE options), run as
real processes on loopback: no fixed ports, mDNS only on 127.0.0.1, every child stopped by
pid at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest

import zmesh
from tests.conftest import spawn, wait_until
from tests.integration.test_cli import ADDRESS_RE, CLI, Proc, run_cli
from zmesh.cli.client import request_admin
from zmesh.cli.output import CliError

DLQ_APP = '''
"""A producer and a consumer in one process: the consumer fails two messages, then acks
whatever comes again (a replay) and says so; it stops when its stdin closes."""
import sys
import threading
import time

import zmesh
from tests.waiting import until

mesh, root = sys.argv[1], sys.argv[2]
stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


threading.Thread(target=watch_stdin, daemon=True).start()
deadline = time.monotonic() + 120
opts = dict(mesh=mesh, interfaces=["127.0.0.1"], mdns=False, heartbeat_interval_s=0.2,
            dead_after_s=2.0)
with zmesh.Node("producer", data_dir=f"{root}/producer", **opts) as prod, \\
        zmesh.Node("consumer", data_dir=f"{root}/consumer", seeds=[prod.control_address],
                   **opts) as cons:
    prod.topic("jobs", groups=["workers"])
    sub = cons.subscribe("jobs", group="workers")
    if not until(lambda: any(ln["topic"] == "jobs" and ln["lane"] == "workers"
                             and ln["members"] for ln in prod.status()["lanes"]),
                 deadline - time.monotonic()):
        sys.exit("the consumer never joined")
    for i, payload in enumerate([b"bad-one", b"bad-two"]):
        prod.publish("jobs", payload, key=f"k{i + 1}")
    failed = 0
    while failed < 2 and time.monotonic() < deadline:
        msg = sub.get(timeout=0.5)
        if msg is not None:
            msg.fail("bad record")
            failed += 1
    if not until(lambda: len(prod.dead_letters("jobs", "workers")) >= 2,
                 deadline - time.monotonic()):
        sys.exit("the failed messages were never parked")
    print("ready", prod.control_address, flush=True)
    while not stop.is_set() and time.monotonic() < deadline:
        msg = sub.get(timeout=0.2)
        if msg is not None:
            msg.ack()
            print("replayed ok", msg.payload.decode(), flush=True)
'''


class App(Proc):
    """A Python script child (not the CLI), with the same output files as Proc."""

    def __init__(self, tmp_path: Path, name: str, script: Path, args: list[str]) -> None:
        self.out = tmp_path / f"{name}.out"
        self.err = tmp_path / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = spawn([str(script), *args], stdout=out, stderr=err, stdin=subprocess.PIPE)


def node_toml(
    tmp_path: Path,
    name: str,
    mesh: str,
    *,
    mdns: bool = False,
    data_dir: Path | None = None,
    extra: str = "",
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[node]
name = "{name}"
mesh = "{mesh}"
data_dir = "{data_dir or tmp_path / (name + "-data")}"
interfaces = ["127.0.0.1"]
mdns = {"true" if mdns else "false"}
heartbeat_interval_s = 0.2
dead_after_s = 2.0
{extra}

[topics.t]
groups = ["g"]
""")
    return path


def start_node(
    tmp_path: Path, procs: list[Proc], name: str, mesh: str, **kw: object
) -> tuple[Proc, str]:
    proc = Proc(tmp_path, name, ["node", "run", str(node_toml(tmp_path, name, mesh, **kw))])
    procs.append(proc)
    return proc, proc.wait_for(ADDRESS_RE).group(1)


def ok(args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    done = run_cli(args, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done


def test_keys_generate_writes_a_pair_and_refuses_to_overwrite(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    done = ok(["keys", "generate", str(d), "--name", "edge-1"])
    key, pub = d / "edge-1.key", d / "edge-1.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    public = pub.read_text().strip()
    assert len(public) == 40 and public in done.stdout
    assert "trusted_keys_dir" in done.stdout and "edge-1.pub" in done.stdout
    secret = key.read_text()
    again = run_cli(["keys", "generate", str(d), "--name", "edge-1"], timeout=30)
    assert again.returncode == 1
    assert "refusing to overwrite" in again.stderr and "Traceback" not in again.stderr
    assert key.read_text() == secret and pub.read_text().strip() == public


def test_keys_generate_refuses_a_bad_directory_or_an_empty_name(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    under_a_file = run_cli(["keys", "generate", str(afile / "sub"), "--name", "k"], timeout=30)
    assert under_a_file.returncode == 2
    assert f"cannot create key directory {afile / 'sub'}: Not a directory" in under_a_file.stderr
    assert "Traceback" not in under_a_file.stderr
    empty = run_cli(["keys", "generate", str(tmp_path / "keys"), "--name", ""], timeout=30)
    assert empty.returncode == 2
    assert "key name '' is invalid" in empty.stderr and "Traceback" not in empty.stderr
    assert not (tmp_path / "keys").exists()


def test_an_error_the_cli_does_not_expect_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    # Output to a full disk (/dev/full: every write fails with ENOSPC), unbuffered so the
    # write fails inside the command, not at exit.
    with open("/dev/full", "wb") as full, (tmp_path / "err").open("wb") as err:
        proc = spawn(
            [*CLI, "keys", "generate", str(tmp_path / "keys"), "--name", "k"],
            stdout=full,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.wait(timeout=30) == 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    stderr = (tmp_path / "err").read_text()
    assert stderr.strip() == "zmesh: error: No space left on device", stderr


def test_dlq_list_replay_purge(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> None:
    script = tmp_path / "dlq_app.py"
    script.write_text(DLQ_APP)
    app = App(tmp_path, "app", script, [mesh_name, str(tmp_path / "data")])
    procs.append(app)
    address = app.wait_for(r"ready (127\.0\.0\.1:\d+)", timeout=60).group(1)
    where = ["--topic", "jobs", "--group", "workers"]

    table = ok(["dlq", "list", address, *where]).stdout
    for expected in ("bad record", "bad-one", "bad-two", "k1", "k2", "attempts"):
        assert expected in table, table
    letters = json.loads(ok(["dlq", "list", address, *where, "--json"]).stdout)
    assert [(d["key"], d["reason"], d["payload_text"]) for d in letters] == [
        ("k1", "bad record", "bad-one"),
        ("k2", "bad record", "bad-two"),
    ]
    assert all("payload" not in d for d in letters)  # (as payload_b64 and payload_text only)
    first, second = (d["seq"] for d in letters)

    replayed = ok(["dlq", "replay", address, *where, "--id", str(first)])
    assert "replayed 1 dead letter" in replayed.stdout
    app.wait_for(r"replayed ok bad-one", timeout=30)

    unconfirmed = run_cli(["dlq", "purge", address, *where, "--id", str(second)])
    assert unconfirmed.returncode == 1 and "nothing purged" in unconfirmed.stderr
    purged = ok(["dlq", "purge", address, *where, "--id", letters[1]["id"], "--yes"])
    assert "purged 1 dead letter" in purged.stdout
    assert json.loads(ok(["dlq", "list", address, *where, "--json"]).stdout) == []
    assert "no dead letters" in ok(["dlq", "list", address, *where]).stdout
    assert "replayed ok bad-two" not in app.stdout()

    # A name no topic can have is bad usage, before the node is asked; an error the node
    # reports (to a request the command would not make) is a CliError (exit 1) saying it.
    refused = run_cli(["dlq", "list", address, "--topic", "", "--group", "workers"])
    assert refused.returncode == 2 and "topic name '' is invalid" in refused.stderr
    with pytest.raises(CliError, match=f"{address} refused dead_letters: topic name 'a b'"):
        request_admin(address, "dead_letters", {"topic": "a b", "group": "workers"}, 10)


def test_top_refreshes_with_rates(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> None:
    _, address = start_node(tmp_path, procs, "hub", mesh_name)
    done = ok(["top", address, "--iterations", "2", "--interval", "0.2"])
    for expected in (
        "published/s",
        "acked/s",
        "redelivered/s",
        "lanes",
        "peers",
        "hub",
        "refresh 2",
    ):
        assert expected in done.stdout, done.stdout
    assert re.search(r"published/s\s+│\s+0\.0 │", done.stdout), done.stdout


def test_snapshot_of_a_running_node_restores_with_its_id(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    hub, address = start_node(tmp_path, procs, "hub", mesh_name)
    node_id = json.loads(ok(["status", address, "--json"]).stdout)["node"]["id"]
    copy = tmp_path / "copy"
    done = ok(["snapshot", str(tmp_path / "hub-data"), str(copy)])
    assert node_id in done.stdout and "To restore" in done.stdout
    assert "never beside it" in done.stdout
    assert (copy / "store" / "data.mdb").exists()
    again = run_cli(["snapshot", str(tmp_path / "hub-data"), str(copy)])
    assert again.returncode == 1 and "not empty" in again.stderr

    # A destination that cannot be a directory: one line, exit 1.
    (tmp_path / "afile").write_text("")
    for dest in (tmp_path / "afile" / "x", Path("/proc/snap")):
        bad = run_cli(["snapshot", str(tmp_path / "hub-data"), str(dest)])
        assert bad.returncode == 1, bad.stderr
        assert f"cannot create the snapshot destination {dest / 'store'}" in bad.stderr
        assert "Traceback" not in bad.stderr

    # Restore in place of the original: stop it, start a node on the copy.
    hub.popen.send_signal(signal.SIGTERM)
    assert hub.finish(timeout=30) == 0, hub.stderr()
    _, restored = start_node(tmp_path, procs, "hub", mesh_name, data_dir=copy)
    assert json.loads(ok(["status", restored, "--json"]).stdout)["node"]["id"] == node_id


def test_a_failed_snapshot_leaves_nothing_behind(tmp_path: Path, mesh_name: str) -> None:
    """A copy LMDB gives up on (a damaged source) removes what it wrote and the
    directories it made, so that it can be tried again at the same destination."""
    source = tmp_path / "source"
    loop = {"mesh": mesh_name, "interfaces": ["127.0.0.1"], "mdns": False}
    with zmesh.Node("n", data_dir=str(source), **loop) as node:  # type: ignore[arg-type]
        node.publish_many("t", [b"x" * 500] * 2000).wait_stored(30)
    with (source / "store" / "data.mdb").open("r+b") as f:  # (pages 8 to 27 garbled)
        f.seek(8 * 4096)
        f.write(b"\xff" * 20 * 4096)
    kept = tmp_path / "kept"  # (a destination that was there stays; what it made does not)
    kept.mkdir()
    for dest in (tmp_path / "new" / "copy", kept):
        for _attempt in range(2):
            done = run_cli(["snapshot", str(source), str(dest)])
            assert done.returncode == 1, done.stderr
            assert "snapshot failed" in done.stderr and "MDB_CORRUPTED" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "source"]
    assert list(kept.iterdir()) == []


def test_doctor_finds_the_mesh_and_flags_another(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    trusted = tmp_path / "trusted"
    for name in ("guard", "operator"):
        ok(["keys", "generate", str(trusted), "--name", name])
    _, address = start_node(tmp_path, procs, "mine", mesh_name, mdns=True)
    start_node(tmp_path, procs, "theirs", mesh_name + "-other", mdns=True)
    start_node(
        tmp_path,
        procs,
        "guard",
        mesh_name,
        mdns=True,
        extra=f'secret_key_file = "{trusted / "guard.key"}"\ntrusted_keys_dir = "{trusted}"',
    )
    port = address.rpartition(":")[2]

    def doctor(*extra: str) -> subprocess.CompletedProcess:
        def seen_all() -> subprocess.CompletedProcess | None:
            done = run_cli(
                [
                    "doctor",
                    "--interface",
                    "127.0.0.1",
                    "--mesh",
                    mesh_name,
                    "--timeout",
                    "2",
                    *extra,
                ],
                timeout=60,
            )
            names = re.findall(r"node: (mine|theirs|guard)-\w+: mesh", done.stdout)
            return done if len(set(names)) == 3 else None

        # Registration probes for about a second after start: look again until all answer.
        found = wait_until(seen_all, 60, interval=0, what="doctor to see the three nodes")
        assert isinstance(found, subprocess.CompletedProcess)
        assert found.returncode == 0, found.stdout + found.stderr
        return found

    out = doctor().stdout
    assert re.search(r"OK\s+mdns socket: .*127\.0\.0\.1", out), out
    assert re.search(rf"OK\s+node: mine-\w+: mesh {mesh_name}, .*:{port}", out), out
    assert re.search(rf"WARN\s+node: theirs-\w+: mesh {mesh_name}-other, .*another mesh", out)
    assert re.search(rf"OK\s+mine-\w+ control port: TCP 127\.0\.0\.1:{port}", out), out
    assert re.search(rf"OK\s+mine-\w+ status: node mine of mesh {mesh_name}", out), out
    assert re.search(rf"WARN\s+node: guard-\w+: mesh {mesh_name}, .*secured", out), out
    assert re.search(r"WARN\s+guard-\w+ status: skipped: the node is secured", out), out
    assert re.search(r"N/A\s+clock skew", out), out

    # With a trusted key pair the secured node is asked too (its key comes from mDNS).
    keyed = doctor("--secret-key-file", str(trusted / "operator.key")).stdout
    assert re.search(rf"OK\s+guard-\w+ status: node guard of mesh {mesh_name}", keyed), keyed
    assert re.search(rf"OK\s+mine-\w+ status: node mine of mesh {mesh_name}", keyed), keyed


def test_doctor_reports_a_dead_seed(tmp_path: Path) -> None:
    # A port bound but not listening: taken from anyone else, and refusing connections.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        done = run_cli(["doctor", "--no-mdns", "--seed", f"127.0.0.1:{port}", "--timeout", "1"])
    assert done.returncode == 1
    assert re.search(rf"FAIL\s+seed 127\.0\.0\.1:{port} control port", done.stdout), done.stdout
    assert "1 failed" in done.stderr and "Traceback" not in done.stderr


def test_secured_node_needs_keys(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> None:
    trusted, strangers = tmp_path / "trusted", tmp_path / "strangers"
    for d, name in ((trusted, "node1"), (trusted, "operator"), (strangers, "x")):
        ok(["keys", "generate", str(d), "--name", name])
    extra = f'secret_key_file = "{trusted / "node1.key"}"\ntrusted_keys_dir = "{trusted}"'
    _, address = start_node(tmp_path, procs, "vault", mesh_name, extra=extra)
    keys = [
        "--server-key",
        str(trusted / "node1.pub"),
        "--secret-key-file",
        str(trusted / "operator.key"),
    ]

    status = json.loads(ok(["status", address, "--json", *keys]).stdout)
    assert status["node"]["name"] == "vault"
    inline = ["--server-key", (trusted / "node1.pub").read_text().strip(), *keys[2:]]
    letters = ok(["dlq", "list", address, "--topic", "t", "--group", "g", *inline])
    assert "no dead letters" in letters.stdout
    assert "peers" in ok(["peers", address, *keys]).stdout

    bare = run_cli(["status", address, "--timeout", "1"])
    assert bare.returncode == 1
    assert "no status reply" in bare.stderr and "secured" in bare.stderr
    assert "--server-key" in bare.stderr and "Traceback" not in bare.stderr
    dlq = run_cli(["dlq", "list", address, "--topic", "t", "--group", "g", "--timeout", "1"])
    assert dlq.returncode == 1 and "secured" in dlq.stderr
    stranger = run_cli(
        [
            "status",
            address,
            "--timeout",
            "1",
            *keys[:2],
            "--secret-key-file",
            str(strangers / "x.key"),
        ]
    )
    assert stranger.returncode == 1 and "trusted_keys_dir" in stranger.stderr
    half = run_cli(["status", address, *keys[:2]])
    assert half.returncode == 2 and "go together" in half.stderr


def test_bench_runs_and_prints_rates() -> None:
    done = ok(["bench", "--messages", "2000", "--timeout", "120"], timeout=180)
    assert "msgs/s" in done.stdout
    assert re.search(r"throughput msgs/s\s+│\s+[\d,]+ │", done.stdout), done.stdout
    assert "p99" in done.stdout and "zmesh bench --suite" in done.stdout


def test_bench_suite_runs_the_benchmarks_of_the_checkout(tmp_path: Path) -> None:
    """From anywhere, --suite finds the checkout this zmesh is installed from; its relative
    paths are the caller's."""
    done = run_cli(
        ["bench", "--suite", "--quick", "--only", "raw_pushpull_1", "--json", "out.json"],
        timeout=120,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"raw_pushpull_1\s+│\s+[\d,]+ │", done.stdout), done.stdout
    assert "raw_pushpull_1" in json.loads((tmp_path / "out.json").read_text())["scenarios"]
    stray = run_cli(["bench", "--quick"], timeout=30)
    assert stray.returncode == 2 and "--suite" in stray.stderr
