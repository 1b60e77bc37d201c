"""Where staged and output files live (conventions only, no I/O): the one place that builds
their paths under ``data_dir`` (a local folder or any fsspec URI, joined with ``/``). What each
file holds: docs/outputs.md ("Where the outputs are", "Typed staging").
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
        raise ConfigurationError(
            f"{what} {name!r} cannot be a path component ('/', '\\', '..' or empty): "
            "nothing was read or written for it"
        )
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
    return _join(
        staging_dir(data_dir, source),
        "chunks",
        table.path_segment,
        check_snapshot_id(snapshot_id, f"snapshot of table {table}"),
    )


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


def source_roots(data_dir: str, source: str) -> tuple[str, ...]:
    """Every folder that holds something of ``source`` (``drop-source --purge-outputs`` removes
    them): its staging, its outputs, its snapshot registers."""
    name = path_component(source, "source name")
    return (staging_dir(data_dir, source), _join(data_dir, "output", name), _join(data_dir, "control", name))


def refreshed_dir(data_dir: str, source: str, table: TableName) -> str:
    """A table refreshed whole (sinks/refreshed.py): a plain Delta table beside the mirrors."""
    return _join(data_dir, "output", path_component(source, "source name"), "refreshed", table.path_segment)


def refresh_staging_dir(data_dir: str, source: str, table: TableName, run: str) -> str:
    """One refresh's staged read, removed once it is published or failed."""
    return _join(staging_dir(data_dir, source), "refresh", table.path_segment, encode_path_segment(run))


def round_path(data_dir: str, source: str, run_id: str) -> str:
    """The chunk results of one snapshot run's round (the merge's input), named by its run
    through the one name encoder, so two run ids (``x:1``, ``x+1``) never share a file."""
    return _join(staging_dir(data_dir, source), "rounds", f"{encode_path_segment(run_id)}.json")


def live_round_path(round_file: str) -> str:
    """The round without the chunks of stopped snapshots, next to its round file. ``~live``
    is no encoded run id's ending ("~" is only ever followed by hex digits or "~" there),
    so a run named ``x.live`` cannot share it with run ``x``."""
    return f"{round_file.removesuffix('.json')}~live.json"
