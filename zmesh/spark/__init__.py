"""zmesh.spark: mesh streams into Apache Spark, and Spark results back into the mesh.

A :class:`Bridge` joins a group on some topics and keeps what it receives in a log of its
own, with an offset per (topic, partition), acking upstream only once a message is logged.
The ``zmesh`` PySpark data source (``pip install 'zmesh[spark]'``, PySpark >= 4.2) reads
that log by offset, in batch or streaming queries, and publishes rows back through the
bridge with ids that make a retried batch a duplicate::

    bridge = zmesh.spark.Bridge(node, topics=["metrics"], log_dir="var/bridge").start()
    zmesh.spark.register(spark)
    df = (spark.readStream.format("zmesh").option("endpoint", bridge.endpoint)
          .option("reader", "metrics-job").load())

The bridge needs only the core dependencies; the data source needs pyspark and pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._bridge import Bridge
from ._config import BridgeConfig
from ._errors import BridgeError, DataLossError, LogFullError

if TYPE_CHECKING:
    from ._source import ZMeshDataSource

__all__ = [
    "Bridge",
    "BridgeConfig",
    "BridgeError",
    "DataLossError",
    "LogFullError",
    "ZMeshDataSource",
    "register",
]


def _data_source() -> type:
    try:
        from ._source import ZMeshDataSource
    except ImportError as exc:
        raise ImportError(
            f"the zmesh Spark data source needs PySpark >= 4.2 and pyarrow ({exc}); "
            "install them with: pip install 'zmesh[spark]'"
        ) from exc
    return ZMeshDataSource


def register(spark: Any) -> None:
    """Register the ``zmesh`` format with a SparkSession.

    The session's default parallelism (its cores) becomes the source's default
    ``minPartitions``, so that every core reads a share of each micro-batch."""
    source = _data_source()
    try:
        context = spark.sparkContext
    except Exception:  # a Spark Connect session has no SparkContext: keep the defaults
        spark.dataSource.register(source)
        return
    parallelism = int(context.defaultParallelism)
    if parallelism > 0:
        # A subclass made here is pickled with its value (it is no module's attribute),
        # which is how the planner, in a Python worker of its own, learns it.
        source = type(
            source.__name__, (source,), {"parallelism": parallelism, "__doc__": source.__doc__}
        )
    environment = context.environment
    saved = dict(environment)
    environment.update(_RUNNER_ENVIRONMENT)
    try:
        spark.dataSource.register(source)
    finally:
        environment.clear()
        environment.update(saved)


# The variables Spark's streaming source runner puts into the registered format's
# environment map. That map is one ``java.util.HashMap`` shared by every query on the
# format, and each query's runner puts into it, unsynchronized, from the query's own
# thread: two queries that start together can each insert the same key and leave the
# map's size one more than its entries, and every task serialized with it afterwards fails
# to deserialize (``java.io.OptionalDataException``) until the driver restarts. Registered
# with the keys already in it, the runners' puts only replace values. Every runner of
# Python code sets the first three itself before it starts a worker; the last is the
# runner's constant.
_RUNNER_ENVIRONMENT = {
    "SPARK_LOCAL_DIRS": "",
    "SPARK_AUTH_SOCKET_TIMEOUT": "",
    "SPARK_BUFFER_SIZE": "",
    "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
}


def __getattr__(name: str) -> Any:
    if name == "ZMeshDataSource":
        return _data_source()
    raise AttributeError(f"module 'zmesh.spark' has no attribute {name!r}")
