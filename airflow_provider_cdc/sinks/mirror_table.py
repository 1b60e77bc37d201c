"""The mirror's Delta table: opening and creating it, its properties (the fences live there),
the Delta log's bounds, the bucket size unit, and the one optimistic-commit retry loop every
mirror writer uses (the writer, fencing, compaction). Design: docs/DESIGN.md, Fencing."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from .. import storage
from ..core.arrow_types import (
    KEY_COLUMN,
    POSITION_COLUMN,
)
from ..core.errors import ConfigurationError
from ..core.formats import MIRROR
from ..core.schema import TableName, TableSchema
from ..storage.layout import mirror_dir, mirrors_dir, schemas_dir
from .delta_buckets import (
    BUCKET_COLUMN,
    BUCKETS_PROPERTY,
    DEFAULT_BUCKETS,
    MirrorVersion,
    commit,
    discard,
    read_version,
)

log = logging.getLogger(__name__)


#: attempts of one optimistic commit (:func:`commit_attempts`)
COMMIT_RETRIES = 12


#: table properties that fence writers (module docstring)
HORIZON_PROPERTY = "cdc.compacted_upto"


EPOCH_PROPERTY = "cdc.merge_epoch"


STOPPED_PROPERTY = "cdc.stopped_snapshots"  # the last stopped snapshot ids, comma separated


#: Set when the source's table changed in a way the mirror cannot follow in place (a column's
#: type, the primary key): the reason. Its events then skip the mirror (the event log keeps
#: them) until a whole-table re-snapshot rebuilds the mirror with the new schema.
SCHEMA_STOP_PROPERTY = "cdc.schema_stopped"


_STOPPED_KEPT = 20


def _backoff(attempt: int) -> None:
    time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))


def commit_attempts(what: str) -> Iterator[int]:
    """The one retry loop of every mirror writer (the engines' apply and merge, compaction,
    the horizon, epoch claims, a rebuild): each attempt reads, builds and commits on top of
    what it read; the caller leaves the loop once its commit went through. Yields 0, 1, ...
    with a growing, jittered pause before each retry; after the last attempt
    CommitFailedError says that other writers kept committing first."""
    for attempt in range(COMMIT_RETRIES):
        if attempt:
            _backoff(attempt - 1)
        yield attempt
    raise CommitFailedError(f"{what}: other writers kept committing first, {COMMIT_RETRIES} attempts")


def check_location(data_dir: str, setting: str = "data_dir") -> str:
    """Refuse a data location delta-rs cannot use: it writes a commit at the literal path but
    reads the path back URL-decoded (1.6.6: a ``%20`` or ``%2520`` in a folder name), so a
    ``%`` anywhere in it makes the mirror unreadable. Table folders never hold ``%`` (the
    path encoder), only a user's folder can."""
    if "%" in data_dir:
        raise ConfigurationError(
            f"{setting} {data_dir!r} contains '%': the Delta mirror (delta-rs) reads such paths back "
            "URL-decoded "
            "and cannot find its own files. Choose a data location without '%'"
        )
    return data_dir


def _delta(path: str) -> DeltaTable:
    """The Delta table at a location (local path or URI; storage settings from storage/)."""
    return DeltaTable(path, storage_options=storage.delta_storage_options(path))


def _open(path: str) -> DeltaTable | None:
    try:
        return _delta(path)
    except TableNotFoundError:
        return None


def _properties(dt: DeltaTable) -> dict[str, str]:
    return dict(dt.metadata().configuration or {})


def _set_properties(dt: DeltaTable, props: dict[str, str]) -> None:
    dt.alter.set_table_properties(props, raise_if_not_exists=False)


#: File statistics only for the meta columns (the MERGE's file pruning and compaction use
#: them). A typed column may hold values no Python date holds (PostgreSQL BC and year 10000+,
#: infinities, MySQL zero dates: core/temporal.py), and deltalake's pyarrow reader turns
#: statistics into Python values: with stats on such a column it cannot read the table at all.
STATS_PROPERTIES = {"delta.dataSkippingStatsColumns": f"{KEY_COLUMN},{POSITION_COLUMN}"}


#: The Delta log stays bounded: a checkpoint every 100 commits (a reader loads the newest
#: checkpoint and at most that many commits after it) and, at each checkpoint, commits older
#: than the log retention removed (delta-rs's post-commit hooks, which every commit runs): the
#: log holds about (commits an hour x log retention) + 100 entries whatever the pipeline's age.
#: The remove actions vacuum needs stay in the checkpoints for the deleted-file retention, twice
#: the mirror's retention (vacuum's horizon), so no replaced file outlives the log that names it.
CHECKPOINT_INTERVAL = 100


DEFAULT_LOG_RETENTION_HOURS = 48.0


def log_properties(
    retention_hours: float, log_retention_hours: float = DEFAULT_LOG_RETENTION_HOURS
) -> dict[str, str]:
    hours = max(1, math.ceil(retention_hours))
    return {
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
        "delta.enableExpiredLogCleanup": "true",
        # in seconds, so a soak of minutes can show the bound (CDC_MIRROR_LOG_RETENTION_HOURS)
        "delta.logRetentionDuration": f"interval {max(36, round(log_retention_hours * 3600))} seconds",
        # twice vacuum's horizon: a checkpoint drops a remove once it is older than this, and lite
        # vacuum only sees the removes the log still holds, so it must see each one past the horizon
        "delta.deletedFileRetentionDuration": f"interval {2 * hours} hours",
    }


def ensure_log_properties(
    path: str, retention_hours: float, log_retention_hours: float = DEFAULT_LOG_RETENTION_HOURS
) -> bool:
    """Set :func:`log_properties` on an existing mirror (made by a version without them, or
    with another retention); one commit, only when something differs. True when it committed."""
    dt = _open(path)
    if dt is None:
        return False
    want = log_properties(retention_hours, log_retention_hours)
    have = _properties(dt)
    if all(have.get(k) == v for k, v in want.items()):
        return False
    try:
        _set_properties(dt, want)
    except CommitFailedError as exc:  # the next round tries again
        log.warning(
            "mirror %s: setting the Delta log properties postponed after a commit conflict (%s)", path, exc
        )
        return False
    return True


def open_mirror(path: str) -> DeltaTable | None:
    """The mirror's Delta table at ``path``, or None when there is none yet."""
    return _open(path)


def _create(path: str, schema: pa.Schema, props: dict[str, str] | None = None) -> tuple[DeltaTable, bool]:
    """Create the Delta table at ``path`` (True), partitioned into key-hash buckets
    (sinks/delta_buckets.py), or open it when another writer created it first (False)."""
    storage.makedirs(path)
    table_schema = pa.schema([*schema, pa.field(BUCKET_COLUMN, pa.int32(), False)])
    config = {
        **STATS_PROPERTIES,
        **log_properties(DEFAULT_RETENTION_HOURS),
        BUCKETS_PROPERTY: str(DEFAULT_BUCKETS),
        # created as format 1 and upgraded at once by the package's own commit: delta-rs 1.6 given
        # delta.enableDeletionVectors also demands the variantType reader feature, which readers
        # that know deletion vectors but not variants would refuse; the upgrade asks only for
        # deletionVectors (and the features the legacy writer version implied)
        MIRROR.key: "1",
        **(props or {}),
    }
    try:
        dt = DeltaTable.create(
            path,
            table_schema,
            mode="error",
            partition_by=[BUCKET_COLUMN],
            configuration=config,
            raise_if_key_not_exists=False,
            storage_options=storage.delta_storage_options(path),
        )
    except Exception:  # noqa: BLE001 - created meanwhile by another writer: use that one
        dt = _open(path)
        if dt is None:
            raise
        return dt, False
    try:
        commit(read_version(dt, path), [], (), operation="create")
    except CommitFailedError:  # another writer committed first: its commit upgrades the mirror
        pass
    return _delta(path), True


#: the size unit of a bucket (rows): compaction splits a bucket that outgrows it, so what one
#: task holds while compacting or reading a bucket does not follow the table
DEFAULT_BUCKET_ROWS = 1_000_000


BUCKET_ROWS_PROPERTY = "cdc.bucket_rows"


def bucket_unit(v: MirrorVersion) -> int:
    """The mirror's size unit: table property ``cdc.bucket_rows`` (set it to change it), or
    DEFAULT_BUCKET_ROWS."""
    raw = v.props.get(BUCKET_ROWS_PROPERTY, "")
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    if raw:
        raise ConfigurationError(
            f"mirror {v.location}: table property {BUCKET_ROWS_PROPERTY} must be a whole number "
            f"of rows >= 1, got {raw!r}; set it again or remove it"
        )
    return DEFAULT_BUCKET_ROWS


def _rows(v: MirrorVersion, paths: Iterable[str]) -> int:
    """Rows of these files by their statistics (an unrecorded count estimated from the size)."""
    return sum(v.info[p].rows if v.info[p].rows is not None else v.sizes[p] // 32 for p in paths)


def _commit_with_retries(
    path: str,
    build: Callable[[list], tuple[MirrorVersion, Iterable[str], object]],
    *,
    operation: str,
    position: str | None = None,
):
    """The one optimistic commit of every mirror writer: ``build(adds)`` reads a version,
    writes its new files (appending their AddActions to ``adds``) and returns the version,
    the paths the files replace and a result; they are committed on top of that version. On
    a commit conflict (another writer committed first) the files are deleted and ``build``
    runs again on a fresh read, so the fences and the bucket tree are checked again; on any
    other error the files are deleted and the error raised. Returns the result."""
    for _attempt in commit_attempts(f"mirror {path}: {operation}"):
        adds: list = []
        try:
            v, removed, result = build(adds)
            commit(v, adds, removed, operation=operation, position=position)
            return result
        except CommitFailedError:
            discard(path, adds)
        except BaseException:
            discard(path, adds)
            raise
    raise AssertionError("unreachable")


def _raise_horizon(path: str, bound: str) -> str:
    """Commit the compaction horizon ``bound`` (unless it is already at or past it): from the
    next commit on, no writer inserts a row at or before it. Returns the horizon now."""
    for _attempt in commit_attempts(f"mirror {path}: the compaction horizon"):
        dt = _delta(path)
        current = _properties(dt).get(HORIZON_PROPERTY)
        if current is not None and current >= bound:
            return current
        try:
            _set_properties(dt, {HORIZON_PROPERTY: bound})
            return bound
        except CommitFailedError:
            continue
    raise AssertionError("unreachable")


def _arrow_schema(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def add_columns(dt: DeltaTable, schema: pa.Schema) -> DeltaTable:
    """Delta schema evolution for ADD COLUMN: the columns of ``schema`` the table lacks are
    added (nullable; earlier rows read null). Returns the table as it is now."""
    from deltalake import Schema as DeltaSchema

    have = set(_arrow_schema(dt).names)
    new = [pa.field(f.name, f.type, True) for f in schema if f.name not in have]
    if not new:
        return dt
    try:
        dt.alter.add_columns(DeltaSchema.from_arrow(pa.schema(new)).fields)
        log.info("mirror %s: added column(s) %s", dt.table_uri, [f.name for f in new])
    except Exception:  # noqa: BLE001 - another writer added them first: re-read and check
        dt = _delta(dt.table_uri)
        missing = [f.name for f in new if f.name not in set(_arrow_schema(dt).names)]
        if missing:
            raise
        return dt
    return _delta(dt.table_uri)


def type_conflicts(dt: DeltaTable, schema: pa.Schema) -> list[str]:
    """Columns the table and ``schema`` both have, with different types."""
    have = {f.name: f.type for f in _arrow_schema(dt)}
    return [
        f"column {f.name!r} is {have[f.name]} in the mirror and {f.type} now"
        for f in schema
        if f.name in have and not have[f.name].equals(f.type)
    ]


def horizon(data_dir: str, source: str, table: str | TableName) -> str | None:
    """The mirror's compaction horizon (encoded position), None before the first compaction."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    dt = _open(mirror_dir(data_dir, source, t))
    return None if dt is None else _properties(dt).get(HORIZON_PROPERTY)


#: how long files that no Delta version references any more stay for readers still on an
#: older version; vacuum removes them after that. Delta's own default is 7 days, but a mirror
#: applied every minute supersedes a few times its changed bytes each round, so 7 days of it
#: held hundreds of times the live data; an hour (the floor: a writer in flight keeps its files)
#: holds about an hour of writes (docs/outputs.md, "Storage")
DEFAULT_RETENTION_HOURS = 1.0


def mirror_tables(data_dir: str, source: str) -> list[TableName]:
    """Tables that have a mirror under ``data_dir`` for ``source``. A folder name decodes to
    its table; a name too long to keep in a folder (hashed) is looked up in the staged
    schema of the same folder name, which holds the whole name."""
    root = mirrors_dir(data_dir, source)
    found = []
    for name in storage.list_names(root, files_only=False):
        if not storage.is_dir(storage.join(root, name, "_delta_log")):
            continue
        table = TableName.from_path_segment(name)
        if table is None:
            staged = storage.join(schemas_dir(data_dir, source), f"{name}.json")
            if not storage.exists(staged):
                log.warning(
                    "mirror folder %s has a hashed name and no staged schema names its table; skipped", name
                )
                continue
            table = TableSchema.from_json(storage.read_text(staged)).table
        found.append(table)
    return sorted(found)


def _position_literal(text: str) -> str:
    if len(text) != 40 or any(c not in "0123456789abcdef" for c in text):
        raise ConfigurationError(
            f"upto_position must be an encoded position (40 lowercase hex digits), got {text!r}"
        )
    return text


def _version(
    data_dir: str, source: str, table: str | TableName, version: int | None = None
) -> MirrorVersion | None:
    t = table if isinstance(table, TableName) else TableName.parse(table)
    path = mirror_dir(data_dir, source, t)
    dt = _open(path)
    if dt is not None and version is not None:
        dt.load_as_version(version)
    return None if dt is None else read_version(dt, path)
