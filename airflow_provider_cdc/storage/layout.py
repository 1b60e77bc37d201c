"""Where staged and output files live and which columns they have (conventions only, no I/O).

``data_dir`` is a local folder or any fsspec/Hadoop URI; paths are joined with ``/``.

Staged changelog segment (Parquet, rows ordered by position)::

    {data_dir}/staging/{source}/changelog/seg-{first}-{last}.parquet
    position: string (Position.encode())   table: string (TableName.id)
    op: string (c, u, d, or w for a watermark write)
    key: string (canonical key JSON; null for w)
    before, after: string (canonical row JSON; null where absent)
    ts_ms: int64 (commit time)   watermark: string (the value written; only for w)
    origin: struct (ChangeEvent.origin: tx, lsn, last_commit_lsn, server_id, thread, file; null
            for w and for files staged before it existed)

Segments may overlap only after a capture crashed between writing and committing;
readers de-duplicate by (table, key, position), and the next capture removes the orphan.

Snapshot chunk (Parquet, rows ordered by key)::

    {data_dir}/staging/{source}/chunks/{table.path_segment}/{snapshot_id}/chunk-{seq:06d}-{hw_id}.parquet
    key: string   after: string

Table schema (JSON, TableSchema.to_json()): the columns the snapshot and the mirror keep
(written by the snapshot planner, evolved by capture)::

    {data_dir}/staging/{source}/schemas/{table.path_segment}.json

Log schema (JSON, TableSchema.to_json()): the columns the event log types a table's events
with, for every table capture staged events of, snapshotted or not (core.schema.follow_log_schema)::

    {data_dir}/staging/{source}/log_schemas/{table.path_segment}.json

Outputs::

    {data_dir}/output/{source}/events/table={table.path_segment}/...   append-only event log
    {data_dir}/output/{source}/mirror/{table.path_segment}/            mirror (Delta Lake)
"""

from __future__ import annotations

from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.schema import TableName, encode_path_segment
from ..core.scope import check_snapshot_id

CHANGELOG_COLUMNS = ("position", "table", "op", "key", "before", "after", "ts_ms", "watermark", "origin")
CHUNK_COLUMNS = ("key", "after")


def _join(*parts: str) -> str:
    return "/".join(p.rstrip("/") for p in parts)


def path_component(name: str, what: str) -> str:
    """``name`` as one path component: never a folder above it or beside it (a name read back
    from a Variable, XCom or file is checked by its grammar first, core/scope.py; this is the
    last guard)."""
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\x00"):
        raise ConfigurationError(f"{what} {name!r} cannot be a path component ('/', '\\', '..' or empty): "
                                 "nothing was read or written for it")
    return name


def staging_dir(data_dir: str, source: str) -> str:
    return _join(data_dir, "staging", path_component(source, "source name"))


def changelog_dir(data_dir: str, source: str) -> str:
    return _join(staging_dir(data_dir, source), "changelog")


def segment_name(first: Position, last: Position) -> str:
    return f"seg-{first.encode()}-{last.encode()}.parquet"


def parse_segment_name(name: str) -> tuple[Position, Position]:
    stem = name.rsplit("/", 1)[-1].removesuffix(".parquet")
    _, first, last = stem.split("-")
    return Position.decode(first), Position.decode(last)


def snapshot_dir(data_dir: str, source: str, table: TableName, snapshot_id: str) -> str:
    """A snapshot's staged chunks, their sidecars and its plan."""
    return _join(staging_dir(data_dir, source), "chunks", table.path_segment,
                 check_snapshot_id(snapshot_id, f"snapshot of table {table}"))


def chunk_path(data_dir: str, source: str, table: TableName, snapshot_id: str, seq: int, hw_id: str) -> str:
    return _join(snapshot_dir(data_dir, source, table, snapshot_id), f"chunk-{seq:06d}-{hw_id}.parquet")


def plan_path(data_dir: str, source: str, table: TableName, snapshot_id: str) -> str:
    """The snapshot's plan (ranges in plan order, upper bound, filter, throttle), next to its chunks."""
    return _join(snapshot_dir(data_dir, source, table, snapshot_id), "plan.json")


def schemas_dir(data_dir: str, source: str) -> str:
    return _join(staging_dir(data_dir, source), "schemas")


def schema_path(data_dir: str, source: str, table: TableName) -> str:
    return _join(schemas_dir(data_dir, source), f"{table.path_segment}.json")


def log_schema_path(data_dir: str, source: str, table: TableName) -> str:
    return _join(staging_dir(data_dir, source), "log_schemas", f"{table.path_segment}.json")


def events_dir(data_dir: str, source: str) -> str:
    return _join(data_dir, "output", path_component(source, "source name"), "events")


def mirrors_dir(data_dir: str, source: str) -> str:
    return _join(data_dir, "output", path_component(source, "source name"), "mirror")


def mirror_dir(data_dir: str, source: str, table: TableName) -> str:
    return _join(mirrors_dir(data_dir, source), table.path_segment)


def round_path(data_dir: str, source: str, run_id: str) -> str:
    """The chunk results of one snapshot run's round (the merge's input), named by its run
    through the one name encoder, so two run ids (``x:1``, ``x+1``) never share a file."""
    return _join(staging_dir(data_dir, source), "rounds", f"{encode_path_segment(run_id)}.json")


def live_round_path(round_file: str) -> str:
    """The round without the chunks of stopped snapshots, next to its round file. ``~live``
    is no encoded run id's ending ("~" is only ever followed by hex digits or "~" there),
    so a run named ``x.live`` cannot share it with run ``x``."""
    return f"{round_file.removesuffix('.json')}~live.json"
