"""The mirror of a table without a key captured as a multiset (CDC_KEY_COLUMNS names it with
``*``): a plain Delta table at the table's mirror location holding each copy of each source row
as a row of its own, so any reader (Spark, Trino, duckdb, polars, deltalake) counts duplicates as
the source does, plus ``_cdc_row``: the md5 of the row's digest text (core/row_digest.py), which
copies are the same row. Design: docs/DESIGN.md, "Tables without a key".

- A *load* (pipeline/multiset.py) reads the whole table in one snapshot aligned with the log
  (core/multiset.py), writes its rows into bucket files (by ``_cdc_row``), applies the staged
  changes the snapshot did not see, and replaces every file of the table in ONE commit, fenced by
  an epoch like a refresh (sinks/refreshed.py).
- An *apply* (the mirror sink's write) applies a table's changes: a DELETE removes one copy of
  its old row, an INSERT adds one of its new row, an UPDATE both. It rewrites only the buckets the
  changes fall in and commits put-if-absent on the version it read; the table property
  ``cdc.multiset_applied`` (the newest position applied, in the same commit) makes a replayed
  change a no-op, and a change the load's snapshot saw is never applied.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError

from .. import storage
from ..core import arrow_types as at
from ..core.errors import FencedError
from ..core.multiset import Alignment
from ..core.row_digest import digest_input, row_text_sql
from ..core.schema import TableSchema
from . import delta_log, refreshed
from .base import TableEvents
from .mirror_table import commit_attempts

log = logging.getLogger(__name__)

ROW_COLUMN = "_cdc_row"
BASE_PROPERTY = "cdc.multiset_base"  # the load's alignment (core/multiset.Alignment)
APPLIED_PROPERTY = "cdc.multiset_applied"  # the newest staged position applied (encoded)
BUCKETS_PROPERTY = "cdc.multiset_buckets"
LOADED_PROPERTY = "cdc.multiset_loaded_at"
#: rows of a bucket file when loaded (an apply reads and rewrites a bucket a change falls in)
BUCKET_ROWS = 262_144
ROW_GROUP_ROWS = 65_536


#: a file in the table's folder that says it is a multiset (maintenance tells it from a keyed mirror
#: without reading its log; readers skip names starting with ``_``)
MARKER = "_cdc_multiset"


def is_multiset(uri: str) -> bool:
    return storage.exists(storage.join(uri, MARKER))


def mark(uri: str) -> None:
    if not is_multiset(uri):
        storage.write_text(storage.join(uri, MARKER), "a table without a key, its copies per row\n")


def table_schema(schema: TableSchema) -> pa.Schema:
    """The source's columns as the mirror types them, then ``_cdc_row``."""
    return refreshed.table_schema(schema).append(pa.field(ROW_COLUMN, pa.string(), nullable=False))


class RowIds:
    """``_cdc_row`` of typed rows: the md5 (32 hex digits) of each row's digest text, computed by
    duckdb over the Arrow columns (no Python per row)."""

    def __init__(self, schema: TableSchema) -> None:
        import duckdb

        self.schema = schema
        self.con = duckdb.connect()
        self._sql: dict[pa.Schema, str] = {}

    def __call__(self, rows: pa.Table) -> pa.Array:
        if not rows.num_rows:
            return pa.array([], pa.string())
        m = digest_input(rows, self.schema)
        sql = self._sql.get(m.schema)
        if sql is None:
            sql = self._sql[m.schema] = f"SELECT md5({row_text_sql(self.schema, m.schema)}) AS h FROM m"  # noqa: S608
        self.con.register("m", m)
        try:
            return self.con.sql(sql).to_arrow_table()["h"].combine_chunks().cast(pa.string())
        finally:
            self.con.unregister("m")

    def close(self) -> None:
        self.con.close()


def bucket_of(ids: pa.Array, buckets: int) -> np.ndarray:
    """The bucket of each ``_cdc_row``: its first 8 hex digits modulo ``buckets``."""
    if buckets <= 1 or not len(ids):
        return np.zeros(len(ids), dtype=np.int64)
    fixed = ids.cast(pa.binary()).cast(pa.binary(32))  # (32 hex digits each)
    raw = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
    codes = raw[fixed.offset * 32 : (fixed.offset + len(fixed)) * 32].reshape(-1, 32)[:, :8].astype(np.int64)
    values = np.where(codes >= ord("a"), codes - ord("a") + 10, codes - ord("0"))
    return (values @ (16 ** np.arange(7, -1, -1, dtype=np.int64))) % buckets


def _bucket_name(bucket: int) -> str:
    return f"b{bucket:05d}-{uuid.uuid4().hex}.parquet"


def _bucket_of_path(path: str) -> int:
    name = path.rsplit("/", 1)[-1]
    return int(name[1:6]) if name.startswith("b") and name[1:6].isdigit() else 0


def _add(rel: str, rows: int, size: int) -> dict:
    return {
        "path": rel,
        "partitionValues": {},
        "size": int(size),
        "modificationTime": int(time.time() * 1000),
        "dataChange": True,
        "stats": json.dumps({"numRecords": int(rows)}),
    }


def _remove(path: str, add: dict) -> dict:
    return {
        "remove": {
            "path": path,
            "deletionTimestamp": int(time.time() * 1000),
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": add.get("partitionValues") or {},
            "size": add.get("size", 0),
        }
    }


def _write(uri: str, bucket: int, rows: pa.Table) -> dict:
    rel = _bucket_name(bucket)
    fs, p = storage.filesystem(storage.join(uri, rel))
    pq.write_table(rows, p, filesystem=fs, row_group_size=ROW_GROUP_ROWS)
    return _add(rel, rows.num_rows, fs.get_file_info(p).size)


def _read(uri: str, rel: str) -> pa.Table:
    fs, p = storage.filesystem(storage.join(uri, rel))
    return pq.read_table(p, filesystem=fs)


# --- changes -> copies ----------------------------------------------------------------------
@dataclass
class Copies:
    """The copies a run of changes removes (``minus``: old rows of DELETEs and UPDATEs) and adds
    (``plus``: new rows of INSERTs and UPDATEs), as mirror rows with ``_cdc_row``; ``truncated``:
    whether a TRUNCATE came first (every older copy is gone)."""

    minus: pa.Table
    plus: pa.Table
    truncated: bool = False


def changes_to_copies(te: TableEvents, schema: TableSchema, ids: RowIds) -> Copies:
    """The copies ``te`` (one table's events, in position order) removes and adds: the events
    after its newest TRUNCATE (then ``truncated``)."""
    ev = te.events
    ops = ev["op"]
    truncated = bool(pc.any(pc.equal(ops, "t")).as_py())
    if truncated:
        newest = pc.max(ev.filter(pc.equal(ops, "t"))["position"]).as_py()
        te = te.filter(pc.greater(ev["position"], newest))
        ev, ops = te.events, te.events["op"]
    want = table_schema(schema)

    def image(column: str, which: Sequence[str]) -> pa.Table:
        mask = pc.is_in(ops, pa.array(list(which)))
        part = te.filter(mask)
        arrays = at.struct_columns(part.events[column], part.schema, part.text_columns, schema)
        rows = pa.Table.from_arrays(arrays, schema=pa.schema(list(want)[:-1]))
        return rows.append_column(want.field(ROW_COLUMN), ids(rows))

    return Copies(image("before", ("u", "d")), image("after", ("c", "u")), truncated)


def _ranks(groups: np.ndarray) -> np.ndarray:
    """Each element's rank among the equal ones before it (0, 1, ...), vectorised."""
    if not len(groups):
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    starts = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, len(g)]))
    ranks = np.empty(len(g), dtype=np.int64)
    ranks[order] = np.arange(len(g)) - first
    return ranks


def fold_bucket(current: pa.Table | None, minus: pa.Array, plus: pa.Table) -> tuple[pa.Table | None, int]:
    """A bucket's rows after removing one copy per id in ``minus`` and adding ``plus``'s rows:
    (the rows, or None for none; copies the changes removed that the bucket did not hold)."""
    cur_ids = current[ROW_COLUMN].combine_chunks() if current is not None else pa.array([], pa.string())
    plus_ids = plus[ROW_COLUMN].combine_chunks()
    universe = pc.unique(pa.concat_arrays([cur_ids, plus_ids, minus.cast(pa.string())]))
    n = len(universe)
    ci = pc.index_in(cur_ids, universe).to_numpy(zero_copy_only=False)
    pi = pc.index_in(plus_ids, universe).to_numpy(zero_copy_only=False)
    mi = pc.index_in(minus, universe).to_numpy(zero_copy_only=False)
    have = np.bincount(ci, minlength=n)
    want = have + np.bincount(pi, minlength=n) - np.bincount(mi, minlength=n)
    missing = int(-want[want < 0].sum())
    want = np.maximum(want, 0)
    keep = _ranks(ci) < np.minimum(have, want)[ci]
    take = _ranks(pi) < np.maximum(want - have, 0)[pi]
    parts = []
    if current is not None and keep.any():
        parts.append(current.filter(pa.array(keep)))
    if take.any():
        parts.append(plus.filter(pa.array(take)).cast(plus.schema))
    if not parts:
        return None, missing
    out = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    return out, missing


def rewrite_buckets(
    uri: str, files: dict[str, dict], buckets: int, copies: Copies, table: str
) -> tuple[list[dict], list[dict]]:
    """Apply ``copies`` to the table's bucket ``files`` (path -> add action): the ``remove`` and
    ``add`` actions of the buckets they change, their new files written (a bucket at a time)."""
    by_bucket: dict[int, list[str]] = {}
    for path in files:
        by_bucket.setdefault(_bucket_of_path(path), []).append(path)
    mb = bucket_of(copies.minus[ROW_COLUMN].combine_chunks(), buckets)
    pb = bucket_of(copies.plus[ROW_COLUMN].combine_chunks(), buckets)
    touched = set(np.unique(np.r_[mb, pb]).tolist())
    if copies.truncated:
        touched |= set(by_bucket)
    removes: list[dict] = []
    adds: list[dict] = []
    missing = 0
    for b in sorted(touched):
        paths = by_bucket.get(b, [])
        current = None
        if paths and not copies.truncated:
            current = pa.concat_tables([_read(uri, p) for p in paths])
        rows, gone = fold_bucket(
            current,
            copies.minus[ROW_COLUMN].combine_chunks().filter(pa.array(mb == b)),
            copies.plus.filter(pa.array(pb == b)),
        )
        missing += gone
        removes += [_remove(p, files[p]) for p in paths]
        if rows is not None and rows.num_rows:
            adds.append(_write(uri, b, rows))
    if missing:
        log.error(
            "mirror of %s (a multiset): %d deleted or updated cop%s of rows it did not hold; verify "
            "the table and load it again if it differs",
            table,
            missing,
            "y" if missing == 1 else "ies",
        )
    return removes, adds


def fold_changes(
    uri: str, files: dict[str, dict], buckets: int, te: TableEvents, alignment: Alignment, schema: TableSchema
) -> tuple[list[dict], list[dict], int]:
    """The changes of ``te`` the load's snapshot (``alignment``) did not see, applied to the
    bucket ``files``: (remove actions, add actions, changes applied)."""
    ev = te.events
    seen = alignment.holds(ev["position"], ev["origin"].combine_chunks().field("tx"))
    todo = te.filter(pa.array(~seen))
    if not todo.num_rows:
        return [], [], 0
    ids = RowIds(schema)
    try:
        copies = changes_to_copies(todo, schema, ids)
    finally:
        ids.close()
    removes, adds = rewrite_buckets(uri, files, buckets, copies, schema.table.id)
    return removes, adds, todo.num_rows


def _not_loaded(schema: TableSchema) -> int:
    log.warning("mirror of %s (a multiset) is not loaded yet: its changes wait for its load", schema.table)
    return 0


# --- the table ---------------------------------------------------------------------------------
def properties(uri: str) -> dict[str, str] | None:
    """The table's configuration, None when there is no table (or no load yet)."""
    version = delta_log.latest_version(uri)
    if version < 0:
        return None
    state = delta_log.log_state(uri, version)
    props = dict((state.metadata or {}).get("configuration") or {})
    return props if BASE_PROPERTY in props else None


def write_base(
    uri: str, schema: TableSchema, staged: Sequence[str], rows_hint: int
) -> tuple[int, list[dict]]:
    """A load's read (staged chunk files, storage/staged.py) as bucket files of the table, not
    visible until :func:`publish`: (buckets, their add actions). Memory holds one row group
    and the open buckets' writers."""
    buckets = 1 << max(0, int(np.ceil(np.log2(max(1, rows_hint) / BUCKET_ROWS))))
    want = table_schema(schema)
    cols = pa.schema(list(want)[:-1])
    ids = RowIds(schema)
    writers: dict[int, tuple[pq.ParquetWriter, str]] = {}
    counts: dict[int, int] = {}
    try:
        for path in staged:
            sfs, sp = storage.filesystem(path)
            with sfs.open_input_file(sp) as f:
                src = pq.ParquetFile(f)
                have, text = at.metadata_schema(src.schema_arrow.metadata)
                for batch in src.iter_batches(batch_size=ROW_GROUP_ROWS, columns=["after"]):
                    rows = pa.Table.from_arrays(
                        at.struct_columns(batch.column(0), have, text, schema), schema=cols
                    )
                    rows = rows.append_column(want.field(ROW_COLUMN), ids(rows))
                    which = bucket_of(rows[ROW_COLUMN].combine_chunks(), buckets)
                    for b in np.unique(which).tolist():
                        if b not in writers:
                            rel = _bucket_name(b)
                            fs, p = storage.filesystem(storage.join(uri, rel))
                            writers[b] = (pq.ParquetWriter(p, want, filesystem=fs), rel)
                        part = rows.filter(pa.array(which == b))
                        writers[b][0].write_table(part, row_group_size=ROW_GROUP_ROWS)
                        counts[b] = counts.get(b, 0) + part.num_rows
    finally:
        ids.close()
        for w, _rel in writers.values():
            w.close()
    adds = []
    for b, (_w, rel) in sorted(writers.items()):
        fs, p = storage.filesystem(storage.join(uri, rel))
        adds.append(_add(rel, counts[b], fs.get_file_info(p).size))
    return buckets, adds


#: a load's catch-up: the staged changes of the table up to the staged end, with that end
CatchUp = Callable[[], "tuple[TableEvents | None, str | None]"]


def publish(
    uri: str,
    epoch: int,
    schema: TableSchema,
    base: tuple[int, list[dict]],
    alignment: Alignment,
    catch_up: CatchUp,
    props: dict[str, str],
) -> int:
    """Replace every file of the table by the load's ``base`` files with the staged changes its
    snapshot did not see applied (``catch_up``, read after the version this commit is based on,
    so it covers everything an apply committed before), in one commit while ``epoch`` is still
    the table's. Returns the version. The base files are discarded on failure."""
    buckets, adds = base
    want = table_schema(schema)
    schema_string = refreshed.schema_string(want)
    try:
        for _attempt in commit_attempts(f"multiset table {uri}: the load"):
            version = delta_log.latest_version(uri)
            state = delta_log.log_state(uri, version)
            have = dict((state.metadata or {}).get("configuration") or {})
            if have.get(refreshed.EPOCH_PROPERTY) != str(epoch):
                raise FencedError(
                    f"multiset table {uri}: a newer load (epoch {have.get(refreshed.EPOCH_PROPERTY)}) "
                    f"claimed it after this one (epoch {epoch}): this load publishes nothing"
                )
            events, staged_end = catch_up()
            files = {a["path"]: a for a in adds}
            removed: list[dict] = []
            written: list[dict] = []
            if events is not None and events.num_rows:
                removed, written, _n = fold_changes(uri, files, buckets, events, alignment, schema)
            gone = {r["remove"]["path"] for r in removed}
            live = [a for a in adds if a["path"] not in gone] + written
            removes = [_remove(p, a) for p, a in state.adds.items()]
            config = {
                **have,
                **props,
                BASE_PROPERTY: alignment.to_text(),
                APPLIED_PROPERTY: staged_end or "",
                BUCKETS_PROPERTY: str(buckets),
            }
            try:
                v = refreshed.commit_actions(
                    uri, version, state, config, schema_string, removes + [{"add": a} for a in live], "WRITE"
                )
            except CommitFailedError:
                refreshed.discard(uri, written)
                continue
            refreshed.discard(uri, [a for a in adds if a["path"] in gone])  # (never visible)
            return v
    except BaseException:
        refreshed.discard(uri, adds)
        raise
    raise AssertionError("unreachable")


def apply(uri: str, te: TableEvents, schema: TableSchema) -> int:
    """Apply one table's events (a run of the staged changelog in position order) to its
    multiset mirror: those past ``cdc.multiset_applied`` that the load's snapshot did not see.
    Returns the events applied (0 when the table was never loaded: its load's snapshot holds
    everything before it)."""
    newest = pc.max(te.events["position"]).as_py()
    for _attempt in commit_attempts(f"multiset table {uri}: an apply"):
        version = delta_log.latest_version(uri)
        if version < 0:
            return _not_loaded(schema)
        state = delta_log.log_state(uri, version)
        have = dict((state.metadata or {}).get("configuration") or {})
        if BASE_PROPERTY not in have:
            return _not_loaded(schema)
        applied = have.get(APPLIED_PROPERTY) or ""
        if newest is None or newest <= applied:
            return 0  # (a replay: every change was applied, or the load's catch-up applied it)
        removes, adds, n = fold_changes(
            uri,
            dict(state.adds),
            int(have.get(BUCKETS_PROPERTY, "1")),
            te.filter(pc.greater(te.events["position"], pa.scalar(applied, pa.string()))),
            Alignment.from_text(have[BASE_PROPERTY]),
            schema,
        )
        try:
            config = {**have, APPLIED_PROPERTY: newest}
            refreshed.commit_actions(
                uri, version, state, config, None, removes + [{"add": a} for a in adds], "WRITE"
            )
        except CommitFailedError:
            refreshed.discard(uri, adds)
            continue
        return n
    raise AssertionError("unreachable")


def read_counts(uri: str) -> tuple[pa.Table, dict[str, str]]:
    """The table's copies per row (``_cdc_row``, ``copies``) and its properties, one version."""
    version = delta_log.latest_version(uri)
    state = delta_log.log_state(uri, version)
    props = dict((state.metadata or {}).get("configuration") or {})
    parts = []
    for path in state.adds:
        fs, p = storage.filesystem(storage.join(uri, path))
        t = pq.read_table(p, filesystem=fs, columns=[ROW_COLUMN])
        t = pa.table({ROW_COLUMN: t[ROW_COLUMN].cast(pa.string())})  # (another writer's string_view)
        parts.append(t.group_by(ROW_COLUMN).aggregate([([], "count_all")]))
    if not parts:
        return pa.table({ROW_COLUMN: pa.array([], pa.string()), "copies": pa.array([], pa.int64())}), props
    t = pa.concat_tables(parts).group_by(ROW_COLUMN).aggregate([("count_all", "sum")])
    return pa.table({ROW_COLUMN: t[ROW_COLUMN], "copies": t["count_all_sum"]}), props
