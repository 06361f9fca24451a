"""The local SparkSession settings every Spark test uses (in-process and in child drivers).

From TESTING.md: loopback only, no UI, two shuffle partitions, and Python workers started
with this interpreter (otherwise they miss our packages and fail late).
"""

from __future__ import annotations

import os
import sys
from typing import Any

SPARK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stopTimeout": "5000",
}


def spark_env() -> None:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def build_session(app: str, master: str = "local[2]") -> Any:
    """A local SparkSession with the zmesh format registered."""
    spark_env()
    from pyspark.sql import SparkSession

    import zmesh.spark

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    zmesh.spark.register(session)
    return session
