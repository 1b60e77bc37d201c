"""The mirror: current state per table in a Delta Lake table (delta-rs), with monotonic writes.

One Delta table per source table at ``core.staging.mirror_dir``: the table's typed columns
(core/arrow_types.py) plus ``__key`` (canonical key), ``__position`` (encoded position of
the event that wrote the row) and ``__deleted``.

Why it converges whatever order the writers run in (the apply job and the merge job):

* an event is applied only if its position is newer than the stored one, so a chunk row
  (stamped with its high watermark) never overwrites a newer log event (I1);
* a delete leaves a tombstone (``__deleted = true`` with its position) instead of removing
  the row, so a chunk row read before the delete but merged after it cannot resurrect the
  key; :func:`compact` removes tombstones behind a committed horizon (below). Callers
  compact only tables whose snapshot is not running, paused or failed: the horizon must not
  pass the high watermark of a chunk that a live snapshot has still to merge;
* within one batch the events are first reduced to the newest per key.

Storage (sinks/delta_buckets.py): the table is partitioned into key-hash buckets that split
as the table grows, each a resolved base file plus the change files writes append
(merge-on-read): a write costs what it changes, and :func:`compact_buckets` folds change
files into the base in the background, within a budget per round. Readers take the newest
position per key, then drop tombstones (:func:`current_batches`, sinks/mirror_readers.py).

Fencing (who may commit; docs/DESIGN.md, Fencing). Two values live in the Delta table's
own properties, so every check is part of the version a commit is based on, and Delta's
optimistic concurrency turns a concurrent change of them into a commit conflict (the
writer re-reads them and checks again; delta-rs refuses a commit whose read version saw
other metadata, "Metadata changed since last commit"):

* ``cdc.compacted_upto``, the compaction horizon H: :func:`compact` removes tombstones at
  or before H only after committing H. A row at or before H whose key has no row in the
  mirror can only be the replay of a write that a removed tombstone superseded (a zombie
  or stopped merge's chunk row, a replayed changelog batch), so every writer inserts only
  rows newer than H. Tombstones thus need no knowledge of which writers are in flight:
  compaction may run at any time without resurrecting a deleted key (I7).
* ``cdc.merge_epoch``, the merge fence token: every snapshot merge claims a new epoch for
  each mirror table it writes before it reads anything (:class:`MergeFence`), and each of
  its commits requires the epoch to be still its own. A retried merge therefore fences out
  the zombie of its earlier try (a killed task whose Spark driver lives on), and a ``stop``
  bumps the epoch so the stopped snapshot's merge in flight cannot commit its next batch.
  Changelog applies carry no epoch: they replay one totally ordered log under the
  position guard, and the horizon keeps a replay from re-inserting a compacted key.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from .. import storage
from ..core.arrow_types import (
    DELETED_COLUMN,
    KEY_COLUMN,
    POSITION_COLUMN,
    mirror_schema,
    rows_to_table,
    struct_columns,
)
from ..core.errors import ConfigurationError, FencedError
from ..core.formats import MIRROR
from ..core.schema import TableName, TableSchema, decode_key
from ..storage.layout import mirror_dir, mirrors_dir, schemas_dir
from .base import Events, SchemaCache, Sink, TableEvents, table_events, type_json_events
from .delta_buckets import (
    BUCKET_COLUMN,
    BUCKETS_PROPERTY,
    DEFAULT_BUCKETS,
    MirrorVersion,
    admit,
    any_dropped,
    change_version,
    children_of,
    commit,
    conform,
    crc_of,
    discard,
    drop_rows,
    level_of,
    live,
    newest,
    node_id,
    node_of,
    read_bucket,
    read_resolved_keys,
    read_version,
    resolve,
    write_bucket_file,
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


def newest_per_key(events: pa.Table) -> pa.Table:
    """Keep only the event with the highest position for each (table, key)."""
    return newest(events, ["table", "key"], "position")


def events_to_mirror_rows(schema: TableSchema, events: pa.Table | TableEvents) -> pa.Table:
    """Events of one table (one per key) -> typed mirror rows of ``schema`` (the staged one),
    in event order; deletes become tombstones holding their key columns. The images come
    typed (TableEvents, as staging holds them) and are only re-typed where the mirror's
    column differs (core/arrow_types.struct_columns); the canonical-JSON form is typed
    first. A value a mirror column cannot hold raises ConfigurationError naming the table,
    the column and the key."""
    te = events if isinstance(events, TableEvents) else type_json_events(schema.table.id, events, schema)
    ev = te.events
    is_delete = _combined(pc.equal(ev["op"], "d"))
    n_delete = pc.sum(is_delete).as_py() or 0
    missing = pc.and_(pc.invert(is_delete), pc.is_null(_combined(ev["after"])))
    if pc.any(missing).as_py():
        i = pc.index(missing, True).as_py()
        raise ConfigurationError(
            f"table {schema.table}: {ev['op'][i].as_py()!r} event for key {ev['key'][i].as_py()} has no 'after' row")
    try:
        arrays = struct_columns(ev["after"], te.schema, te.text_columns, schema)
    except ConfigurationError:
        # the reference decoding of the canonical rows names the table, the column and the key
        rows_to_table(schema, [r for r in te.canonical("after") if r is not None])
        raise
    if n_delete:
        keys = _delete_keys(schema, te, is_delete)
        for i, col in enumerate(schema.columns):
            if col.name in keys:
                arrays[i] = pc.if_else(is_delete, keys[col.name], arrays[i])
    return _mirror_table(schema, arrays, ev, is_delete)


def _delete_keys(schema: TableSchema, te: TableEvents, is_delete: pa.Array) -> dict[str, pa.Array]:
    """The key columns of the deletes among ``te`` (other rows: null), typed as the mirror's:
    from each delete's before-image, which holds the key (PostgreSQL's replica identity,
    MariaDB's row image); a delete without one (hand-built events) decodes its canonical key."""
    pk = schema.primary_key
    key_schema = TableSchema(schema.table, tuple(schema.column(c) for c in pk), pk, dict(schema.extra))
    before = _combined(te.events["before"])
    names = {f.name for f in before.type}
    no_image = pc.and_(is_delete, pc.is_null(before))
    if all(c in names for c in pk) and not pc.any(no_image).as_py():
        return dict(zip(pk, struct_columns(before, te.schema, te.text_columns, key_schema), strict=True))
    keys = te.events["key"].to_pylist()
    flags = is_delete.to_pylist()
    rows = [dict(zip(pk, decode_key(k), strict=True)) if d else None for k, d in zip(keys, flags, strict=True)]
    return dict(zip(pk, rows_to_table(key_schema, rows), strict=True))


def _combined(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _mirror_table(schema: TableSchema, arrays: list[pa.Array], events: pa.Table, is_delete: pa.Array | None = None) -> pa.Table:
    """Typed column arrays of ``events`` plus the mirror's ``__key, __position, __deleted``."""
    deleted = _combined(pc.equal(events["op"], "d")) if is_delete is None else is_delete
    meta = [_combined(events["key"]), _combined(events["position"]), deleted]
    return pa.Table.from_arrays([*arrays, *meta], schema=mirror_schema(schema))


def check_location(data_dir: str, setting: str = "data_dir") -> str:
    """Refuse a data location delta-rs cannot use: it writes a commit at the literal path but
    reads the path back URL-decoded (1.6.6: a ``%20`` or ``%2520`` in a folder name), so a
    ``%`` anywhere in it makes the mirror unreadable. Table folders never hold ``%`` (the
    path encoder), only a user's folder can."""
    if "%" in data_dir:
        raise ConfigurationError(
            f"{setting} {data_dir!r} contains '%': the Delta mirror (delta-rs) reads such paths back URL-decoded "
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


class MirrorDeltaSink(Sink):
    name = "mirror"

    def __init__(
        self, data_dir: str, source: str, *, require_schema: bool = False, fence: MergeFence | None = None
    ) -> None:
        self.data_dir, self.source = check_location(data_dir), source
        self.schemas = SchemaCache(data_dir, source)
        self.require_schema = require_schema
        self.fence = fence
        self.schema_stopped: dict[str, str] = {}  # tables whose events this sink skipped, and why

    def write(self, events: Events) -> None:
        for part in table_events(events, self.schemas.get):
            table_id = part.table
            schema = self.schemas.require(table_id) if self.require_schema else self.schemas.get(table_id)
            if schema is None:
                log.warning("mirror: no staged schema for %s; its events go to the event log only", table_id)
                continue
            path = mirror_dir(self.data_dir, self.source, schema.table)
            stopped = schema_stopped(path)
            if stopped:
                # the event log has them; the re-snapshot that clears the stop rebuilds the mirror
                log.error("mirror of %s waits for a re-snapshot (%s): %d event(s) not applied to it",
                          table_id, stopped, part.num_rows)
                self.schema_stopped[table_id] = stopped
                continue
            epoch = None if self.fence is None else self.fence.epoch(table_id)
            truncates = pc.equal(part.events["op"], "t")
            if pc.any(truncates).as_py():
                # a TRUNCATE: every row older than it is gone, rows of this batch included;
                # the horizon it leaves keeps older writers (late chunks, replays) out
                newest = pc.max(part.events.filter(truncates)["position"]).as_py()
                sweep(path, newest, mirror_schema(schema), reason=f"TRUNCATE of {table_id}")
                part = part.filter(pc.greater(part.events["position"], newest))
                if part.num_rows == 0:
                    continue
            try:
                mirror_schema(schema)  # a table the mirror cannot hold at all (column names only case apart)
            except ConfigurationError as exc:
                if self.fence is not None:  # a snapshot's merge fails its round, naming the columns
                    raise
                log.error("mirror of %s: %s; its events go to the event log only", table_id, exc)
                self.schema_stopped[table_id] = str(exc)
                continue
            try:
                rows = events_to_mirror_rows(schema, part.with_events(newest_per_key(part.events)))
            except ConfigurationError as exc:
                # a value the mirror's type cannot hold (numeric(p,s) NaN, a timestamp past year
                # 294247): on the changelog path only this table stops, the others go on; a
                # snapshot's merge (fenced) fails its round instead, naming the same
                if self.fence is not None or not stop_for_schema(path, f"{exc}; correct the value at the source"):
                    raise
                self.schema_stopped[table_id] = str(exc)
                continue
            upsert(path, rows, epoch=epoch)


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


def log_properties(retention_hours: float, log_retention_hours: float = DEFAULT_LOG_RETENTION_HOURS) -> dict[str, str]:
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


def ensure_log_properties(path: str, retention_hours: float,
                          log_retention_hours: float = DEFAULT_LOG_RETENTION_HOURS) -> bool:
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
        log.warning("mirror %s: setting the Delta log properties postponed after a commit conflict (%s)", path, exc)
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
    config = {**STATS_PROPERTIES, **log_properties(DEFAULT_RETENTION_HOURS), BUCKETS_PROPERTY: str(DEFAULT_BUCKETS),
              MIRROR.key: str(MIRROR.version), **(props or {})}
    try:
        return DeltaTable.create(
            path, table_schema, mode="error", partition_by=[BUCKET_COLUMN], configuration=config,
            raise_if_key_not_exists=False, storage_options=storage.delta_storage_options(path),
        ), True
    except Exception:  # noqa: BLE001 - created meanwhile by another writer: use that one
        dt = _open(path)
        if dt is None:
            raise
        return dt, False


#: the size unit of a bucket (rows): compaction splits a bucket that outgrows it, so what one
#: task holds while compacting or reading a bucket does not follow the table
DEFAULT_BUCKET_ROWS = 1_000_000
#: rows one maintenance round may rewrite per table (the due buckets with most change first)
DEFAULT_COMPACT_BUDGET_ROWS = 4_000_000
#: a bucket is due for compaction when its change rows reach this share of its base rows, it
#: holds this many change files, or it is this small (cheap to keep tidy)
CHANGE_SHARE, CHANGE_FILES, SMALL_BUCKET_ROWS = 0.1, 8, 100_000


BUCKET_ROWS_PROPERTY = "cdc.bucket_rows"


def bucket_unit(v: MirrorVersion) -> int:
    """The mirror's size unit: table property ``cdc.bucket_rows`` (set it to change it), or
    DEFAULT_BUCKET_ROWS."""
    raw = v.props.get(BUCKET_ROWS_PROPERTY, "")
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    if raw:
        raise ConfigurationError(f"mirror {v.location}: table property {BUCKET_ROWS_PROPERTY} must be a whole number "
                                 f"of rows >= 1, got {raw!r}; set it again or remove it")
    return DEFAULT_BUCKET_ROWS


def _rows(v: MirrorVersion, paths: Iterable[str]) -> int:
    """Rows of these files by their statistics (an unrecorded count estimated from the size)."""
    return sum(v.info[p].rows if v.info[p].rows is not None else v.sizes[p] // 32 for p in paths)


def _write_split(v: MirrorVersion, bucket: int, rows: pa.Table, unit: int | None) -> list:
    """``rows`` (resolved) as base files of ``bucket``, or of its descendants when more than
    ``unit`` rows (the bucket splits; only a bucketed table can)."""
    if unit is None or not v.bucketed or rows.num_rows <= unit:
        return [write_bucket_file(v.table_uri, bucket, rows, bucketed=v.bucketed)] if rows.num_rows else []
    level = level_of(bucket, v.buckets)
    crc = crc_of(rows[KEY_COLUMN])
    child = node_of(crc, v.buckets * 2 ** (level + 1)) + node_id(level + 1, 0, v.buckets)
    adds = []
    for c in children_of(bucket, v.buckets):
        adds += _write_split(v, c, rows.filter(pa.array(child == c)), unit)
    return adds


def rewrite_buckets(
    v: MirrorVersion, transform: Callable[[int, pa.Table], pa.Table | None], buckets: Iterable[int] | None = None,
    *, unit: int | None = -1,
) -> tuple[list, list[str]]:
    """Run ``transform(bucket, rows)`` over the buckets of ``v`` (all, or ``buckets``): it
    gets the bucket's stored row versions and returns its new resolved rows (None:
    unchanged). A bucket it changes, or of several files, is written as one base file (or
    split, past ``unit`` rows). Returns the AddActions and the paths they replace, for
    :func:`delta_buckets.commit`."""
    unit = bucket_unit(v) if unit == -1 else unit
    adds: list = []
    removed: list[str] = []
    try:
        for b in sorted(v.files if buckets is None else set(buckets)):
            paths = v.files.get(b, ())
            rows = read_bucket(v.table_uri, paths, v.schema)
            out = transform(b, rows)
            if out is None and len(paths) <= 1 and (unit is None or rows.num_rows <= unit):
                continue
            if out is None:  # several files (change files, or a table written before buckets): one again
                out = resolve(rows)
            # an emptied bucket has no file (DataFusion cannot read an empty one on S3)
            adds += _write_split(v, b, out, unit)
            removed.extend(paths)
    except BaseException:
        discard(v.table_uri, adds)
        raise
    return adds, removed


def _commit_with_retries(path: str, build: Callable[[list], tuple[MirrorVersion, Iterable[str], object]], *,
                         operation: str):
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
            commit(v, adds, removed, operation=operation)
            return result
        except CommitFailedError:
            discard(path, adds)
        except BaseException:
            discard(path, adds)
            raise
    raise AssertionError("unreachable")


def _commit_rewrite(path: str, read: Callable[[], MirrorVersion], transform, *, buckets=None, operation: str,
                    unit: int | None = -1) -> MirrorVersion:
    """Read, rewrite the buckets (:func:`rewrite_buckets`), commit, with retries."""

    def build(adds: list):
        v = read()
        new, removed = rewrite_buckets(v, transform, buckets(v) if callable(buckets) else buckets, unit=unit)
        adds.extend(new)
        return v, removed, v

    return _commit_with_retries(path, build, operation=operation)


def _spread(path: str, budget_rows: int | None = None) -> int:
    """Split the buckets whose stored rows exceed twice the unit (rows appended while nothing
    compacted them, a large snapshot's merges) into as many descendants as it takes, a file
    at a time: each file's rows become change files of the descendants, so no step holds more
    than one file. The largest go first, within ``budget_rows`` stored rows (at least one
    bucket). The descendants are compacted as usual. Returns the buckets spread."""

    def build(adds: list):
        v = read_version(_delta(path), path)
        if not v.bucketed:
            return v, [], 0
        unit = bucket_unit(v)
        big = {b: _rows(v, f) for b, f in v.files.items() if f and _rows(v, f) > 2 * unit}
        spent = 0
        for b, n in sorted(big.items(), key=lambda item: -item[1]):
            if spent and budget_rows is not None and spent + n > budget_rows:
                del big[b]
            else:
                spent += n
        removed: list[str] = []
        for b, n in sorted(big.items()):
            depth = max(1, math.ceil(math.log2(n / unit)))
            level = level_of(b, v.buckets)
            below = v.buckets * 2 ** (level + depth)
            for rel in v.files[b]:  # base first, then change files in commit order: kept so
                rows = read_bucket(v.table_uri, [rel], v.schema)
                node = node_of(crc_of(rows[KEY_COLUMN]), below) + node_id(level + depth, 0, v.buckets)
                version = change_version(rel)
                for c in np.unique(node).tolist():
                    adds.append(write_bucket_file(v.table_uri, int(c), rows.filter(pa.array(node == c)),
                                                  change=0 if version is None else version))
                removed.append(rel)
        if big:
            log.info("mirror %s: %d oversized bucket(s) split below the unit of %d rows", path, len(big), unit)
        return v, removed, len(big)

    return _commit_with_retries(path, build, operation="split")


def due_buckets(v: MirrorVersion, *, budget_rows: int | None = None) -> list[int]:
    """The buckets background compaction should rewrite now, most change first, within
    ``budget_rows`` stored rows (at least one bucket): a bucket with change files once they
    reach CHANGE_SHARE of its base rows or CHANGE_FILES files, or while it is small; a
    bucket of several base files (written before merge-on-read); one over ``unit`` rows."""
    unit = bucket_unit(v)
    scored = []
    for b, paths in v.files.items():
        if not paths:
            continue
        change = [p for p in paths if v.info[p].change]
        base_rows, change_rows = _rows(v, [p for p in paths if p not in change]), _rows(v, change)
        total = base_rows + change_rows
        due = (len(paths) > 1 and not change) or (total > unit and v.bucketed) or (change and (
            total <= SMALL_BUCKET_ROWS or len(change) >= CHANGE_FILES or change_rows >= CHANGE_SHARE * base_rows))
        if due:
            scored.append((-(change_rows / max(1, base_rows)), -len(paths), b, total))
    picked, spent = [], 0
    for _score, _files, b, total in sorted(scored):
        if picked and budget_rows is not None and spent + total > budget_rows:
            break
        picked.append(b)
        spent += total
    return picked


def compact_buckets(path: str, *, tombstones_upto: str | None = None,
                    budget_rows: int | None = DEFAULT_COMPACT_BUDGET_ROWS, everything: bool = False) -> dict[str, int]:
    """Background compaction of the mirror at ``path``: oversized buckets are spread below
    the unit, then the due buckets (:func:`due_buckets`; with ``everything`` each bucket of
    several files or over the unit, or with tombstones to remove) are rewritten as resolved
    base files, their tombstones at or before ``tombstones_upto`` removed behind the horizon
    (raised first, module docstring). Returns counts: buckets rewritten, tombstones removed,
    buckets split."""
    out = {"buckets": 0, "tombstones": 0, "split": 0}
    if _open(path) is None:
        return out
    out["split"] = _spread(path, budget_rows)
    v = read_version(_delta(path), path)
    if everything:
        picks = [b for b, paths in v.files.items()
                 if len(paths) > 1 or _rows(v, paths) > bucket_unit(v)
                 or any_dropped(v.table_uri, paths, tombstones_upto=tombstones_upto)]
    else:
        picks = due_buckets(v, budget_rows=budget_rows)
        if tombstones_upto is not None:  # small buckets whose base holds removable tombstones: cheap to check
            picks += [b for b, paths in v.files.items() if paths and b not in picks
                      and _rows(v, paths) <= SMALL_BUCKET_ROWS
                      and any_dropped(v.table_uri, paths, tombstones_upto=tombstones_upto)]
    if not picks:
        return out
    target = None
    if tombstones_upto is not None:
        newest = None
        for b in picks:  # the newest current tombstone at or before the bound among them
            keys = read_resolved_keys(v.table_uri, v.files.get(b, ()))
            gone = keys.filter(pc.and_(keys[DELETED_COLUMN], pc.less_equal(keys[POSITION_COLUMN], tombstones_upto)))
            top = pc.max(gone[POSITION_COLUMN]).as_py() if gone.num_rows else None
            newest = top if newest is None or (top is not None and top > newest) else newest
        if newest is not None:
            target = _raise_horizon(path, newest)
    removed = [0]

    def read() -> MirrorVersion:
        removed[0] = 0
        return read_version(_delta(path), path)

    def transform(_b: int, current: pa.Table) -> pa.Table | None:
        rows = resolve(current)
        out_ = drop_rows(rows, tombstones_upto=target) if target is not None else None
        removed[0] += 0 if out_ is None else rows.num_rows - out_.num_rows
        return rows if out_ is None else out_

    _commit_rewrite(path, read, transform, buckets=lambda v_: [b for b in picks if v_.files.get(b)],
                    operation="compact")
    out.update(buckets=len(picks), tombstones=removed[0])
    log.info("mirror %s: %d bucket(s) compacted, %d tombstone(s) removed, %d split", path, len(picks), removed[0],
             out["split"])
    return out


def _check_epoch(path: str, props: Mapping[str, str], epoch: int | None) -> None:
    if epoch is not None and props.get(EPOCH_PROPERTY) != str(epoch):
        raise FencedError(
            f"mirror {path}: this merge holds epoch {epoch} but the table's {EPOCH_PROPERTY} is "
            f"{props.get(EPOCH_PROPERTY)!r}: a newer merge attempt claimed the table, or its snapshot was "
            "stopped. This writer is superseded and committed nothing; the newer attempt writes the round"
        )


def open_for_write(path: str, schema: pa.Schema, epoch: int | None = None) -> MirrorVersion:
    """The preamble of every write of new rows (both engines): the mirror at ``path`` (created
    with ``schema`` when absent), its new columns added, its current version read, and the
    writer's merge ``epoch`` checked against the table's (:class:`FencedError` when fenced
    out)."""
    dt = _open(path) or _create(path, schema)[0]
    v = read_version(add_columns(dt, schema), path)
    _check_epoch(path, v.props, epoch)
    return v


def upsert(path: str, rows: pa.Table, *, epoch: int | None = None) -> dict:
    """Apply mirror rows (one per key) to the Delta table at ``path``: one change file per
    bucket they fall in, appended (creates the table if absent); readers take the newest
    position per key. Fenced: rows at or before the compaction horizon only update live
    rows, never insert (:func:`delta_buckets.admit`), and with an ``epoch`` the commit
    happens only while that merge epoch is the table's own (else :class:`FencedError`,
    nothing written)."""
    def build(adds: list):
        v = open_for_write(path, rows.schema, epoch)
        horizon = v.props.get(HORIZON_PROPERTY)
        new = conform(rows, v.schema)
        nodes = v.nodes_of(new[KEY_COLUMN])
        for b in pc.unique(nodes).to_pylist():
            part = admit(new.filter(pc.equal(nodes, b)), horizon,
                         lambda v=v, b=b: read_resolved_keys(v.table_uri, v.files.get(b, ())))
            if part.num_rows:
                adds.append(write_bucket_file(v.table_uri, b, part, bucketed=v.bucketed, change=v.version + 1))
        return v, (), (v, len(adds))

    v, written = _commit_with_retries(path, build, operation="upsert")
    log.info("mirror %s: %d row(s) appended to %d of %d bucket(s) at version %d", path, rows.num_rows, written,
             len(v.files), v.version + 1)
    return {"num_source_rows": rows.num_rows, "num_buckets_written": written}


def sweep(path: str, before_position: str, schema: pa.Schema | None = None, *, reason: str = "sweep") -> int:
    """Every row (live or tombstone) with a position before ``before_position`` is gone, and
    stays gone: the compaction horizon is raised to it first (one commit), then the rows are
    deleted (a second); a writer in between conflicts and re-reads the horizon, and a crash in
    between leaves rows that a replay deletes. Older writers (a late chunk merge, a replayed
    apply batch) can then only update live rows newer than it, never insert (I7, I9).
    Creates the table (with ``schema``) when absent, so the horizon holds before the first
    row arrives. Used for TRUNCATE events and for a finished snapshot's convergence.
    Idempotent; retried on commit conflicts. Returns the number of rows deleted."""
    bound = _position_literal(before_position)
    dt = _open(path)
    if dt is None:
        if schema is None:
            return 0
        dt = _create(path, schema, {HORIZON_PROPERTY: bound})[0]
    _raise_horizon(path, bound)
    removed = _drop_everywhere(path, operation="sweep", before=bound)
    log.info("mirror %s: %s removed %d row(s) older than %s", path, reason, removed, bound)
    return removed


def _drop_everywhere(path: str, *, operation: str, before: str) -> int:
    """Remove every stored row version older than ``before`` (live or tombstone), a file at a
    time: a file holding such a row is written again without it (a change file stays a change
    file of its version), the others are not touched; returns how many rows went. Per file is
    exact here, with no need to resolve a bucket: a key keeps exactly its versions at or after
    the bound. Which files hold such a row is told by their position column alone, read a row
    group at a time (a finished snapshot's convergence usually removes nothing)."""

    def build(adds: list):
        v = read_version(_delta(path), path)
        removed: list[str] = []
        gone = 0
        for b, paths in sorted(v.files.items()):
            for rel in paths:
                if not any_dropped(v.table_uri, [rel], before=before):
                    continue
                rows = read_bucket(v.table_uri, [rel], v.schema)
                kept = drop_rows(rows, before=before)
                kept = rows if kept is None else kept
                gone += rows.num_rows - kept.num_rows
                if kept.num_rows:
                    adds.append(write_bucket_file(v.table_uri, b, kept, bucketed=v.bucketed,
                                                  change=change_version(rel)))
                removed.append(rel)
        return v, removed, gone

    return _commit_with_retries(path, build, operation=operation)


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
    return [f"column {f.name!r} is {have[f.name]} in the mirror and {f.type} now" for f in schema
            if f.name in have and not have[f.name].equals(f.type)]


def schema_stopped(path: str) -> str | None:
    """Why the mirror at ``path`` waits for a re-snapshot (None: it does not)."""
    dt = _open(path)
    return None if dt is None else _properties(dt).get(SCHEMA_STOP_PROPERTY) or None


def stop_for_schema(path: str, reason: str) -> bool:
    """Mark the mirror as waiting for a re-snapshot (False when there is no mirror yet)."""
    dt = _open(path)
    if dt is None:
        return False
    if _properties(dt).get(SCHEMA_STOP_PROPERTY) != reason:
        _set_properties(dt, {SCHEMA_STOP_PROPERTY: reason})
        log.error("mirror %s stopped: %s", path, reason)
    return True


def needs_rebuild(path: str, table_schema: TableSchema) -> str | None:
    """Why the mirror at ``path`` cannot take the table's schema in place (None: it can, or
    is absent): a schema change stopped it, or a column it has changed type."""
    dt = _open(path)
    if dt is None:
        return None
    stopped = _properties(dt).get(SCHEMA_STOP_PROPERTY)
    return stopped or "; ".join(type_conflicts(dt, mirror_schema(table_schema))) or None


def reconcile_schema(path: str, table_schema: TableSchema, *, whole_table: bool) -> str:
    """At a snapshot's start: bring the mirror to the source's current ``schema``. Columns it
    lacks are added ("evolved"); when a column's type changed, or a schema change stopped the
    table, a whole-table snapshot rebuilds it: emptied, with the new schema, its fencing
    properties kept ("rebuilt"), and its chunks fill it again (the convergence sweep at DONE
    removes anything older). A snapshot of some keys, ranges or a filter cannot rebuild:
    ConfigurationError. Returns "none", "evolved" or "rebuilt"."""
    dt = _open(path)
    if dt is None:
        return "none"
    table_id, schema = table_schema.table.id, mirror_schema(table_schema)
    why = needs_rebuild(path, table_schema)
    if why is None:
        before = set(_arrow_schema(dt).names)
        return "evolved" if set(_arrow_schema(add_columns(dt, schema)).names) != before else "none"
    if not whole_table:
        raise ConfigurationError(
            f"table {table_id}: its mirror cannot take the source's current schema ({why}); snapshot the whole "
            "table (no 'keys', 'key_ranges' or 'where') to rebuild it"
        )
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    from .delta_buckets import WRITER_APP_ID

    bucketed = pa.schema([*schema, pa.field(BUCKET_COLUMN, pa.int32(), False)])
    for _attempt in commit_attempts(f"mirror {path}: rebuild"):
        v = read_version(_delta(path), path)
        try:  # one commit: no rows, the new columns, in buckets; a writer in flight conflicts
            write_deltalake(path, bucketed.empty_table(), mode="overwrite", schema_mode="overwrite",
                            partition_by=[BUCKET_COLUMN], storage_options=storage.delta_storage_options(path),
                            commit_properties=CommitProperties(
                                max_commit_retries=0, app_transactions=[Transaction(WRITER_APP_ID, v.txn + 1)]))
            break
        except CommitFailedError:
            continue
    if BUCKETS_PROPERTY not in _properties(_delta(path)):
        _set_properties(_delta(path), {BUCKETS_PROPERTY: str(DEFAULT_BUCKETS)})
    _set_properties(_delta(path), {SCHEMA_STOP_PROPERTY: ""})
    log.warning("mirror of %s rebuilt with the source's current schema (%s); the snapshot fills it", table_id, why)
    return "rebuilt"


def schema_stopped_tables(data_dir: str, source: str) -> dict[str, str]:
    """Table id -> reason, for every mirror of ``source`` waiting for a re-snapshot."""
    out = {}
    for t in mirror_tables(data_dir, source):
        reason = schema_stopped(mirror_dir(data_dir, source, t))
        if reason:
            out[t.id] = reason
    return out


def _stopped(props: dict[str, str]) -> list[str]:
    return [x for x in props.get(STOPPED_PROPERTY, "").split(",") if x]


def claim_epoch(
    path: str, schema: pa.Schema | None, *, snapshots: Iterable[str] = (), stop: str | None = None
) -> int | None:
    """Claim a new merge epoch on the mirror at ``path`` (creating the table with ``schema``
    when it does not exist; with ``schema=None`` an absent table is left alone and None
    returned). Every earlier epoch is fenced out from the next commit on.

    A merge passes the ``snapshots`` its round belongs to: the claim is refused
    (:class:`FencedError`) when one of them was stopped, so a stop that lands between the
    merge task's own check and this claim still wins. ``stop`` (a snapshot id) records that
    snapshot as stopped in the same commit."""
    wanted = set(snapshots)
    for _attempt in commit_attempts(f"mirror {path}: a merge epoch"):
        dt = _open(path)
        if dt is None:
            if schema is None:
                return None
            first = {EPOCH_PROPERTY: "1", **({STOPPED_PROPERTY: stop} if stop else {})}
            if _create(path, schema, first)[1]:
                return 1
            continue  # another writer created it: claim on top of theirs
        props = _properties(dt)
        stopped = _stopped(props)
        refused = sorted(wanted & set(stopped))
        if refused:
            raise FencedError(
                f"mirror {path}: snapshot(s) {', '.join(refused)} were stopped; their merge may not start. "
                "Start a new snapshot to read the table again"
            )
        epoch = int(props.get(EPOCH_PROPERTY, "0")) + 1
        update = {EPOCH_PROPERTY: str(epoch)}
        if stop and stop not in stopped:
            update[STOPPED_PROPERTY] = ",".join([*stopped, stop][-_STOPPED_KEPT:])
        try:
            _set_properties(dt, update)
            return epoch
        except CommitFailedError:
            continue
    raise AssertionError("unreachable")


class MergeFence:
    """The merge epochs one snapshot merge claimed, per table (module docstring, Fencing).

    Claimed once when the merge starts, before it reads chunks; every mirror commit then
    requires its epoch (atomically, in :func:`upsert`) and :meth:`check` lets the other
    sinks refuse a superseded writer before they write."""

    def __init__(self, data_dir: str, source: str) -> None:
        self.data_dir, self.source = data_dir, source
        self.epochs: dict[str, int] = {}

    def claim(
        self, schemas: Iterable[TableSchema], snapshots: Mapping[str, Iterable[str]] | None = None
    ) -> MergeFence:
        """Claim an epoch on each table's mirror; ``snapshots`` (table id -> the snapshot ids
        of the round's chunks) makes the claim fail for a snapshot that was stopped."""
        for schema in schemas:
            path = mirror_dir(self.data_dir, self.source, schema.table)
            wanted = (snapshots or {}).get(schema.table.id, ())
            epoch = claim_epoch(path, mirror_schema(schema), snapshots=wanted)
            assert epoch is not None
            self.epochs[schema.table.id] = epoch
            log.info("mirror %s: merge epoch %d claimed", schema.table, epoch)
        return self

    def epoch(self, table_id: str) -> int | None:
        return self.epochs.get(table_id)

    def check(self, table_id: str) -> None:
        """Raise FencedError when a newer merge or a stop took the table from this writer."""
        epoch = self.epochs.get(table_id)
        if epoch is None:
            return
        path = mirror_dir(self.data_dir, self.source, TableName.parse(table_id))
        dt = _open(path)
        current = None if dt is None else _properties(dt).get(EPOCH_PROPERTY)
        if current != str(epoch):
            raise FencedError(
                f"table {table_id}: this merge holds epoch {epoch} but the mirror's is {current!r}; a newer merge "
                "attempt or a stop superseded it. It writes nothing more"
            )


def fence_out_merges(data_dir: str, source: str, table: str | TableName, snapshot_id: str | None = None) -> int | None:
    """``stop``: bump the merge epoch of ``table``'s mirror so no merge in flight commits
    again, and record ``snapshot_id`` as stopped so no merge of it can claim later. The
    mirror is created for that when its schema is staged (a first snapshot stopped before
    its first merge). Returns the new epoch, None when there is no mirror and no schema."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    staged = SchemaCache(data_dir, source).get(t.id) if snapshot_id else None
    schema = None if staged is None else mirror_schema(staged)
    return claim_epoch(mirror_dir(data_dir, source, t), schema, stop=snapshot_id)


def horizon(data_dir: str, source: str, table: str | TableName) -> str | None:
    """The mirror's compaction horizon (encoded position), None before the first compaction."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    dt = _open(mirror_dir(data_dir, source, t))
    return None if dt is None else _properties(dt).get(HORIZON_PROPERTY)


#: how long files that no Delta version references any more stay for readers still on an
#: older version (Delta's own default: 7 days); vacuum removes them after that
DEFAULT_RETENTION_HOURS = 168.0


def compact(data_dir: str, source: str, table: str | TableName, *, upto_position: str | None = None,
            retention_hours: float = DEFAULT_RETENTION_HOURS) -> int:
    """Compact every bucket of the mirror that is not one resolved base file, removing its
    tombstones (all, or those at or before ``upto_position``), then vacuum files no version
    younger than ``retention_hours`` references. Returns the number of tombstones removed.
    Used when a snapshot finishes; rounds use the budgeted :func:`compact_buckets`.

    Safe at any time, against any writer in flight: it first commits the horizon (the
    newest position of the tombstones it removes) and then deletes them; a writer that read
    an older version conflicts and re-reads the horizon (module docstring). Idempotent, and
    retried on commit conflicts."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    path = mirror_dir(data_dir, source, t)
    bound = "f" * 40 if upto_position is None else _position_literal(upto_position)
    if _open(path) is None:
        return 0
    removed = compact_buckets(path, tombstones_upto=bound, everything=True)["tombstones"]
    vacuum(path, retention_hours)
    if removed:
        log.info("mirror %s: %d tombstone(s) removed up to horizon %s", path, removed, _properties(_open(path)).get(HORIZON_PROPERTY))
    return removed


def vacuum(path: str, retention_hours: float = DEFAULT_RETENTION_HOURS) -> int:
    """Delete the data files of the mirror at ``path`` that the current version does not
    reference and no version of the last ``retention_hours`` did (replaced by merges,
    compaction, deletes). Readers that follow the Delta log never need them; readers of a
    plain folder glob would see them as rows (use mirror_readers instead). Returns the
    number of files removed."""
    if retention_hours < 0:
        raise ConfigurationError(f"mirror retention must be >= 0 hours, got {retention_hours}")
    dt = _open(path)
    if dt is None:
        return 0
    # the retention also covers writers in flight: a file written but not committed yet is
    # as young as its writer, so it is never older than the retention (keep it >= 1 h)
    try:
        hours = math.ceil(retention_hours)
        # a dry run first: a vacuum commits twice (START, END) even when it removes nothing
        if not dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=True):
            return 0
        gone = dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=False)
    except CommitFailedError as exc:  # an optimisation: a concurrent commit only postpones it
        log.warning("mirror %s: vacuum postponed after a commit conflict (%s)", path, exc)
        return 0
    if gone:
        log.info("mirror %s: vacuum removed %d unreferenced file(s) older than %s h", path, len(gone), retention_hours)
    return len(gone)


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
                log.warning("mirror folder %s has a hashed name and no staged schema names its table; skipped", name)
                continue
            table = TableSchema.from_json(storage.read_text(staged)).table
        found.append(table)
    return sorted(found)


def tombstone_count(data_dir: str, source: str, table: str | TableName) -> int:
    """How many keys of the mirror of ``table`` are deleted but still held as tombstones (a
    bucket at a time)."""
    v = _version(data_dir, source, table)
    if v is None:
        return 0
    return sum(pc.sum(read_resolved_keys(v.table_uri, paths)[DELETED_COLUMN]).as_py() or 0
               for paths in v.files.values() if paths)


#: snapshot statuses under which a table's chunks may still be merged: no compaction then
ACTIVE_SNAPSHOT = ("running", "paused", "failed")


def compact_inactive(data_dir: str, source: str, status_of: Callable[[str], str | None], *,
                     retention_hours: float = DEFAULT_RETENTION_HOURS,
                     budget_rows: int | None = DEFAULT_COMPACT_BUDGET_ROWS,
                     log_retention_hours: float = DEFAULT_LOG_RETENTION_HOURS) -> dict[str, int]:
    """A changelog round's maintenance of every mirror table: the Delta log's bounds set, the
    due buckets compacted within ``budget_rows`` (:func:`compact_buckets`), and unreferenced
    files vacuumed once past the retention. Tombstones go only from tables whose snapshot is
    not active, up to the position the mirror has applied. Returns removed tombstones per
    table.

    The applied position is read BEFORE the snapshot statuses: a snapshot that starts after
    the check reads its chunks after that position, so its chunk rows are newer than the
    horizon and insert normally."""
    from .base import read_marker

    applied = read_marker(data_dir, source, "mirror")
    removed: dict[str, int] = {}
    for table in mirror_tables(data_dir, source):
        path = mirror_dir(data_dir, source, table)
        ensure_log_properties(path, retention_hours, log_retention_hours)
        upto = None if applied is None or status_of(table.id) in ACTIVE_SNAPSHOT else applied.encode()
        try:
            got = compact_buckets(path, tombstones_upto=upto, budget_rows=budget_rows)
        except CommitFailedError as exc:  # a writer kept committing first: the next round goes on
            log.warning("mirror %s: compaction postponed after commit conflicts (%s)", path, exc)
            got = {"tombstones": 0}
        if got["tombstones"]:
            removed[table.id] = got["tombstones"]
        vacuum(path, retention_hours)
    return removed


def _position_literal(text: str) -> str:
    if len(text) != 40 or any(c not in "0123456789abcdef" for c in text):
        raise ConfigurationError(f"upto_position must be an encoded position (40 lowercase hex digits), got {text!r}")
    return text


def _version(data_dir: str, source: str, table: str | TableName) -> MirrorVersion | None:
    t = table if isinstance(table, TableName) else TableName.parse(table)
    path = mirror_dir(data_dir, source, t)
    dt = _open(path)
    return None if dt is None else read_version(dt, path)


def _keyed_columns(schema: pa.Schema) -> list[str]:
    """The table's columns and ``__key``: what a reader of live rows gets."""
    return [n for n in schema.names if n not in (DELETED_COLUMN, BUCKET_COLUMN, POSITION_COLUMN)]


def current_batches(v: MirrorVersion, *, batch_rows: int = 100_000, columns: Sequence[str] | None = None,
                    tombstones: bool = False) -> Iterator[pa.RecordBatch]:
    """The current rows of the mirror version ``v`` (live only, or with ``tombstones``), a
    bucket at a time (memory: one bucket, bounded by the unit): a bucket of one file is
    streamed as stored (one file never holds a key twice), a bucket with change files is
    resolved first (the newest position per key wins); a bucket that grew past twice the unit
    before compaction spread it is resolved in parts of about a unit, by key hash, one pass
    over its files each."""
    cols = list(columns or v.schema.names)
    need = list(dict.fromkeys([*cols, DELETED_COLUMN]))
    for b in sorted(v.files):
        paths = v.files[b]
        if not paths:
            continue
        if len(paths) == 1:
            fs, p = storage.filesystem(storage.join(v.table_uri, *paths[0].split("/")))
            with fs.open_input_file(p) as fh:
                f = pq.ParquetFile(fh)
                present = [c for c in need if c in f.schema_arrow.names]
                for batch in f.iter_batches(batch_size=batch_rows, columns=present):
                    t = conform(pa.Table.from_batches([batch]), pa.schema([v.schema.field(n) for n in need]))
                    yield from (t if tombstones else live(t)).select(cols).to_batches()
            continue
        stored = _rows(v, paths)
        parts = max(1, math.ceil(stored / bucket_unit(v))) if stored > 2 * bucket_unit(v) else 1
        for part in range(parts):  # a bucket past twice the unit (compaction behind): a unit at a time
            rows = read_bucket(v.table_uri, paths, v.schema, part=(part, parts) if parts > 1 else None)
            rows = resolve(rows)
            yield from (rows if tombstones else live(rows)).select(cols).to_batches(max_chunksize=batch_rows)


def read_mirror(data_dir: str, source: str, table: str | TableName, *, with_meta: bool = False) -> pa.Table:
    """Live rows of a mirror table (tombstones and superseded versions left out), typed,
    sorted by ``__key``; ``with_meta`` keeps ``__key`` and ``__position``. An absent mirror
    reads as an empty table with no columns."""
    v = _version(data_dir, source, table)
    if v is None:
        return pa.table({})
    cols = [n for n in v.schema.names if n != DELETED_COLUMN and (with_meta or n not in (KEY_COLUMN, POSITION_COLUMN))]
    keyed = list(dict.fromkeys([*cols, KEY_COLUMN]))
    parts = list(current_batches(v, columns=keyed))
    want = pa.schema([v.schema.field(n) for n in keyed])
    data = pa.Table.from_batches(parts, schema=want) if parts else want.empty_table()
    return data.sort_by([(KEY_COLUMN, "ascending")]).select(cols)


def mirror_batches(data_dir: str, source: str, table: str | TableName, *,
                   batch_rows: int = 100_000) -> tuple[int, Iterable[pa.RecordBatch]]:
    """Live rows of a mirror table with ``__key``, typed, a batch at a time in no particular
    order (a bucket held at a time), and at most how many there are (the stored rows, read
    from the Delta statistics): for readers of a table too large to hold (verify). An absent
    mirror: ``(0, [])``."""
    v = _version(data_dir, source, table)
    if v is None:
        return 0, []
    return _rows(v, [p for f in v.files.values() for p in f]), \
        current_batches(v, batch_rows=batch_rows, columns=_keyed_columns(v.schema))


def newest_position(data_dir: str, source: str, table: str | TableName) -> str | None:
    """The newest encoded position any stored row of a mirror table carries (live rows, chunk
    rows, tombstones, superseded versions alike), from the files' Delta statistics; a file
    without them has its position column read. None: no mirror or no rows."""
    v = _version(data_dir, source, table)
    if v is None:
        return None
    actions = pa.table(v.dt.get_add_actions(flatten=True))
    col = f"max.{POSITION_COLUMN}"
    tops = actions[col].to_pylist() if col in actions.column_names else [None] * actions.num_rows
    newest = None
    for path, top in zip(actions["path"].to_pylist() if actions.num_rows else [], tops, strict=True):
        if top is None:
            fs, p = storage.filesystem(storage.join(v.table_uri, *path.split("/")))
            with fs.open_input_file(p) as fh:
                top = pc.max(pq.read_table(fh, columns=[POSITION_COLUMN])[POSITION_COLUMN]).as_py()
        if top is not None and (newest is None or top > newest):
            newest = top
    return newest


def mirror_rows_of(data_dir: str, source: str, table: str | TableName, keys: Sequence[str]) -> pa.Table:
    """The live mirror rows of these canonical keys, with ``__key`` (one scan of their
    buckets, filtered)."""
    v = _version(data_dir, source, table)
    if v is None or not keys:
        return pa.table({})
    wanted = pa.array(list(keys), pa.string())
    nodes = v.nodes_of(wanted)
    parts = []
    for b in pc.unique(nodes).to_pylist():
        rows = read_bucket(v.table_uri, v.files.get(b, ()), v.schema)
        rows = rows.filter(pc.is_in(rows[KEY_COLUMN].cast(pa.string()), value_set=wanted))
        parts.append(live(resolve(rows)).select(_keyed_columns(v.schema)))
    return pa.concat_tables(parts) if parts else pa.table({})


def read_mirror_raw(data_dir: str, source: str, table: str | TableName) -> pa.Table:
    """The current row of every key, tombstones included, with its position, sorted by key:
    the mirror's logical state (tests and diagnostics). :func:`read_mirror_files` has the
    stored row versions."""
    v = _version(data_dir, source, table)
    if v is None:
        return pa.table({})
    parts = list(current_batches(v, tombstones=True))
    data = pa.Table.from_batches(parts, schema=v.schema) if parts else v.schema.empty_table()
    return data.sort_by([(KEY_COLUMN, "ascending")])


def read_mirror_files(data_dir: str, source: str, table: str | TableName) -> pa.Table:
    """Every stored row version, superseded ones and tombstones included, with its bucket:
    what a plain Delta reader sees."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    dt = _open(mirror_dir(data_dir, source, t))
    return pa.table({}) if dt is None else dt.to_pyarrow_dataset().to_table()
