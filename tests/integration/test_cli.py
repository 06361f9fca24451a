"""The ``zmesh`` command, run as real processes on loopback (mDNS off, no fixed ports)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import reap, spawn, wait_until
from zmesh._security import generate_keypair
from zmesh.spark._client import BridgeClient

CLI = ["-m", "zmesh.cli"]
LOOP = ["--interface", "127.0.0.1", "--no-mdns"]
ADDRESS_RE = re.compile(r"control (127\.0\.0\.1:\d+)")


class Proc:
    """A CLI child whose stdout and stderr go to files (no pipes to drain)."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        args: list[str],
        stdin: int | None = subprocess.DEVNULL,
        env: dict[str, str] | None = None,
    ) -> None:
        self.out = tmp_path / f"{name}.out"
        self.err = tmp_path / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = spawn([*CLI, *args], stdout=out, stderr=err, stdin=stdin, env=env)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(
        self, pattern: re.Pattern[str] | str, timeout: float = 30.0, stream: str = "stdout"
    ) -> re.Match[str]:
        """Wait until the output matches; fail early (with its stderr) if the process ends."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern

        def seen() -> re.Match[str] | None:
            found = regex.search(self.stdout() if stream == "stdout" else self.stderr())
            if found is None and self.popen.poll() is not None:
                pytest.fail(
                    f"process exited {self.popen.returncode} before printing "
                    f"{regex.pattern!r}; stderr:\n{self.stderr()}"
                )
            return found

        return wait_until(seen, timeout, what=f"{regex.pattern!r} on {stream}")  # type: ignore[return-value]

    def finish(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


def run_cli(
    args: list[str],
    timeout: float = 60.0,
    stdin_data: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the CLI to completion (killed after ``timeout``); text stdout and stderr."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    env.setdefault("COLUMNS", "120")  # rich tables wide enough to match rows
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, *CLI, *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(stdin_data, timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def hub_toml(tmp_path: Path, mesh: str) -> Path:
    path = tmp_path / "hub.toml"
    path.write_text(f"""
[node]
name = "hub"
mesh = "{mesh}"
data_dir = "{tmp_path / "hub-data"}"
interfaces = ["127.0.0.1"]
mdns = false
heartbeat_interval_s = 0.2
dead_after_s = 2.0

[topics.t]
groups = ["g"]
ack_timeout_s = 5.0
""")
    return path


@pytest.fixture
def hub(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> tuple[Proc, str]:
    """``zmesh node run`` on a TOML file: the seed the other commands start from."""
    proc = Proc(tmp_path, "hub", ["node", "run", str(hub_toml(tmp_path, mesh_name))])
    procs.append(proc)
    return proc, proc.wait_for(ADDRESS_RE).group(1)


def status_json(address: str) -> dict:
    done = run_cli(["status", address, "--json", "--timeout", "5"])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pub_to_sub_through_a_seed(
    tmp_path: Path, mesh_name: str, hub: tuple[Proc, str], procs: list[Proc]
) -> None:
    _, seed = hub
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = Proc(
        tmp_path, "sub", ["sub", "t", "--group", "g", *node, "--count", "3", "--timeout", "60"]
    )
    procs.append(sub)
    sub.wait_for("consuming t as g", stream="stderr")
    pub = run_cli(
        ["pub", "t", "-", *node, "--group", "g", "--timeout", "60"],
        stdin_data=b"alpha\nbeta\ngamma\n",
        timeout=90,
    )
    assert pub.returncode == 0, pub.stderr
    assert "published 3, acknowledged 3" in pub.stdout
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert sorted(sub.stdout().split()) == ["alpha", "beta", "gamma"]


def test_sub_max_message_bytes_has_larger_payloads_parked(
    tmp_path: Path, mesh_name: str, hub: tuple[Proc, str], procs: list[Proc]
) -> None:
    _, seed = hub
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = Proc(
        tmp_path,
        "sub",
        [
            "sub",
            "t",
            "--group",
            "g",
            *node,
            "--count",
            "1",
            "--timeout",
            "60",
            "--max-message-bytes",
            "64",
        ],
    )
    procs.append(sub)
    sub.wait_for("consuming t as g", stream="stderr")
    long_line = "x" * 100
    pub = run_cli(
        ["pub", "t", "-", *node, "--group", "g", "--timeout", "60"],
        stdin_data=f"{long_line}\nshort\n".encode(),
        timeout=90,
    )
    # Settled, but not delivered to g: exit 3, and the outcome per group.
    assert pub.returncode == 3, pub.stderr
    assert "published 2, acknowledged 1" in pub.stdout
    assert "g: 1 acked, 1 dead_lettered" in pub.stdout
    said = " ".join(pub.stderr.split())  # (rich wraps log lines)
    assert "parked as dead letters" in said and "max_message_bytes (64)" in said
    assert "1 of 2 messages were not acknowledged by every group" in said
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert sub.stdout().split() == ["short"]


def test_sub_exec_nacks_on_failure_then_acks(
    tmp_path: Path, mesh_name: str, hub: tuple[Proc, str], procs: list[Proc]
) -> None:
    _, seed = hub
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    flag, out = tmp_path / "failed-once", tmp_path / "handled.txt"
    # The first run fails (nack: redelivered after the backoff); later runs append the payload.
    cmd = f"test -e {flag} || {{ touch {flag}; exit 3; }}; cat >> {out}; echo >> {out}"
    sub = Proc(
        tmp_path,
        "sub",
        ["sub", "t", "--group", "g", *node, "--count", "2", "--timeout", "60", "--exec", cmd],
    )
    procs.append(sub)
    sub.wait_for("consuming t as g", stream="stderr")
    for payload in ("one", "two"):
        done = run_cli(["pub", "t", payload, *node, "--group", "g", "--timeout", "60"], timeout=90)
        assert done.returncode == 0, done.stderr
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert sorted(out.read_text().split()) == ["one", "two"]
    assert "exited 3" in sub.stderr() and "nacked" in sub.stderr()


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: nobody may reap it here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_sub_exec_kills_what_its_command_started(
    tmp_path: Path, mesh_name: str, hub: tuple[Proc, str], procs: list[Proc]
) -> None:
    """A --exec command past --exec-timeout is killed with its children (not sh alone),
    and so is one running when sub is stopped."""
    _, seed = hub
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    started = tmp_path / "pids"
    cmd = f"sleep 60 & echo $! >> {started}; wait"
    args = ["sub", "t", "--group", "g", *node, "--exec", cmd, "--exec-timeout", "1"]
    sub = Proc(tmp_path, "sub", [*args, "--timeout", "60"])
    procs.append(sub)
    sub.wait_for("consuming t as g", stream="stderr")

    def pids() -> list[int]:
        return [int(p) for p in started.read_text().split()] if started.exists() else []

    try:
        pub = Proc(tmp_path, "pub", ["pub", "t", "x", "--count", "2", *node, "--group", "g"])
        procs.append(pub)  # (it stays, waiting for acks: what it owes is delivered again)
        sub.wait_for("ran longer than 1s", stream="stderr")
        wait_until(lambda: len(pids()) >= 2, 30, what="a second command")
        first, second = pids()[:2]
        assert not running(first)  # (killed before the next one started)
        sub.popen.send_signal(signal.SIGTERM)  # (with the second one running, or killed)
        assert sub.finish(timeout=10) == 143, sub.stderr()
        wait_until(lambda: not running(second), 10, what="the second command's sleep killed")
    finally:
        for pid in pids():  # (without the fix they run on: not left behind)
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_status_and_peers_of_a_running_node(
    tmp_path: Path, mesh_name: str, hub: tuple[Proc, str], procs: list[Proc]
) -> None:
    hub_proc, address = hub
    sub = Proc(
        tmp_path,
        "sub",
        [
            "sub",
            "t",
            "--group",
            "g",
            *LOOP,
            "--mesh",
            mesh_name,
            "--seed",
            address,
            "--name",
            "reader-1",
            "--timeout",
            "120",
        ],
    )
    procs.append(sub)

    def sub_is_member() -> dict | None:
        status = status_json(address)
        lanes = [ln for ln in status["lanes"] if ln["topic"] == "t" and ln["lane"] == "g"]
        return status if lanes and len(lanes[0]["members"]) == 1 else None

    status = wait_until(sub_is_member, 30, interval=0.2, what="reader-1 in lane t/g at hub")
    assert isinstance(status, dict)
    assert status["node"]["name"] == "hub"
    assert status["node"]["mesh"] == mesh_name
    assert [p["name"] for p in status["peers"]] == ["reader-1"]
    assert status["peers"][0]["subscriptions"] == [["t", "g", "shared"]]
    [lane] = [ln for ln in status["lanes"] if ln["topic"] == "t" and ln["lane"] == "g"]
    assert lane["windows"] == [2000]  # two frames of 1,000 until it is sent some

    text = run_cli(["status", address])
    assert text.returncode == 0, text.stderr
    for expected in ("hub", mesh_name, "lanes", "reader-1", "peers", "counters"):
        assert expected in text.stdout
    assert re.search(r"│ t\s+│ g\s+│ shared\s+│\s+0 │\s+0 │", text.stdout), text.stdout
    assert "reader-1 (window 2000)" in text.stdout, text.stdout

    peers = run_cli(["peers", address])
    assert peers.returncode == 0, peers.stderr
    assert "reader-1" in peers.stdout and "t/g (shared)" in peers.stdout
    peers_json = json.loads(run_cli(["peers", address, "--json"]).stdout)
    assert [p["name"] for p in peers_json] == ["reader-1"]

    # A second node on the same data dir is refused with one clear line.
    twin = run_cli(["node", "run", str(tmp_path / "hub.toml")], timeout=60)
    assert twin.returncode == 1, twin.stderr
    assert "in use by another zmesh node" in twin.stderr and "Traceback" not in twin.stderr

    # SIGTERM stops `zmesh node run` cleanly.
    hub_proc.popen.send_signal(signal.SIGTERM)
    assert hub_proc.finish(timeout=30) == 0, hub_proc.stderr()
    assert "hub: closed" in hub_proc.stderr()


def test_status_without_a_node_fails_clearly() -> None:
    # A listening socket that never speaks ZMTP: connectable, but no reply ever comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        done = run_cli(["status", f"127.0.0.1:{port}", "--timeout", "1"])
    assert done.returncode == 1
    assert f"no status reply from 127.0.0.1:{port} within 1s" in done.stderr
    assert "Traceback" not in done.stderr
    bad = run_cli(["status", "not-an-address"])
    assert bad.returncode == 2
    assert "host:port" in bad.stderr
    # A host name that does not resolve is named as the reason (.invalid never does).
    unknown = run_cli(["status", "no-such-host.invalid:4000", "--timeout", "0.5"])
    assert unknown.returncode == 1
    assert "host 'no-such-host.invalid' does not resolve" in unknown.stderr, unknown.stderr


def test_ls_that_finds_no_node_fails(mesh_name: str) -> None:
    """As status, dlq and group ls do when there is nothing to ask: exit 1, no table."""
    alone = ["--mesh", mesh_name, *LOOP, "--wait", "0.5"]
    done = run_cli(["ls", "nodes", *alone])
    assert done.returncode == 1, done.stderr
    assert done.stdout == "" and f"no node of mesh '{mesh_name}' found" in done.stderr
    rows = run_cli(["ls", "topics", *alone, "--json"])  # (the empty rows, for what reads them)
    assert rows.returncode == 1 and json.loads(rows.stdout)["topics"] == [], rows.stderr


@pytest.mark.parametrize("command", ["status", "peers", "top", "dlq list --topic t --group g"])
@pytest.mark.parametrize("address", ["not-an-address", "a b:1", "[::1]:5"])
def test_a_bad_address_is_a_usage_error(command: str, address: str) -> None:
    done = run_cli([*command.split(), address, "--timeout", "1"], timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"address {address!r}" in done.stderr and "seed" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # NaN passes every bound: a wait of NaN waited for good, or a traceback
        (["status", "127.0.0.1:1", "--timeout", "nan"], "'--timeout': 'nan' is not a number"),
        (["top", "127.0.0.1:1", "--interval", "nan"], "'--interval': 'nan' is not a number"),
        (["pub", "t", "x", *LOOP, "--timeout", "nan"], "'--timeout': 'nan' is not a number"),
        (["ls", "nodes", *LOOP, "--timeout", "nan"], "'--timeout': 'nan' is not a number"),
        # a digit to str.isdigit, not to int()
        (["status", "a:\u00b2"], "address 'a:\u00b2' must be 'host:port'"),
        (
            ["dlq", "replay", "127.0.0.1:1", "--topic", "t", "--group", "g", "--id", "9" * 30],
            "is not a message id",
        ),
        (
            ["dlq", "list", "127.0.0.1:1", "--topic", "t", "--group", "g", "--limit", "9" * 20],
            "--limit",
        ),
        # an argument that is no text (bytes argv decodes with surrogates)
        (["pub", "t", "\udcff", *LOOP, "--timeout", "1"], "not valid text"),
    ],
)
def test_values_no_command_can_use_are_usage_errors(args: list[str], named: str) -> None:
    done = run_cli(args, timeout=30)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr


def test_a_table_whose_reader_went_away_ends_with_141(hub: tuple[Proc, str]) -> None:
    # (rich ended it with 1, a failed run, where a command writing itself gives 141)
    # The pipe's reader is gone before the table is written: with `| head -c 1` the
    # whole table could fit in the pipe before head ended, and the run rightly exit 0.
    _proc, address = hub
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root, COLUMNS="120")
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "zmesh.cli", "status", address],
            env=env,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr


def test_a_stop_signal_a_command_does_not_handle_removes_its_temporary_data_dir(
    tmp_path: Path, mesh_name: str
) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    err = tmp_path / "ls.err"
    with err.open("wb") as stderr:
        ls = spawn(
            [
                *CLI,
                "ls",
                "nodes",
                "--mesh",
                mesh_name,
                *LOOP,
                "--seed",
                "127.0.0.1:1",
                "--wait",
                "30",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
    try:
        wait_until(lambda: list(tmp_path.glob("zmesh-ls-*/LOCK")), 30, what="its node's data dir")
        ls.send_signal(signal.SIGTERM)
        assert ls.wait(30) == 143
    finally:
        reap(ls)
    assert not list(tmp_path.glob("zmesh-ls-*")), err.read_text()


def test_a_bad_log_level_names_where_it_came_from() -> None:
    env = {**os.environ, "ZMESH_LOG_LEVEL": "bogus"}
    from_env = run_cli(["status", "127.0.0.1:1"], timeout=30, env=env)
    assert from_env.returncode == 2
    assert "'bogus'" in from_env.stderr and "ZMESH_LOG_LEVEL" in from_env.stderr
    from_option = run_cli(["--log-level", "bogus", "status", "127.0.0.1:1"], timeout=30)
    assert from_option.returncode == 2
    assert "--log-level" in from_option.stderr and "ZMESH_LOG_LEVEL" not in from_option.stderr


@pytest.mark.parametrize(
    ("variable", "value", "args"),
    [
        ("ZMESH_SEED", "bad", ["pub", "t", "x", "--no-mdns"]),
        ("ZMESH_SEED", "[::1]:5", ["status"]),
        ("ZMESH_MDNS", "maybe", ["pub", "t", "x"]),
        ("ZMESH_INTERFACE", "bad", ["sub", "t", "--no-mdns"]),
        ("ZMESH_INTERFACE", "bad", ["node", "run", "node.toml"]),
        ("ZMESH_MESH", "bad mesh", ["request", "t", "x", "--no-mdns"]),
    ],
)
def test_a_bad_variable_is_named(variable: str, value: str, args: list[str]) -> None:
    """A bad value from the environment is bad usage (2) naming the variable, found
    when the command line is read (before a node starts, or a definition is read)."""
    done = run_cli(args, timeout=30, env={**os.environ, variable: value})
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert f"{value!r}" in said and f"(set by the environment variable {variable})" in said
    assert "Traceback" not in said and "is open" not in said


@pytest.mark.parametrize(
    "args",
    [
        ["pub", "no spaces", "x"],
        ["pub", "t", "x", "--group", ""],
        ["sub", "t", "--group", "no spaces"],
        ["sub", "no spaces", "--group", "g"],
    ],
    ids=["pub topic", "pub group", "sub group", "sub topic"],
)
def test_pub_and_sub_refuse_bad_names_before_starting_a_node(args: list[str]) -> None:
    done = run_cli([*args, *LOOP], timeout=30)
    assert done.returncode == 2, done.stderr
    assert "name" in done.stderr and "invalid" in done.stderr
    assert "is open" not in done.stderr  # (no node started: it would warn of an open mesh)


def test_pub_reading_a_terminal_says_so(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> None:
    main, terminal = os.openpty()
    try:
        pub = Proc(
            tmp_path,
            "pub",
            ["pub", "t", *LOOP, "--mesh", mesh_name, "--discovery-wait", "0"],
            stdin=terminal,
        )
        procs.append(pub)
        pub.wait_for("reading lines from stdin; Ctrl-D to end", stream="stderr")
        os.write(main, b"\x04")  # Ctrl-D: the end of input, nothing typed
        assert pub.finish(timeout=30) == 0, pub.stderr()
    finally:
        os.close(terminal)
        os.close(main)
    assert "nothing to publish" in pub.stderr()
    # Piped in: no hint (nobody is there to read it).
    piped = run_cli(
        ["pub", "t", *LOOP, "--mesh", mesh_name, "--discovery-wait", "0"],
        stdin_data=b"",
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert "Ctrl-D" not in piped.stderr


BAD_TOML = {
    "invalid": ("[node\nname = 'x'\n", "invalid TOML"),
    "unknown-key": ("[node]\nname = 'x'\ndata_dir = 'd'\ncolour = 'blue'\n", "colour"),
    "bad-value": (
        "[node]\nname = 'x'\ndata_dir = 'd'\nheartbeat_interval_s = -1\n",
        "heartbeat_interval_s",
    ),
    "bad-topic": ("[node]\nname = 'x'\ndata_dir = 'd'\n[topics.t]\npartitions = 0\n", "partitions"),
    "bad-name": ("[node]\nname = 'no spaces'\ndata_dir = 'd'\n", "name"),
    "empty": ("", "[node] needs name and data_dir"),
    "no-data-dir": ("[node]\nname = 'x'\n", "[node] needs data_dir"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOML))
def test_node_run_rejects_bad_toml(tmp_path: Path, case: str) -> None:
    text, key = BAD_TOML[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    done = run_cli(["node", "run", str(path)], timeout=30, cwd=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert str(path) in done.stderr
    assert key in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "body, said",
    [
        ("raise RuntimeError('boom at import')", "RuntimeError: boom at import"),
        ("def handle(msg:\n", "SyntaxError"),
        ("import sys\nsys.exit(3)", "SystemExit: 3"),
    ],
    ids=["raises", "syntax", "exits"],
)
def test_node_run_names_a_handler_module_that_fails_as_it_is_imported(
    tmp_path: Path, body: str, said: str
) -> None:
    (tmp_path / "broken_handlers.py").write_text(body + "\n")
    path = tmp_path / "node.toml"
    path.write_text(
        f"[node]\nname = 'x'\ndata_dir = '{tmp_path / 'd'}'\ninterfaces = ['127.0.0.1']\n"
        "mdns = false\n\n[subscriptions.orders]\ntopic = 't'\ngroup = 'g'\n"
        "handler = 'broken_handlers:handle'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # (run_cli puts the repository first)
    done = run_cli(["node", "run", str(path)], timeout=30, env=env)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "importing module 'broken_handlers' failed" in line and said in line, done.stderr
    assert "Traceback" not in done.stderr


def not_here(network: str) -> str:
    """An address of ``network`` (a documentation /24, "198.51.100") this host does not
    have: one it cannot bind."""
    for last in range(1, 255):
        address = f"{network}.{last}"
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                return address
    raise AssertionError(f"this host has every address of {network}.0/24")


def test_node_run_refuses_what_this_host_cannot_give_as_a_definition_error(
    tmp_path: Path,
) -> None:
    """A data_dir that is a file or cannot be made, an interface this host does not have
    (documentation addresses): exit 2, as a definition error (no restart loop under
    systemd), naming the file and key (or the option), before a node starts."""
    (tmp_path / "afile").write_text("")
    one, other = not_here("198.51.100"), not_here("203.0.113")
    cases = [
        (tmp_path / "afile", "127.0.0.1", [], "[node] data_dir", "exists and is not a directory"),
        (tmp_path / "afile" / "d", "127.0.0.1", [], "[node] cannot create data_dir", "Not a"),
        (tmp_path / "d", one, [], f"[node] interfaces: {one}", "not an address of this host"),
        (tmp_path / "d", "127.0.0.1", ["--interface", other], f"--interface: {other}", ""),
    ]
    for data_dir, iface, extra, where, why in cases:
        path = tmp_path / "node.toml"
        path.write_text(
            f"[node]\nname = 'x'\ndata_dir = '{data_dir}'\ninterfaces = ['{iface}']\nmdns = false\n"
        )
        done = run_cli(["node", "run", str(path), *extra], timeout=30)
        assert done.returncode == 2, done.stderr
        said = " ".join(done.stderr.split())
        assert where in said and why in said and "Traceback" not in said
        assert not (tmp_path / "d").exists()  # (refused before anything is made)


def test_node_run_names_key_files_it_cannot_use(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "keys", "a")
    cases = [
        ("secret_key_file = 'keys/nope.key'", "[node] secret_key_file keys/nope.key (that is"),
        ("secret_key_file = 'keys/a.pub'", "is a public key (NAME.pub): give the secret one"),
        (
            "secret_key_file = 'keys/a.key'\ntrusted_keys_dir = 'keys/a.key'",
            "[node] trusted_keys_dir keys/a.key (that is",
        ),
    ]
    for lines, said in cases:
        path = tmp_path / "node.toml"
        path.write_text(
            f"[node]\nname = 'x'\ndata_dir = 'd'\ninterfaces = ['127.0.0.1']\nmdns = false\n"
            f"{lines}\n"
        )
        done = run_cli(["node", "run", str(path)], timeout=30, cwd=str(tmp_path))
        assert done.returncode == 2, done.stderr
        line = " ".join(done.stderr.split())
        assert f"{path}: " in line and said in line and "Traceback" not in line, line
        assert not (tmp_path / "d").exists()  # (refused before anything is made)


def test_node_run_starts_a_spark_bridge_and_publishes_into_it(
    tmp_path: Path, mesh_name: str, hub: tuple[Proc, str], procs: list[Proc]
) -> None:
    """A definition with a [bridge] table runs as a bridge: it logs what it is sent."""
    _hub, seed = hub
    path = tmp_path / "bridge.toml"
    path.write_text(f"""
[node]
name = "bridge"
mesh = "{mesh_name}"
data_dir = "{tmp_path / "bridge-data"}"
interfaces = ["127.0.0.1"]
mdns = false
seeds = ["{seed}"]
heartbeat_interval_s = 0.2

[bridge]
topics = ["t"]
group = "g"
log_dir = "{tmp_path / "bridge-log"}"
bind = "tcp://127.0.0.1:*"
""")
    bridge = Proc(tmp_path, "bridge", ["node", "run", str(path)])
    procs.append(bridge)
    endpoint = bridge.wait_for(r"bridge (tcp://127\.0\.0\.1:\d+)").group(1)
    done = run_cli(
        ["pub", "t", "-", "--mesh", mesh_name, "--seed", seed, *LOOP, "--group", "g"],
        stdin_data=b"one\ntwo\nthree\n",
    )
    assert done.returncode == 0, done.stderr
    with BridgeClient(endpoint) as client:
        assert sum(end for _head, end in client.info().values()) == 3
    bridge.popen.send_signal(signal.SIGTERM)
    assert bridge.finish(30) == 0, bridge.stderr()


def test_node_run_missing_file_and_bad_options() -> None:
    missing = run_cli(["node", "run", "/nonexistent/node.toml"], timeout=30)
    assert missing.returncode == 2
    assert "/nonexistent/node.toml" in missing.stderr and "Traceback" not in missing.stderr
    bad_mesh = run_cli(["pub", "t", "x", "--mesh", "not a mesh", *LOOP], timeout=30)
    assert bad_mesh.returncode == 2
    assert "mesh name" in bad_mesh.stderr and "Traceback" not in bad_mesh.stderr


def test_help_and_console_script() -> None:
    done = run_cli(["--help"], timeout=30)
    assert done.returncode == 0
    for command in ("demo", "pub", "sub", "status", "peers", "node"):
        assert command in done.stdout
    script = Path(sys.executable).parent / "zmesh"
    if not script.exists():
        pytest.skip("zmesh console script not installed next to this interpreter")
    installed = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert installed.returncode == 0 and "zmesh" in installed.stdout


@pytest.mark.slow
def test_demo_loses_nothing(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run_cli(
        ["demo", "--messages", "3000", "--timeout", "120"],
        timeout=280,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lost 0" in done.stdout
    assert re.search(r"│ lost\s+│\s+0 │", done.stdout), done.stdout
    assert re.search(r"delivered to workers \(2 members\)\s+│\s+3,000", done.stdout)
    assert re.search(r"delivered to audit \(1 member\)\s+│\s+3,000", done.stdout)
    assert "killed (SIGKILL)" in done.stdout
    assert list(scratch.iterdir()) == []  # data dirs, records and logs are gone
