"""The command's logs (one line per record off a terminal, JSON lines, rich on one) and
`zmesh node run`'s own errors and --interface, in real processes on loopback."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.conftest import spawn, wait_until
from tests.integration.test_cli import ADDRESS_RE, CLI, LOOP, Proc, run_cli

PLAIN_RE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (WARNING|ERROR|INFO) "
    r"[\w.]+: \S.*$"
)
BAD_SEED = ["--seed", "no-such-host.invalid:4000", "--group", "g", "--timeout", "0.1"]


def node_file(tmp_path: Path, mesh: str, extra: str = "", interfaces: str = "127.0.0.1") -> Path:
    path = tmp_path / "agg.toml"
    path.write_text(f"""
[node]
name = "agg"
mesh = "{mesh}"
data_dir = "{tmp_path / "agg-data"}"
interfaces = ["{interfaces}"]
mdns = false
{extra}
""")
    return path


def test_plain_lines_off_a_terminal_and_json_lines(tmp_path: Path, mesh_name: str) -> None:
    plain = run_cli(["pub", "t", "x", *LOOP, "--mesh", mesh_name, *BAD_SEED])
    [warning] = [ln for ln in plain.stderr.splitlines() if "no-such-host" in ln]
    assert PLAIN_RE.match(warning), warning
    assert "WARNING zmesh.node: seed no-such-host.invalid:4000" in warning
    as_json = run_cli(
        ["--log-format", "json", "pub", "t", "x", *LOOP, "--mesh", mesh_name, *BAD_SEED]
    )
    records = [json.loads(ln) for ln in as_json.stderr.splitlines() if ln.startswith("{")]
    [record] = [r for r in records if "no-such-host" in r["msg"]]
    assert record["level"] == "WARNING" and record["logger"] == "zmesh.node"
    assert set(record) == {"ts", "level", "logger", "msg"}
    by_env = run_cli(
        ["pub", "t", "x", *LOOP, "--mesh", mesh_name, *BAD_SEED],
        env={**os.environ, "ZMESH_LOG_FORMAT": "json"},
    )
    assert any(ln.startswith("{") and "no-such-host" in ln for ln in by_env.stderr.splitlines())
    bad = run_cli(["status", "127.0.0.1:1"], env={**os.environ, "ZMESH_LOG_FORMAT": "xml"})
    assert bad.returncode == 2 and "ZMESH_LOG_FORMAT" in bad.stderr


def test_a_traceback_stays_on_its_record_s_line(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    # The handler parses JSON: "not json" makes it raise, and the node logs the exception
    # (with its traceback) each time before it nacks the message.
    (tmp_path / "parsing.py").write_text(
        "import json\n\ndef handle(msg):\n    json.loads(msg.payload)\n"
    )
    path = node_file(
        tmp_path,
        mesh_name,
        extra="""
[subscriptions.readings]
topic = "readings"
group = "aggregators"
handler = "parsing:handle"
""",
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    agg = Proc(tmp_path, "agg", ["node", "run", str(path)], env=env)
    procs.append(agg)
    seed = agg.wait_for(ADDRESS_RE).group(1)
    run_cli(
        [
            "pub",
            "readings",
            "not json",
            *LOOP,
            "--mesh",
            mesh_name,
            "--seed",
            seed,
            "--timeout",
            "0.5",
        ]
    )
    wait_until(lambda: "Traceback" in agg.stderr(), 30, what="the handler's traceback")
    record = next(ln for ln in agg.stderr().splitlines() if "Traceback" in ln)
    assert PLAIN_RE.match(record), record
    assert "ERROR zmesh.subscription: handler for readings/aggregators raised" in record
    assert "\\nTraceback (most recent call last):\\n" in record and "JSONDecodeError" in record
    assert all(
        PLAIN_RE.match(ln) for ln in agg.stderr().splitlines() if not ln.startswith("node agg")
    )  # (the notes of node run itself)


def test_rich_on_a_terminal(tmp_path: Path, mesh_name: str) -> None:
    main, terminal = os.openpty()
    try:
        proc = spawn(
            [*CLI, "pub", "t", "x", *LOOP, "--mesh", mesh_name, *BAD_SEED],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert proc.wait(timeout=60) == 1
        out = os.read(main, 1 << 16).decode(errors="replace")
    finally:
        os.close(terminal)
        os.close(main)
    [line] = [ln for ln in out.splitlines() if "no-such-host" in ln]
    assert "WARNING" in line and not PLAIN_RE.match(line.strip())


def test_node_run_interface_overrides_the_file(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    # 127.0.0.2 is loopback too on Linux: the file's address, overridden.
    path = node_file(tmp_path, mesh_name, interfaces="127.0.0.2")
    by_flag = Proc(tmp_path, "flag", ["node", "run", str(path), "--interface", "127.0.0.1"])
    procs.append(by_flag)
    address = by_flag.wait_for(r"control (127\.0\.0\.\d+:\d+)").group(1)
    assert address.startswith("127.0.0.1:")
    status = run_cli(["status", address, "--json"])
    assert status.returncode == 0 and json.loads(status.stdout)["node"]["name"] == "agg"
    by_flag.popen.terminate()
    assert by_flag.finish(timeout=30) == 0, by_flag.stderr()
    by_env = run_cli(
        ["node", "run", str(path)], timeout=30, env={**os.environ, "ZMESH_INTERFACE": "not-an-ip"}
    )
    assert by_env.returncode == 2 and "not-an-ip" in by_env.stderr
    assert "Traceback" not in by_env.stderr


def test_node_run_names_a_missing_handler_fully(tmp_path: Path, mesh_name: str) -> None:
    path = node_file(
        tmp_path,
        mesh_name,
        extra="""
[subscriptions.readings]
topic = "readings"
group = "aggregators"
handler = "zmesh.cli.roles:agregate"
""",
    )
    done = run_cli(["node", "run", str(path)], timeout=60)
    assert done.returncode == 2, done.stderr
    said = done.stderr
    assert str(path) in said and "subscription readings/aggregators" in said
    assert (
        "module zmesh.cli.roles (" in said and "roles.py) has no function named 'agregate'" in said
    )
    assert "Traceback" not in said
