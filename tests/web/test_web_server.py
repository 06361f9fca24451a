"""``zmesh web``'s server as a process, without a browser: its snapshot and its events
follow the scene's mesh, it refuses admin actions unless started with --admin, and with
--api it reads a node's HTTP API instead of joining the mesh."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import zmesh
from tests.conftest import fetched, wait_members, wait_until
from tests.integration.test_cli import Proc, run_cli
from tests.web.conftest import (
    ORDERS,
    Scene,
    build_scene,
    call_json,
    connect,
    get_json,
    lane_of,
    post_json,
    read_all,
    run_node,
)
from tests.web.test_browser import URL_RE
from zmesh._security import generate_keypair

SNAPSHOT_KEYS = {
    "mesh",
    "collected_at",
    "source",
    "admin",
    "interval_s",
    "nodes",
    "links",
    "topics",
    "groups",
    "lanes",
    "unreachable",
    "statuses",
    "stale",
}
LANE_POINT_KEYS = {
    "key",
    "node",
    "name",
    "topic",
    "lane",
    "group",
    "t",
    "rate_in",
    "rate_out",
    "pending",
}


def start(
    tmp_path: Path,
    procs: list[Proc],
    args: list[str],
    name: str = "web",
    env: dict[str, str] | None = None,
) -> str:
    web = Proc(
        tmp_path, name, ["web", "--listen", "127.0.0.1:0", "--interval", "0.2", *args], env=env
    )
    procs.append(web)
    return web.wait_for(URL_RE).group(1)


def first_event(url: str) -> tuple[str, dict]:
    with urllib.request.urlopen(url + "events", timeout=30) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        event = ""
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                return event, json.loads(line.removeprefix("data: "))
    raise AssertionError("the event stream ended")


def test_web_from_its_own_node_without_admin(
    tmp_path: Path, scene: Scene, procs: list[Proc]
) -> None:
    url = start(
        tmp_path,
        procs,
        [
            "--mesh",
            scene.hub.config.mesh,
            "--seed",
            scene.hub.control_address,
            "--interface",
            "127.0.0.1",
            "--no-mdns",
        ],
    )
    code, snap = get_json(url + "api/snapshot")
    assert code == 200 and set(snap) == SNAPSHOT_KEYS
    snap = wait_until(
        lambda: (
            (s := get_json(url + "api/snapshot")[1])["statuses"].keys()
            == {scene.hub.id, scene.prod.id, scene.cons.id}
            and s
        ),
        what="the web's node meeting the scene",
    )
    assert snap["admin"] is False and snap["source"].startswith("node web-")
    assert sorted(n["name"] for n in snap["nodes"]) == ["cons", "hub", "prod"]
    audit = [g for g in snap["groups"] if g["group"] == "audit"][0]
    assert audit["pending"] == ORDERS and {"rate_in", "rate_out"} <= set(audit)
    assert all(set(ln) == LANE_POINT_KEYS for ln in snap["lanes"])
    event, data = first_event(url)
    assert event == "snapshot" and set(data) == SNAPSHOT_KEYS
    code, history = get_json(url + "api/history")
    [points] = [ln for ln in history["lanes"] if ln["key"].endswith("/orders/audit")]
    assert len(points["t"]) == len(points["pending"]) >= 1 and points["pending"][-1] == ORDERS
    code, dead = get_json(url + "api/dead-letters?topic=orders&group=billing")
    assert code == 200 and [d["reason"] for d in dead["letters"]] == ["bad record"]
    code, dead = get_json(url + "api/dead-letters?topic=orders&group=billing&node=cons")
    assert code == 200 and dead["letters"] == []  # (the one dead letter is at prod)
    code, dead = get_json(url + "api/dead-letters?topic=orders&group=billing&node=ghost")
    assert code == 404
    code, dead = get_json(url + "api/dead-letters?topic=orders&group=billing&limit=1")
    assert code == 200 and dead["limit"] == 1 and len(dead["letters"]) == 1
    code, dead = get_json(url + "api/dead-letters?topic=orders&group=billing&limit=0")
    assert code == 400 and dead["error"].startswith("limit must be an int in 1..")
    body = {"node": "prod", "topic": "orders", "group": "billing"}
    code, answer = post_json(url + "api/dead-letters/replay", body)
    assert code == 403 and "--admin" in answer["error"]
    assert get_json(url + "api/dead-letters?topic=orders&group=billing")[1]["letters"]
    code, answer = post_json(url + "api/groups/rm", {"topic": "orders", "group": "audit"})
    assert code == 403 and "--admin" in answer["error"]
    with urllib.request.urlopen(url, timeout=10) as resp:
        page = resp.read().decode()
    assert '<script src="/static/uPlot.iife.min.js">' in page  # (shipped, no CDN)
    with urllib.request.urlopen(url + "static/uPlot.iife.min.js", timeout=10) as resp:
        assert resp.read().startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32)")


def test_web_from_a_nodes_http_api(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc]
) -> None:
    scene = build_scene(make_node)
    url = start(tmp_path, procs, ["--api", f"http://{scene.hub.http_address}", "--admin"])
    code, snap = get_json(url + "api/snapshot")
    assert code == 200 and snap["source"] == f"the HTTP API at http://{scene.hub.http_address}"
    # (the API's node is one of the mesh's: it stays in the view)
    assert sorted(n["name"] for n in snap["nodes"]) == ["cons", "hub", "prod"]
    code, dead = get_json(url + "api/dead-letters?topic=orders&group=billing")
    assert [d["node"] for d in dead["letters"]] == ["prod"]
    # The page allows actions, the node behind it does not (http_admin is off there).
    body = {"node": "prod", "topic": "orders", "group": "billing"}
    code, answer = post_json(url + "api/dead-letters/replay", body)
    assert code == 403 and "http_admin" in answer["error"]
    # Without --api, ZMESH_HTTP_ADDRESS (HOST:PORT, as a node's http_address) names it.
    env = {**os.environ, "ZMESH_HTTP_ADDRESS": scene.hub.http_address}
    url = start(tmp_path, procs, [], name="web-env", env=env)
    code, snap = get_json(url + "api/snapshot")
    assert code == 200 and snap["source"] == f"the HTTP API at http://{scene.hub.http_address}"


def test_an_api_that_answers_no_mesh_is_a_failure_and_looks_go_on(
    tmp_path: Path, procs: list[Proc]
) -> None:
    # An HTTP server that is no node's API (200, but no mesh in it): the sampler died on
    # it, unsaid, and the page froze with its last snapshot.
    class NoMesh(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoMesh)
    served = threading.Thread(target=server.serve_forever, daemon=True)
    served.start()
    try:
        api = f"http://127.0.0.1:{server.server_address[1]}"
        url = start(tmp_path, procs, ["--api", api])
        for _ in range(2):  # (told at each look: the sampler goes on)
            event, data = first_event(url)
            assert event == "failure" and "cannot read the mesh" in data["error"]
    finally:
        server.shutdown()
        server.server_close()
        served.join(10)


def test_admin_bodies_too_large_or_undecodable_are_refused_as_such(
    tmp_path: Path, scene: Scene, procs: list[Proc]
) -> None:
    url = start(tmp_path, procs, ["--api", f"http://{scene.hub.http_address}", "--admin"])
    action = url + "api/dead-letters/replay"
    big = {"node": "prod", "topic": "orders", "group": "billing", "pad": "x" * (2 << 20)}
    assert post_json(action, big)[0] == 413
    code, answer = post_json(
        action, {"node": "prod"}, content_type="application/json; charset=bogus"
    )
    assert code == 400 and "body is not JSON" in answer["error"]


def test_a_failing_source_is_told_to_the_pages(
    tmp_path: Path, mesh_name: str, procs: list[Proc]
) -> None:
    with socket.socket() as closed:  # (bound, never listening: connections are refused)
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
        url = start(tmp_path, procs, ["--api", nowhere], name="web-nowhere")
        event, data = first_event(url)
        error = f"cannot read the mesh from the HTTP API at {nowhere}: {nowhere}: "
        assert event == "failure" and data["error"].startswith(error)
        assert data["source"] == f"the HTTP API at {nowhere}"
        code, answer = get_json(url + "api/snapshot")
        assert code == 503 and answer["error"].startswith(error)

    node, api = run_node(tmp_path, mesh_name, procs)
    url = start(tmp_path, procs, ["--api", api])
    code, snap = get_json(url + "api/snapshot")
    assert code == 200 and snap["stale"] is None
    os.kill(node.popen.pid, signal.SIGKILL)
    node.popen.wait(10)
    stale = wait_until(
        lambda: get_json(url + "api/snapshot")[1]["stale"], what="the snapshot marked stale"
    )
    assert stale["error"].startswith(f"cannot read the mesh from the HTTP API at {api}: ")
    assert stale["age_s"] >= 0
    event, data = first_event(url)
    assert event == "snapshot" and data["stale"]["error"] == stale["error"]


def test_stopping_ends_the_open_pages_streams(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc]
) -> None:
    hub = make_node("hub")
    where = ["--mesh", hub.config.mesh, "--seed", hub.control_address, "--no-mdns"]
    web = Proc(
        tmp_path,
        "web",
        ["web", *where, "--interface", "127.0.0.1", "--listen", "127.0.0.1:0", "--interval", "0.2"],
    )
    procs.append(web)
    address = web.wait_for(URL_RE).group(1).removeprefix("http://").rstrip("/")
    with connect(address) as stream:
        stream.sendall(b"GET /events HTTP/1.1\r\nHost: " + address.encode() + b"\r\n\r\n")
        answer = stream.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        web.popen.terminate()
        answer += read_all(stream)
    # (the stream ends as a response does, its last chunk sent, not cut off after a
    # grace period: the server tells each page at once that it stops)
    assert answer.endswith(b"\r\n0\r\n\r\n")
    assert web.finish(30) == 0


def test_bad_input_is_a_400_that_says_why(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc]
) -> None:
    hub = make_node("hub")
    where = ["--mesh", hub.config.mesh, "--seed", hub.control_address, "--no-mdns"]
    url = start(tmp_path, procs, [*where, "--interface", "127.0.0.1", "--admin"])
    body = {"node": "hub", "topic": "t", "group": "g"}
    for bad, error in (
        ({"seqs": [10**23]}, "seqs must be a list of ints in 0..2**64-1"),
        ({"seqs": [-1]}, "seqs must be a list of ints in 0..2**64-1"),
        ({"topic": "a*b"}, "topic name 'a*b' is invalid"),
    ):
        code, answer = post_json(url + "api/dead-letters/replay", {**body, **bad})
        assert code == 400 and answer["error"].startswith(error)
    deep = urllib.request.Request(
        url + "api/groups/rm",
        data=b"[" * 100_000,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    code, answer = call_json(deep)
    assert code == 400 and answer["error"].startswith("body is not JSON")


def test_a_secured_mesh_seen_and_acted_on_with_an_operators_key(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc]
) -> None:
    trusted = tmp_path / "trusted"
    for name in ("a", "b", "op"):
        generate_keypair(trusted, name)

    def secured(name: str) -> dict:
        return {"secret_key_file": str(trusted / f"{name}.key"), "trusted_keys_dir": str(trusted)}

    a = make_node("a", **secured("a"))
    b = make_node("b", seeds=[a.control_address], **secured("b"))
    sub = b.subscribe("t", group="g")
    wait_members(a, "t", "g", 1)
    a.publish("t", b"bad")
    [msg] = fetched(sub, 1)
    msg.fail("bad record")
    wait_until(lambda: lane_of(a, "t", "g")["dead_letters"] == 1, what="a dead letter at a")
    where = [
        "--mesh",
        a.config.mesh,
        "--seed",
        a.control_address,
        "--interface",
        "127.0.0.1",
        "--no-mdns",
    ]
    operator = ["--secret-key-file", str(trusted / "op.key"), "--trusted-keys-dir", str(trusted)]
    done = run_cli(["ls", "nodes", *where, *operator, "--json"])
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert sorted((r["name"], r["reachable"]) for r in rows) == [("a", True), ("b", True)]
    keyless = run_cli(["ls", "nodes", *where, "--json", "--wait", "1"])
    assert json.loads(keyless.stdout) == []  # (a node without keys is not let in)
    url = start(tmp_path, procs, [*where, *operator, "--admin"])
    wait_until(
        lambda: len(get_json(url + "api/snapshot")[1]["nodes"]) == 2,
        what="the page's node meeting the secured mesh",
    )
    code, dead = get_json(url + "api/dead-letters?topic=t&group=g")
    assert [d["reason"] for d in dead["letters"]] == ["bad record"]
    body = {"node": "a", "topic": "t", "group": "g"}
    # (a page of another site whose name was made to point at the web's address)
    rebound = url.replace("127.0.0.1", "rebound.example").rstrip("/")
    for headers in ({"Host": rebound.removeprefix("http://")}, {"Origin": rebound}):
        code, answer = post_json(url + "api/dead-letters/replay", body, headers=headers)
        assert code == 403 and "this server" in answer["error"]
    code, answer = post_json(url + "api/dead-letters/replay", body)
    assert (code, answer["replayed"]) == (200, 1)
    [again] = fetched(sub, 1)
    assert again.payload == b"bad"
    again.ack()
