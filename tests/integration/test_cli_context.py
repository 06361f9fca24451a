"""Contexts and environment variables: where each common setting comes from (flag > env >
context > default), and a context that carries a command to its mesh. Each test has a
config dir of its own (XDG_CONFIG_HOME, see conftest)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from tests.integration.test_cli import ADDRESS_RE, Proc, hub_toml, run_cli


def ok(args: list[str], **kw: object) -> str:
    done = run_cli(args, **kw)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    return done.stdout


def shown(*args: str, env: dict[str, str] | None = None) -> dict:
    """What `zmesh context show --json` says, as {setting: (value, from)}."""
    out = json.loads(ok([*args, "context", "show", "--json"], env={**os.environ, **(env or {})}))
    return {k: (v["value"], v["from"]) for k, v in out["settings"].items()} | {
        "context": out["context"]
    }


def contexts_file() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "zmesh" / "contexts.toml"


def test_add_ls_select_rm(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    added = ok(
        [
            "context",
            "add",
            "plant",
            "--mesh",
            "plant",
            "--seed",
            "10.0.0.5:41000",
            "--seed",
            "sensor-host:41001",
            "--interface",
            "127.0.0.1",
            "--no-mdns",
            "--secret-key-file",
            "keys/op.key",
            "--http-address",
            "127.0.0.1:8080",
            "--description",
            "the plant floor",
            "--select",
        ],
        cwd=str(tmp_path),
    )
    assert "context plant saved" in added and "selected" in added
    stored = tomllib.loads(contexts_file().read_text())
    assert stored["selected"] == "plant"
    assert stored["contexts"]["plant"] == {
        "mesh": "plant",
        "seeds": ["10.0.0.5:41000", "sensor-host:41001"],
        "interfaces": ["127.0.0.1"],
        "mdns": False,
        "secret_key_file": str(tmp_path / "keys" / "op.key"),  # (stored absolute)
        "http_address": "127.0.0.1:8080",
        "description": "the plant floor",
    }
    assert oct(contexts_file().stat().st_mode & 0o777) == "0o600"

    ok(["context", "add", "lab", "--mesh", "lab"])
    again = run_cli(["context", "add", "lab", "--mesh", "other"])
    assert again.returncode == 1 and "pass --force" in again.stderr
    ok(["context", "add", "lab", "--mesh", "other", "--force"])
    table = ok(["context", "ls"])
    assert "* plant" in table and "  lab" in table and "10.0.0.5:41000" in table
    listed = json.loads(ok(["context", "ls", "--json"]))
    assert listed["selected"] == "plant" and listed["contexts"]["lab"] == {"mesh": "other"}

    assert "context lab selected" in ok(["context", "select", "lab"])
    assert ok(["context", "select"]).strip() == "lab"
    missing = run_cli(["context", "select", "nope"])
    assert missing.returncode == 2 and "no context named 'nope'" in missing.stderr
    ok(["context", "rm", "lab"])  # (the selected one: none is selected after it)
    assert ok(["context", "select"]).strip() == "no context selected"
    assert set(json.loads(ok(["context", "ls", "--json"]))["contexts"]) == {"plant"}

    bad = run_cli(["context", "add", "x", "--seed", "no-port"])
    assert bad.returncode == 2 and "'no-port' must be 'host:port'" in bad.stderr
    assert "x" not in json.loads(ok(["context", "ls", "--json"]))["contexts"]


def test_a_server_key_file_is_stored_absolute_and_a_key_as_it_is(tmp_path: Path) -> None:
    ok(["context", "add", "file", "--server-key", "keys/node.pub"], cwd=str(tmp_path))
    ok(["context", "add", "inline", "--server-key", "K" * 40], cwd=str(tmp_path))
    stored = tomllib.loads(contexts_file().read_text())["contexts"]
    assert stored["file"]["server_key"] == str(tmp_path / "keys" / "node.pub")
    assert stored["inline"]["server_key"] == "K" * 40


def test_each_setting_comes_from_flag_then_env_then_context_then_default() -> None:
    assert shown()["mesh"] == ("default", "default") and shown()["context"] is None
    ok(
        [
            "context",
            "add",
            "plant",
            "--mesh",
            "plant",
            "--seed",
            "10.0.0.5:41000",
            "--server-key",
            "K" * 40,
            "--http-address",
            "127.0.0.1:8080",
            "--select",
        ]
    )
    ok(["context", "add", "lab", "--mesh", "lab", "--interface", "127.0.0.1"])
    got = shown()
    assert got["context"] == "plant"
    assert got["mesh"] == ("plant", "context plant")
    assert got["seeds"] == (["10.0.0.5:41000"], "context plant")
    assert got["interfaces"] == ([], "default") and got["mdns"] == (None, "default")
    assert got["server_key"] == ("K" * 40, "context plant")
    assert got["http_address"] == ("127.0.0.1:8080", "context plant")

    env = {
        "ZMESH_MESH": "env-mesh",
        "ZMESH_SEED": "a:1, b:2",
        "ZMESH_MDNS": "false",
        "ZMESH_HTTP_ADDRESS": "127.0.0.1:9090",
    }
    got = shown(env=env)
    assert got["mesh"] == ("env-mesh", "env") and got["seeds"] == (["a:1", "b:2"], "env")
    assert got["mdns"] == (False, "env") and got["http_address"] == ("127.0.0.1:9090", "env")
    assert got["server_key"] == ("K" * 40, "context plant")  # (the rest still from it)

    got = shown("--context", "lab", env=env)  # a flag of the group...
    assert got["context"] == "lab" and got["mesh"] == ("env-mesh", "env")
    assert got["interfaces"] == (["127.0.0.1"], "context lab")
    got = json.loads(
        ok(
            ["context", "show", "--json", "--mesh", "flag-mesh", "--seed", "c:3"],
            env={**os.environ, **env, "ZMESH_CONTEXT": "lab"},
        )
    )
    settings = got["settings"]  # ...or of the command, over ZMESH_CONTEXT
    assert got["context"] == "lab"
    assert (settings["mesh"]["value"], settings["mesh"]["from"]) == ("flag-mesh", "flag")
    assert (settings["seeds"]["value"], settings["seeds"]["from"]) == (["c:3"], "flag")

    unknown = run_cli(["context", "show"], env={**os.environ, "ZMESH_CONTEXT": "nope"})
    assert unknown.returncode == 2 and "no context named 'nope'" in unknown.stderr
    assert "defined: lab, plant" in unknown.stderr


def test_a_broken_contexts_file_is_named() -> None:
    contexts_file().parent.mkdir(parents=True)
    contexts_file().write_text('[contexts.x\nmesh = "m"\n')
    done = run_cli(["pub", "t", "x", "--interface", "127.0.0.1"])
    assert done.returncode == 2 and str(contexts_file()) in done.stderr
    assert "cannot read the contexts file" in done.stderr
    keys = run_cli(["keys", "generate", "/nonexistent-dir/x"])  # (a command without them)
    assert str(contexts_file()) not in keys.stderr


def test_an_invalid_context_fails_only_the_commands_that_use_it() -> None:
    ok(["context", "add", "good", "--mesh", "plant", "--seed", "127.0.0.1:1", "--select"])
    with contexts_file().open("a") as f:
        f.write('\n[contexts.broken]\nseeds = ["no-port"]\n\n[contexts.odd]\ncolour = "blue"\n')
    # Commands that use another context (or none) work.
    assert shown()["context"] == "good"
    status = run_cli(["status", "--timeout", "0.2"])  # (the good context's seed: nobody)
    assert status.returncode == 1 and "no status reply from 127.0.0.1:1" in status.stderr
    listed = json.loads(ok(["context", "ls", "--json"]))
    assert set(listed["contexts"]) == {"good"} and set(listed["invalid"]) == {"broken", "odd"}
    assert "'no-port' must be 'host:port'" in listed["invalid"]["broken"]
    assert "unknown setting colour" in listed["invalid"]["odd"]
    table = ok(["context", "ls"], env={**os.environ, "COLUMNS": "300"})
    [row] = [line for line in table.splitlines() if " broken " in line]
    assert "invalid: seed 'no-port'" in row
    # The one in use fails, saying why and what to do.
    used = run_cli(["--context", "broken", "context", "show"])
    assert used.returncode == 2 and "the context 'broken' in use is invalid" in used.stderr
    assert "'no-port'" in used.stderr and "zmesh context rm broken" in used.stderr
    chosen = run_cli(["context", "select", "odd"])
    assert chosen.returncode == 2 and "is invalid: unknown setting colour" in chosen.stderr
    # It is removed, or replaced, and the others are kept as they were.
    ok(["context", "rm", "broken"])
    ok(["context", "add", "other", "--mesh", "other"])
    listed = json.loads(ok(["context", "ls", "--json"]))
    assert set(listed["contexts"]) == {"good", "other"} and set(listed["invalid"]) == {"odd"}
    assert tomllib.loads(contexts_file().read_text())["contexts"]["odd"] == {"colour": "blue"}
    ok(["context", "add", "odd", "--mesh", "m", "--force"])
    listed = json.loads(ok(["context", "ls", "--json"]))
    assert listed["contexts"]["odd"] == {"mesh": "m"} and listed["invalid"] == {}
    assert listed["selected"] == "good"


def test_a_context_takes_pub_sub_and_status_to_the_mesh(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    hub = Proc(tmp_path, "hub", ["node", "run", str(hub_toml(tmp_path, mesh_name))])
    procs.append(hub)
    seed = hub.wait_for(ADDRESS_RE).group(1)
    ok(
        [
            "context",
            "add",
            "here",
            "--mesh",
            mesh_name,
            "--seed",
            seed,
            "--interface",
            "127.0.0.1",
            "--select",
        ]
    )
    sub = Proc(tmp_path, "sub", ["sub", "t", "--group", "g", "--count", "1", "--timeout", "60"])
    procs.append(sub)
    sub.wait_for("consuming t as g", stream="stderr")
    status = json.loads(ok(["status", "--json"]))  # (no address: the context's seed)
    assert status["node"]["name"] == "hub" and status["node"]["mesh"] == mesh_name
    assert [p["name"] for p in json.loads(ok(["peers", "--json"]))] == [f"sub-{sub.popen.pid}"]
    pub = run_cli(["pub", "t", "through the context"])
    assert pub.returncode == 0 and "acknowledged 1" in pub.stdout, pub.stderr
    assert pub.stderr == ""  # (nothing said on a call that went well)
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert sub.stdout() == "through the context\n"
    ok(["context", "select", "--none"])
    lost = run_cli(["status"])
    assert lost.returncode == 2 and "give the node's control address" in lost.stderr


def test_help_shows_examples_settings_and_exit_codes() -> None:
    top = ok(["--help"])
    assert "Examples:" in top and "zmesh context add plant" in top and "context" in top
    pub = ok(["pub", "--help"])
    for expected in (
        "[env: ZMESH_SEED]",
        "[env: ZMESH_SECRET_KEY_FILE]",
        "--msg-id",
        "{{Count}}",
        "Exit codes: 0 every group acknowledged",
        "130 / 143",
    ):
        assert expected in pub, expected
    assert "Exit codes: 0 after --count messages" in ok(["sub", "--help"])
    for command in ("pub", "sub", "request", "reply", "ls", "web"):  # (cli_node's rule)
        said = " ".join(ok([command, "--help"]).split())
        assert "off when a seed is given for pub, sub, request, reply, ls and web" in said
