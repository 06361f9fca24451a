"""``zmesh pub`` with each option, received as sent by ``zmesh sub --json``, in real
processes on loopback (a hub from `zmesh node run` as the seed); exit codes of both."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import read_line, reap, spawn, wait_until
from tests.integration.test_cli import ADDRESS_RE, CLI, LOOP, Proc, hub_toml, run_cli
from tests.waiting import pause


@pytest.fixture
def seed(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> str:
    """A hub (`zmesh node run`) whose control address the other commands seed from."""
    proc = Proc(tmp_path, "hub", ["node", "run", str(hub_toml(tmp_path, mesh_name))])
    procs.append(proc)
    return proc.wait_for(ADDRESS_RE).group(1)


def consumer(
    tmp_path: Path, procs: list[Proc], node: list[str], *args: str, name: str = "sub"
) -> Proc:
    """`zmesh sub t --group g ARGS`, once it consumes."""
    proc = Proc(tmp_path, name, ["sub", "t", "--group", "g", *node, *args])
    procs.append(proc)
    proc.wait_for("consuming t as g", stream="stderr")
    return proc


def lines(proc: Proc, n: int, timeout: float = 30.0) -> list[dict]:
    """The first ``n`` JSON lines ``proc`` printed (waiting for them)."""
    wait_until(
        lambda: len(proc.stdout().splitlines()) >= n,
        timeout,
        what=f"{n} lines from {proc.out.name}",
    )
    return [json.loads(line) for line in proc.stdout().splitlines()[:n]]


def test_each_pub_option_is_received_as_sent(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc]
) -> None:
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = consumer(tmp_path, procs, node, "--json")
    done = run_cli(
        [
            "pub",
            "t",
            "reading {{Count}}",
            *node,
            "--count",
            "3",
            "--key",
            "line-4",
            "--header",
            "unit=C",
            "--header",
            "n={{Count}}",
            "--msg-id",
            "job-{{Count}}",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert "published 3, acknowledged 3" in done.stdout
    assert "is open" not in done.stderr  # (the command's own node: no warning every call)
    got = lines(sub, 3)
    assert [m["payload"] for m in got] == ["reading 1", "reading 2", "reading 3"]
    assert [m["headers"] for m in got] == [{"unit": "C", "n": str(i)} for i in (1, 2, 3)]
    assert {m["key"] for m in got} == {"line-4"} and {m["attempt"] for m in got} == {1}
    assert {m["topic"] for m in got} == {"t"} and {m["group"] for m in got} == {"g"}
    assert len({m["id"] for m in got}) == 3 and len({m["partition"] for m in got}) == 1

    # One --msg-id for every message: the producer stores one, whose receipt they follow.
    # The output says so, and counts that one message once per group.
    same = run_cli(["pub", "t", "once", *node, "--count", "3", "--msg-id", "the-one"])
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines() == [
        "published 3, acknowledged 3 (topic t)",
        "  2 repeated a msg_id published before: not stored again, each has that message's outcome",
        "  g: 1 acked",
    ]
    # Lines of stdin, and a file as one binary message.
    piped = run_cli(["pub", "t", *node], stdin_data=b"first line\nsecond line\n")
    assert piped.returncode == 0, piped.stderr
    blob = bytes(range(256))
    (tmp_path / "blob.bin").write_bytes(blob)
    filed = run_cli(["pub", "t", *node, "--file", str(tmp_path / "blob.bin")])
    assert filed.returncode == 0, filed.stderr
    got = lines(sub, 7)[3:]
    assert [m.get("payload") for m in got[:3]] == ["once", "first line", "second line"]
    assert base64.b64decode(got[3]["payload_b64"]) == blob and "payload" not in got[3]

    # --delay: delivered no sooner than that after publishing.
    started = time.time()
    delayed = run_cli(["pub", "t", "later", *node, "--delay", "1.5"])
    assert delayed.returncode == 0, delayed.stderr
    assert time.time() - started >= 1.5  # (it waited for the ack of the delayed message)
    [late] = lines(sub, 8)[7:]
    assert late["payload"] == "later" and time.time() >= late["published_at"] + 1.5
    assert len(sub.stdout().splitlines()) == 8  # (the duplicates never came)


def test_pub_to_ephemeral_subscribers_waits_for_no_ack(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc]
) -> None:
    """`zmesh pub` with only ephemeral subscribers of its topic (`zmesh sub` without
    --group, here by a pattern): it publishes once it knows them, and exits 0 at once,
    as no ack can come (at most once)."""
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = Proc(tmp_path, "sub", ["sub", "plant.*", *node, "--count", "2", "--timeout", "60"])
    procs.append(sub)
    sub.wait_for(re.escape("consuming plant.* (ephemeral)"), stream="stderr")
    for payload in ("one", "two"):
        # (the old way waited 3 s for a group, then 30 s for acks, and failed)
        done = run_cli(["pub", "plant.l4", payload, *node, "--timeout", "60"], timeout=20)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "published 1, acknowledged 0 (topic plant.l4)",
            "  ephemeral subscribers: 1, sent at most once (they do not ack)",
        ]
        assert "no consumer group of plant.l4 was found: no acks to wait for" in done.stderr
        assert "found within" not in done.stderr  # (no discovery wait to its end)
    assert sub.finish(timeout=30) == 0, sub.stderr()
    assert sub.stdout() == "one\ntwo\n"


def test_pub_finds_a_group_subscribed_by_a_pattern(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc]
) -> None:
    # The group's lane of the topic is made at its first message: pub finds the group by
    # the member's pattern subscription, not by a lane, and waits for its acks.
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = Proc(tmp_path, "sub", ["sub", "plant.*", "--group", "g", *node, "--count", "2"])
    procs.append(sub)
    sub.wait_for(re.escape("consuming plant.* as g"), stream="stderr")
    done = run_cli(["pub", "plant.l4", "one", *node, "--count", "2", "--timeout", "60"])
    assert done.returncode == 0, done.stderr
    assert "published 2, acknowledged 2 (topic plant.l4)" in done.stdout
    assert "found within" not in done.stderr  # (no discovery wait to its end)
    assert sub.finish(timeout=30) == 0, sub.stderr()


def test_pub_to_a_topic_no_group_consumes_says_what_the_peers_consume(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc]
) -> None:
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = Proc(tmp_path, "sub", ["sub", "readings", "--group", "ops", *node])
    procs.append(sub)
    sub.wait_for(re.escape("consuming readings as ops"), stream="stderr")
    done = run_cli(["pub", "readngs", "x", *node, "--discovery-wait", "0.5", "--timeout", "0.5"])
    assert done.returncode == 1
    said = " ".join(done.stderr.split())
    assert "no group consuming readngs found within 0.5s" in said, said
    assert "(the peers found consume: readings)" in said


def test_priority_and_ttl_act_on_a_kept_outbox(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    """Messages published with --data-dir while no member is there stay in that outbox;
    a node run on it later sends the urgent one first and drops the expired one."""
    outbox = tmp_path / "outbox"
    alone = [
        *LOOP,
        "--mesh",
        mesh_name,
        "--data-dir",
        str(outbox),
        "--group",
        "g",
        "--timeout",
        "0",
    ]
    for args in (
        ["low", "--priority", "200"],
        ["expires", "--ttl", "0.5"],
        ["urgent", "--priority", "0"],
    ):
        done = run_cli(["pub", "t", *args, *alone])
        assert done.returncode == 1, done.stderr  # (nobody acked: they stay)
        assert "stay in the outbox" in done.stderr
    pause(0.5)  # (the ttl runs out: the passing time is what is tested)
    toml = tmp_path / "producer.toml"
    toml.write_text(
        f'[node]\nname = "producer"\nmesh = "{mesh_name}"\n'
        f'data_dir = "{outbox}"\ninterfaces = ["127.0.0.1"]\nmdns = false\n'
    )
    producer = Proc(tmp_path, "producer", ["node", "run", str(toml)])
    procs.append(producer)
    address = producer.wait_for(ADDRESS_RE).group(1)
    sub = consumer(
        tmp_path,
        procs,
        [*LOOP, "--mesh", mesh_name, "--seed", address],
        "--json",
        "--max-in-flight",
        "1",
        "--count",
        "2",
        "--timeout",
        "60",
    )
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert [m["payload"] for m in lines(sub, 2)] == ["urgent", "low"]


def test_sub_raw_no_ack_and_redelivery(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc]
) -> None:
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    peek = consumer(
        tmp_path, procs, node, "--raw", "--no-ack", "--count", "2", "--timeout", "60", name="peek"
    )
    pub = Proc(
        tmp_path,
        "pub",
        ["pub", "t", "-", *node, "--group", "g", "--timeout", "60"],
        stdin=subprocess.PIPE,
    )
    procs.append(pub)
    assert pub.popen.stdin is not None
    pub.popen.stdin.write(b"one\ntwo\n")
    pub.popen.stdin.close()
    assert peek.finish(timeout=60) == 0, peek.stderr()
    assert peek.out.read_bytes() in (b"onetwo", b"twoone")  # (raw: nothing added)
    # Not acked: the next member gets them again, as second attempts.
    again = consumer(
        tmp_path, procs, node, "--json", "--count", "2", "--timeout", "60", name="again"
    )
    assert again.finish(timeout=60) == 0, again.stderr()
    got = lines(again, 2)
    assert sorted(m["payload"] for m in got) == ["one", "two"]
    assert {m["attempt"] for m in got} == {2}
    assert pub.finish(timeout=60) == 0, pub.stderr()
    assert "published 2, acknowledged 2" in pub.stdout()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_stop_signals_give_their_exit_codes(
    tmp_path: Path, mesh_name: str, seed: str, procs: list[Proc], sig: int, code: int
) -> None:
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    sub = consumer(tmp_path, procs, node)
    sub.popen.send_signal(sig)
    assert sub.finish(timeout=30) == code, sub.stderr()
    assert "interrupted after 0 messages" in sub.stderr()
    # A pub waiting for acks that will not come (the hub owes t to group g, nobody is in
    # it) is stopped the same way.
    pub = Proc(tmp_path, "pub", ["pub", "t", "x", *node, "--timeout", "120"])
    procs.append(pub)
    wait_until(
        lambda: "waiting up to" in pub.stderr() or pub.popen.poll() is not None,
        30,
        what="pub waiting for acks",
    )
    pub.popen.send_signal(sig)
    assert pub.finish(timeout=30) == code, pub.stderr()
    assert "interrupted with 1 of 1 messages not acknowledged" in pub.stderr()


def test_sub_whose_reader_went_away_ends_quietly(tmp_path: Path, mesh_name: str, seed: str) -> None:
    """`zmesh sub t --count 3 | head -1`: the next write finds no reader; sub ends at
    once, quietly, with 141 (as a command SIGPIPE killed), the message not printed given
    back."""
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed]
    err = tmp_path / "sub.err"
    with err.open("wb") as stderr:
        sub = spawn(
            [*CLI, "sub", "t", "--group", "g", *node, "--count", "3"],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        wait_until(lambda: "consuming t as g" in err.read_text(), 30, what="sub consuming")
        assert run_cli(["pub", "t", "one", *node]).returncode == 0
        assert read_line(sub) == b"one\n"
        assert sub.stdout is not None
        sub.stdout.close()  # (`head -1` is done)
        run_cli(["pub", "t", "two", *node, "--timeout", "0.5"])
        assert sub.wait(timeout=30) == 141, err.read_text()
    finally:
        reap(sub)
    assert "Traceback" not in err.read_text() and "error" not in err.read_text()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_ends_pub_reading_stdin(
    tmp_path: Path, mesh_name: str, procs: list[Proc], sig: int, code: int
) -> None:
    """A pub waiting for a line of stdin that does not come (`sleep 60 | zmesh pub`)
    stops at once, and removes its temporary data dir."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    pub = Proc(
        tmp_path,
        "pub",
        ["pub", "t", *LOOP, "--mesh", mesh_name, "--group", "g"],
        stdin=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    procs.append(pub)
    # Its node started (signals are handled from before its data dir is made): reading.
    wait_until(lambda: list(scratch.glob("zmesh-pub-*/store")), 30, what="pub's node")
    pub.popen.send_signal(sig)
    assert pub.finish(timeout=10) == code, pub.stderr()
    assert "interrupted before anything was published" in pub.stderr()
    assert list(scratch.iterdir()) == []


def test_pub_fails_clearly_when_not_acknowledged(tmp_path: Path, mesh_name: str) -> None:
    done = run_cli(
        ["pub", "t", "x", *LOOP, "--mesh", mesh_name, "--group", "g", "--timeout", "0.3"]
    )
    assert done.returncode == 1
    assert "published 1, acknowledged 0" in done.stdout
    assert "1 of 1 messages not acknowledged within 0.3s (groups owed: g)" in done.stderr
    bad = run_cli(["pub", "t", "{{Nope}}", *LOOP])
    assert bad.returncode == 2 and "unknown template {{Nope}}" in bad.stderr
    header = run_cli(["pub", "t", "x", "--header", "novalue", *LOOP])
    assert header.returncode == 2 and "'novalue' is not KEY=VALUE" in header.stderr
    # A --file that is not there: bad usage, before a node starts (and waits 3 s).
    missing = run_cli(["pub", "t", "--file", str(tmp_path / "nope"), *LOOP])
    assert missing.returncode == 2 and "'--file'" in missing.stderr
    assert "No such file" in missing.stderr and "is open" not in missing.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["pub", "t", "x", "--group", "g", "--wait-groups", "2"], "with --group the groups"),
        (["pub", "t", "x", "--ttl", "1", "--delay", "5"], "ttl=1 ends before the message is due"),
        (["sub", "t", "--json", "--raw"], "--json and --raw print messages two ways"),
        (["sub", "t", "--no-ack"], "--no-ack goes with --group"),
    ],
)
def test_contradictory_options_are_bad_usage(args: list[str], said: str) -> None:
    done = run_cli([*args, *LOOP])
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unresolvable_seed_is_reported_at_start(tmp_path: Path, mesh_name: str) -> None:
    done = run_cli(
        [
            "pub",
            "t",
            "x",
            *LOOP,
            "--mesh",
            mesh_name,
            "--seed",
            "no-such-host.invalid:4000",
            "--group",
            "g",
            "--timeout",
            "0.2",
        ]
    )
    assert done.returncode == 1
    [warning] = [ln for ln in done.stderr.splitlines() if "no-such-host.invalid" in ln]
    assert "WARNING" in warning and "does not resolve" in warning
    assert "tried until it resolves" in warning


def test_pub_and_sub_join_a_secured_mesh(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> None:
    trusted = tmp_path / "trusted"
    for name in ("hub", "reader", "writer"):
        done = run_cli(["keys", "generate", str(trusted), "--name", name])
        assert done.returncode == 0, done.stderr
    toml = hub_toml(tmp_path, mesh_name)
    toml.write_text(
        toml.read_text().replace(
            "mdns = false",
            f'mdns = false\nsecret_key_file = "{trusted / "hub.key"}"\n'
            f'trusted_keys_dir = "{trusted}"',
        )
    )
    hub = Proc(tmp_path, "hub", ["node", "run", str(toml)])
    procs.append(hub)
    seed = hub.wait_for(ADDRESS_RE).group(1)
    node = [*LOOP, "--mesh", mesh_name, "--seed", seed, "--trusted-keys-dir", str(trusted)]
    sub = consumer(
        tmp_path,
        procs,
        [*node, "--secret-key-file", str(trusted / "reader.key")],
        "--json",
        "--count",
        "1",
        "--timeout",
        "60",
    )
    # The writer's key from the environment, as a context or a service would give it.
    done = run_cli(
        ["pub", "t", "sealed", *node],
        env={**os.environ, "ZMESH_SECRET_KEY_FILE": str(trusted / "writer.key")},
    )
    assert done.returncode == 0 and "acknowledged 1" in done.stdout, done.stderr
    assert sub.finish(timeout=60) == 0, sub.stderr()
    assert lines(sub, 1)[0]["payload"] == "sealed"
    # Without keys the secured hub never says hello: nobody consuming t is found.
    bare = run_cli(
        [
            "pub",
            "t",
            "open",
            *LOOP,
            "--mesh",
            mesh_name,
            "--seed",
            seed,
            "--discovery-wait",
            "0.5",
            "--timeout",
            "0.5",
        ]
    )
    said = " ".join(bare.stderr.split())
    assert bare.returncode == 1 and "no group consuming t found within 0.5s" in said
    assert "no peer found: check --mesh, --seed, --interface and, for a secured mesh" in said
