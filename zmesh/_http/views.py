"""The mesh seen by topic and by group: pure functions of a collected mesh (collect.py).

A backlog in zmesh lives at each producer (its lanes), so a group's figures are the sums
over the producers that owe it, and each producer's share is kept beside the sums. Nodes
that did not answer are listed in ``unreachable``: their share is missing from the sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Per-lane figures summed over a group's lanes (at every producer).
SUMMED = (
    "pending",
    "ready",
    "in_flight",
    "dead_letters",
    "acked",
    "nacked",
    "ack_timeouts",
    "expired",
    "dead_lettered",
    "superseded",
    "dead_replayed",
)
# Outcomes of a lane's messages; with ``pending`` they make what entered the lane (less
# the dead letters replayed: pending again, and counted as dead_lettered already).
SETTLED = ("acked", "expired", "dead_lettered", "superseded")


def drop_observer(mesh: dict[str, Any]) -> dict[str, Any]:
    """The mesh without the node that collected it: for tools (``zmesh ls``, ``zmesh
    web``) whose own node only looks. Its lanes, links and place in peer lists go too."""
    me = mesh["observer"]
    nodes = []
    for node in mesh["nodes"]:
        if node["id"] == me:
            continue
        status = node["status"]
        if status is not None:
            status = {**status, "peers": [p for p in status["peers"] if p["id"] != me]}
        nodes.append({**node, "status": status})
    links = [ln for ln in mesh["links"] if me not in (ln["from"], ln["to"])]
    return {**mesh, "nodes": nodes, "links": links}


def reached(mesh: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The nodes that answered, each with a status."""
    return (n for n in mesh["nodes"] if n["status"] is not None)


def names(mesh: dict[str, Any]) -> dict[str, str]:
    """Node id -> name, of every node known to the mesh's reached nodes."""
    out = {}
    for node in mesh["nodes"]:
        out[node["id"]] = node["name"]
        for p in (node["status"] or {}).get("peers", []):
            out.setdefault(p["id"], p["name"])
    return out


def _oldest(ages: Iterable[float | None]) -> float | None:
    known = [a for a in ages if a is not None]
    return max(known) if known else None


def lane_rows(mesh: dict[str, Any]) -> list[dict[str, Any]]:
    """Every lane of every reached producer, with the producer's name and id."""
    rows = []
    for node in reached(mesh):
        for lane in node["status"]["lanes"]:
            rows.append({"node": node["name"], "node_id": node["id"], **lane})
    return rows


def entered(lane: dict[str, Any]) -> int:
    """Messages that entered the lane since its producer started: those still pending and
    those settled one way or another, a replayed dead letter once (a sum whose rate is
    the lane's rate in)."""
    settled = sum(int(lane.get(k, 0)) for k in SETTLED)
    return int(lane.get("pending", 0)) + settled - int(lane.get("dead_replayed", 0))


def _subscribers(mesh: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(topic, group) -> names of the nodes whose application subscribes to it."""
    out: dict[tuple[str, str], set[str]] = {}
    for node in reached(mesh):
        for sub in node["status"].get("subscriptions", []):
            out.setdefault((sub["topic"], sub["group"]), set()).add(node["name"])
    return out


def _group(topic: str, group: str, mode: str | None) -> dict[str, Any]:
    return {
        "topic": topic,
        "group": group,
        "mode": mode,
        **dict.fromkeys(SUMMED, 0),
        "oldest_age_s": None,
        "members": set(),
        "subscribers": set(),
        "producers": [],
    }


def groups_view(mesh: dict[str, Any]) -> dict[str, Any]:
    """Every (topic, group) of the mesh with its backlog summed over its producers."""
    who = names(mesh)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for lane in lane_rows(mesh):
        key = (lane["topic"], lane["group"])
        g = groups.get(key) or groups.setdefault(key, _group(*key, lane["mode"]))
        for k in SUMMED:
            g[k] += int(lane.get(k, 0))
        g["oldest_age_s"] = _oldest([g["oldest_age_s"], lane.get("oldest_age_s")])
        g["members"].update(who.get(m, m[:12]) for m in lane["members"])
        g["producers"].append(
            {
                "node": lane["node"],
                "node_id": lane["node_id"],
                "lane": lane["lane"],
                **{k: int(lane.get(k, 0)) for k in SUMMED},
                "oldest_age_s": lane.get("oldest_age_s"),
                "entered": entered(lane),
            }
        )
    for key, subs in _subscribers(mesh).items():
        g = groups.get(key) or groups.setdefault(key, _group(*key, None))
        g["subscribers"].update(subs)
    rows = []
    for _key, g in sorted(groups.items()):
        g["members"] = sorted(g["members"])
        g["subscribers"] = sorted(g["subscribers"])
        g["entered"] = sum(p["entered"] for p in g["producers"])
        rows.append(g)
    return {
        "mesh": mesh["mesh"],
        "collected_at": mesh["collected_at"],
        "unreachable": unreachable(mesh),
        "groups": rows,
    }


def topics_view(mesh: dict[str, Any]) -> dict[str, Any]:
    """Every topic of the mesh: its producers, groups and consumers, and its backlog."""
    topics: dict[str, dict[str, Any]] = {}
    for g in groups_view(mesh)["groups"]:
        t = topics.setdefault(
            g["topic"],
            {
                "topic": g["topic"],
                "producers": set(),
                "groups": [],
                "subscribers": set(),
                "pending": 0,
                "in_flight": 0,
                "dead_letters": 0,
                "acked": 0,
                "oldest_age_s": None,
            },
        )
        t["groups"].append(g["group"])
        # (every node that knows a group has a lane for it: producers are those whose
        # lanes took messages since they started, or still owe some)
        t["producers"].update(p["node"] for p in g["producers"] if p["entered"])
        t["subscribers"].update(g["subscribers"])
        for k in ("pending", "in_flight", "dead_letters", "acked"):
            t[k] += g[k]
        t["oldest_age_s"] = _oldest([t["oldest_age_s"], g["oldest_age_s"]])
    for t in topics.values():
        t["producers"] = sorted(t["producers"])
        t["subscribers"] = sorted(t["subscribers"])
    return {
        "mesh": mesh["mesh"],
        "collected_at": mesh["collected_at"],
        "unreachable": unreachable(mesh),
        "topics": [topics[k] for k in sorted(topics)],
    }


def unreachable(mesh: dict[str, Any]) -> list[str]:
    """Names of the nodes that did not answer."""
    return sorted(n["name"] for n in mesh["nodes"] if n["status"] is None)


def nodes_view(mesh: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per node: identity, health, and its headline figures."""
    rows = []
    for node in mesh["nodes"]:
        st = node["status"] or {}
        rows.append(
            {
                "id": node["id"],
                "name": node["name"],
                "control": node["control"],
                "self": node["self"],
                "alive": node["alive"],
                "reachable": node["reachable"],
                "rtt_ms": node["rtt_ms"],
                "error": node["error"],
                "outbox": st.get("outbox"),
                "lanes": len(st.get("lanes", [])) if st else None,
                "subscriptions": len(st.get("subscriptions", [])) if st else None,
                "peers_alive": sum(1 for p in st.get("peers", []) if p["alive"]) if st else None,
                "peers": len(st.get("peers", [])) if st else None,
            }
        )
    return rows
