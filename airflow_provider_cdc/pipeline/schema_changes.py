"""Schema changes of captured tables, followed after each capture by the staged schemas and the
Delta mirror: ADD COLUMN joins, DROP COLUMN reads null, a changed type or key stops that table's
mirror until a re-snapshot (docs/operations.md). A server that refused or dropped the connection
(SourceUnreachableError) is never a schema change: it is raised as it is, and no mirror stops for
it. No Airflow: the capture operator calls :func:`follow_schema_changes`.
"""

from __future__ import annotations

import logging

from .. import storage
from ..core.errors import CdcError, SchemaChangeError, SourceUnreachableError, TableNotFoundError
from ..core.schema import TableName, TableSchema, evolve_schema, follow_log_schema, log_typing_schema
from ..dialects.base import Dialect
from ..storage.layout import log_schema_path, mirror_dir, schema_path, schemas_dir

log = logging.getLogger(__name__)


def staged_schemas(data_dir: str, source: str) -> list[TableSchema]:
    folder = schemas_dir(data_dir, source)
    return [
        TableSchema.from_json(storage.read_text(storage.join(folder, n)))
        for n in storage.list_names(folder, suffix=".json")
    ]


def write_staged_schema(data_dir: str, source: str, schema: TableSchema) -> None:
    storage.write_text(schema_path(data_dir, source, schema.table), schema.to_json())


def _describe(dialect: Dialect, table: TableName) -> tuple[TableSchema | None, CdcError | None]:
    """:func:`current_schema` with the error itself (to chain) instead of its text."""
    try:
        return dialect.describe_table(table), None
    except TableNotFoundError:
        return None, None
    except SourceUnreachableError:
        raise  # the server went away: it says nothing about the table
    except CdcError as exc:
        return None, exc


def current_schema(dialect: Dialect, table: TableName) -> tuple[TableSchema | None, str | None]:
    """The source's schema of the table now: (schema, None), (None, None) when the table is
    gone (its DROP is the user's business), or (None, why) when it cannot be described any more
    (a column of a type CDC does not support was added). Raises SourceUnreachableError when
    the server refused or dropped the connection: that is no answer about the table."""
    current, problem = _describe(dialect, table)
    return current, None if problem is None else str(problem)


def follow(
    dialect: Dialect, data_dir: str, source: str, staged: TableSchema
) -> tuple[TableSchema, list[str]]:
    """One table: the evolved staged schema (written when it changed) and the conflicts.
    SourceUnreachableError passes (never a conflict)."""
    current, problem = current_schema(dialect, staged.table)
    if current is None:
        return staged, [problem] if problem else []
    evolved, conflicts = evolve_schema(staged, current)
    if not conflicts and evolved != staged:
        added = [c for c in evolved.column_names if c not in staged.column_names]
        write_staged_schema(data_dir, source, evolved)
        log.info(
            "table %s: column(s) %s added at the source; the sinks carry them from now on",
            staged.table,
            added,
        )
    return evolved, conflicts


def read_log_schema(data_dir: str, source: str, table: TableName) -> TableSchema | None:
    path = log_schema_path(data_dir, source, table)
    return TableSchema.from_json(storage.read_text(path)) if storage.exists(path) else None


def follow_log_schemas(
    dialect: Dialect, data_dir: str, source: str, table_ids
) -> dict[str, TableSchema | None]:
    """The log schema (storage/layout.py) of every table in ``table_ids`` followed to the
    source's catalog now: capture calls it for the tables of each segment before it writes
    the segment (and so before it commits its offset), so the apply that writes those events
    finds their columns. A table that is gone or cannot be described keeps its last log
    schema. Returns table id -> the schema its staged images are typed with
    (core/schema.py log_typing_schema: the log schema plus columns only the staged schema
    has; None: never described, the images keep text columns). SourceUnreachableError passes:
    the segment is not written, and the capture is retried."""
    out: dict[str, TableSchema | None] = {}
    for tid in sorted(table_ids):
        table = TableName.parse(tid)
        previous = read_log_schema(data_dir, source, table)
        current, problem = current_schema(dialect, table)
        followed = previous
        if current is None:
            if problem:
                log.warning(
                    "table %s: its columns cannot be described (%s); the event log keeps its last known "
                    "columns for it",
                    table,
                    problem,
                )
        else:
            followed = follow_log_schema(previous, current)
            if followed != previous:
                storage.write_text(log_schema_path(data_dir, source, table), followed.to_json())
        spath = schema_path(data_dir, source, table)
        staged = TableSchema.from_json(storage.read_text(spath)) if storage.exists(spath) else None
        out[tid] = log_typing_schema(followed, staged)
    return out


def follow_schema_changes(dialect: Dialect, data_dir: str, source: str) -> dict[str, str]:
    """Every staged table (see the module docstring). Returns table id -> why it stopped.
    SourceUnreachableError passes, stopping no mirror: the capture fails and is retried, and
    its retry follows every table again."""
    from ..sinks.mirror_fencing import stop_for_schema

    stopped = {}
    for staged in staged_schemas(data_dir, source):
        _, conflicts = follow(dialect, data_dir, source, staged)
        if conflicts:
            reason = "; ".join(conflicts)
            stop_for_schema(mirror_dir(data_dir, source, staged.table), reason)
            stopped[staged.table.id] = reason
    return stopped


def chunk_schema(dialect: Dialect, data_dir: str, source: str, staged: TableSchema) -> TableSchema:
    """The columns a snapshot chunk of the table reads now: the staged schema followed to the
    source's current one (new columns in, dropped ones left out: they read null), so a DROP
    or ADD COLUMN while a snapshot runs does not fail it. A change the mirror cannot follow
    stops the snapshot of this table (SchemaChangeError naming it; other tables go on). A server
    that refused or dropped the connection raises SourceUnreachableError (the task retries)."""
    current, problem = _describe(dialect, staged.table)
    if current is None:
        if problem is not None:
            raise SchemaChangeError(f"table {staged.table} cannot be read any more: {problem}") from problem
        return staged  # gone: the chunk's SELECT says so
    evolved, conflicts = follow(dialect, data_dir, source, staged)
    if conflicts:
        raise SchemaChangeError(
            f"table {staged.table} changed while its snapshot ran ({'; '.join(conflicts)}): stop this "
            "snapshot "
            "(action 'stop') and start a new one (action 'start'), which rebuilds the mirror with the "
            "new schema"
        )
    now = set(current.column_names)
    return TableSchema(
        staged.table,
        tuple(c for c in evolved.columns if c.name in now),
        evolved.primary_key,
        dict(evolved.extra),
    )
