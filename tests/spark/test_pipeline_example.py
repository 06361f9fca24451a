"""examples/metrics_pipeline end to end: sensors -> bridge -> Spark (local) -> Parquet and
alerts -> pager, started by its one command; the output is checked against the readings."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import spawn

from .conftest import needs_spark

pytestmark = needs_spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "metrics_pipeline"
SENSORS, READINGS, THRESHOLD, WINDOW = 3, 60, 75.0, 10


def load_sensors() -> Any:
    spec = importlib.util.spec_from_file_location("pipeline_sensors", EXAMPLE / "sensors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_windows() -> dict[tuple[str, float], tuple[int, float, float]]:
    sensors = load_sensors()
    out = {}
    for s in range(1, SENSORS + 1):
        for w in range(0, READINGS, WINDOW):
            values = [sensors.reading(s, i)["value"] for i in range(w, w + WINDOW)]
            start = sensors.reading(s, w)["ts"]
            out[(f"sensor-{s}", start)] = (
                len(values),
                round(sum(values) / len(values), 3),
                max(values),
            )
    return out


def test_metrics_pipeline_runs_end_to_end(spark: Any, tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = spawn(
        [
            str(EXAMPLE / "run.py"),
            "--workdir",
            str(work),
            "--sensors",
            str(SENSORS),
            "--readings",
            str(READINGS),
            "--threshold",
            str(THRESHOLD),
            "--master",
            "local[2]",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    expected = expected_windows()
    assert f"bridge: {SENSORS * (READINGS + 1)} readings logged" in out
    assert f"job: {len(expected)} windows in" in out

    windows = spark.read.parquet(str(work / "windows")).collect()
    got = {
        (r.sensor, r.window_start.timestamp()): (r.readings, r.avg_value, r.max_value)
        for r in windows
    }
    assert len(windows) == len(got) == len(expected)
    assert got == expected

    alerts = sorted(line for line in out.splitlines() if line.startswith("ALERT "))
    hot = sorted((s, ts) for (s, ts), (_n, avg, _m) in expected.items() if avg > THRESHOLD)
    assert hot == [("sensor-2", load_sensors().BASE_TS + 20)]
    assert len(alerts) == len(hot)
    assert alerts[0].startswith("ALERT sensor-2 window 2023-11-14T22:13:40.000Z avg=91.1")
    assert "pipeline done: 1 alerts published" in out
