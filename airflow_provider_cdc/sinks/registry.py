"""The sinks by name (``CDC_SINKS``, ``--sinks``): the one place a sink is registered.

A factory takes a :class:`SinkContext` (what the job knows: data location, source, the
merge fence, the options of named targets) and returns the Sink. Both engines get their
sinks from here (pipeline/spark/common.build_sinks) and call them through the Sink
protocol (sinks/base.py), so a new table format is one class and one :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.errors import ConfigurationError
from ..core.schema import TableName, TableSchema

if TYPE_CHECKING:  # the registry is read at DAG parse (settings): Sink's module loads pyarrow
    from .base import Sink


@dataclass(frozen=True)
class SinkContext:
    """What a sink factory may use: where the lake is, whose events, whether a merge requires
    every table's staged schema, the merge's fence (None outside a merge), and the sink's own
    ``options`` (:class:`SinkOptions`: the 'postgres' sink's ``pg_uri`` and ``pg_schema``)."""

    data_dir: str
    source: str
    database: str | None = None
    require_schema: bool = False
    fence: object | None = None
    options: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkOptions:
    """How a sink that writes elsewhere gets its target: ``resolve(setting, connection)`` in the
    worker, from the task's settings (the glue gives ``setting(name)`` and ``connection(conn_id)``,
    an Airflow connection's libpq parameters with its password: that process only);
    ``to_job(options, folder)``, the spark-submit's arguments (secrets as 0600 files in the job's
    private ``folder``, never on the command line); ``add_job_arguments(parser)`` and
    ``from_job(args)``, the job's side."""

    resolve: Callable[[Callable[[str], object], Callable[[str], dict]], dict]
    to_job: Callable[[Mapping[str, object], str], list[str]]
    add_job_arguments: Callable[[object], None]
    from_job: Callable[[object], dict]


@dataclass(frozen=True)
class SinkEntry:
    factory: Callable[[SinkContext], Sink]
    #: a snapshot merge claims a merge epoch on each round table's mirror when one of its
    #: sinks says so (sinks/mirror_fencing.py): the fence every sink of the merge then checks
    claims_fence: bool = False
    #: its outputs are locations under the data location (the storage layer's: lineage names
    #: them, status reads how far it applied from its marker there); False: it writes elsewhere
    #: (a database)
    in_data_location: bool = False
    #: the check a table's schema must pass before a snapshot plans it (raises ConfigurationError
    #: naming what the sink cannot hold); None: it holds any table
    check_schema: Callable[[TableSchema], object] | None = None
    #: it stops a table whose schema changed until a re-snapshot (sinks/mirror_fencing.py): an
    #: apply then lists the stopped tables, and reports how fresh the sink is
    stops_tables: bool = False
    #: its background maintenance, ``maintain(data_dir, source)``, run by the changelog's
    #: maintenance task (the event log's small files merged); None: nothing to do
    maintain: Callable[[str, str], object] | None = None
    #: its own options (a target outside the data location); None: it needs none
    options: SinkOptions | None = None
    #: a whole-table snapshot's convergence, ``converge(data_dir, source, table, at, reason,
    #: within)``: rows older than position ``at`` (inside the key ranges ``within``; None: all)
    #: that no chunk re-emitted are gone from the source; returns the rows it removed
    converge: Callable[..., int] | None = None
    #: after a snapshot is done, ``after_snapshot(data_dir, source, table, budget_rows,
    #: retention_hours)``: the table's upkeep (the Delta mirror folds its tombstones)
    after_snapshot: Callable[..., object] | None = None
    #: where a table's outputs are, ``table_location(data_dir, source, table)`` (a location under
    #: the data location: what an Asset event of the table names); None: not under it
    table_location: Callable[[str, str, TableName], str] | None = None
    #: the check the data location must pass when the settings are read (raises
    #: ConfigurationError naming CDC_DATA_DIR and what to choose); None: it takes any location
    check_location: Callable[[str], object] | None = None


_SINKS: dict[str, SinkEntry] = {}


def register(
    name: str,
    factory: Callable[[SinkContext], Sink],
    *,
    claims_fence: bool = False,
    in_data_location: bool = False,
    check_schema: Callable[[TableSchema], object] | None = None,
    stops_tables: bool = False,
    maintain: Callable[[str, str], object] | None = None,
    options: SinkOptions | None = None,
    converge: Callable[..., int] | None = None,
    after_snapshot: Callable[..., object] | None = None,
    table_location: Callable[[str, str, TableName], str] | None = None,
    check_location: Callable[[str], object] | None = None,
    replace: bool = False,
) -> None:
    """Register a sink under ``name`` (refused when taken, unless ``replace``); the keywords are
    :class:`SinkEntry`'s."""
    if name in _SINKS and not replace:
        raise ConfigurationError(f"a sink named {name!r} is registered already")
    _SINKS[name] = SinkEntry(
        factory,
        claims_fence=claims_fence,
        in_data_location=in_data_location,
        check_schema=check_schema,
        stops_tables=stops_tables,
        maintain=maintain,
        options=options,
        converge=converge,
        after_snapshot=after_snapshot,
        table_location=table_location,
        check_location=check_location,
    )


def unregister(name: str) -> None:
    _SINKS.pop(name, None)


def names() -> list[str]:
    return list(_SINKS)


def entry(name: str) -> SinkEntry:
    if name not in _SINKS:
        raise ConfigurationError(f"unknown sink {name!r} in --sinks; known: {', '.join(_SINKS)}")
    return _SINKS[name]


def location_sinks(among: Iterable[str] | None = None) -> list[str]:
    """The sinks (of ``among``, in its order; None: every registered one) whose outputs are
    under the data location."""
    return [n for n in (names() if among is None else among) if n in _SINKS and _SINKS[n].in_data_location]


def create(name: str, context: SinkContext) -> Sink:
    return entry(name).factory(context)


def table_location(name: str, data_dir: str, source: str, table: TableName) -> str | None:
    """Where sink ``name`` keeps the outputs of ``table`` under the data location (None: it
    does not say)."""
    where = entry(name).table_location
    return None if where is None else where(data_dir, source, table)


def check_location(names: Iterable[str], data_dir: str) -> None:
    """Every named sink's check of the data location (raises the first refusal); unknown names
    are the sink list's own error, raised where it is read."""
    for n in names:
        check = _SINKS[n].check_location if n in _SINKS else None
        if check is not None:
            check(data_dir)


def check_schema(names: Iterable[str], schema: TableSchema) -> None:
    """Every named sink's check of a table's schema (raises the first refusal)."""
    for n in names:
        check = entry(n).check_schema
        if check is not None:
            check(schema)


def converge(names: Iterable[str], data_dir: str, source: str, table: TableName, at: str, **kw) -> int:
    """Every named sink's convergence of ``table`` after a whole-table snapshot (SinkEntry.converge):
    the rows they removed."""
    return sum(int(e.converge(data_dir, source, table, at, **kw)) for n in names if (e := entry(n)).converge)


def after_snapshot(names: Iterable[str], data_dir: str, source: str, table: TableName, **kw) -> None:
    """Every named sink's upkeep of ``table`` once a snapshot of it is done (SinkEntry.after_snapshot)."""
    for n in names:
        if (e := entry(n)).after_snapshot is not None:
            e.after_snapshot(data_dir, source, table, **kw)


def table_stopping(names: Iterable[str]) -> list[str]:
    """The named sinks that stop a table on a schema change."""
    return [n for n in names if entry(n).stops_tables]


def resolve_options(
    names: Iterable[str], setting: Callable[[str], object], connection: Callable[[str], dict]
) -> dict[str, dict]:
    """Sink name -> its options, for the named sinks that take any (in the worker)."""
    return {n: e.options.resolve(setting, connection) for n in names if (e := entry(n)).options is not None}


def job_arguments(options: Mapping[str, Mapping[str, object]], folder: str) -> list[str]:
    """The spark-submit arguments of every sink's options (secrets as files in ``folder``)."""
    out: list[str] = []
    for n, opts in options.items():
        sink_options = entry(n).options
        if sink_options is not None:
            out += sink_options.to_job(opts, folder)
    return out


def add_job_arguments(parser) -> None:
    """Every registered sink's job arguments, on a job's parser."""
    for e in _SINKS.values():
        if e.options is not None:
            e.options.add_job_arguments(parser)


def options_from_job(names: Iterable[str], args) -> dict[str, dict]:
    """Sink name -> the options a job was given, for the named sinks that take any."""
    return {n: e.options.from_job(args) for n in names if (e := entry(n)).options is not None}


def maintain(names: Iterable[str], data_dir: str, source: str) -> None:
    """Every named sink's background maintenance."""
    for n in names:
        work = entry(n).maintain
        if work is not None:
            work(data_dir, source)


# --- the package's sinks --------------------------------------------------------------------------
def _events(c: SinkContext) -> Sink:
    from .event_log import EventLogSink

    return EventLogSink(c.data_dir, c.source, c.database, fence=c.fence)


def _mirror(c: SinkContext) -> Sink:
    from .mirror_delta import MirrorDeltaSink

    return MirrorDeltaSink(c.data_dir, c.source, require_schema=c.require_schema, fence=c.fence)


def _postgres(c: SinkContext) -> Sink:
    if not c.options.get("pg_uri"):
        raise ConfigurationError(
            "sink 'postgres' (CDC_SINKS) has no target database: set CDC_POSTGRES_SINK_CONN_ID to the id of "
            "an Airflow connection of type postgres (a Spark job run by hand: --pg-uri without a password, "
            "which libpq then takes from PGPASSFILE or PGPASSWORD)"
        )
    from .mirror_postgres import MirrorPostgresSink

    return MirrorPostgresSink(
        c.options["pg_uri"],
        c.data_dir,
        c.source,
        target_schema=c.options.get("pg_schema"),
        require_schema=c.require_schema,
        fence=c.fence,
    )


def _mirror_schema(schema: TableSchema) -> None:
    from ..core.arrow_types import mirror_schema

    mirror_schema(schema)  # a table the Delta mirror cannot hold fails here, named


def _compact_event_log(data_dir: str, source: str) -> None:
    # the event log's small changelog files it has applied, merged (sinks/event_log.py)
    from .base import read_marker
    from .event_log import compact_event_log

    compact_event_log(data_dir, source, read_marker(data_dir, source, "events"))


def _events_dir(data_dir: str, source: str, _table: TableName) -> str:
    from ..storage.layout import events_dir

    return events_dir(data_dir, source)


register("events", _events, in_data_location=True, maintain=_compact_event_log, table_location=_events_dir)


def _mirror_converge(data_dir: str, source: str, table: TableName, at: str, **kw) -> int:
    from ..storage.layout import mirror_dir
    from .mirror_delta import sweep

    return sweep(mirror_dir(data_dir, source, table), at, **kw)


def _mirror_after_snapshot(data_dir: str, source: str, table: TableName, **kw) -> None:
    from .mirror_compaction import after_snapshot

    after_snapshot(data_dir, source, table, **kw)


def _mirror_dir(data_dir: str, source: str, table: TableName) -> str:
    from ..storage.layout import mirror_dir

    return mirror_dir(data_dir, source, table)


def _mirror_location(data_dir: str) -> None:
    if "%" in data_dir:
        raise ConfigurationError(
            f"CDC_DATA_DIR {data_dir!r} contains '%': the Delta mirror (delta-rs) reads such paths back "
            "URL-decoded and cannot find its own files. Choose a data location without '%'"
        )


register(
    "mirror",
    _mirror,
    claims_fence=True,
    in_data_location=True,
    check_schema=_mirror_schema,
    stops_tables=True,
    converge=_mirror_converge,
    after_snapshot=_mirror_after_snapshot,
    table_location=_mirror_dir,
    check_location=_mirror_location,
)


def _postgres_options() -> SinkOptions:
    from . import postgres_target as t

    return SinkOptions(t.resolve, t.to_job, t.add_job_arguments, t.from_job)


def _keyed_rows(schema: TableSchema) -> None:
    if schema.multiset:
        raise ConfigurationError(
            f"table {schema.table} has no key and is captured as a multiset, which the 'postgres' sink "
            "cannot hold (it keeps one row per key): capture it to the Delta mirror and the event log "
            "only (CDC_SINKS), or give the table a key"
        )


register("postgres", _postgres, options=_postgres_options(), check_schema=_keyed_rows)
