"""``zmesh web`` in a real headless browser (Debian's chromium, driven by Playwright through
``executable_path``; never ``playwright install``): what a person sees. The three nodes on
the map; a group's backlog rising while it is offline and falling once it returns; a dead
letter replayed from its button. Screenshots go to the test's tmp dir, and to
``$ZMESH_SCREENSHOTS_DIR`` when set (docs/images is made that way)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh
from tests.conftest import fetched, read_line, reap, spawn, wait_members, wait_until
from tests.integration.test_cli import Proc
from tests.web.conftest import build_scene, lane_of, run_node

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
URL_RE = re.compile(r"zmesh web: (http://\S+)")
SEEN_S = 20_000  # ms a figure on the page may take to follow the mesh (samples every 0.3 s)

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"no browser: {CHROMIUM} is not installed (apt-get install chromium chromium-driver)",
)


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (the dev extra)"
    )
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


def shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # (a page drawn, not a blank one)
    where = os.environ.get("ZMESH_SCREENSHOTS_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / path.name)


def start_web(tmp_path: Path, hub: zmesh.Node, procs: list[Proc], *extra: str) -> str:
    web = Proc(
        tmp_path,
        "web",
        [
            "web",
            "--mesh",
            hub.config.mesh,
            "--seed",
            hub.control_address,
            "--interface",
            "127.0.0.1",
            "--no-mdns",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "0.3",
            *extra,
        ],
    )
    procs.append(web)
    return web.wait_for(URL_RE).group(1)


def test_the_mesh_live_in_a_browser(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc], browser: Any
) -> None:
    from playwright.sync_api import expect

    hub = make_node("hub")
    prod = make_node("prod", seeds=[hub.control_address])
    cons = make_node("cons", seeds=[hub.control_address])
    prod.topic("orders", groups=["billing", "audit"])
    billing = cons.subscribe("orders", group="billing")
    audit = cons.subscribe("orders", group="audit")
    wait_members(prod, "orders", "billing", 1)
    wait_members(prod, "orders", "audit", 1)
    url = start_web(tmp_path, hub, procs, "--admin")
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)

    # The three nodes on the map, each answering (the page's own node is not shown).
    nodes = page.locator("svg.map g.node")
    expect(nodes).to_have_count(3, timeout=SEEN_S)
    assert sorted(nodes.evaluate_all("gs => gs.map(g => g.dataset.name)")) == [
        "cons",
        "hub",
        "prod",
    ]
    expect(page.locator("svg.map g.node[data-health=ok]")).to_have_count(3, timeout=SEEN_S)
    expect(page.locator("svg.map line.alive")).to_have_count(3, timeout=SEEN_S)

    # audit goes offline: its backlog rises on the page as orders are published.
    audit.close()
    wait_members(prod, "orders", "audit", 0)
    pending = page.locator("tr[data-topic=orders][data-group=audit] td[data-col=pending]")
    members = page.locator("tr[data-topic=orders][data-group=audit] td[data-col=members]")
    for i in range(12):
        prod.publish("orders", f"order-{i}".encode(), key=f"k{i}")
    expect(pending).to_have_text("12", timeout=SEEN_S)
    expect(members).to_have_text("none", timeout=SEEN_S)
    for i in range(12, 30):
        prod.publish("orders", f"order-{i}".encode(), key=f"k{i}")
    expect(pending).to_have_text("30", timeout=SEEN_S)
    for msg in fetched(billing, 30):
        if msg.payload == b"order-3":
            msg.fail("bad record")
        else:
            msg.ack()
    dead = page.locator("tr[data-topic=orders][data-group=billing] td[data-col=dead_letters]")
    expect(dead).to_have_text("1", timeout=SEEN_S)
    expect(page.locator('.lane-card[data-lane$="/orders/audit"]')).to_have_count(1)
    shot(page, tmp_path, "web-backlog")

    # The table sorts by a heading's click and filters as one types.
    rows = page.locator("table[data-testid=groups] tbody tr")
    page.locator("table[data-testid=groups] th[data-col=group]").click()
    expect(rows.first).to_have_attribute("data-group", "audit")
    page.locator("table[data-testid=groups] th[data-col=group]").click()
    expect(rows.first).to_have_attribute("data-group", "billing")
    # Typing survives the snapshots that redraw the table around the filter: it keeps its
    # focus, and a key pressed after a redraw lands in it.
    box = page.get_by_test_id("filter")
    box.press_sequentially("au")
    updated = page.locator("#updated")
    expect(updated).not_to_have_text(updated.inner_text(), timeout=SEEN_S)
    expect(box).to_be_focused()
    page.keyboard.type("d")
    expect(box).to_have_value("aud")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-group", "audit")
    box.fill("")
    expect(rows).to_have_count(2)

    # audit returns and drains it: the figure falls to 0.
    audit = cons.subscribe("orders", group="audit")
    for msg in fetched(audit, 30):
        msg.ack()
    expect(pending).to_have_text("0", timeout=SEEN_S)
    expect(members).to_have_text("cons", timeout=SEEN_S)

    # A node's page: its counters and peers.
    page.locator("svg.map g.node[data-name=prod]").click()
    expect(page.get_by_test_id("node-title")).to_have_text("Node prod")
    expect(page.locator("tr[data-counter=dead_lettered] td.num")).to_have_text("1")
    expect(page.locator("tr[data-peer]")).to_have_count(2)
    shot(page, tmp_path, "web-node")

    # The dead letter, replayed from its button after a confirmation.
    page.goto(url)
    dead.locator("a").click()
    expect(page.get_by_test_id("dead-title")).to_have_text("Dead letters of orders / billing")
    row = page.locator("table[data-testid=dead-letters] tbody tr")
    expect(row).to_have_count(1, timeout=SEEN_S)
    expect(row.locator("td[data-col=reason]")).to_have_text("bad record")
    shot(page, tmp_path, "web-dead-letters")
    asked: list[str] = []

    def confirm(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    row.locator("button[data-action=replay]").click()
    expect(page.locator("#action-result")).to_have_text(re.compile(r"^replayed 1 at prod$"))
    assert asked and asked[0].startswith("Replay dead letter")
    expect(page.get_by_test_id("no-dead-letters")).to_be_visible()
    [again] = fetched(billing, 1)
    assert again.payload == b"order-3" and again.attempt >= 1
    again.ack()
    wait_until(
        lambda: lane_of(prod, "orders", "billing")["pending"] == 0,
        what="the replayed message acked",
    )
    page.goto(url)
    expect(dead).to_have_text("0", timeout=SEEN_S)

    # audit, offline again with a backlog, removed from its button: every producer drops
    # its lane and what it owed, and the row goes.
    audit.close()
    wait_members(prod, "orders", "audit", 0)
    for i in range(5):
        prod.publish("orders", f"late-{i}".encode())
    expect(pending).to_have_text("5", timeout=SEEN_S)
    page.locator("tr[data-topic=orders][data-group=audit] button[data-action=group-rm]").click()
    expect(page.locator("#group-result")).to_have_text(
        re.compile(
            r"^removed group audit of orders: 5 messages owed dropped \(prod 5\); 3 nodes told$"
        ),
        timeout=SEEN_S,
    )
    assert asked[-1].startswith("Delete group audit of orders")
    expect(page.locator("tr[data-topic=orders][data-group=audit]")).to_have_count(0, timeout=SEEN_S)
    expect(page.locator('.lane-card[data-lane$="/orders/audit"]')).to_have_count(0)
    assert prod.stats()["dropped_group_deleted"] == 5

    # A topic no group is known of: its messages wait in its unclaimed lane, labelled so,
    # with nothing to remove.
    prod.publish("drafts", b"draft").wait_stored(5)
    drafts = page.locator("tr[data-topic=drafts]")
    expect(drafts.locator("td[data-col=group]")).to_have_text("(no group yet)", timeout=SEEN_S)
    expect(drafts.locator("td[data-col=mode]")).to_have_text("unclaimed")
    expect(drafts.locator("button")).to_have_count(0)
    expect(page.locator('.lane-card[data-lane$="/drafts/"] h3')).to_contain_text(
        "drafts / (no group yet)", timeout=SEEN_S
    )
    assert errors == []


def test_without_admin_the_page_offers_no_actions(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc], browser: Any
) -> None:
    from playwright.sync_api import expect

    scene = build_scene(make_node)
    url = start_web(tmp_path, scene.hub, procs)
    page = browser.new_page()
    page.goto(url + "#/dead/orders/billing")
    row = page.locator("table[data-testid=dead-letters] tbody tr")
    expect(row).to_have_count(1, timeout=SEEN_S)
    expect(row.locator("td[data-col=reason]")).to_have_text("bad record")
    expect(page.locator("button[data-action]")).to_have_count(0)
    expect(page.get_by_text("Admin actions are off")).to_be_visible()


def test_a_failing_source_is_shown(
    tmp_path: Path, mesh_name: str, procs: list[Proc], browser: Any
) -> None:
    from playwright.sync_api import expect

    node, api = run_node(tmp_path, mesh_name, procs)
    web = Proc(
        tmp_path, "web", ["web", "--api", api, "--listen", "127.0.0.1:0", "--interval", "0.3"]
    )
    procs.append(web)
    page = browser.new_page()
    page.goto(web.wait_for(URL_RE).group(1))
    live = page.locator("#live")
    expect(live).to_have_text("live", timeout=SEEN_S)
    expect(page.locator("svg.map g.node[data-name=solo]")).to_have_count(1)
    os.kill(node.popen.pid, signal.SIGKILL)
    node.popen.wait(10)
    expect(live).to_have_text("stale", timeout=SEEN_S)
    expect(page.get_by_test_id("stale")).to_contain_text(
        f"cannot read the mesh from the HTTP API at {api}"
    )

    with socket.socket() as closed:  # (bound, never listening: connections are refused)
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
        web = Proc(tmp_path, "web-nowhere", ["web", "--api", nowhere, "--listen", "127.0.0.1:0"])
        procs.append(web)
        page.goto(web.wait_for(URL_RE).group(1))
        expect(live).to_have_text("no data", timeout=SEEN_S)
        expect(page.get_by_test_id("failure")).to_contain_text(
            f"cannot read the mesh from the HTTP API at {nowhere}"
        )


FAR = """
import sys

import zmesh

node = zmesh.Node(
    "far", mesh=sys.argv[1], data_dir=sys.argv[2], seeds=[sys.argv[3]],
    interfaces=["127.0.0.1"], mdns=False, heartbeat_interval_s=0.2, dead_after_s=1.5,
).start()
node.topic("jobs", groups=["workers"])
node.publish("jobs", b"job").wait_stored(10)
print("published", flush=True)
sys.stdin.read()  # (until killed)
"""


def test_lanes_of_a_silent_producer_are_marked_and_keep_their_names(
    tmp_path: Path,
    mesh_name: str,
    make_node: Callable[..., zmesh.Node],
    procs: list[Proc],
    browser: Any,
) -> None:
    from playwright.sync_api import expect

    hub = make_node("hub")
    far = spawn(
        ["-c", FAR, mesh_name, str(tmp_path / "far"), hub.control_address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert read_line(far) == b"published\n"
        url = start_web(tmp_path, hub, procs, "--timeout", "0.5")
        page = browser.new_page()
        page.goto(url)
        card = page.locator('.lane-card[data-lane$="/jobs/workers"]')
        expect(card.locator("h3")).to_have_text("jobs / workers at far", timeout=SEEN_S)
        expect(card).not_to_have_attribute("data-stale", "")
        far.kill()  # (no word to its peers: it stays listed, unreachable)
        far.wait(10)
        expect(card).to_have_attribute("data-stale", "", timeout=SEEN_S)
        expect(card.locator(".figs")).to_contain_text("its producer does not answer")
        # A page opened now starts from the server's history: named as before.
        page.reload()
        expect(card).to_have_attribute("data-stale", "", timeout=SEEN_S)
        expect(card.locator("h3")).to_have_text("jobs / workers at far")
    finally:
        reap(far)


def test_a_dead_letter_a_taker_holds_is_shown_and_replayed_there(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc], browser: Any
) -> None:
    """A producer gone for good leaves its dead letters in the copy of the replica host
    that serves its lanes: the page lists them as held there, and replays them there."""
    from playwright.sync_api import expect

    takeover = {"takeover_after_s": 2.0}
    r = make_node("r", **takeover)
    c = make_node("c", seeds=[r.control_address], replica_host=False, **takeover)
    sub = c.subscribe("t", group="g")
    p = make_node("p", seeds=[r.control_address], replica_host=False, **takeover)
    p.topic("t", replicas=2, groups=["g"])
    wait_members(p, "t", "g", 1)
    p.publish("t", b"bad").wait_stored(10)
    [msg] = fetched(sub, 1)
    msg.fail("bad record")
    wait_until(lambda: p.status()["outbox"] == 0, what="p settled")
    p_id = p.id
    p.close()
    wait_until(lambda: bool(r.status()["replicas"]["serving"]), what="p taken over")
    url = start_web(tmp_path, r, procs, "--admin")
    page = browser.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(url + "#/dead/t/g")
    row = page.locator("table[data-testid=dead-letters] tbody tr")
    expect(row).to_have_count(1, timeout=SEEN_S)
    expect(row.locator("td").first).to_have_text(f"r (serving {p_id[:12]})")
    row.locator("button[data-action=replay]").click()
    expect(page.locator("#action-result")).to_have_text("replayed 1 at r")
    [again] = fetched(sub, 1)
    assert again.payload == b"bad" and again.id.producer == p_id
    again.ack()
    expect(page.get_by_test_id("no-dead-letters")).to_be_visible()


def test_a_mesh_with_no_node_found_says_so(
    tmp_path: Path, mesh_name: str, procs: list[Proc], browser: Any
) -> None:
    from playwright.sync_api import expect

    with socket.socket() as closed:  # (bound, never listening: connections are refused)
        closed.bind(("127.0.0.1", 0))
        seed = f"127.0.0.1:{closed.getsockname()[1]}"
        web = Proc(
            tmp_path,
            "web",
            ["web", "--mesh", mesh_name, "--seed", seed, "--interface", "127.0.0.1"]
            + ["--no-mdns", "--listen", "127.0.0.1:0", "--interval", "0.3"],
        )
        procs.append(web)
        page = browser.new_page()
        page.goto(web.wait_for(URL_RE).group(1))
        expect(page.get_by_test_id("no-nodes")).to_contain_text(
            f"No node of mesh {mesh_name} found", timeout=SEEN_S
        )
        expect(page.locator("#live")).to_have_text("live")


# (for every chart's two value axes: the room its widest tick label needs, and the room
# the axis has)
AXES_ROOM = """() => [...state.charts.values()].flatMap((u) => [1, 2].map((i) => {
  const axis = u.axes[i], labels = axis._values || [];
  u.ctx.font = axis.font[0];
  const widest = Math.max(0, ...labels.map((v) => u.ctx.measureText(v).width));
  return [labels.join(" "), axis.ticks.size + axis.gap + widest / devicePixelRatio, axis._size];
}))"""


def test_chart_axes_have_room_for_their_labels(
    tmp_path: Path, make_node: Callable[..., zmesh.Node], procs: list[Proc], browser: Any
) -> None:
    from playwright.sync_api import expect

    hub = make_node("hub")
    prod = make_node("prod", seeds=[hub.control_address])
    prod.topic("orders", groups=["audit"])  # (no member: a backlog of thousands)
    prod.publish_many("orders", [b"o"] * 2500).wait_stored(10)
    page = browser.new_page()
    page.goto(start_web(tmp_path, hub, procs))
    card = page.locator('.lane-card[data-lane$="/orders/audit"]')
    expect(card.locator(".figs")).to_contain_text("backlog 2,500", timeout=SEEN_S)
    room = page.evaluate(AXES_ROOM)
    assert any("2,000" in labels for labels, _needed, _had in room), room
    assert all(needed <= had for _labels, needed, had in room), room
