"""A bucket's row versions: the newest per key (merge-on-read resolution), the rows a write may
append behind the compaction horizon, and the rows a compaction or sweep drops."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from .bucket_files import _location


def newest(t: pa.Table, keys: Sequence[str], position: str) -> pa.Table:
    """The row with the highest ``position`` for each value of the ``keys`` columns (sorted
    by them), of equal positions the first in ``t``: events by (table, key), or mirror rows
    by ``__key`` (``__position``)."""
    if t.num_rows <= 1:
        return t
    # stable: rows of equal keys and position keep their order
    ordered = t.sort_by([*((k, "ascending") for k in keys), (position, "descending")])
    # first row of each run of equal keys: ordered input makes this a vectorised mask
    n = ordered.num_rows
    same_prev = None
    for k in keys:
        col = ordered[k].combine_chunks()
        eq = pc.equal(col.slice(1), col.slice(0, n - 1))
        same_prev = eq if same_prev is None else pc.and_(same_prev, eq)
    keep = pa.concat_arrays([pa.array([True]), pc.invert(same_prev)])
    return ordered.filter(keep)


def resolve(rows: pa.Table) -> pa.Table:
    """The current row of each key among a bucket's row versions (read base first, then change
    files in commit order): the one with the highest ``__position`` (a tombstone included);
    of equal positions the one written first, as a stored row was replaced only by a strictly
    newer one. Sorted by ``__key``."""
    return newest(rows, [KEY_COLUMN], POSITION_COLUMN)


def live(rows: pa.Table) -> pa.Table:
    """Resolved rows without tombstones."""
    return rows.filter(pc.invert(rows[DELETED_COLUMN]))


def admit(new: pa.Table, horizon: str | None, current: Callable[[], pa.Table]) -> pa.Table:
    """The rows of ``new`` (one per key, one bucket) a write may append, fenced by the
    compaction ``horizon``: a row newer than it always (the reader's newest-position rule
    keeps a stale one from winning); a row at or before it only when it updates a stored
    row of its key that is older (else it replays a write that a compacted tombstone
    superseded, and must not bring the key back). ``current()`` (the bucket's resolved
    ``__key, __position, __deleted``) is read only when such a row is there."""
    if new.num_rows == 0 or horizon is None:
        return new
    old = pc.less_equal(new[POSITION_COLUMN], horizon)
    if not pc.any(old).as_py():
        return new
    cur = current()
    idx = (
        pc.index_in(new[KEY_COLUMN], value_set=cur[KEY_COLUMN].combine_chunks())
        if cur.num_rows
        else pa.nulls(new.num_rows, pa.int32())
    )
    stored_pos = pc.take(cur[POSITION_COLUMN], idx) if cur.num_rows else pa.nulls(new.num_rows, pa.string())
    updates = pc.fill_null(pc.greater(new[POSITION_COLUMN], stored_pos), False)
    return new.filter(pc.or_(pc.invert(old), updates))


def read_resolved_keys(table_uri: str, paths: Iterable[str]) -> pa.Table:
    """A bucket's resolved ``__key, __position, __deleted`` (three columns, not the rows)."""
    cols = [KEY_COLUMN, POSITION_COLUMN, DELETED_COLUMN]
    parts = []
    for rel in paths:
        fs, p = storage.filesystem(_location(table_uri, rel))
        parts.append(pq.read_table(p, filesystem=fs, columns=cols))
    if not parts:
        return pa.schema(
            [(KEY_COLUMN, pa.string()), (POSITION_COLUMN, pa.string()), (DELETED_COLUMN, pa.bool_())]
        ).empty_table()
    return resolve(pa.concat_tables(parts, promote_options="permissive"))


def keys_within(keys: pa.Array | pa.ChunkedArray, ranges: Sequence) -> pa.Array:
    """Which canonical keys of a one-integer-column key (``[123]``) lie in one of ``ranges``
    (ChunkRange-like: ``start`` inclusive, ``end`` exclusive, None open; one-element tuples),
    compared as integers, as the source orders them."""
    col = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    ints = pc.utf8_slice_codeunits(col, 1, -1).cast(pa.int64()).to_numpy(zero_copy_only=False)
    inside = np.zeros(len(ints), dtype=bool)
    for r in ranges:
        m = np.ones(len(ints), dtype=bool)
        if r.start is not None:
            m &= ints >= int(r.start[0])
        if r.end is not None:
            m &= ints < int(r.end[0])
        inside |= m
    return pa.array(inside)


def any_dropped(
    table_uri: str,
    paths: Iterable[str],
    *,
    before: str | None = None,
    tombstones_upto: str | None = None,
    within: Sequence | None = None,
) -> bool:
    """Would :func:`drop_rows` remove a row of these files? Reads only the position (and
    deleted, and with ``within`` key) column, a row group at a time: memory does not follow
    the bucket's size."""
    if before is None and tombstones_upto is None:
        return False
    cols = [POSITION_COLUMN] + ([DELETED_COLUMN] if tombstones_upto is not None else [])
    cols += [KEY_COLUMN] if within is not None else []
    for rel in paths:
        fs, p = storage.filesystem(_location(table_uri, rel))
        with fs.open_input_file(p) as fh:
            f = pq.ParquetFile(fh)
            for i in range(f.num_row_groups):
                if (
                    drop_rows(
                        f.read_row_group(i, columns=cols),
                        before=before,
                        tombstones_upto=tombstones_upto,
                        within=within,
                    )
                    is not None
                ):
                    return True
    return False


def drop_rows(
    current: pa.Table,
    *,
    before: str | None = None,
    tombstones_upto: str | None = None,
    within: Sequence | None = None,
) -> pa.Table | None:
    """``current`` without rows older than ``before`` (any state; with ``within`` only rows
    whose key lies in those ranges: :func:`keys_within`) or tombstones at or before
    ``tombstones_upto``; None when nothing goes."""
    if current.num_rows == 0:
        return None
    gone = pa.array(np.zeros(current.num_rows, dtype=bool))
    if before is not None:
        older = pc.less(current[POSITION_COLUMN], before)
        if within is not None:
            older = pc.and_(older, keys_within(current[KEY_COLUMN], within))
        gone = pc.or_(gone, older)
    if tombstones_upto is not None:
        gone = pc.or_(
            gone, pc.and_(current[DELETED_COLUMN], pc.less_equal(current[POSITION_COLUMN], tombstones_upto))
        )
    if not pc.any(gone).as_py():
        return None
    return current.filter(pc.invert(gone))
