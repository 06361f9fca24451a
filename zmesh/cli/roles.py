"""Functions the reference node definitions in nodes/ name: a sensor's readings, an
aggregator's handler, and a relay's transform."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import defaultdict
from typing import Any

log = logging.getLogger(__name__)

_rng = random.Random()
_lock = threading.Lock()
_stats: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, float("inf"), float("-inf")])


def sensor_reading() -> tuple[str, dict[str, Any]]:
    """One temperature reading of this sensor, keyed by sensor id (ZMESH_SENSOR_ID, or
    the process id)."""
    sensor = os.environ.get("ZMESH_SENSOR_ID", f"sensor-{os.getpid()}")
    return sensor, {
        "sensor": sensor,
        "ts": time.time(),
        "temp_c": round(20.0 + _rng.gauss(0, 3), 2),
    }


def aggregate(msg: Any) -> None:
    """Keep count, mean, min and max per sensor; log a summary every 100 readings;
    dead-letter what is not a reading (JSON with ``sensor`` and a numeric ``temp_c``)."""
    try:
        reading = json.loads(msg.payload)
        sensor, value = str(reading["sensor"]), float(reading["temp_c"])
    except (ValueError, TypeError, KeyError) as exc:
        _not_a_reading(msg, exc)
        return
    with _lock:
        s = _stats[sensor]
        s[0] += 1
        s[1] += value
        s[2] = min(s[2], value)
        s[3] = max(s[3], value)
        if s[0] % 100 == 0:
            log.info("%s: n=%d mean=%.2f min=%.2f max=%.2f", sensor, s[0], s[1] / s[0], s[2], s[3])


def _not_a_reading(msg: Any, exc: Exception) -> None:
    """Dead-letter ``msg`` with the reason: delivered again, it would fail the same way."""
    reason = f"not a reading ({type(exc).__name__}: {exc})"
    log.warning("%s of %s: %s; dead-lettered", msg.id, msg.topic, reason)
    msg.fail(reason)


def snapshot() -> dict[str, dict[str, float]]:
    """The aggregator's figures so far."""
    with _lock:
        return {
            k: {"count": v[0], "mean": v[1] / v[0], "min": v[2], "max": v[3]}
            for k, v in _stats.items()
            if v[0]
        }


def clean(msg: Any) -> dict[str, Any] | None:
    """Relay transform: drop implausible readings, convert to Kelvin; dead-letter what is
    not a reading (a JSON object with a numeric ``temp_c``)."""
    try:
        reading = json.loads(msg.payload)
        temp = float(reading.get("temp_c", "nan"))
    except (ValueError, TypeError, AttributeError) as exc:
        _not_a_reading(msg, exc)
        return None
    if not -60.0 <= temp <= 90.0:
        return None
    return {**reading, "temp_k": round(temp + 273.15, 2)}
