"""Which Spark settings ``CDC_SPARK_CONF`` (and a source's ``spark_conf``) may give a spark-submit.

The sources config may live on object storage where more people can write than can change
the DAG folder, and its ``spark_conf`` reaches the ``--conf`` of every merge and apply
submit. Many Spark settings run code or carry credentials (``spark.driver.extraJavaOptions``
takes a ``-javaagent``, ``spark.jars*`` and ``*.extraClassPath`` load classes,
``spark.executorEnv.*`` and ``spark.pyspark.python`` choose what runs, ``spark.sql.extensions``
and ``spark.sql.catalog.*`` load plugins, ``spark.hadoop.*`` / ``spark.kubernetes.*`` /
``spark.yarn.*`` hold keys and tokens). So only tuning is accepted here: memory, cores,
instances, dynamic allocation, shuffle and SQL tuning; anything else is refused, naming the
key. An administrator sets the others where only administrators write: the Spark
installation's ``spark-defaults.conf`` (the Spark connection chooses the installation), or a
DAG file of their own that passes ``conf=`` to the operators.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigurationError

#: settings accepted as they are
ALLOWED: frozenset[str] = frozenset({
    # memory and cores
    "spark.driver.memory", "spark.driver.memoryOverhead", "spark.driver.memoryOverheadFactor",
    "spark.driver.cores", "spark.driver.maxResultSize",
    "spark.executor.memory", "spark.executor.memoryOverhead", "spark.executor.memoryOverheadFactor",
    "spark.executor.cores", "spark.executor.instances", "spark.executor.heartbeatInterval",
    "spark.memory.fraction", "spark.memory.storageFraction", "spark.memory.offHeap.enabled",
    "spark.memory.offHeap.size", "spark.cores.max", "spark.task.cpus", "spark.task.maxFailures",
    "spark.kubernetes.driver.request.cores", "spark.kubernetes.driver.limit.cores",
    "spark.kubernetes.executor.request.cores", "spark.kubernetes.executor.limit.cores",
    # parallelism, scheduling, shuffle
    "spark.default.parallelism", "spark.scheduler.mode", "spark.locality.wait", "spark.network.timeout",
    "spark.speculation", "spark.shuffle.compress", "spark.shuffle.spill.compress", "spark.shuffle.file.buffer",
    "spark.shuffle.service.enabled", "spark.reducer.maxSizeInFlight", "spark.rdd.compress",
    "spark.io.compression.codec", "spark.broadcast.blockSize", "spark.kryoserializer.buffer.max",
    "spark.files.maxPartitionBytes", "spark.ui.enabled", "spark.ui.showConsoleProgress",
    # SQL tuning
    "spark.sql.shuffle.partitions", "spark.sql.autoBroadcastJoinThreshold", "spark.sql.broadcastTimeout",
    "spark.sql.session.timeZone", "spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes",
    "spark.sql.files.maxRecordsPerFile", "spark.sql.parquet.compression.codec",
    "spark.sql.parquet.enableVectorizedReader", "spark.sql.parquet.columnarReaderBatchSize",
    "spark.sql.parquet.filterPushdown", "spark.sql.inMemoryColumnarStorage.batchSize",
    "spark.sql.inMemoryColumnarStorage.compressed", "spark.sql.codegen.wholeStage",
})
#: families of tuning settings accepted by prefix (none of them names a class, path or secret)
ALLOWED_PREFIXES: tuple[str, ...] = (
    "spark.dynamicAllocation.",
    "spark.speculation.",
    "spark.sql.adaptive.",
    "spark.sql.execution.arrow.",
)


def allowed(key: str) -> bool:
    return key in ALLOWED or key.startswith(ALLOWED_PREFIXES)


def check_spark_conf(conf: Mapping[str, Any], setting: str = "CDC_SPARK_CONF") -> dict[str, Any]:
    """``conf`` when every key is an allowed tuning setting with a plain value; else a
    ConfigurationError naming the key and where to set it instead."""
    refused = sorted(str(k) for k in conf if not isinstance(k, str) or not allowed(k))
    if refused:
        raise ConfigurationError(
            f"{setting}: Spark setting(s) {', '.join(map(repr, refused))} not allowed here; it accepts only tuning "
            "(memory, cores, instances, dynamic allocation, shuffle and SQL tuning: "
            "airflow_provider_cdc/core/spark_settings.py lists them), since a setting that runs code, loads "
            "classes or carries credentials must not come from a file more people may write than the DAG "
            "folder. Have an administrator set it in spark-defaults.conf of the Spark installation the Spark "
            "connection (CDC_SPARK_CONN_ID) uses, or pass it as conf= to the operators in a DAG file of your own"
        )
    bad = sorted(k for k, v in conf.items() if not isinstance(v, str | int | float))  # bool is an int
    if bad:
        raise ConfigurationError(
            f"{setting}: Spark setting {bad[0]!r} must have a text or number value, got {conf[bad[0]]!r}"
        )
    return dict(conf)
