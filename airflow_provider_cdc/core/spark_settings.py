"""Which Spark settings ``CDC_SPARK_CONF`` (and a source's ``spark_conf``) may give a
spark-submit: tuning only, no key that names a class; anything else is refused, naming the key
(why: docs/DESIGN.md, "Security").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import ConfigurationError

#: settings accepted as they are
ALLOWED: frozenset[str] = frozenset(
    {
        # memory and cores
        "spark.driver.memory",
        "spark.driver.memoryOverhead",
        "spark.driver.memoryOverheadFactor",
        "spark.driver.cores",
        "spark.driver.maxResultSize",
        "spark.executor.memory",
        "spark.executor.memoryOverhead",
        "spark.executor.memoryOverheadFactor",
        "spark.executor.cores",
        "spark.executor.instances",
        "spark.executor.heartbeatInterval",
        "spark.memory.fraction",
        "spark.memory.storageFraction",
        "spark.memory.offHeap.enabled",
        "spark.memory.offHeap.size",
        "spark.cores.max",
        "spark.task.cpus",
        "spark.task.maxFailures",
        "spark.kubernetes.driver.request.cores",
        "spark.kubernetes.driver.limit.cores",
        "spark.kubernetes.executor.request.cores",
        "spark.kubernetes.executor.limit.cores",
        # parallelism, scheduling, shuffle
        "spark.default.parallelism",
        "spark.scheduler.mode",
        "spark.locality.wait",
        "spark.network.timeout",
        "spark.speculation",
        "spark.shuffle.compress",
        "spark.shuffle.spill.compress",
        "spark.shuffle.file.buffer",
        "spark.shuffle.service.enabled",
        "spark.reducer.maxSizeInFlight",
        "spark.rdd.compress",
        "spark.io.compression.codec",
        "spark.broadcast.blockSize",
        "spark.kryoserializer.buffer.max",
        "spark.files.maxPartitionBytes",
        "spark.ui.enabled",
        "spark.ui.showConsoleProgress",
        # SQL tuning
        "spark.sql.shuffle.partitions",
        "spark.sql.autoBroadcastJoinThreshold",
        "spark.sql.broadcastTimeout",
        "spark.sql.session.timeZone",
        "spark.sql.files.maxPartitionBytes",
        "spark.sql.files.openCostInBytes",
        "spark.sql.files.maxRecordsPerFile",
        "spark.sql.parquet.compression.codec",
        "spark.sql.parquet.enableVectorizedReader",
        "spark.sql.parquet.columnarReaderBatchSize",
        "spark.sql.parquet.filterPushdown",
        "spark.sql.inMemoryColumnarStorage.batchSize",
        "spark.sql.inMemoryColumnarStorage.compressed",
        "spark.sql.codegen.wholeStage",
    }
)
#: families of tuning settings accepted by prefix (none of them names a class, path or secret)
ALLOWED_PREFIXES: tuple[str, ...] = (
    "spark.dynamicAllocation.",
    "spark.speculation.",
    "spark.sql.adaptive.",
    "spark.sql.execution.arrow.",
)


#: settings whose value may name a class (Spark loads it): accepted only with one of these names
SHORT_NAMES: dict[str, frozenset[str]] = {
    "spark.io.compression.codec": frozenset({"lz4", "lzf", "snappy", "zstd"}),
    "spark.sql.parquet.compression.codec": frozenset(
        {"none", "uncompressed", "snappy", "gzip", "lzo", "brotli", "lz4", "lz4_raw", "zstd"}
    ),
}
#: a Java class name as a value (``org.example.Evil``, ``a.b.C$D``): never accepted
_CLASS_NAME = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)+")


def allowed(key: str) -> bool:
    """Tuning only, and no key that takes a class (``...Class``, ``...Classes``, ``...class``)."""
    if "class" in key.rsplit(".", 1)[-1].lower():
        return False
    return key in ALLOWED or key.startswith(ALLOWED_PREFIXES)


def _value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` may not be given to ``key`` (None: it may)."""
    if not isinstance(value, str | int | float):  # bool is an int
        return f"must have a text or number value, got {value!r}"
    text = str(value).strip()
    names = SHORT_NAMES.get(key)
    if names is not None and text.lower() not in names:
        return (
            f"takes only one of {', '.join(sorted(names))} here (a class name would be loaded), got {text!r}"
        )
    if isinstance(value, str) and _CLASS_NAME.fullmatch(text) and not re.fullmatch(r"[\d.]+", text):
        return f"has a class name as its value ({text!r}), which Spark would load"
    return None


def check_spark_conf(conf: Mapping[str, Any], setting: str = "CDC_SPARK_CONF") -> dict[str, Any]:
    """``conf`` when every key is an allowed tuning setting with a plain value; else a
    ConfigurationError naming the key and where to set it instead."""
    refused = sorted(str(k) for k in conf if not isinstance(k, str) or not allowed(k))
    if refused:
        raise ConfigurationError(
            f"{setting}: Spark setting(s) {', '.join(map(repr, refused))} not allowed here; it accepts "
            "only tuning "
            "(memory, cores, instances, dynamic allocation, shuffle and SQL tuning: "
            "airflow_provider_cdc/core/spark_settings.py lists them), since a setting that runs code, loads "
            "classes or carries credentials is an administrator's alone (defence in depth: the sources "
            "config "
            "is code, reviewed like the DAG folder, the docs' security page). Have an administrator "
            "set it in spark-defaults.conf of the Spark installation the Spark "
            "connection (CDC_SPARK_CONN_ID) uses, or pass it as conf= to the operators in a DAG file "
            "of your own"
        )
    for key in sorted(conf):
        problem = _value_problem(key, conf[key])
        if problem:
            raise ConfigurationError(
                f"{setting}: Spark setting {key!r} {problem}; set it in spark-defaults.conf of "
                "the Spark installation if it must be so"
            )
    return dict(conf)
