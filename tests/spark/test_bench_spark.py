"""The mesh-to-Spark benchmark runs end to end on a small log, so it never rots.

Speed is not asserted: only that every stage produced a positive rate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_module

from .conftest import needs_spark

ROOT = Path(__file__).resolve().parents[2]
STAGES = {"ingest", "arrow", "batch/net", "batch/lmdb", "stream", "stream+json"}

pytestmark = [needs_spark]


@pytest.mark.timeout(240)
def test_spark_benchmark_reports_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "spark.json"
    code, text = run_module(["-m", "benchmarks.bench_spark", "--messages", "3000", "--reps",
                             "1", "--json", str(out)], 200, str(ROOT))
    assert code == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["messages"] == 3000
    assert set(doc["rows_per_s"]) == STAGES, text[-2000:]
    assert all(rate > 0 for rate in doc["rows_per_s"].values()), doc
    assert "rows/s" in text
