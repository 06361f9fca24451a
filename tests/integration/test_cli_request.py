"""``zmesh request`` and ``zmesh reply`` as real processes on loopback: answers, many
answers, a failing responder, nobody to answer; and their exit codes."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

import zmesh
from tests.conftest import wait_until
from tests.integration.test_cli import ADDRESS_RE, LOOP, Proc, hub_toml, run_cli


@pytest.fixture
def node(tmp_path: Path, mesh_name: str, procs: list[Proc]) -> list[str]:
    """The node options of a command that seeds from a hub (`zmesh node run`)."""
    proc = Proc(tmp_path, "hub", ["node", "run", str(hub_toml(tmp_path, mesh_name))])
    procs.append(proc)
    return [*LOOP, "--mesh", mesh_name, "--seed", proc.wait_for(ADDRESS_RE).group(1)]


def replier(tmp_path: Path, procs: list[Proc], node: list[str], name: str, *args: str) -> Proc:
    proc = Proc(tmp_path, name, ["reply", "calib.*", *node, *args])
    procs.append(proc)
    proc.wait_for("answering calib.*", stream="stderr")
    return proc


def test_request_gets_the_reply_and_reply_stops_after_count(
    tmp_path: Path, node: list[str], procs: list[Proc]
) -> None:
    server = replier(tmp_path, procs, node, "echo", "--count", "2")
    done = run_cli(["request", "calib.l4", "hello", *node])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello\n"
    done = run_cli(["request", "calib.l5", "again", *node, "--json", "--key", "k1"])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["topic"], doc["payload"], doc["ok"]) == ("calib.l5", "again", True)
    assert server.finish(30) == 0
    assert server.stdout() == "hello\nagain\n"


def test_request_many_gathers_every_broadcast_member(
    tmp_path: Path, node: list[str], procs: list[Proc]
) -> None:
    for name in ("r1", "r2"):
        replier(tmp_path, procs, node, name, "--mode", "broadcast", "--data", name)
    done = run_cli(["request", "calib.x", "?", *node, "--many", "--count", "2", "--timeout", "10"])
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["r1", "r2"]
    assert "2 replies" in done.stderr


def test_request_many_without_count_asks_every_member_it_finds(
    tmp_path: Path, node: list[str], procs: list[Proc]
) -> None:
    # The responders are found through the hub, one after the other: every one is asked.
    names = ("r1", "r2", "r3")
    for name in names:
        replier(tmp_path, procs, node, name, "--mode", "broadcast", "--data", name)
    hub = node[node.index("--seed") + 1]

    def hub_knows_them() -> bool:  # (what a request can learn through the hub)
        done = run_cli(["status", hub, "--json"])
        peers = json.loads(done.stdout)["peers"] if done.returncode == 0 else []
        return sum(1 for p in peers if p["alive"] and p["subscriptions"]) == len(names)

    wait_until(hub_knows_them, 30, what="the hub meeting every responder")
    for _ in range(3):
        done = run_cli(["request", "calib.x", "?", *node, "--many", "--timeout", "10"])
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()) == list(names), done.stderr


def test_request_many_says_which_responder_failed(
    tmp_path: Path, node: list[str], procs: list[Proc]
) -> None:
    """A failure among the replies of --many is a line on stderr, not a reply on stdout,
    and exit 3, as for a single request."""
    replier(tmp_path, procs, node, "fine", "--mode", "broadcast", "--data", "fine")
    replier(
        tmp_path, procs, node, "failing", "--mode", "broadcast", "--exec", "echo broken >&2; exit 4"
    )
    for extra, shown in (([], "fine\n"), (["--json"], None)):
        done = run_cli(
            ["request", "calib.x", "?", *node, "--many", "--count", "2", "--timeout", "10", *extra]
        )
        assert done.returncode == 3, done.stderr
        if shown is not None:
            assert done.stdout == shown
        else:
            [doc] = [json.loads(line) for line in done.stdout.splitlines()]
            assert (doc["payload"], doc["ok"]) == ("fine", True)
        said = " ".join(done.stderr.split())
        assert "failed: RuntimeError: --exec exited 4: broken" in said
        assert "2 replies, 1 of them failures" in said
        assert "1 of 2 responders' functions failed" in said


def test_a_failing_responder_and_nobody_to_answer(
    tmp_path: Path, node: list[str], procs: list[Proc]
) -> None:
    replier(tmp_path, procs, node, "failing", "--exec", "echo broken >&2; exit 4")
    done = run_cli(["request", "calib.l4", "?", *node])
    assert done.returncode == 3, done.stderr
    assert "--exec exited 4: broken" in done.stderr
    nobody = run_cli(["request", "nobody.here", "?", *node, "--discovery-wait", "0.5"])
    assert nobody.returncode == 1
    assert "no responders for 'nobody.here'" in nobody.stderr
    bad = run_cli(["request", "calib.*", "?", *node])
    assert bad.returncode == 2 and "wildcard" in bad.stderr


def test_sub_last_per_key_gets_the_kept_values_first(
    tmp_path: Path, mesh_name: str, make_node, procs: list[Proc]
) -> None:
    """`zmesh sub PATTERN --last-per-key`: what a producer keeps of each key first."""
    prod = make_node("prod", topics={"plant.>": zmesh.TopicConfig(keep_last=1)})
    for value in (b"20.5", b"21.0"):
        prod.publish("plant.l4.temp", value, key="s1").wait_stored(5)
    prod.publish("plant.l4.wind", b"3", key="s1").wait_stored(5)
    args = ["sub", "plant.*.temp", "--last-per-key", "--count", "1", "--timeout", "20"]
    sub = Proc(tmp_path, "sub", [*args, *LOOP, "--mesh", mesh_name, "--seed", prod.control_address])
    procs.append(sub)
    assert sub.finish(30) == 0, sub.stderr()
    assert sub.stdout() == "21.0\n"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_ends_a_request_waiting_for_its_reply(
    tmp_path: Path, mesh_name: str, make_node, procs: list[Proc], sig: int, code: int
) -> None:
    asked, release = threading.Event(), threading.Event()

    def slow(msg: zmesh.Message) -> bytes:
        asked.set()
        release.wait(60)
        return b"late"

    server = make_node("server")
    server.serve("calib.x", "responders", slow)
    try:
        request = Proc(
            tmp_path,
            "request",
            [
                "request",
                "calib.x",
                "?",
                *LOOP,
                "--mesh",
                mesh_name,
                "--seed",
                server.control_address,
                "--timeout",
                "60",
            ],
        )
        procs.append(request)
        assert asked.wait(30), request.stderr()
        request.popen.send_signal(sig)
        assert request.finish(timeout=10) == code, request.stderr()
        assert "interrupted" in request.stderr() and request.stdout() == ""
    finally:
        release.set()
