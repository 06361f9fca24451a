"""The mesh-to-Spark benchmark runs end to end on a few rows, so it never rots.

Speed is not asserted: only that every figure was measured, each rate positive.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_spark import FIGURES
from tests.conftest import run_module

from .conftest import needs_spark

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [needs_spark, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_spark_benchmark_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "spark.json"
    code, text = run_module(
        [
            "-m",
            "benchmarks.bench_spark",
            "--quick",
            "--rows",
            "3000",
            "--results-dir",
            str(tmp_path),
        ],
        560,
        str(ROOT),
    )
    assert code == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["rows"] == 3000 and len(doc["runs"]) == 1
    run = doc["runs"][0]
    assert {name for name, *_rest in FIGURES} <= set(run), text[-2000:]
    assert all(run[name] > 0 for name, *_rest in FIGURES), run
    assert "stream_steady" in (tmp_path / "spark.txt").read_text()
