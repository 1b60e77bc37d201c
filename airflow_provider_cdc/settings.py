"""The provider's settings, read from ``CDC_*`` environment variables in one place.

Operators read them when they run (``load()`` at execute time, in the worker), so a
change to the environment of the workers takes effect at the next task without a DAG
re-parse, and a DAG file parsed in another directory or by another process (the
dag-processor) cannot pin a different data location. Only what Airflow needs while
parsing (schedules, the sensor's mode, the chunk tasks' parallelism, the Spark
connection) is read by the DAG files, through this module too.

No Airflow import: the CLI, the Spark jobs and the tests use it as they are. Every bad
value is a ConfigurationError that names the variable and says what it accepts.

Variables (all optional):

==============================  ================================================================
CDC_SOURCE_CONN_ID              Airflow connection of the source database (``cdc_source``)
CDC_SOURCE                      staging name of the source (default: the connection id)
CDC_DATA_DIR                    staging and outputs: a folder or a URI (default
                                ``$AIRFLOW_HOME/cdc-data``; ``AIRFLOW_HOME`` defaults to
                                ``~/airflow``). Never the working directory
CDC_TABLES                      tables a snapshot reads when its conf has none: a comma list,
                                or a JSON list for names holding commas
CDC_SINKS                       ``events,mirror`` (comma list; ``postgres`` too)
CDC_STORAGE_CONN_ID             Airflow connection (type aws) with the object-storage endpoint
                                and credentials (unset: the standard AWS_* variables)
CDC_SPARK_CONN_ID               Spark connection of the merge/apply submits (``spark_default``)
CDC_SPARK_CONF                  JSON object of Spark settings for those submits
CDC_LOCAL_MAX_ROWS              rounds/batches up to this many rows run in the worker (100000;
                                0 = always spark-submit)
CDC_MAX_PARALLEL_CHUNKS         chunk tasks at once per snapshot run (4)
CDC_SENSOR_DEFERRABLE           true/false; unset = Airflow's [operators] default_deferrable
CDC_SENSOR_POKE_INTERVAL        seconds between the high-watermark sensor's checks (5)
CDC_SENSOR_TIMEOUT              seconds the sensor waits in all before failing (21600 = 6 h)
CDC_SNAPSHOT_SCHEDULE           cron/preset of periodic refresh snapshots (unset: manual only)
CDC_CHANGELOG_SCHEDULE          cron/preset of cdc_changelog (``* * * * *``; ``none``: manual)
CDC_MIRROR_RETENTION_HOURS      hours unreferenced mirror files stay for readers of older
                                versions before vacuum removes them (168; at least 1)
CDC_CAPTURE_MAX_EVENTS          cap on events per capture (unbounded)
CDC_CAPTURE_SEGMENT_MAX_EVENTS  events per staged segment (connection extra or 20000; 0 = one)
CDC_SOURCES_FILE                the sources config (YAML or JSON) that dags/cdc_sources.py turns
                                into DAGs (default: ``cdc_sources.yaml`` next to that file)
==============================  ================================================================

Many sources: a sources config (sources_config.py) gives each source its own values of
these settings; its DAGs' tasks read the environment with those values on top.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .core.errors import ConfigurationError
from .core.schema import split_table_list

DEFAULT_CONN_ID = "cdc_source"
DEFAULT_SINKS = "events,mirror"
DEFAULT_SPARK_CONN_ID = "spark_default"
DEFAULT_LOCAL_MAX_ROWS = 100_000
DEFAULT_MAX_PARALLEL_CHUNKS = 4
DEFAULT_POKE_INTERVAL = 5.0
DEFAULT_SENSOR_TIMEOUT = 6 * 3600.0
DEFAULT_CHANGELOG_SCHEDULE = "* * * * *"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def default_data_dir(env: Mapping[str, str] | None = None) -> str:
    """``$AIRFLOW_HOME/cdc-data`` (Airflow's own default home, ``~/airflow``, when unset):
    the same folder for the dag-processor, the scheduler and every worker of a host,
    whatever their working directory."""
    env = os.environ if env is None else env
    home = (env.get("AIRFLOW_HOME") or "").strip() or str(Path("~/airflow").expanduser())
    return str(Path(home).expanduser() / "cdc-data")


def _raw(env: Mapping[str, str], name: str) -> str:
    return (env.get(name) or "").strip()


def _int(env: Mapping[str, str], name: str, default: int | None, what: str, minimum: int = 0) -> int | None:
    raw = _raw(env, name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigurationError(f"{name} must be {what}, got {raw!r}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _raw(env, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ConfigurationError(f"{name} must be a number of seconds > 0, got {raw!r}")
    return value


def _schedule(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    raw = env.get(name)
    if raw is None:
        return default
    raw = raw.strip()
    return None if raw.lower() in ("", "none", "null") else raw


@dataclass(frozen=True)
class Settings:
    conn_id: str = DEFAULT_CONN_ID
    source: str = DEFAULT_CONN_ID
    explicit_source: str | None = None  # CDC_SOURCE as given (None: each connection's own id)
    data_dir: str = field(default_factory=default_data_dir)
    tables: tuple[str, ...] = ()
    sinks: str = DEFAULT_SINKS
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID
    storage_conn_id: str | None = None
    spark_conf: dict = field(default_factory=dict)
    local_max_rows: int = DEFAULT_LOCAL_MAX_ROWS
    max_parallel_chunks: int = DEFAULT_MAX_PARALLEL_CHUNKS
    sensor_deferrable: bool | None = None
    sensor_poke_interval: float = DEFAULT_POKE_INTERVAL
    sensor_timeout: float = DEFAULT_SENSOR_TIMEOUT
    snapshot_schedule: str | None = None
    changelog_schedule: str | None = DEFAULT_CHANGELOG_SCHEDULE
    capture_max_events: int | None = None
    capture_segment_max_events: int | None = None
    mirror_retention_hours: float = 168.0


def load(env: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None) -> Settings:
    """Parse and check every ``CDC_*`` variable (``env`` defaults to ``os.environ``, read now).

    ``overrides`` are ``CDC_*`` values that win over ``env``: a source of the sources config
    (sources_config.py) is the environment with its entry's values on top."""
    env = os.environ if env is None else env
    if overrides:
        env = {**env, **overrides}
    conn_id = _raw(env, "CDC_SOURCE_CONN_ID") or DEFAULT_CONN_ID
    raw_conf = _raw(env, "CDC_SPARK_CONF")
    try:
        spark_conf = json.loads(raw_conf) if raw_conf else {}
    except ValueError as exc:
        raise ConfigurationError(
            f"CDC_SPARK_CONF must be a JSON object of Spark settings, e.g. '{{\"spark.executor.memory\": \"4g\"}}': {exc}"
        ) from None
    if not isinstance(spark_conf, dict):
        raise ConfigurationError(f"CDC_SPARK_CONF must be a JSON object of Spark settings, got {raw_conf!r}")
    sinks = ",".join(s.strip() for s in (_raw(env, "CDC_SINKS") or DEFAULT_SINKS).split(",") if s.strip())
    if not sinks:
        raise ConfigurationError("CDC_SINKS must name at least one sink, e.g. 'events,mirror'")
    deferrable_raw = _raw(env, "CDC_SENSOR_DEFERRABLE").lower()
    if deferrable_raw and deferrable_raw not in _TRUE + _FALSE:
        raise ConfigurationError(
            f"CDC_SENSOR_DEFERRABLE must be true or false, got {_raw(env, 'CDC_SENSOR_DEFERRABLE')!r}"
        )
    from . import storage

    data_dir = storage.check_location(_raw(env, "CDC_DATA_DIR") or default_data_dir(env), "CDC_DATA_DIR")
    if "mirror" in sinks.split(",") and "%" in data_dir:
        raise ConfigurationError(
            f"CDC_DATA_DIR {data_dir!r} contains '%': the Delta mirror (delta-rs) reads such paths back "
            "URL-decoded and cannot find its own files. Choose a data location without '%'"
        )
    return Settings(
        conn_id=conn_id,
        source=_raw(env, "CDC_SOURCE") or conn_id,
        explicit_source=_raw(env, "CDC_SOURCE") or None,
        data_dir=data_dir,
        tables=tuple(split_table_list(_raw(env, "CDC_TABLES"), "CDC_TABLES")),
        sinks=sinks,
        spark_conn_id=_raw(env, "CDC_SPARK_CONN_ID") or DEFAULT_SPARK_CONN_ID,
        storage_conn_id=_raw(env, "CDC_STORAGE_CONN_ID") or None,
        spark_conf=spark_conf,
        local_max_rows=_int(env, "CDC_LOCAL_MAX_ROWS", DEFAULT_LOCAL_MAX_ROWS,
                            "a whole number >= 0 (0: always spark-submit)"),
        max_parallel_chunks=_int(env, "CDC_MAX_PARALLEL_CHUNKS", DEFAULT_MAX_PARALLEL_CHUNKS,
                                 "a whole number >= 1", minimum=1),
        sensor_deferrable=(deferrable_raw in _TRUE) if deferrable_raw else None,
        sensor_poke_interval=_seconds(env, "CDC_SENSOR_POKE_INTERVAL", DEFAULT_POKE_INTERVAL),
        sensor_timeout=_seconds(env, "CDC_SENSOR_TIMEOUT", DEFAULT_SENSOR_TIMEOUT),
        snapshot_schedule=_schedule(env, "CDC_SNAPSHOT_SCHEDULE", None),
        changelog_schedule=_schedule(env, "CDC_CHANGELOG_SCHEDULE", DEFAULT_CHANGELOG_SCHEDULE),
        capture_max_events=_int(env, "CDC_CAPTURE_MAX_EVENTS", None, "a whole number >= 1 (unset: unbounded)",
                                minimum=1),
        capture_segment_max_events=_int(env, "CDC_CAPTURE_SEGMENT_MAX_EVENTS", None,
                                        "a whole number >= 0 (0: one segment per capture)"),
        mirror_retention_hours=_retention_hours(env),
    )


def _retention_hours(env: Mapping[str, str]) -> float:
    raw = _raw(env, "CDC_MIRROR_RETENTION_HOURS")
    if not raw:
        return 168.0
    try:
        hours = float(raw)
    except ValueError:
        hours = float("nan")
    if not hours >= 1 or hours == float("inf"):
        raise ConfigurationError(
            f"CDC_MIRROR_RETENTION_HOURS must be a number of hours >= 1 (files younger than that may belong to a "
            f"writer still in flight), got {raw!r}"
        )
    return hours


class FromSettings:
    """An operator attribute that is the value the DAG gave, or else the setting ``name``
    read when it is used (in the worker, at execute time; template rendering reads it
    there too). ``None`` means "not given". The settings are the environment with the
    operator's ``cdc_overrides`` (a source of the sources config) on top. Plain Python: no
    Airflow import."""

    def __init__(self, name: str) -> None:
        if name not in Settings.__dataclass_fields__:
            raise ValueError(f"unknown setting {name!r}")
        self.name = name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = f"_cdc_given_{attr}"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__.get(self.attr)
        if value is not None:
            return value
        return getattr(load(overrides=getattr(obj, "cdc_overrides", None)), self.name)

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.attr] = value
