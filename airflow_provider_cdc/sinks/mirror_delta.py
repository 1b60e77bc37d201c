"""The Delta mirror's writer, the one both engines use: plan on the driver, write a bucket, commit
with the fence; an event wins only with a newer position (I1), a delete is a tombstone
(docs/DESIGN.md, "The mirror"). Storage: sinks/delta_buckets.py; readers: sinks/mirror_readers.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from ..core.arrow_types import (
    KEY_COLUMN,
    mirror_schema,
    rows_to_table,
    struct_columns,
)
from ..core.errors import ConfigurationError
from ..core.schema import TableSchema, decode_key
from ..storage.layout import mirror_dir
from . import multiset
from .base import (
    BUCKETS,
    Events,
    SchemaCache,
    Sink,
    TableEvents,
    newest_truncate,
    past_truncate,
    table_events,
    type_json_events,
)
from .delta_buckets import (
    MirrorVersion,
    NewFile,
    admit,
    any_dropped,
    change_version,
    commit,
    conform,
    discard,
    drop_rows,
    newest,
    nodes_of_keys,
    read_bucket,
    read_resolved_keys,
    read_version,
    resolve,
    write_bucket_file,
    write_change,
)
from .mirror_fencing import MergeFence, open_for_write, schema_stopped, stop_for_schema
from .mirror_table import (
    HORIZON_PROPERTY,
    _commit_with_retries,
    _create,
    _delta,
    _open,
    _position_literal,
    _raise_horizon,
    check_location,
    commit_attempts,
)

log = logging.getLogger(__name__)


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
            f"table {schema.table}: {ev['op'][i].as_py()!r} event for key {ev['key'][i].as_py()} has "
            "no 'after' row"
        )
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
    rows = [
        dict(zip(pk, decode_key(k), strict=True)) if d else None for k, d in zip(keys, flags, strict=True)
    ]
    return dict(zip(pk, rows_to_table(key_schema, rows), strict=True))


def _combined(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _mirror_table(
    schema: TableSchema, arrays: list[pa.Array], events: pa.Table, is_delete: pa.Array | None = None
) -> pa.Table:
    """Typed column arrays of ``events`` plus the mirror's ``__key, __position, __deleted``."""
    deleted = _combined(pc.equal(events["op"], "d")) if is_delete is None else is_delete
    meta = [_combined(events["key"]), _combined(events["position"]), deleted]
    return pa.Table.from_arrays([*arrays, *meta], schema=mirror_schema(schema))


@dataclass(frozen=True)
class TablePlan:
    """What the driver decided for one table of a round before anything is written: where its
    mirror is, the staged schema its rows take, the merge epoch its commits need, and the
    newest TRUNCATE among its events (swept already: only events past it are written)."""

    table_id: str
    path: str
    schema: TableSchema
    epoch: int | None
    truncate: str | None


class BucketJob(NamedTuple):
    """What a worker needs to write one table's buckets: read on the driver from the version
    the commit will be based on (:meth:`MirrorDeltaSink.open_table`), pickled to the workers."""

    table_id: str
    location: str
    files: dict  # bucket -> the current files
    schema: pa.Schema  # the mirror's Arrow schema
    buckets: int  # the roots of the bucket tree (sinks/delta_buckets.py)
    inner: tuple  # its split buckets
    bucketed: bool
    horizon: str | None  # the compaction horizon: older rows of unknown keys stay out
    table_schema: str  # TableSchema JSON
    truncate: str | None  # the newest TRUNCATE among the events: older events are swept already
    version: int  # the version read: the change files are written for the next one
    vectors: dict  # path -> its deletion vector's descriptor (files that have one)

    def rows(self, part: TableEvents) -> pa.Table:
        """One table's events (past its TRUNCATE) -> its mirror rows, newest per key, in the
        mirror's schema (ConfigurationError: a value the mirror cannot hold)."""
        rows = events_to_mirror_rows(
            TableSchema.from_json(self.table_schema), part.with_events(newest_per_key(part.events))
        )
        return conform(rows, self.schema)

    def bucket_of(self, rows: pa.Table) -> pa.Array:
        """The bucket each mirror row falls in."""
        return nodes_of_keys(rows[KEY_COLUMN], self.buckets, self.inner)

    def write(self, bucket: int, rows: pa.Table):
        """Rows of one bucket (from several units: resolved to the newest per key first) as its
        change file (:func:`write_bucket`); None when nothing is left to write."""
        return write_bucket(
            self.location,
            bucket,
            resolve(rows),
            self.files.get(bucket, []),
            self.vectors,
            compacted_upto=self.horizon,
            bucketed=self.bucketed,
            version=self.version,
        )


class MirrorDeltaSink(Sink):
    """The Delta mirror. Both engines write it through the same three steps: :meth:`plan` on
    the driver (the per-table policy), the rows of each key bucket written
    (:func:`write_bucket`; on Spark's executors through :class:`BucketJob`), a commit per table
    on top of the version read, fenced (:meth:`open_table`, :meth:`commit_table`)."""

    name = "mirror"
    placement = BUCKETS
    needs_truncates = True
    commit_attempts = staticmethod(commit_attempts)  # the one retry loop of every mirror writer

    def __init__(
        self, data_dir: str, source: str, *, require_schema: bool = False, fence: MergeFence | None = None
    ) -> None:
        self.data_dir, self.source = check_location(data_dir), source
        self.schemas = SchemaCache(data_dir, source)
        self.require_schema = require_schema
        self.fence = fence
        self.schema_stopped: dict[str, str] = {}  # tables whose events this sink skipped, and why
        self.multisets: dict[str, TableSchema] = {}  # tables without a key plan() left to write_deferred

    def plan(self, truncates: Mapping[str, str | None]) -> dict[str, TablePlan]:
        """The per-table policy of a write, on the driver (``truncates``: table id -> its
        newest TRUNCATE among the events, or None): a table without a staged schema is
        skipped (an error when ``require_schema``), one stopped for a schema change waits
        for its re-snapshot, a TRUNCATE sweeps every older row first (the horizon it leaves
        keeps older writers out). Returns the tables to write."""
        plan: dict[str, TablePlan] = {}
        for table_id in sorted(truncates):
            schema = self.schemas.lookup(table_id, require=self.require_schema, sink="mirror")
            if schema is None:
                continue
            if schema.multiset:  # no key buckets: its changes are counted copies (sinks/multiset.py)
                self.multisets[table_id] = schema
                continue
            path = mirror_dir(self.data_dir, self.source, schema.table)
            stopped = schema_stopped(path)
            if stopped:
                # the event log has them; the re-snapshot that clears the stop rebuilds the mirror
                log.error(
                    "mirror of %s waits for a re-snapshot (%s): its events are not applied to it",
                    table_id,
                    stopped,
                )
                self.schema_stopped[table_id] = stopped
                continue
            newest_t = truncates[table_id]
            if newest_t is not None:
                sweep(path, newest_t, mirror_schema(schema), reason=f"TRUNCATE of {table_id}")
            try:
                mirror_schema(schema)  # a table the mirror cannot hold at all (column names only case apart)
            except ConfigurationError as exc:
                if self.fence is not None:  # a snapshot's merge fails its round, naming the columns
                    raise
                log.error("mirror of %s: %s; its events go to the event log only", table_id, exc)
                self.schema_stopped[table_id] = str(exc)
                continue
            epoch = None if self.fence is None else self.fence.epoch(table_id)
            plan[table_id] = TablePlan(table_id, path, schema, epoch, newest_t)
        return plan

    def open_table(self, table: TablePlan) -> tuple[MirrorVersion, BucketJob]:
        """The version a distributed write of ``table`` is based on (created when absent, new
        columns added, the merge epoch checked: FencedError) and the job its workers get."""
        v = open_for_write(table.path, mirror_schema(table.schema), table.epoch)
        job = BucketJob(
            table.table_id,
            v.location,
            {b: list(f) for b, f in v.files.items()},
            v.schema,
            v.buckets if v.bucketed else 1,
            tuple(sorted(v.inner)),
            v.bucketed,
            v.props.get(HORIZON_PROPERTY),
            table.schema.to_json(),
            table.truncate,
            v.version,
            {p: dict(i.dv) for p, i in v.info.items() if i.dv},
        )
        return v, job

    def commit_table(self, v: MirrorVersion, written: Sequence[NewFile]) -> bool:
        """Commit the change files the workers wrote for version ``v`` (with the deletion
        vectors they worked out): False when another writer committed first (the files are
        deleted; read and write again)."""
        if not written:
            return True
        try:
            commit(v, list(written), (), operation="upsert" if self.fence is None else "merge")
        except CommitFailedError:
            discard(v.location, written)
            return False
        return True

    def discard(self, v: MirrorVersion, written: Sequence[NewFile]) -> None:
        """Delete change files written for a commit that will not happen."""
        discard(v.location, written)

    def stop_table(self, table: TablePlan, error: str) -> None:
        """A value the mirror's type cannot hold (numeric(p,s) NaN, a timestamp past year
        294247): on the changelog path only this table stops, the others go on; a snapshot's
        merge (fenced) fails its round instead, naming the same (ConfigurationError)."""
        if self.fence is not None or not stop_for_schema(
            table.path, f"{error}; correct the value at the source"
        ):
            raise ConfigurationError(error)
        self.schema_stopped[table.table_id] = error

    def deferred(self) -> frozenset[str]:
        return frozenset(self.multisets)

    def write_deferred(self, events: Sequence[TableEvents]) -> None:
        """The tables without a key among those :meth:`plan` saw, each applied to its multiset
        mirror on the driver, a table's events at a time."""
        for part in events:
            schema = self.multisets.get(part.table)
            if schema is not None and part.num_rows:
                multiset.apply(mirror_dir(self.data_dir, self.source, schema.table), part, schema)

    def write(self, events: Events) -> None:
        for part in table_events(events, self.schemas.get):
            schema = self.schemas.get(part.table)
            if schema is not None and schema.multiset:
                multiset.apply(mirror_dir(self.data_dir, self.source, schema.table), part, schema)
                continue
            table = self.plan({part.table: newest_truncate(part.events)}).get(part.table)
            if table is None:
                continue
            part = past_truncate(part, table.truncate)
            if part.num_rows == 0:
                continue
            try:
                rows = events_to_mirror_rows(table.schema, part.with_events(newest_per_key(part.events)))
            except ConfigurationError as exc:
                self.stop_table(table, str(exc))
                continue
            upsert(table.path, rows, epoch=table.epoch)


def write_bucket(
    location: str,
    bucket: int,
    rows: pa.Table,
    paths: Sequence[str],
    vectors: Mapping[str, Mapping],
    *,
    compacted_upto: str | None,
    bucketed: bool,
    version: int,
) -> NewFile | None:
    """Write a bucket's new rows (mirror rows of its keys, one per key) as a change file of
    the next version after ``version``, for the commit of that version (both engines: the
    worker's :func:`upsert` and the Spark executors); into a bucket without files, as its base file (it is
    resolved: one row per key), so a first write is not folded again. Fenced by the horizon: rows at or before
    it (``compacted_upto``, the horizon) only update live rows of ``paths`` (the bucket's files), never insert
    (delta_buckets.admit). The deletion vectors of the write (``vectors``: the current ones
    of ``paths``) come with it (delta_buckets.write_change). Returns the new file, None when
    nothing is left to write."""
    new = admit(rows, compacted_upto, lambda: read_resolved_keys(location, paths))
    if not new.num_rows:
        return None
    return write_change(
        location,
        bucket,
        new,
        paths,
        vectors,
        bucketed=bucketed,
        change=version + 1 if paths else None,
    )


#: buckets one in-worker apply writes at a time
WRITE_THREADS = min(4, os.cpu_count() or 1)


def upsert(path: str, rows: pa.Table, *, epoch: int | None = None) -> dict:
    """Apply mirror rows (one per key) to the Delta table at ``path``: one change file per
    bucket they fall in, appended (creates the table if absent); readers take the newest
    position per key. Fenced: rows at or before the compaction horizon only update live
    rows, never insert (:func:`delta_buckets.admit`), and with an ``epoch`` the commit
    happens only while that merge epoch is the table's own (else :class:`FencedError`,
    nothing written)."""

    def build(adds: list):
        v = open_for_write(path, rows.schema, epoch)
        upto = v.props.get(HORIZON_PROPERTY)
        new = conform(rows, v.schema)
        nodes = v.nodes_of(new[KEY_COLUMN])
        vectors = {p: i.dv for p, i in v.info.items() if i.dv}

        def one(b: int):
            return write_bucket(
                v.table_uri,
                b,
                new.filter(pc.equal(nodes, b)),
                v.files.get(b, ()),
                vectors,
                compacted_upto=upto,
                bucketed=v.bucketed,
                version=v.version,
            )

        # buckets are independent (their own files and vectors); Arrow's Parquet reads and
        # kernels release the GIL, so the lookups of the stored winners overlap
        with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
            futures = [pool.submit(one, b) for b in pc.unique(nodes).to_pylist()]
        error = None
        for f in futures:  # every file written is collected, so a failure discards them all
            try:
                add = f.result()
            except BaseException as exc:  # noqa: BLE001 - raised once the others are collected
                error = error or exc
                continue
            if add is not None:
                adds.append(add)
        if error is not None:
            raise error
        return v, (), (v, len(adds))

    v, written = _commit_with_retries(path, build, operation="upsert" if epoch is None else "merge")
    log.info(
        "mirror %s: %d row(s) appended to %d of %d bucket(s) at version %d",
        path,
        rows.num_rows,
        written,
        len(v.files),
        v.version + 1,
    )
    return {"num_source_rows": rows.num_rows, "num_buckets_written": written}


def sweep(
    path: str,
    before_position: str,
    schema: pa.Schema | None = None,
    *,
    reason: str = "sweep",
    within: Sequence | None = None,
) -> int:
    """Every row (live or tombstone) with a position before ``before_position`` is gone, and
    stays gone: the compaction horizon is raised to it first (one commit), then the rows are
    deleted (a second); a writer in between conflicts and re-reads the horizon, and a crash in
    between leaves rows that a replay deletes. Older writers (a late chunk merge, a replayed
    apply batch) can then only update live rows newer than it, never insert (I7, I9).
    Creates the table (with ``schema``) when absent, so the horizon holds before the first
    row arrives. Used for TRUNCATE events and for a finished snapshot's convergence.
    Idempotent; retried on commit conflicts. Returns the number of rows deleted. With
    ``within`` (a ranged snapshot's key ranges, one integer key column) only rows whose key
    lies in those ranges go; the horizon still rises for the whole table (a row older than the
    mark can only come from a replay of what the mirror has applied)."""
    bound = _position_literal(before_position)
    dt = _open(path)
    if dt is None:
        if schema is None:
            return 0
        dt = _create(path, schema, {HORIZON_PROPERTY: bound})[0]
    _raise_horizon(path, bound)
    removed = _drop_everywhere(path, operation="sweep", before=bound, position=bound, within=within)
    log.info("mirror %s: %s removed %d row(s) older than %s", path, reason, removed, bound)
    return removed


def _drop_everywhere(
    path: str, *, operation: str, before: str, position: str | None = None, within: Sequence | None = None
) -> int:
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
                if not any_dropped(v.table_uri, [rel], before=before, within=within):
                    continue
                rows = read_bucket(v.table_uri, [rel], v.schema)
                kept = drop_rows(rows, before=before, within=within)
                kept = rows if kept is None else kept
                gone += rows.num_rows - kept.num_rows
                if kept.num_rows:
                    adds.append(
                        write_bucket_file(
                            v.table_uri, b, kept, bucketed=v.bucketed, change=change_version(rel)
                        )
                    )
                removed.append(rel)
        return v, removed, gone

    return _commit_with_retries(path, build, operation=operation, position=position)
