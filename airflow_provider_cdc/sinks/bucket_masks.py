"""Deletion vectors: every stored row that is not its key's live row is masked, so any Delta
reader sees exactly the live rows."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from . import deletion_vectors as dvs
from . import key_index
from .bucket_files import MirrorVersion, NewFile, Remask, _location, discard, read_order, write_bucket_file

log = logging.getLogger(__name__)

# --- deletion vectors: every stored row that is not its key's live row is masked -----------
#
# A key's live row is its stored version with the highest position (of equal positions the one
# read first: base files, then change files in commit order), unless that is a tombstone. The
# package reads the files whole (the position guard needs every version and tombstone); the
# vectors make any Delta reader see exactly the live rows. They are a function of the bucket's
# rows, so a commit can always work them out again (bucket_masks), and a writer of a few keys
# works out only what its rows change (stored_versions, in write_change).

_WINNER_SCHEMA = pa.schema(
    [
        ("k", pa.int32()),
        ("file", pa.int32()),
        ("row", pa.int64()),
        (POSITION_COLUMN, pa.string()),
        (DELETED_COLUMN, pa.bool_()),
    ]
)


def _first_of_runs(col: pa.Array) -> pa.Array:
    n = len(col)
    if n == 0:
        return pa.array([], pa.bool_())
    same = pc.equal(col.slice(1), col.slice(0, n - 1))
    return pa.concat_arrays([pa.array([True]), pc.invert(same)])


def _winners(candidates: pa.Table) -> pa.Table:
    """The winning version per ``k`` among candidate rows (k, file, row, position, deleted):
    the highest position, of equal ones the first file in read order."""
    if candidates.num_rows == 0:
        return candidates
    ordered = candidates.sort_by(
        [("k", "ascending"), (POSITION_COLUMN, "descending"), ("file", "ascending"), ("row", "ascending")]
    )
    return ordered.filter(_first_of_runs(ordered["k"].combine_chunks()))


def stored_versions(
    table_uri: str,
    paths: Sequence[str],
    keys: pa.Array,
    older_than: str | None = None,
    vectors: Mapping[str, Mapping | None] | None = None,
) -> pa.Table:
    """The stored versions of the canonical ``keys`` (distinct) in the bucket made of ``paths``
    (read order): columns k (index into keys), file (index into paths), row, ``__position``,
    ``__deleted``. Finds the rows through a file's key index (sinks/key_index.py) or else by
    reading the key column of the row groups whose key range holds a wanted key (files are
    sorted by key); reads the position and deleted columns only of row groups with a match
    whose positions are not all older than ``older_than`` (the oldest new row): there the
    position given is the row group's newest (at least the row's own) and deleted is null. A
    changelog apply, newer than everything stored, so reads keys only: its cost follows its
    keys, through the index, or is at most the bucket's key column without one.

    With ``vectors`` (the files' deletion vectors), a file whose every row is masked and
    whose newest position is older than ``older_than`` is not read: none of its rows can be
    live, and none can stop a row of the write (the guard takes a row that is newer than the
    stored winner), so leaving them out changes neither the write's rows nor any vector. A hot
    small table's bucket gains a file a round, each masked whole by the next: a round reads
    only the newest instead of every file since the bucket's last compaction."""
    wanted = sorted(keys.to_pylist())
    parts = []
    for i, rel in enumerate(paths):
        dv = (vectors or {}).get(rel)
        fs, p = storage.filesystem(_location(table_uri, rel))
        with fs.open_input_file(p) as fh:
            f = pq.ParquetFile(fh)
            meta = f.metadata
            if older_than is not None and dv and dv.get("cardinality") == meta.num_rows:
                newest = _newest_position(f)
                if newest is not None and newest < older_than:
                    continue
            indexed = key_index.lookup(table_uri, rel, keys, wanted)
            if indexed is not None and meta.num_rows != indexed.file_rows:
                log.warning(
                    "key index of %s counts %d rows, the file %d: reading its keys",
                    rel,
                    indexed.file_rows,
                    meta.num_rows,
                )
                indexed = None
            if indexed is not None and not len(indexed.rows):
                continue
            offset = 0
            for g in range(meta.num_row_groups):
                found = _group_versions(f, g, i, offset, keys, wanted, indexed, older_than)
                if found is not None:
                    parts.append(found)
                offset += meta.row_group(g).num_rows
    if not parts:
        return _WINNER_SCHEMA.empty_table()
    return pa.concat_tables(parts)


def _group_versions(
    f: pq.ParquetFile,
    g: int,
    i: int,
    offset: int,
    keys: pa.Array,
    wanted: list,
    indexed,
    older_than: str | None,
) -> pa.Table | None:
    """:func:`stored_versions` of row group ``g`` of file ``i`` (``f``; its first row is row
    ``offset`` of the file): found through the file's key index (``indexed``) or by reading the
    group's keys when their range holds a wanted one. None: no wanted key there."""
    group = f.metadata.row_group(g)
    n = group.num_rows
    if indexed is not None:
        lo, hi = np.searchsorted(indexed.rows, [offset, offset + n])
        k_of, hit = pa.array(indexed.keys[lo:hi]), pa.array(indexed.rows[lo:hi] - offset)
    else:
        key_col = f.schema_arrow.get_field_index(KEY_COLUMN)
        st = group.column(key_col).statistics if key_col >= 0 else None
        if st is not None and st.has_min_max:
            lo = bisect.bisect_left(wanted, st.min)
            if lo >= len(wanted) or wanted[lo] > st.max:
                return None
        col = f.read_row_group(g, columns=[KEY_COLUMN])[KEY_COLUMN].combine_chunks()
        idx = pc.index_in(col, value_set=keys)
        hit = pc.indices_nonzero(pc.is_valid(idx))
        k_of = pc.take(idx, hit)
    if not len(hit):
        return None
    newest = _group_newest(f, g)
    if older_than is not None and newest is not None and newest < older_than:
        position = pa.repeat(pa.scalar(newest, pa.string()), len(hit))
        deleted = pa.nulls(len(hit), pa.bool_())
    else:
        rest = f.read_row_group(g, columns=[POSITION_COLUMN, DELETED_COLUMN])
        position = pc.take(rest[POSITION_COLUMN], hit).cast(pa.string())
        deleted = pc.take(rest[DELETED_COLUMN], hit)
    return pa.table(
        [
            k_of.cast(pa.int32()),
            pa.array(np.full(len(hit), i, dtype=np.int32)),
            pc.add(hit.cast(pa.int64()), offset),
            position,
            deleted,
        ],
        schema=_WINNER_SCHEMA,
    )


def _group_newest(f: pq.ParquetFile, g: int) -> str | None:
    """The newest ``__position`` of row group ``g`` by its statistics (None: none recorded)."""
    col = f.schema_arrow.get_field_index(POSITION_COLUMN)
    st = f.metadata.row_group(g).column(col).statistics if col >= 0 else None
    return st.max if st is not None and st.has_min_max and isinstance(st.max, str) else None


def _newest_position(f: pq.ParquetFile) -> str | None:
    """The newest ``__position`` of a Parquet file (None: a row group without statistics)."""
    newest = [_group_newest(f, g) for g in range(f.metadata.num_row_groups)]
    return None if not newest or None in newest else max(newest)


def write_change(
    table_uri: str,
    bucket: int,
    rows: pa.Table,
    paths: Sequence[str],
    current: Mapping[str, Mapping | None],
    *,
    bucketed: bool,
    change: int | None,
) -> NewFile | None:
    """Append ``rows`` (resolved: one per key, sorted by key) to the bucket made of ``paths``
    (read order; ``current``: their deletion vectors) as one file, with the vectors the write
    changes: a row that is not newer than its key's stored winner is left out (it would never
    be live), a tombstone is written and masked (the guard needs it), and the stored live row
    of a key the file supersedes is masked in its file. None: nothing newer to write."""
    rows = rows.sort_by(KEY_COLUMN)  # files sorted by key: lookups skip row groups by their range
    oldest_new = pc.min(rows[POSITION_COLUMN]).as_py()
    found = (
        stored_versions(table_uri, paths, rows[KEY_COLUMN].combine_chunks(), oldest_new, current)
        if paths
        else None
    )
    if found is not None and found.num_rows:
        # per key the newest stored position (exact, or a row group's newest where all of it is
        # older than this write's rows): a row must be strictly newer to be written
        top = _winners(found)
        at = np.full(rows.num_rows, -1, dtype=np.int64)  # row -> its key's entry in top, or none
        at[top["k"].to_numpy()] = np.arange(top.num_rows)
        stored = pc.take(top[POSITION_COLUMN], pa.array(at, mask=at < 0))
        newer = pc.fill_null(pc.greater(rows[POSITION_COLUMN], stored), True)
        rows = rows.filter(newer)
        # every stored version of a key the write supersedes is masked (the winner among them;
        # the others are masked already, so the union changes nothing for them)
        beaten = found.filter(
            pc.and_(pc.take(newer, found["k"]), pc.invert(pc.fill_null(found[DELETED_COLUMN], False)))
        )
    else:
        beaten = _WINNER_SCHEMA.empty_table()
    if not rows.num_rows:
        return None
    add = write_bucket_file(table_uri, bucket, rows, bucketed=bucketed, change=change)
    vectors, owners = [], []
    own = pc.indices_nonzero(rows[DELETED_COLUMN]).to_numpy()
    if len(own):
        vectors.append(own.astype(np.uint64))
        owners.append(None)
    files = beaten["file"].to_numpy()
    hit_rows = beaten["row"].to_numpy()
    for i in np.unique(files).tolist():
        rel = paths[i]
        old = dvs.read_vector(table_uri, current.get(rel))
        mask = np.union1d(old, hit_rows[files == i].astype(np.uint64))
        if len(mask) == len(old):  # every row it supersedes there is masked already: no new vector
            continue
        vectors.append(mask)
        owners.append(rel)
    try:
        descriptors = dvs.write_vectors(table_uri, vectors) if vectors else []
    except BaseException:
        discard(table_uri, [add])
        raise
    given = dict(zip(owners, descriptors, strict=True))
    return replace(add, dv=given.pop(None, None), remasks=tuple(Remask(rel, dv) for rel, dv in given.items()))


def bucket_masks(
    table_uri: str, paths: Sequence[str], known: Mapping[str, pa.Table] | None = None
) -> list[np.ndarray]:
    """The rows each file of a bucket (``paths``, read order) must mask: every row that is not
    its key's winner, and winners that are tombstones. Reads the key, position and deleted
    columns of the bucket (``known``: those of files a writer holds already)."""
    cols = [KEY_COLUMN, POSITION_COLUMN, DELETED_COLUMN]
    parts, sizes = [], []
    for i, rel in enumerate(paths):
        t = (known or {}).get(rel)
        if t is None:
            fs, p = storage.filesystem(_location(table_uri, rel))
            t = pq.read_table(p, filesystem=fs, columns=cols)
        t = t.select(cols)
        n = t.num_rows
        sizes.append(n)
        parts.append(
            pa.table(
                [
                    t[KEY_COLUMN].cast(pa.string()),
                    pa.array(np.full(n, i, dtype=np.int32)),
                    pa.array(np.arange(n, dtype=np.int64)),
                    t[POSITION_COLUMN].cast(pa.string()),
                    t[DELETED_COLUMN],
                ],
                names=["key", "file", "row", POSITION_COLUMN, DELETED_COLUMN],
            )
        )
    out = [np.zeros(0, dtype=np.uint64) for _ in paths]
    if not parts:
        return out
    allrows = pa.concat_tables(parts)
    if allrows.num_rows == 0:
        return out
    ordered = allrows.sort_by(
        [("key", "ascending"), (POSITION_COLUMN, "descending"), ("file", "ascending"), ("row", "ascending")]
    )
    first = _first_of_runs(ordered["key"].combine_chunks())
    visible = pc.and_(first, pc.invert(ordered[DELETED_COLUMN].combine_chunks()))
    hidden = ordered.filter(pc.invert(visible))
    files = hidden["file"].to_numpy()
    rows = hidden["row"].to_numpy()
    for i in np.unique(files).tolist():
        out[i] = np.sort(rows[files == i]).astype(np.uint64)
    return out


def _remask_buckets(
    v: MirrorVersion, adds: list[NewFile], removed: set[str], buckets: Iterable[int]
) -> tuple[list[NewFile], list[Remask]]:
    """Work out the vectors of ``buckets`` after the commit from their files (bucket_masks):
    the new files get theirs, and each kept file whose vector changes is re-added."""
    adds = list(adds)
    remasks: list[Remask] = []
    for b in sorted(set(buckets)):
        new = {a.path: i for i, a in enumerate(adds) if a.bucket == b or not v.bucketed}
        for i in new.values():
            adds[i] = replace(adds[i], dv=None, remasks=())
        kept = [p for p in v.files.get(b, ()) if p not in removed]
        paths = read_order([*kept, *new])
        masks = bucket_masks(v.table_uri, paths)
        vectors, owners = [], []
        for rel, mask in zip(paths, masks, strict=True):
            if rel in new:
                if len(mask):
                    vectors.append(mask)
                    owners.append(rel)
                continue
            old = v.info[rel].dv if rel in v.info else None
            if not np.array_equal(dvs.read_vector(v.table_uri, old), mask):
                vectors.append(mask)
                owners.append(rel)
        descriptors = dvs.write_vectors(v.table_uri, vectors) if vectors else []
        for rel, dv in zip(owners, descriptors, strict=True):
            if rel in new:
                adds[new[rel]] = replace(adds[new[rel]], dv=dv)
            else:
                remasks.append(Remask(rel, dv if dv["cardinality"] else None))
    return adds, remasks
