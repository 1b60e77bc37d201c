"""The provider's settings (``CDC_*``), read in one place when a task runs, so a change to the
workers' environment takes effect at the next task. No Airflow import; a bad value is a
ConfigurationError naming the variable. ``OPTIONS`` lists every setting; where a value comes
from, first found wins: docs/configuration.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigurationError
from ..core.schema import TableName
from ..core.throttle import ChunkSizing
from .readers import (
    Reader,
    flag,
    hours,
    key_columns,
    raw_value,
    schedule,
    seconds,
    sink_names,
    sinks,
    spark_conf,
    table_list,
    text,
    whole,
)


@dataclass(frozen=True)
class Option:
    """One setting, declared once: its variable, default (as text; None: none, or computed),
    meaning, and how it is read (``read``: its value in :class:`Settings`, attribute
    :attr:`field`; None: :func:`load` composes it with others). The docs' configuration page,
    Airflow's ``[cdc]`` section and the sources config's entry keys all come from here."""

    var: str
    default: str | None
    description: str
    example: str | None = None
    read: Reader | None = None
    #: a source of the sources config may set it, under :attr:`entry`
    per_source: bool = True
    field_name: str | None = None
    entry_key: str | None = None

    @property
    def key(self) -> str:
        """Its option name in Airflow's ``[cdc]`` section."""
        return self.var.removeprefix("CDC_").lower()

    @property
    def field(self) -> str:
        """Its attribute in :class:`Settings`."""
        return self.field_name or self.key

    @property
    def entry(self) -> str:
        """Its key in a source of the sources config."""
        return self.entry_key or self.key


OPTIONS: tuple[Option, ...] = (
    Option(
        "CDC_SOURCE_CONN_ID",
        "cdc_source",
        "Airflow connection of the source database",
        read=text,
        field_name="conn_id",
        entry_key="conn_id",
    ),
    Option(
        "CDC_SOURCE",
        None,
        "staging name of the source (default: the connection id)",
        "shop",
        per_source=False,
    ),
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
        read=table_list,
    ),
    Option(
        "CDC_REFRESH_TABLES",
        None,
        "tables refreshed whole instead of captured (the cdc_refresh DAG): tables without any key "
        "included; each refresh reads the table in one consistent snapshot and publishes it as one new "
        "version of a plain Delta table, and nothing is created or changed on the source for them. "
        "Never in CDC_TABLES; a comma list or a JSON list",
        "public.audit_log",
        read=table_list,
    ),
    Option(
        "CDC_REFRESH_SCHEDULE",
        None,
        "cron or preset of the cdc_refresh DAG's runs (unset: triggered by hand only)",
        "@daily",
        read=schedule,
    ),
    Option(
        "CDC_CAPTURE_ALL_TABLES",
        None,
        "true: capture every table of the database instead of CDC_TABLES (PostgreSQL: "
        "a FOR ALL TABLES publication, under which UPDATE and DELETE fail on tables without a replica "
        "identity, "
        "so it is refused while any exists; MariaDB/MySQL: every database of the server). System "
        "schemas never",
        read=flag,
    ),
    Option(
        "CDC_KEY_COLUMNS",
        None,
        "the key of scope tables without a primary key: the columns of a unique index on NOT NULL columns, "
        "per table (Debezium's message.key.columns). PostgreSQL takes a table's REPLICA IDENTITY USING INDEX "
        "by itself; under REPLICA IDENTITY FULL name the key here. '*': no key at all, captured as a "
        "multiset. A JSON object, or 'schema.table:col1,col2;schema.other:col'",
        '{"public.events": ["event_uid"]}',
        read=key_columns,
    ),
    Option("CDC_SINKS", "events,mirror", "sinks of merge and apply, a comma list (postgres too)", read=sinks),
    Option(
        "CDC_STORAGE_CONN_ID",
        None,
        "Airflow connection (type aws) with the object-storage endpoint and "
        "credentials, resolved where used: in the task, per poll in the triggerer, a 0600 file for a "
        "spark-submit "
        "(unset: the workers' AWS_* variables)",
        read=text,
    ),
    Option(
        "CDC_POSTGRES_SINK_CONN_ID",
        None,
        "Airflow connection (type postgres) of the 'postgres' sink's target "
        "database; its password reaches a spark-submit only as a 0600 passfile, never on the command line",
        "cdc_mirror_pg",
        read=text,
    ),
    Option(
        "CDC_POSTGRES_SINK_SCHEMA",
        None,
        "target schema of the 'postgres' sink (default: cdc_{source})",
        "lake",
        read=text,
    ),
    Option("CDC_SPARK_CONN_ID", "spark_default", "Spark connection of the merge/apply submits", read=text),
    Option(
        "CDC_SPARK_CONF",
        "{}",
        "JSON object of Spark settings for those submits: tuning only (memory, cores, "
        "instances, dynamic allocation, shuffle and SQL tuning; core/spark_settings.py lists them)",
        '{"spark.executor.memory": "4g"}',
        read=spark_conf,
    ),
    Option(
        "CDC_LOCAL_MAX_ROWS",
        "100000",
        "rounds/batches up to this many rows run in the worker (0: always spark-submit); see also "
        "CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS",
        read=whole("a whole number >= 0 (0: always spark-submit)"),
    ),
    Option(
        "CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS",
        "5000000",
        "under a local[...] Spark master, a snapshot's merge of up to this many rows runs in the worker "
        "(a local Spark has no core the worker lacks; the worker merges a group of chunks at a time); "
        "larger ones, and any on a cluster master, follow CDC_LOCAL_MAX_ROWS (0: that alone decides)",
        read=whole("a whole number of rows >= 0 (0: CDC_LOCAL_MAX_ROWS alone decides)"),
    ),
    Option(
        "CDC_MERGE_WHILE_READING_ROWS",
        "2000000",
        "committed chunk rows (high watermark staged) that start a "
        "merge while later chunks are still read (0: merge only after reading)",
        read=whole("a whole number of rows >= 0 (0: merge only after the chunks are read)"),
        per_source=False,
    ),
    Option(
        "CDC_MAX_PARALLEL_CHUNKS",
        "4",
        "chunk tasks at once per snapshot run",
        read=whole("a whole number >= 1", minimum=1),
    ),
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
        read=flag,
    ),
    Option(
        "CDC_SENSOR_POKE_INTERVAL", "5", "seconds between the high-watermark sensor's checks", read=seconds()
    ),
    Option("CDC_SENSOR_TIMEOUT", "21600", "seconds the sensor waits in all before failing", read=seconds()),
    Option(
        "CDC_SNAPSHOT_SCHEDULE",
        None,
        "cron or preset of periodic refresh snapshots (unset: manual only)",
        "@weekly",
        read=schedule,
    ),
    Option(
        "CDC_CHANGELOG_SCHEDULE",
        "* * * * *",
        "cron or preset of the changelog DAG (none: manual only); '@log': a round starts when the "
        "source writes to the capture scope (the triggerer watches it) and every "
        "CDC_CHANGELOG_HEARTBEAT_SECONDS on an idle source",
        "@log",
        read=schedule,
    ),
    Option(
        "CDC_CHANGELOG_POLL_SECONDS",
        "2",
        "with CDC_CHANGELOG_SCHEDULE=@log: seconds between two readings of the source's activity",
        read=seconds(),
    ),
    Option(
        "CDC_CHANGELOG_HEARTBEAT_SECONDS",
        "600",
        "with CDC_CHANGELOG_SCHEDULE=@log: seconds after which a round starts on an idle source "
        "(log retention checks, compaction)",
        read=seconds(),
    ),
    Option(
        "CDC_CHANGELOG_MIN_INTERVAL_SECONDS",
        "5",
        "with CDC_CHANGELOG_SCHEDULE=@log: seconds between the starts of two rounds at least (the "
        "mirror's age under steady writes is about this plus a round; fewer rounds cost less CPU and "
        "fewer, fuller files)",
        read=seconds(zero=True),
    ),
    Option(
        "CDC_MAINTENANCE_INTERVAL_SECONDS",
        "300",
        "with CDC_CHANGELOG_SCHEDULE=@log or @continuous: seconds between two runs of the mirrors' "
        "background compaction and vacuum (the compact_tombstones task); periodic schedules run it "
        "every round",
        read=seconds(zero=True),
    ),
    Option(
        "CDC_MIRROR_RETENTION_HOURS",
        "1",
        "hours unreferenced mirror files stay for readers of older "
        "versions before vacuum removes them (at least 1; raise it for time travel: the folder then holds "
        "about that many hours of writes beside the live rows)",
        read=hours(1, "files younger than that may belong to a writer still in flight"),
    ),
    Option(
        "CDC_MIRROR_LOG_RETENTION_HOURS",
        "48",
        "hours a mirror's Delta log keeps commits a checkpoint "
        "already covers (how far back a reader can time-travel; fractions allowed, at least 0.01)",
        read=hours(0.01),
    ),
    Option(
        "CDC_MIRROR_COMPACT_BUDGET_ROWS",
        "4000000",
        "stored rows one changelog round's background compaction "
        "may rewrite per mirror table (the due buckets with most change first; at least 1)",
        read=whole("a whole number of rows >= 1", minimum=1),
    ),
    Option(
        "CDC_STAGING_RETENTION_HOURS",
        "72",
        "hours staged segments and finished snapshots' chunk folders stay "
        "after nothing else holds them (every sink applied them, no open snapshot needs them), for "
        "replays and "
        "late readers; at least 1, or 'never' to keep staging forever",
        read=hours(1, "a reader that listed a segment may still be reading it", never=True),
        per_source=False,
    ),
    Option(
        "CDC_CAPTURE_MAX_EVENTS",
        None,
        "cap on the events of one capture (unset: unbounded, but a one-task round of @log or "
        "@continuous stops at 90% of CDC_LOCAL_MAX_ROWS, see CDC_ROUND_CATCH_UP_SECONDS)",
        read=whole("a whole number >= 1 (unset: unbounded)", minimum=1),
    ),
    Option(
        "CDC_ROUND_CATCH_UP_SECONDS",
        "300",
        "with CDC_CHANGELOG_SCHEDULE=@log or @continuous and CDC_CAPTURE_MAX_EVENTS unset: a round's "
        "capture stops at 90% of CDC_LOCAL_MAX_ROWS so its apply stays in the worker, unless it is "
        "still this many seconds behind the source after that: then it captures the rest at once "
        "(one spark-submit apply drains a large backlog faster); 0: rounds are never capped",
        read=seconds(zero=True),
    ),
    Option(
        "CDC_CAPTURE_SEGMENT_MAX_EVENTS",
        None,
        "events per staged segment (the connection's segment_max_events "
        "extra, else 20000; 0: one segment per capture)",
        read=whole("a whole number >= 0 (0: one segment per capture)"),
    ),
    Option(
        "CDC_SOURCES_FILE",
        None,
        "the sources config that dags/cdc_sources.py turns into DAGs (default: "
        "cdc_sources.yaml next to that file)",
        "/opt/airflow/dags/cdc_sources.yaml",
        read=text,
        per_source=False,
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


def option(var: str) -> Option:
    """The declaration of the setting ``var``."""
    return _BY_VAR[var]


_BY_VAR = {o.var: o for o in OPTIONS}
DEFAULT_LOCAL_MAX_ROWS = int(option("CDC_LOCAL_MAX_ROWS").default or 0)


def default_data_dir(env: Mapping[str, str] | None = None) -> str:
    """``$AIRFLOW_HOME/cdc-data`` (Airflow's own default home, ``~/airflow``, when unset):
    the same folder for the dag-processor, the scheduler and every worker of a host,
    whatever their working directory."""
    env = os.environ if env is None else env
    home = (env.get("AIRFLOW_HOME") or "").strip() or str(Path("~/airflow").expanduser())
    return str(Path(home).expanduser() / "cdc-data")


@dataclass(frozen=True)
class Settings:
    """Every setting's value (:data:`OPTIONS` declares them, with their defaults; :func:`load`
    reads them). The fields named by an option's :attr:`Option.field`, and those load composes:
    ``source`` and ``explicit_source`` (CDC_SOURCE), ``data_dir`` (CDC_DATA_DIR, checked), and
    ``chunk_sizing`` (the CDC_CHUNK_* options)."""

    conn_id: str
    source: str
    explicit_source: str | None  # CDC_SOURCE as given (None: each connection's own id)
    data_dir: str
    tables: tuple[str, ...]
    capture_all_tables: bool
    refresh_tables: tuple[str, ...]  # refreshed whole, never captured
    refresh_schedule: str | None
    key_columns: dict  # table text -> key columns
    sinks: str
    spark_conn_id: str
    storage_conn_id: str | None
    postgres_sink_conn_id: str | None
    postgres_sink_schema: str | None
    spark_conf: dict
    local_max_rows: int
    local_snapshot_merge_max_rows: int
    merge_while_reading_rows: int
    max_parallel_chunks: int
    chunk_sizing: ChunkSizing
    sensor_deferrable: bool | None
    sensor_poke_interval: float
    sensor_timeout: float
    snapshot_schedule: str | None
    changelog_schedule: str | None
    changelog_poll_seconds: float
    changelog_heartbeat_seconds: float
    changelog_min_interval_seconds: float
    maintenance_interval_seconds: float
    capture_max_events: int | None
    round_catch_up_seconds: float
    capture_segment_max_events: int | None
    mirror_retention_hours: float
    mirror_log_retention_hours: float
    mirror_compact_budget_rows: int
    staging_retention_hours: float | None  # None: staging is kept forever
    sources_file: str | None


def load(env: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None) -> Settings:
    """Parse and check every ``CDC_*`` variable (``env`` defaults to ``os.environ``, read now).

    ``overrides`` are ``CDC_*`` values that win over ``env``: a source of the sources config
    (sources_config.py) is the environment with its entry's values on top."""
    env = {**airflow_section(), **os.environ} if env is None else env
    if overrides:
        env = {**env, **overrides}
    values = {o.field: o.read(env, o) for o in OPTIONS if o.read is not None}
    values["capture_all_tables"] = bool(values["capture_all_tables"])
    if values["tables"] and values["capture_all_tables"]:
        raise ConfigurationError(
            "CDC_TABLES and CDC_CAPTURE_ALL_TABLES=true are both set: the capture scope is one or the "
            "other; unset one"
        )
    both = sorted(
        {str(TableName.parse(t)) for t in values["tables"]}
        & {str(TableName.parse(t)) for t in values["refresh_tables"]}
    )
    if both:
        raise ConfigurationError(
            f"table(s) {', '.join(both)} are in both CDC_TABLES and CDC_REFRESH_TABLES: a table is either "
            "captured (CDC_TABLES) or refreshed whole (CDC_REFRESH_TABLES); remove it from one"
        )
    from .. import storage

    data_dir = storage.check_location(raw_value(env, "CDC_DATA_DIR") or default_data_dir(env), "CDC_DATA_DIR")
    from ..sinks import registry

    registry.check_location(sink_names(values["sinks"]), data_dir)  # each sink's word on the location
    chunk = {
        k: raw_value(env, f"CDC_CHUNK_{k.upper()}")
        for k in ("target_seconds", "target_mb", "min_rows", "max_rows")
    }
    return Settings(
        **values,
        source=raw_value(env, "CDC_SOURCE") or values["conn_id"],
        explicit_source=raw_value(env, "CDC_SOURCE") or None,
        data_dir=data_dir,
        chunk_sizing=ChunkSizing.parse(chunk),
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
