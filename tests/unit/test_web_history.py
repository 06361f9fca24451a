"""The lanes' history of ``zmesh web``: rates from counter differences, a producer's
restart (counters going down) starting afresh, lanes retired dropped at once and those of
a producer that does not answer kept for a while, at most the last points kept. Times are
given: no clock."""

from __future__ import annotations

from zmesh.web import history
from zmesh.web.history import History


def mesh(read_at: float | None = None, reached: bool = True, **lanes: dict) -> dict:
    rows = [
        {
            "topic": "t",
            "lane": name,
            "group": name,
            "mode": "shared",
            "members": [],
            "pending": 0,
            **figures,
        }
        for name, figures in lanes.items()
    ]
    status = {"lanes": rows} if reached else None
    return {"nodes": [{"id": "p" * 32, "name": "prod", "read_at": read_at, "status": status}]}


def test_rates_are_differences_over_time() -> None:
    h = History()
    [first] = h.add(mesh(g={"pending": 5}), t=100.0)
    assert (first["rate_in"], first["rate_out"], first["pending"]) == (None, None, 5)
    [second] = h.add(mesh(g={"pending": 3, "acked": 8, "dead_lettered": 1}), t=102.0)
    # entered: 5 -> 12 (3 pending + 8 acked + 1 parked) in 2 s; acked 0 -> 8
    assert (second["rate_in"], second["rate_out"]) == (3.5, 4.0)
    assert second["name"] == "prod" and second["key"] == f"{'p' * 32}/t/g"


def test_a_restarted_producer_starts_afresh() -> None:
    h = History()
    h.add(mesh(g={"pending": 0, "acked": 50}), t=1.0)
    [after] = h.add(mesh(g={"pending": 2, "acked": 1}), t=2.0)
    assert (after["rate_in"], after["rate_out"]) == (None, None)
    [later] = h.add(mesh(g={"pending": 2, "acked": 3}), t=3.0)
    assert (later["rate_in"], later["rate_out"]) == (2.0, 2.0)


def test_points_are_bounded_and_gone_lanes_dropped(monkeypatch) -> None:
    monkeypatch.setattr(history, "HISTORY_POINTS", 3)
    h = History()
    h.add(mesh(a={}, b={}), t=0.0)
    for t in range(1, 5):
        h.add(mesh(a={"pending": t}), t=float(t))
    assert sorted(h.series) == [f"{'p' * 32}/t/a"]
    [a] = h.points()
    assert (a["t"], a["pending"]) == ([2.0, 3.0, 4.0], [2, 3, 4])


def test_points_are_stamped_when_their_status_was_read() -> None:
    # A collection that waited 2 s on an unreachable node, then one that did not: the
    # counters moved over the second between the reads, not over the 0.1 s between the
    # collections' ends.
    h = History()
    h.add(mesh(read_at=100.0, g={"pending": 0}), t=102.0)
    [point] = h.add(mesh(read_at=101.0, g={"pending": 10}), t=102.1)
    assert (point["t"], point["rate_in"]) == (101.0, 10.0)


def test_a_replayed_dead_letter_is_not_published_again() -> None:
    h = History()
    h.add(mesh(g={"pending": 0, "acked": 9, "dead_lettered": 1}), t=1.0)
    [point] = h.add(
        mesh(g={"pending": 1, "acked": 9, "dead_lettered": 1, "dead_replayed": 1}), t=2.0
    )
    assert (point["rate_in"], point["pending"]) == (0.0, 1)


def test_a_lane_retired_goes_at_once_one_unheard_of_stays_named() -> None:
    h = History()
    h.add(mesh(a={"pending": 1}, b={"pending": 2}), t=1.0)
    h.add(mesh(reached=False), t=2.0)  # (its producer did not answer: both kept)
    assert [(p["name"], p["lane"], p["pending"]) for p in h.points()] == [
        ("prod", "a", [1]),
        ("prod", "b", [2]),
    ]
    h.add(mesh(a={"pending": 1}), t=3.0)  # (it answered without b: b's group was removed)
    assert [p["lane"] for p in h.points()] == ["a"]
