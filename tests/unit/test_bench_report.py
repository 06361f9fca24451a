"""The benchmark report's ratios pair each repetition with the baseline's of its round, so
a host that slows between rounds moves both figures of a pair, not the ratio."""

from __future__ import annotations

from benchmarks.report import paired_ratio, summarize


def _reps(rates: list[float], rounds: list[int] | None = None) -> list[dict[str, float]]:
    rounds = rounds or list(range(1, len(rates) + 1))
    return [{"rate": r, "rep": n} for r, n in zip(rates, rounds, strict=True)]


def test_each_round_is_divided_by_its_own_baseline() -> None:
    # The host halves its speed after the first two rounds: every pair is 0.5, while the
    # medians (400 over 600) would say 0.667.
    zmesh = _reps([500, 500, 250, 250, 400])
    raw = _reps([1000, 1000, 500, 500, 800])
    assert paired_ratio(zmesh, raw, "rate") == 0.5


def test_a_round_one_side_lacks_is_left_out() -> None:
    # Round 2 of the baseline failed: round 3's figure is not divided by round 1's.
    zmesh = _reps([300, 100, 330], [1, 2, 3])
    raw = _reps([1000, 1100], [1, 3])
    assert paired_ratio(zmesh, raw, "rate") == 0.3
    assert paired_ratio(zmesh, [], "rate") is None
    assert paired_ratio(zmesh, _reps([0.0, 0.0, 0.0]), "rate") is None


def test_targets_and_the_raw_column_use_the_paired_ratio() -> None:
    raw = {
        "raw_pushpull_1": {"reps": _reps([2000, 2000, 1000]), "errors": []},
        "zmesh_process": {"reps": _reps([1300, 1300, 650]), "errors": []},
        "zmesh_memory": {"reps": _reps([1000, 1690, 845]), "errors": []},
    }
    scenarios, targets = summarize(raw)
    assert scenarios["zmesh_process"]["ratio"] == 0.65
    assert scenarios["zmesh_process"]["median"]["rate"] == 1300
    by_target = {(t["scenario"], t["baseline"]): t for t in targets}
    process = by_target[("zmesh_process", "raw_pushpull_1")]
    assert process["ratio"] == 0.65 and process["met"] is True and process["value"] == 1300
    memory = by_target[("zmesh_memory", "zmesh_process")]
    assert memory["ratio"] == 1.3 and memory["met"] is True
