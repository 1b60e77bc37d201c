"""A bucket folded into resolved base files a key range at a time: compaction's memory follows
``FOLD_SLICE_ROWS``, not the bucket.

A bucket's files are each sorted by ``__key`` (base files resolved, change files sorted when
written), with Parquet statistics per row group. The fold reads the bucket's resolved keys first
(three columns: key, position, deleted), which say how many rows the fold keeps, whether the
bucket splits past the unit and where, and where to cut it into slices of about
``FOLD_SLICE_ROWS`` kept rows. Each slice is then read from every file (row groups outside its key
range skipped), resolved, its removable tombstones dropped, and appended, in key order, to the base
file of its node: the files hold what resolving the whole bucket at once would give (the fold did
that until 2026-11-29, holding up to twice the unit of rows, ~1 GB at the default unit).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.arrow_types import KEY_COLUMN
from . import bucket_files, key_index
from .delta_buckets import (
    BASE_PREFIX,
    BUCKET_COLUMN,
    POSITION_COLUMN,
    MirrorVersion,
    NewFile,
    _location,
    conform,
    crc_of,
    discard,
    drop_rows,
    node_of,
    read_resolved_keys,
    resolve,
)

#: kept rows per slice of a fold: what compaction holds of a bucket's rows at once (x the
#: versions of a key it reads: the stored versions of the slice's keys)
FOLD_SLICE_ROWS = 65_536

Bound = tuple[str | None, str | None]  # (after, upto] of keys; None: open


class BaseFileWriter:
    """One new base file of a node, written a slice at a time (not visible until committed): the
    same name, row groups, statistics and key index as :func:`delta_buckets.write_bucket_file`."""

    def __init__(self, v: MirrorVersion, node: int, schema: pa.Schema) -> None:
        self.rel = f"{BASE_PREFIX}{uuid.uuid4().hex}.parquet"
        if v.bucketed:
            self.rel = f"{BUCKET_COLUMN}={node}/{self.rel}"
        self.v, self.node = v, node
        location = _location(v.table_uri, self.rel)
        storage.makedirs(storage.parent(location))
        self.fs, self.path = storage.filesystem(location)
        self.writer = pq.ParquetWriter(self.path, schema, filesystem=self.fs)
        self.keys: list[pa.ChunkedArray] = []
        self.rows = 0
        self.lo: str | None = None
        self.hi: str | None = None

    def write(self, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        self.writer.write_table(rows, row_group_size=bucket_files.ROW_GROUP_ROWS)
        self.keys.append(rows[KEY_COLUMN])
        self.rows += rows.num_rows
        lo, hi = (x.as_py() for x in pc.min_max(rows[POSITION_COLUMN]).values())
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)

    def close(self) -> NewFile:
        self.writer.close()
        keys = pa.chunked_array([c for k in self.keys for c in k.chunks], pa.string())
        if key_index.wanted_for(keys):
            key_index.write(self.v.table_uri, self.rel, keys)
        stats = {
            "numRecords": self.rows,
            "minValues": {POSITION_COLUMN: self.lo},
            "maxValues": {POSITION_COLUMN: self.hi},
            "nullCount": {POSITION_COLUMN: 0},
        }
        size = self.fs.get_file_info(self.path).size
        part = {BUCKET_COLUMN: str(self.node)} if self.v.bucketed else {}
        return NewFile(self.rel, int(size), part, json.dumps(stats))


def split_nodes(v: MirrorVersion, bucket: int, crc: np.ndarray, unit: int | None) -> frozenset[int]:
    """The nodes under ``bucket`` that split for kept keys of hashes ``crc``: the bucket when it
    keeps more than ``unit`` rows, and each descendant that would still (only a bucketed table
    splits)."""
    if unit is None or not v.bucketed or len(crc) <= unit:
        return frozenset()
    inner = frozenset(v.inner) | {bucket}
    while True:
        nodes, counts = np.unique(node_of(crc, v.buckets, inner), return_counts=True)
        over = {int(n) for n, c in zip(nodes, counts, strict=True) if c > unit}
        if not over:
            return inner - frozenset(v.inner)
        inner |= over


def slice_bounds(keys: pa.Array | pa.ChunkedArray, rows: int) -> list[Bound]:
    """(after, upto] key ranges holding about ``rows`` of the sorted ``keys`` each, covering
    every key (the first and last open)."""
    n = len(keys)
    cuts = [keys[i].as_py() for i in range(rows - 1, n - 1, max(1, rows))]
    edges = [None, *cuts, None]
    return list(zip(edges[:-1], edges[1:], strict=True))


def read_range(table_uri: str, paths: Sequence[str], schema: pa.Schema, bound: Bound) -> pa.Table:
    """The stored rows of a bucket's files whose key lies in ``bound``, in ``schema``: a file's
    row groups outside it are skipped by their statistics (files are sorted by key)."""
    after, upto = bound
    parts = []
    for rel in paths:
        fs, p = storage.filesystem(_location(table_uri, rel))
        with fs.open_input_file(p) as fh:
            f = pq.ParquetFile(fh)
            col = f.schema_arrow.get_field_index(KEY_COLUMN)
            keep = [c for c in f.schema_arrow.names if c in schema.names]
            for g in range(f.num_row_groups):
                st = f.metadata.row_group(g).column(col).statistics
                if st is not None and st.has_min_max:
                    if (after is not None and st.max <= after) or (upto is not None and st.min > upto):
                        continue
                t = f.read_row_group(g, columns=keep)
                mask = None
                if after is not None:
                    mask = pc.greater(t[KEY_COLUMN], after)
                if upto is not None:
                    le = pc.less_equal(t[KEY_COLUMN], upto)
                    mask = le if mask is None else pc.and_(mask, le)
                parts.append(conform(t if mask is None else t.filter(mask), schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def fold_bucket(
    v: MirrorVersion,
    bucket: int,
    *,
    tombstones_upto: str | None,
    unit: int | None,
    slice_rows: int | None = None,
) -> tuple[list[NewFile], int]:
    """The bucket's files as resolved base files (split past ``unit``), tombstones at or before
    ``tombstones_upto`` dropped, a slice of about ``slice_rows`` (FOLD_SLICE_ROWS) kept rows at
    a time. Returns the new files (none for an emptied bucket) and the tombstones dropped; on
    an error the files written are deleted."""
    paths = v.files.get(bucket, ())
    keys = read_resolved_keys(v.table_uri, paths)
    kept = drop_rows(keys, tombstones_upto=tombstones_upto) if tombstones_upto is not None else None
    dropped = 0 if kept is None else keys.num_rows - kept.num_rows
    kept = keys if kept is None else kept
    inner = split_nodes(v, bucket, crc_of(kept[KEY_COLUMN]), unit)
    bounds = slice_bounds(kept[KEY_COLUMN], slice_rows or FOLD_SLICE_ROWS)
    del keys, kept
    writers: dict[int, BaseFileWriter] = {}
    try:
        for bound in bounds:
            rows = resolve(read_range(v.table_uri, paths, v.schema, bound))
            out = drop_rows(rows, tombstones_upto=tombstones_upto) if tombstones_upto is not None else None
            rows = rows if out is None else out
            if not rows.num_rows:
                continue
            nodes = (
                node_of(crc_of(rows[KEY_COLUMN]), v.buckets, frozenset(v.inner) | inner)
                if inner
                else np.full(rows.num_rows, bucket)
            )
            for node in np.unique(nodes):
                w = writers.get(int(node))
                if w is None:
                    w = writers[int(node)] = BaseFileWriter(v, int(node), v.schema)
                w.write(rows if not inner else rows.filter(pa.array(nodes == node)))
        return [w.close() for w in writers.values()], dropped
    except BaseException:
        for w in writers.values():
            try:
                w.writer.close()
            except Exception:  # noqa: BLE001, S110 - deleting it below is what matters
                pass
        discard(v.table_uri, [NewFile(w.rel, 0, {}, "{}") for w in writers.values()])
        raise
