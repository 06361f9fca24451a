"""A local SparkSession on loopback, as zmesh's tests and benchmarks run one.

Loopback only, no UI, two shuffle partitions, and Python workers started with this
interpreter (otherwise they miss the packages of this environment and fail late with
"Python worker failed to connect back").
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stopTimeout": "5000",
}


def local_env() -> None:
    """Environment a local driver and its Python workers need (set before the JVM starts)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def local_session(app: str, master: str = "local[2]", conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on loopback with the ``zmesh`` format registered (``conf`` adds
    to or overrides ``LOCAL_CONF``)."""
    local_env()
    from pyspark.sql import SparkSession

    from . import register

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
