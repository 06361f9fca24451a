"""The subjects benchmark runs end to end (quick mode), so it never rots.

Speed is not asserted: only that every figure was measured and is positive.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_subjects import FIGURES
from tests.conftest import run_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_quick_subjects_benchmark_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "subjects.json"
    cmd = ["-m", "benchmarks.bench_subjects", "--quick", "--json", str(out)]
    code, text = run_module(cmd, 200, str(ROOT))
    assert code == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "quick" and len(doc["runs"]) == 1
    for name, *_ in FIGURES:
        assert doc["median"][name] > 0, name
    assert doc["median"]["rr_raw_p99_ms"] >= doc["median"]["rr_raw_p50_ms"]
    assert doc["median"]["rr_zmesh_memory_p99_ms"] >= doc["median"]["rr_zmesh_memory_p50_ms"]
    assert "publish_ratio" in text
