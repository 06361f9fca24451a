"""The mesh views (topics, groups, nodes) and the Prometheus text, from status snapshots
made by hand: sums over producers, unreachable nodes, escaping."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from zmesh._http.prometheus import render
from zmesh._http.views import entered, groups_view, nodes_view, topics_view


def lane(topic: str, group: str, members: list[str], **figures: object) -> dict:
    base = {
        "topic": topic,
        "lane": group,
        "group": group,
        "mode": "shared",
        "members": members,
        "windows": [8] * len(members),
        "pending": 0,
        "ready": 0,
        "in_flight": 0,
        "oldest_age_s": None,
        "dead_letters": 0,
    }
    return {**base, **figures}


def status(
    name: str,
    lanes: list[dict],
    subs: tuple[tuple[str, str], ...] = (),
    peers: tuple[tuple[str, str, bool], ...] = (),
) -> dict:
    return {
        "node": {"id": name * 4, "name": name, "mesh": "m"},
        "outbox": 0,
        "lanes": lanes,
        "counters": {"published": 3},
        "subscriptions": [
            {"topic": t, "group": g, "mode": "shared", "delivered": 0, "queued": 0} for t, g in subs
        ],
        "peers": [{"id": i, "name": n, "alive": a} for i, n, a in peers],
    }


def node(name: str, st: dict | None) -> dict:
    return {
        "id": name * 4,
        "name": name,
        "control": "127.0.0.1:1",
        "self": name == "a",
        "alive": st is not None,
        "reachable": st is not None,
        "rtt_ms": None,
        "error": None if st else "no status reply within 2s",
        "status": st,
    }


def mesh() -> dict:
    a = status(
        "a",
        [
            lane(
                "t",
                "g",
                ["cccc"],
                pending=5,
                ready=3,
                in_flight=2,
                acked=7,
                oldest_age_s=4.5,
                dead_letters=1,
            )
        ],
        peers=(("bbbb", "b", True), ("cccc", "c", True), ("dddd", "d", False)),
    )
    b = status("b", [lane("t", "g", ["cccc"], pending=1, acked=2, expired=1, oldest_age_s=9.0)])
    c = status("c", [lane("t", "g", [])], subs=(("t", "g"), ("u", "h")))
    return {
        "mesh": "m",
        "collected_at": 1.0,
        "nodes": [node("a", a), node("b", b), node("c", c), node("d", None)],
        "links": [],
    }


def test_groups_sum_producers_and_keep_each_share() -> None:
    view = groups_view(mesh())
    assert view["unreachable"] == ["d"]
    g, h = view["groups"]
    assert (
        g["topic"],
        g["group"],
        g["pending"],
        g["ready"],
        g["in_flight"],
        g["acked"],
        g["expired"],
        g["dead_letters"],
        g["oldest_age_s"],
    ) == ("t", "g", 6, 3, 2, 9, 1, 1, 9.0)
    assert g["members"] == ["c"] and g["subscribers"] == ["c"]
    assert [(p["node"], p["entered"]) for p in g["producers"]] == [("a", 12), ("b", 4), ("c", 0)]
    assert g["entered"] == 16
    # A group known only from a subscriber: no producer owes it anything yet.
    assert (h["topic"], h["group"], h["mode"], h["producers"], h["subscribers"]) == (
        "u",
        "h",
        None,
        [],
        ["c"],
    )


def test_topics_name_the_producers_that_took_messages() -> None:
    t, u = topics_view(mesh())["topics"]
    assert (t["producers"], t["groups"], t["pending"], t["oldest_age_s"]) == (
        ["a", "b"],
        ["g"],
        6,
        9.0,
    )
    assert (u["producers"], u["subscribers"], u["oldest_age_s"]) == ([], ["c"], None)


def test_nodes_rows_mark_the_unreachable() -> None:
    rows = {r["name"]: r for r in nodes_view(mesh())}
    assert (rows["a"]["peers"], rows["a"]["peers_alive"], rows["a"]["lanes"]) == (3, 2, 1)
    assert (rows["d"]["reachable"], rows["d"]["outbox"], rows["d"]["peers"]) == (False, None, None)


def test_entered_is_pending_plus_every_outcome() -> None:
    assert (
        entered(
            lane(
                "t",
                "g",
                [],
                pending=2,
                acked=3,
                dead_lettered=1,
                superseded=4,
                expired=5,
                nacked=100,
            )
        )
        == 15
    )


def test_prometheus_text_parses_with_the_reference_parser() -> None:
    st = status(
        'we"ird\\node',
        [lane("t", "g\nx", ["cccc"], pending=5, acked=7, oldest_age_s=4.5, dead_letters=1)],
        peers=(("bbbb", "b", True), ("dddd", "d", False)),
    )
    families = {f.name: f for f in text_string_to_metric_families(render(st))}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    node = (("mesh", "m"), ("node", 'we"ird\\node'))
    lane_labels = (
        ("group", "g\nx"),
        ("lane", "g\nx"),
        ("mesh", "m"),
        ("node", 'we"ird\\node'),
        ("topic", "t"),
    )
    assert samples[("zmesh_events_total", (("event", "published"), *node))] == 3
    assert samples[("zmesh_lane_pending", lane_labels)] == 5
    assert samples[("zmesh_lane_members", lane_labels)] == 1
    assert samples[("zmesh_lane_dead_letters", lane_labels)] == 1
    assert samples[("zmesh_lane_oldest_age_seconds", lane_labels)] == 4.5
    assert samples[("zmesh_lane_events_total", (("event", "acked"), *lane_labels))] == 7
    assert samples[("zmesh_peers", (("alive", "false"), *node))] == 1
    assert families["zmesh_events"].type == "counter"
