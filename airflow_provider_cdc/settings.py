"""The provider's settings (``CDC_*``), read in one place when a task runs, so a change to the
workers' environment takes effect at the next task. No Airflow import; a bad value is a
ConfigurationError naming the variable. ``OPTIONS`` lists every setting; where a value comes
from, first found wins: docs/configuration.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .core.errors import ConfigurationError
from .core.schema import TableName, parse_key_columns, split_table_list
from .core.throttle import ChunkSizing


@dataclass(frozen=True)
class Option:
    """One setting: its variable, default (as text; None: none, or computed) and meaning."""

    var: str
    default: str | None
    description: str
    example: str | None = None

    @property
    def key(self) -> str:
        """Its option name in Airflow's ``[cdc]`` section and in the sources config."""
        return self.var.removeprefix("CDC_").lower()


OPTIONS: tuple[Option, ...] = (
    Option("CDC_SOURCE_CONN_ID", "cdc_source", "Airflow connection of the source database"),
    Option("CDC_SOURCE", None, "staging name of the source (default: the connection id)", "shop"),
    Option(
        "CDC_DATA_DIR",
        None,
        "staging and outputs: a folder or a URI (default $AIRFLOW_HOME/cdc-data; never "
        "the working directory)",
        "s3://lake/cdc",
    ),
    Option(
        "CDC_TABLES",
        None,
        "the capture scope: the only tables the changelog captures and a snapshot may read "
        "(a run's conf can narrow it, never widen it), and those a snapshot reads when its conf names "
        "none; a comma "
        "list, or a JSON list for names holding commas. Unset: nothing is captured",
        "public.orders,public.customers",
    ),
    Option(
        "CDC_REFRESH_TABLES",
        None,
        "tables refreshed whole instead of captured (the cdc_refresh DAG): tables without any key "
        "included; each refresh reads the table in one consistent snapshot and publishes it as one new "
        "version of a plain Delta table, and nothing is created or changed on the source for them. "
        "Never in CDC_TABLES; a comma list or a JSON list",
        "public.audit_log",
    ),
    Option(
        "CDC_REFRESH_SCHEDULE",
        None,
        "cron or preset of the cdc_refresh DAG's runs (unset: triggered by hand only)",
        "@daily",
    ),
    Option(
        "CDC_CAPTURE_ALL_TABLES",
        None,
        "true: capture every table of the database instead of CDC_TABLES (PostgreSQL: "
        "a FOR ALL TABLES publication, under which UPDATE and DELETE fail on tables without a replica "
        "identity, "
        "so it is refused while any exists; MariaDB/MySQL: every database of the server). System "
        "schemas never",
    ),
    Option(
        "CDC_KEY_COLUMNS",
        None,
        "the key of scope tables without a primary key: the columns of a unique index on NOT NULL columns, "
        "per table (Debezium's message.key.columns). PostgreSQL takes a table's REPLICA IDENTITY USING INDEX "
        "by itself; under REPLICA IDENTITY FULL name the key here. '*': no key at all, captured as a "
        "multiset. A JSON object, or 'schema.table:col1,col2;schema.other:col'",
        '{"public.events": ["event_uid"]}',
    ),
    Option("CDC_SINKS", "events,mirror", "sinks of merge and apply, a comma list (postgres too)"),
    Option(
        "CDC_STORAGE_CONN_ID",
        None,
        "Airflow connection (type aws) with the object-storage endpoint and "
        "credentials, resolved where used: in the task, per poll in the triggerer, a 0600 file for a "
        "spark-submit "
        "(unset: the workers' AWS_* variables)",
    ),
    Option(
        "CDC_POSTGRES_SINK_CONN_ID",
        None,
        "Airflow connection (type postgres) of the 'postgres' sink's target "
        "database; its password reaches a spark-submit only as a 0600 passfile, never on the command line",
        "cdc_mirror_pg",
    ),
    Option(
        "CDC_POSTGRES_SINK_SCHEMA",
        None,
        "target schema of the 'postgres' sink (default: cdc_{source})",
        "lake",
    ),
    Option("CDC_SPARK_CONN_ID", "spark_default", "Spark connection of the merge/apply submits"),
    Option(
        "CDC_SPARK_CONF",
        "{}",
        "JSON object of Spark settings for those submits: tuning only (memory, cores, "
        "instances, dynamic allocation, shuffle and SQL tuning; core/spark_settings.py lists them)",
        '{"spark.executor.memory": "4g"}',
    ),
    Option(
        "CDC_LOCAL_MAX_ROWS",
        "100000",
        "rounds/batches up to this many rows run in the worker (0: always spark-submit)",
    ),
    Option(
        "CDC_MERGE_WHILE_READING_ROWS",
        "2000000",
        "committed chunk rows (high watermark staged) that start a "
        "merge while later chunks are still read (0: merge only after reading)",
    ),
    Option("CDC_MAX_PARALLEL_CHUNKS", "4", "chunk tasks at once per snapshot run"),
    Option(
        "CDC_CHUNK_TARGET_SECONDS",
        "1",
        "adaptive chunk size: seconds a snapshot chunk (watermarks, SELECT, "
        "staging) aims to take; each chunk of a range is sized from those before it (at most 2x the "
        "last one, "
        "any smaller). Used unless chunk_size is given in the run's conf or the DAG's throttle (then "
        "every chunk "
        "has that many rows; conf chunk_size 'auto' asks for the adaptive size)",
    ),
    Option(
        "CDC_CHUNK_TARGET_MB",
        "32",
        "adaptive chunk size: megabytes a staged chunk's rows aim to take "
        "(uncompressed; at most the source's batch_max_bytes); caps the size even below "
        "CDC_CHUNK_MIN_ROWS, so "
        "wide rows give fewer rows per chunk",
    ),
    Option("CDC_CHUNK_MIN_ROWS", "100", "adaptive chunk size: fewest rows the duration target may ask for"),
    Option("CDC_CHUNK_MAX_ROWS", "1000000", "adaptive chunk size: most rows a chunk may ask for"),
    Option(
        "CDC_SENSOR_DEFERRABLE",
        None,
        "true: the high-watermark sensor waits in the triggerer (unset: "
        "Airflow's [operators] default_deferrable)",
    ),
    Option("CDC_SENSOR_POKE_INTERVAL", "5", "seconds between the high-watermark sensor's checks"),
    Option("CDC_SENSOR_TIMEOUT", "21600", "seconds the sensor waits in all before failing"),
    Option(
        "CDC_SNAPSHOT_SCHEDULE",
        None,
        "cron or preset of periodic refresh snapshots (unset: manual only)",
        "@weekly",
    ),
    Option(
        "CDC_CHANGELOG_SCHEDULE",
        "* * * * *",
        "cron or preset of the changelog DAG (none: manual only); '@log': a round starts when the "
        "source writes to the capture scope (the triggerer watches it) and every "
        "CDC_CHANGELOG_HEARTBEAT_SECONDS on an idle source",
        "@log",
    ),
    Option(
        "CDC_CHANGELOG_POLL_SECONDS",
        "2",
        "with CDC_CHANGELOG_SCHEDULE=@log: seconds between two readings of the source's activity",
    ),
    Option(
        "CDC_CHANGELOG_HEARTBEAT_SECONDS",
        "600",
        "with CDC_CHANGELOG_SCHEDULE=@log: seconds after which a round starts on an idle source "
        "(log retention checks, compaction)",
    ),
    Option(
        "CDC_CHANGELOG_MIN_INTERVAL_SECONDS",
        "5",
        "with CDC_CHANGELOG_SCHEDULE=@log: seconds between the starts of two rounds at least (the "
        "mirror's age under steady writes is about this plus a round; fewer rounds cost less CPU and "
        "fewer, fuller files)",
    ),
    Option(
        "CDC_MAINTENANCE_INTERVAL_SECONDS",
        "300",
        "with CDC_CHANGELOG_SCHEDULE=@log or @continuous: seconds between two runs of the mirrors' "
        "background compaction and vacuum (the compact_tombstones task); periodic schedules run it "
        "every round",
    ),
    Option(
        "CDC_MIRROR_RETENTION_HOURS",
        "1",
        "hours unreferenced mirror files stay for readers of older "
        "versions before vacuum removes them (at least 1; raise it for time travel: the folder then holds "
        "about that many hours of writes beside the live rows)",
    ),
    Option(
        "CDC_MIRROR_LOG_RETENTION_HOURS",
        "48",
        "hours a mirror's Delta log keeps commits a checkpoint "
        "already covers (how far back a reader can time-travel; fractions allowed, at least 0.01)",
    ),
    Option(
        "CDC_MIRROR_COMPACT_BUDGET_ROWS",
        "4000000",
        "stored rows one changelog round's background compaction "
        "may rewrite per mirror table (the due buckets with most change first; at least 1)",
    ),
    Option(
        "CDC_STAGING_RETENTION_HOURS",
        "72",
        "hours staged segments and finished snapshots' chunk folders stay "
        "after nothing else holds them (every sink applied them, no open snapshot needs them), for "
        "replays and "
        "late readers; at least 1, or 'never' to keep staging forever",
    ),
    Option("CDC_CAPTURE_MAX_EVENTS", None, "cap on the events of one capture (unset: unbounded)"),
    Option(
        "CDC_CAPTURE_SEGMENT_MAX_EVENTS",
        None,
        "events per staged segment (the connection's segment_max_events "
        "extra, else 20000; 0: one segment per capture)",
    ),
    Option(
        "CDC_SOURCES_FILE",
        None,
        "the sources config that dags/cdc_sources.py turns into DAGs (default: "
        "cdc_sources.yaml next to that file)",
        "/opt/airflow/dags/cdc_sources.yaml",
    ),
)


def airflow_section(section: str = "cdc") -> dict[str, str]:
    """Airflow's ``[cdc]`` configuration as ``CDC_*`` values, when this process runs Airflow
    (``airflow.configuration`` imported already); ``{}`` elsewhere (the Spark jobs, the
    CLI outside Airflow). Empty values count as unset."""
    import sys

    module = sys.modules.get("airflow.configuration")
    if module is None:
        return {}
    try:
        values = module.conf.getsection(section) or {}
    except Exception:  # noqa: BLE001 - no section, or a configuration that cannot be read: the defaults
        return {}
    known = {o.key: o.var for o in OPTIONS}
    return {
        known[k]: str(v).strip() for k, v in values.items() if k in known and v is not None and str(v).strip()
    }


def provider_config() -> dict:
    """The provider's ``config`` entry of get_provider_info: the ``[cdc]`` section, one option
    per setting, with its default and description."""
    return {
        "cdc": {
            "description": "Settings of airflow-provider-cdc. A CDC_* environment variable of the same "
            "name wins; "
            "a source of the sources config wins over both.",
            "options": {
                o.key: {
                    "description": f"{o.description} (environment: {o.var})",
                    "version_added": "0.1.0",
                    "type": "string",
                    "example": o.example,
                    # Airflow renders defaults with str.format: braces are doubled
                    "default": None if o.default is None else o.default.replace("{", "{{").replace("}", "}}"),
                }
                for o in OPTIONS
            },
        }
    }


DEFAULT_CONN_ID = "cdc_source"
DEFAULT_SINKS = "events,mirror"
DEFAULT_SPARK_CONN_ID = "spark_default"
DEFAULT_LOCAL_MAX_ROWS = 100_000
#: committed chunk rows whose high watermark is staged that start a merge while later chunks
#: are read (the snapshot DAG's merge_while_reading task; 0: merge only after reading)
DEFAULT_MERGE_WHILE_READING_ROWS = 2_000_000
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


def sink_names(sinks: str) -> list[str]:
    """The names in a comma list of sinks (``CDC_SINKS``, an operator's ``sinks``)."""
    return [n.strip() for n in sinks.split(",") if n.strip()]


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


def _seconds(env: Mapping[str, str], name: str, default: float, *, zero: bool = False) -> float:
    """A number of seconds > 0 (``zero``: >= 0)."""
    raw = _raw(env, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 if zero else value > 0) or value == float("inf"):
        raise ConfigurationError(f"{name} must be a number of seconds {'>=' if zero else '>'} 0, got {raw!r}")
    return value


def _table_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A list of table names (a comma list or a JSON list), each checked, errors naming ``name``."""
    tables = tuple(split_table_list(_raw(env, name), name))
    for t in tables:
        try:
            TableName.parse(t)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{name}: {exc}") from None
    return tables


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
    capture_all_tables: bool = False
    refresh_tables: tuple[str, ...] = ()  # CDC_REFRESH_TABLES: refreshed whole, never captured
    refresh_schedule: str | None = None
    key_columns: dict = field(default_factory=dict)  # table text -> key columns (CDC_KEY_COLUMNS)
    sinks: str = DEFAULT_SINKS
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID
    storage_conn_id: str | None = None
    postgres_sink_conn_id: str | None = None
    postgres_sink_schema: str | None = None
    spark_conf: dict = field(default_factory=dict)
    local_max_rows: int = DEFAULT_LOCAL_MAX_ROWS
    merge_while_reading_rows: int = DEFAULT_MERGE_WHILE_READING_ROWS
    max_parallel_chunks: int = DEFAULT_MAX_PARALLEL_CHUNKS
    chunk_sizing: ChunkSizing = field(default_factory=ChunkSizing)  # CDC_CHUNK_TARGET_SECONDS, ...
    sensor_deferrable: bool | None = None
    sensor_poke_interval: float = DEFAULT_POKE_INTERVAL
    sensor_timeout: float = DEFAULT_SENSOR_TIMEOUT
    snapshot_schedule: str | None = None
    changelog_schedule: str | None = DEFAULT_CHANGELOG_SCHEDULE
    changelog_poll_seconds: float = 2.0
    changelog_heartbeat_seconds: float = 600.0
    changelog_min_interval_seconds: float = 5.0
    maintenance_interval_seconds: float = 300.0
    capture_max_events: int | None = None
    capture_segment_max_events: int | None = None
    mirror_retention_hours: float = 1.0
    mirror_log_retention_hours: float = 48.0
    mirror_compact_budget_rows: int = 4_000_000
    staging_retention_hours: float | None = 72.0  # None: staging is kept forever
    sources_file: str | None = None


def load(env: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None) -> Settings:
    """Parse and check every ``CDC_*`` variable (``env`` defaults to ``os.environ``, read now).

    ``overrides`` are ``CDC_*`` values that win over ``env``: a source of the sources config
    (sources_config.py) is the environment with its entry's values on top."""
    env = {**airflow_section(), **os.environ} if env is None else env
    if overrides:
        env = {**env, **overrides}
    conn_id = _raw(env, "CDC_SOURCE_CONN_ID") or DEFAULT_CONN_ID
    raw_conf = _raw(env, "CDC_SPARK_CONF")
    try:
        spark_conf = json.loads(raw_conf) if raw_conf else {}
    except ValueError as exc:
        raise ConfigurationError(
            "CDC_SPARK_CONF must be a JSON object of Spark settings, e.g. "
            f'\'{{"spark.executor.memory": "4g"}}\': {exc}'
        ) from None
    if not isinstance(spark_conf, dict):
        raise ConfigurationError(f"CDC_SPARK_CONF must be a JSON object of Spark settings, got {raw_conf!r}")
    from .core.spark_settings import check_spark_conf

    spark_conf = check_spark_conf(spark_conf)  # tuning only: it reaches spark-submit's --conf
    sinks = ",".join(sink_names(_raw(env, "CDC_SINKS") or DEFAULT_SINKS))
    if not sinks:
        raise ConfigurationError("CDC_SINKS must name at least one sink, e.g. 'events,mirror'")
    all_raw = _raw(env, "CDC_CAPTURE_ALL_TABLES").lower()
    if all_raw and all_raw not in _TRUE + _FALSE:
        raise ConfigurationError(
            f"CDC_CAPTURE_ALL_TABLES must be true or false, got {_raw(env, 'CDC_CAPTURE_ALL_TABLES')!r}"
        )
    tables = _table_list(env, "CDC_TABLES")
    if tables and all_raw in _TRUE:
        raise ConfigurationError(
            "CDC_TABLES and CDC_CAPTURE_ALL_TABLES=true are both set: the capture scope is one or the "
            "other; unset one"
        )
    refresh_tables = _table_list(env, "CDC_REFRESH_TABLES")
    both = sorted(
        {str(TableName.parse(t)) for t in tables} & {str(TableName.parse(t)) for t in refresh_tables}
    )
    if both:
        raise ConfigurationError(
            f"table(s) {', '.join(both)} are in both CDC_TABLES and CDC_REFRESH_TABLES: a table is either "
            "captured (CDC_TABLES) or refreshed whole (CDC_REFRESH_TABLES); remove it from one"
        )
    key_columns = parse_key_columns(_raw(env, "CDC_KEY_COLUMNS"), "CDC_KEY_COLUMNS")
    for t in key_columns:
        try:
            TableName.parse(t)
        except ConfigurationError as exc:
            raise ConfigurationError(f"CDC_KEY_COLUMNS: {exc}") from None
    deferrable_raw = _raw(env, "CDC_SENSOR_DEFERRABLE").lower()
    if deferrable_raw and deferrable_raw not in _TRUE + _FALSE:
        raise ConfigurationError(
            f"CDC_SENSOR_DEFERRABLE must be true or false, got {_raw(env, 'CDC_SENSOR_DEFERRABLE')!r}"
        )
    from . import storage

    data_dir = storage.check_location(_raw(env, "CDC_DATA_DIR") or default_data_dir(env), "CDC_DATA_DIR")
    if "mirror" in sink_names(sinks) and "%" in data_dir:
        raise ConfigurationError(
            f"CDC_DATA_DIR {data_dir!r} contains '%': the Delta mirror (delta-rs) reads such paths back "
            "URL-decoded and cannot find its own files. Choose a data location without '%'"
        )
    return Settings(
        conn_id=conn_id,
        source=_raw(env, "CDC_SOURCE") or conn_id,
        explicit_source=_raw(env, "CDC_SOURCE") or None,
        data_dir=data_dir,
        tables=tables,
        capture_all_tables=all_raw in _TRUE,
        refresh_tables=refresh_tables,
        refresh_schedule=_schedule(env, "CDC_REFRESH_SCHEDULE", None),
        key_columns=key_columns,
        sinks=sinks,
        spark_conn_id=_raw(env, "CDC_SPARK_CONN_ID") or DEFAULT_SPARK_CONN_ID,
        storage_conn_id=_raw(env, "CDC_STORAGE_CONN_ID") or None,
        postgres_sink_conn_id=_raw(env, "CDC_POSTGRES_SINK_CONN_ID") or None,
        postgres_sink_schema=_raw(env, "CDC_POSTGRES_SINK_SCHEMA") or None,
        spark_conf=spark_conf,
        local_max_rows=_int(
            env, "CDC_LOCAL_MAX_ROWS", DEFAULT_LOCAL_MAX_ROWS, "a whole number >= 0 (0: always spark-submit)"
        ),
        merge_while_reading_rows=_int(
            env,
            "CDC_MERGE_WHILE_READING_ROWS",
            DEFAULT_MERGE_WHILE_READING_ROWS,
            "a whole number of rows >= 0 (0: merge only after the chunks are read)",
        ),
        max_parallel_chunks=_int(
            env, "CDC_MAX_PARALLEL_CHUNKS", DEFAULT_MAX_PARALLEL_CHUNKS, "a whole number >= 1", minimum=1
        ),
        chunk_sizing=ChunkSizing.parse(
            {
                "target_seconds": _raw(env, "CDC_CHUNK_TARGET_SECONDS"),
                "target_mb": _raw(env, "CDC_CHUNK_TARGET_MB"),
                "min_rows": _raw(env, "CDC_CHUNK_MIN_ROWS"),
                "max_rows": _raw(env, "CDC_CHUNK_MAX_ROWS"),
            }
        ),
        sensor_deferrable=(deferrable_raw in _TRUE) if deferrable_raw else None,
        sensor_poke_interval=_seconds(env, "CDC_SENSOR_POKE_INTERVAL", DEFAULT_POKE_INTERVAL),
        sensor_timeout=_seconds(env, "CDC_SENSOR_TIMEOUT", DEFAULT_SENSOR_TIMEOUT),
        snapshot_schedule=_schedule(env, "CDC_SNAPSHOT_SCHEDULE", None),
        changelog_schedule=_schedule(env, "CDC_CHANGELOG_SCHEDULE", DEFAULT_CHANGELOG_SCHEDULE),
        changelog_poll_seconds=_seconds(env, "CDC_CHANGELOG_POLL_SECONDS", 2.0),
        changelog_heartbeat_seconds=_seconds(env, "CDC_CHANGELOG_HEARTBEAT_SECONDS", 600.0),
        changelog_min_interval_seconds=_seconds(env, "CDC_CHANGELOG_MIN_INTERVAL_SECONDS", 5.0, zero=True),
        maintenance_interval_seconds=_seconds(env, "CDC_MAINTENANCE_INTERVAL_SECONDS", 300.0, zero=True),
        capture_max_events=_int(
            env, "CDC_CAPTURE_MAX_EVENTS", None, "a whole number >= 1 (unset: unbounded)", minimum=1
        ),
        capture_segment_max_events=_int(
            env, "CDC_CAPTURE_SEGMENT_MAX_EVENTS", None, "a whole number >= 0 (0: one segment per capture)"
        ),
        mirror_retention_hours=_retention_hours(env),
        mirror_log_retention_hours=_log_retention_hours(env),
        mirror_compact_budget_rows=_int(
            env, "CDC_MIRROR_COMPACT_BUDGET_ROWS", 4_000_000, "a whole number of rows >= 1", minimum=1
        ),
        staging_retention_hours=_staging_retention_hours(env),
        sources_file=_raw(env, "CDC_SOURCES_FILE") or None,
    )


def _hours(
    env: Mapping[str, str], name: str, default: float, why: str, *, never: bool = False
) -> float | None:
    """A number of hours >= 1 (``why``: the reason for the minimum), or None for ``never``."""
    raw = _raw(env, name)
    if not raw:
        return default
    if never and raw.strip().lower() == "never":
        return None
    try:
        hours = float(raw)
    except ValueError:
        hours = float("nan")
    if not hours >= 1 or hours == float("inf"):
        alternative = " or 'never'" if never else ""
        raise ConfigurationError(f"{name} must be a number of hours >= 1 ({why}){alternative}, got {raw!r}")
    return hours


def _retention_hours(env: Mapping[str, str]) -> float:
    return _hours(
        env,
        "CDC_MIRROR_RETENTION_HOURS",
        1.0,
        "files younger than that may belong to a writer still in flight",
    )


def _log_retention_hours(env: Mapping[str, str]) -> float:
    """Any positive number of hours, not below 36 seconds: commits a checkpoint covers are
    only history (a reader loads the newest checkpoint), so no writer needs them kept."""
    name, raw = "CDC_MIRROR_LOG_RETENTION_HOURS", _raw(env, "CDC_MIRROR_LOG_RETENTION_HOURS")
    if not raw:
        return 48.0
    try:
        hours = float(raw)
    except ValueError:
        hours = float("nan")
    if not hours >= 0.01 or hours == float("inf"):
        raise ConfigurationError(f"{name} must be a number of hours >= 0.01, got {raw!r}")
    return hours


def _staging_retention_hours(env: Mapping[str, str]) -> float | None:
    return _hours(
        env,
        "CDC_STAGING_RETENTION_HOURS",
        72.0,
        "a reader that listed a segment may still be reading it",
        never=True,
    )


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
