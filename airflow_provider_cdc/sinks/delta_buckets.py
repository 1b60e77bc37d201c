"""The mirror's storage: key-hash buckets of a Delta table, each a base file plus change
files; the bucket tree, merge-on-read resolution and the one serialising commit
(docs/DESIGN.md, "The mirror").
"""

from __future__ import annotations

import bisect
import json
import logging
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from .. import storage
from ..core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from ..core.errors import ConfigurationError
from ..core.formats import MIRROR
from . import deletion_vectors as dvs
from . import key_index
from .delta_log import after_commit, log_state, write_commit

log = logging.getLogger(__name__)

BUCKET_COLUMN = "__bucket"
BUCKETS_PROPERTY = "cdc.buckets"
DEFAULT_BUCKETS = 8
MAX_BUCKETS = 4096
WRITER_APP_ID = "cdc-mirror"


def check_buckets(n: int, setting: str = "buckets") -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BUCKETS:
        raise ConfigurationError(
            f"{setting} must be a whole number from 1 to {MAX_BUCKETS}, got {n!r}; "
            "a mirror's bucket count is fixed when it is created"
        )
    return n


def crc_of(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """crc32 of each canonical key's UTF-8 bytes (the same in every process and engine,
    unlike Python's salted ``hash``). A per-key loop, measured against a numpy hash over the
    Arrow buffers (polynomial, ``reduceat``): 0.16 s against 0.57 s for 1M keys; pyarrow
    has no hash kernel."""
    values = keys.to_pylist()
    return np.fromiter((zlib.crc32(k.encode("utf-8")) for k in values), dtype=np.uint64, count=len(values))


def bucket_of(keys: pa.Array | pa.ChunkedArray, buckets: int) -> pa.Array:
    """The root bucket of each canonical key: crc32 mod ``buckets`` (also the partitions of
    verify's spill files)."""
    if buckets == 1:
        return pa.array(np.zeros(len(keys), dtype=np.int32))
    return pa.array((crc_of(keys) % buckets).astype(np.int32))


def level_of(node: int, roots: int) -> int:
    """The tree level of bucket ``node`` (module docstring): level l holds ids
    N·(2^l - 1) .. N·(2^(l+1) - 1) - 1."""
    level = 0
    while node >= roots * (2 ** (level + 1) - 1):
        level += 1
    return level


def node_id(level: int, residue: int, roots: int) -> int:
    return roots * (2**level - 1) + residue


def parent_of(node: int, roots: int) -> int | None:
    level = level_of(node, roots)
    if level == 0:
        return None
    residue = node - node_id(level, 0, roots)
    return node_id(level - 1, residue % (roots * 2 ** (level - 1)), roots)


def children_of(node: int, roots: int) -> tuple[int, int]:
    level = level_of(node, roots)
    residue = node - node_id(level, 0, roots)
    return node_id(level + 1, residue, roots), node_id(level + 1, residue + roots * 2**level, roots)


def split_nodes(nodes: Iterable[int], roots: int) -> frozenset[int]:
    """The split (inner) nodes of a tree whose leaves with files are ``nodes``: their ancestors."""
    inner: set[int] = set()
    for n in nodes:
        p = parent_of(n, roots)
        while p is not None and p not in inner:
            inner.add(p)
            p = parent_of(p, roots)
    return frozenset(inner)


def node_of(crc: np.ndarray, roots: int, inner: Iterable[int] = ()) -> np.ndarray:
    """The leaf bucket of each key hash ``crc`` (:func:`crc_of`) in the tree whose split
    nodes are ``inner``."""
    ids = (crc % roots).astype(np.int64)
    inner_arr = np.fromiter(inner, dtype=np.int64)
    if inner_arr.size == 0:
        return ids.astype(np.int32)
    active = np.isin(ids, inner_arr)
    level = 0
    while active.any():
        level += 1
        where = np.flatnonzero(active)
        ids[where] = roots * (2**level - 1) + (crc[where] % (roots * 2**level)).astype(np.int64)
        active[where] = np.isin(ids[where], inner_arr)
    return ids.astype(np.int32)


def nodes_of_keys(keys: pa.Array | pa.ChunkedArray, roots: int, inner: Iterable[int] = ()) -> pa.Array:
    """The leaf bucket of each canonical key."""
    if roots == 1 and not inner:
        return pa.array(np.zeros(len(keys), dtype=np.int32))
    return pa.array(node_of(crc_of(keys), roots, inner))


#: file name prefixes: compaction's resolved base files (and every file written before
#: merge-on-read) and the change files writes append
BASE_PREFIX, CHANGE_PREFIX = "part-", "chg-"


@dataclass(frozen=True)
class FileInfo:
    path: str  # relative to the table root
    size: int
    rows: int | None  # from the Delta statistics (None: not recorded)
    change: bool  # a change file (not yet compacted into the bucket's base)
    dv: Mapping | None = None  # its deletion vector's descriptor (None: every row visible)

    @property
    def masked(self) -> int:
        """Rows its deletion vector masks."""
        return int(self.dv.get("cardinality", 0)) if self.dv else 0


@dataclass(frozen=True)
class MirrorVersion:
    """What a writer read: the table at one version, its data files by bucket (leaf node),
    its columns (without the bucket column), properties and the writers' transaction
    version."""

    dt: DeltaTable
    location: str  # the table's location as the package names it (dt.table_uri may be %-encoded)
    version: int
    buckets: int  # the roots, N
    bucketed: bool
    files: Mapping[int, tuple[str, ...]]  # bucket -> file paths relative to the table root
    sizes: Mapping[str, int]
    schema: pa.Schema
    props: Mapping[str, str]
    txn: int
    info: Mapping[str, FileInfo] = field(default_factory=dict)
    #: the active add actions by path, as the log holds them (a remove must name the vector)
    adds: Mapping[str, Mapping] = field(default_factory=dict)
    #: the mirror masks superseded rows and tombstones with deletion vectors (format 2); False:
    #: a mirror written before them, upgraded in place by its next commit
    masked: bool = True

    @property
    def table_uri(self) -> str:
        return self.location

    @property
    def inner(self) -> frozenset[int]:
        """The split buckets: those with files below them."""
        return (
            split_nodes((b for b, f in self.files.items() if f), self.buckets)
            if self.bucketed
            else frozenset()
        )

    def nodes_of(self, keys: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The bucket each key's rows live in, in this version."""
        return nodes_of_keys(keys, self.buckets if self.bucketed else 1, self.inner)


#: the mirror format (core/formats.py MIRROR) from which superseded rows and tombstones are
#: masked by deletion vectors
MASKED_FORMAT = 2


def mirror_format(props: Mapping[str, str], location: str) -> int:
    """The mirror's format version: 1 for a mirror made before deletion vectors (upgraded in
    place by its next commit), else the current one (FormatError for a newer package's)."""
    found = MIRROR.found(props)
    if found is None or found < MASKED_FORMAT:
        return 1
    MIRROR.read(props, f"mirror {location}")
    return MIRROR.version


def read_version(dt: DeltaTable, location: str) -> MirrorVersion:
    """``location``: where the table is (what the package opened it from)."""
    props = dict(dt.metadata().configuration or {})
    masked = mirror_format(props, location) >= MASKED_FORMAT
    parts = list(dt.metadata().partition_columns or [])
    bucketed = parts == [BUCKET_COLUMN]
    raw = props.get(BUCKETS_PROPERTY, "1") if bucketed else "1"
    buckets = check_buckets(
        int(raw) if raw.isdigit() else -1,
        f"mirror {location}: table property {BUCKETS_PROPERTY} ({raw!r}, set by hand?)",
    )
    state = log_state(location, dt.version(), dt.metadata().id)
    files: dict[int, list[str]] = {b: [] for b in range(buckets)}
    sizes: dict[str, int] = {}
    info: dict[str, FileInfo] = {}
    for p, add in state.adds.items():
        b = int((add.get("partitionValues") or {}).get(BUCKET_COLUMN, 0)) if bucketed else 0
        files.setdefault(b, []).append(p)
        sizes[p] = int(add["size"])
        try:
            n = json.loads(add.get("stats") or "{}").get("numRecords")
        except ValueError:
            n = None
        info[p] = FileInfo(
            p,
            sizes[p],
            None if n is None else int(n),
            p.rsplit("/", 1)[-1].startswith(CHANGE_PREFIX),
            add.get("deletionVector") or None,
        )
    schema = pa.schema([f for f in pa.schema(dt.schema().to_arrow()) if f.name != BUCKET_COLUMN])
    return MirrorVersion(
        dt,
        location,
        dt.version(),
        buckets,
        bucketed,
        {b: read_order(f) for b, f in files.items()},
        sizes,
        schema,
        props,
        int(dt.transaction_version(WRITER_APP_ID) or 0),
        info,
        state.adds,
        masked,
    )


def read_order(paths: Iterable[str]) -> tuple[str, ...]:
    """A bucket's files in the order resolve() breaks ties of equal positions in: base files
    first, then change files oldest first (their names carry the commit version)."""

    def key(p: str):
        name = p.rsplit("/", 1)[-1]
        return (name.startswith(CHANGE_PREFIX), name)

    return tuple(sorted(paths, key=key))


def _location(table_uri: str, relative: str) -> str:
    return storage.join(table_uri, *relative.split("/"))


def read_bucket(
    table_uri: str, paths: Iterable[str], schema: pa.Schema, *, part: tuple[int, int] | None = None
) -> pa.Table:
    """The rows of a bucket's files, in ``schema`` (columns added since a file was written
    read as null); with ``part`` = (i, n) only the rows whose key hash is i mod n (each
    file's key column read first, so a file is held only as that part)."""
    parts = []
    for rel in paths:
        fs, p = storage.filesystem(_location(table_uri, rel))
        if part is None:
            t = pq.read_table(p, filesystem=fs)
        else:
            with fs.open_input_file(p) as fh:
                f = pq.ParquetFile(fh)
                pieces = []
                for batch in f.iter_batches(batch_size=65_536):
                    mask = crc_of(batch.column(KEY_COLUMN)) % part[1] == part[0]
                    if mask.any():
                        pieces.append(pa.Table.from_batches([batch]).filter(pa.array(mask)))
                t = pa.concat_tables(pieces) if pieces else f.schema_arrow.empty_table()
        parts.append(conform(t.select([c for c in t.column_names if c in schema.names]), schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` in the table's columns: a column the rows lack (dropped at the source, kept
    in the mirror, or added after a file was written) is null."""
    extra = set(rows.column_names) - set(schema.names)
    if extra:
        raise ConfigurationError(f"mirror rows have column(s) {sorted(extra)} the table lacks")
    cols = [
        rows[f.name].cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.table(cols, schema=schema)


def change_version(path: str) -> int | None:
    """The commit version a change file was first written for (its name), None for a base file."""
    name = path.rsplit("/", 1)[-1]
    if not name.startswith(CHANGE_PREFIX):
        return None
    digits = name[len(CHANGE_PREFIX) :].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


@dataclass(frozen=True)
class Remask:
    """An active file of the version a writer read, re-added with another deletion vector
    (its remove names the old one: Delta identifies a file by path and vector)."""

    path: str
    dv: Mapping | None


@dataclass(frozen=True)
class NewFile:
    """A data file a writer wrote, not visible until committed: the ``add`` it gets, and what
    the writer worked out of the bucket's vectors: its own (``dv``) and the other files'
    (``remasks``), or ``remasks`` None when the commit must work them out from the bucket's
    files (:func:`bucket_masks`)."""

    path: str  # relative to the table root
    size: int
    partition: Mapping[str, str]
    stats: str
    dv: Mapping | None = None
    remasks: tuple[Remask, ...] | None = None

    @property
    def rows(self) -> int:
        return int(json.loads(self.stats)["numRecords"])

    @property
    def bucket(self) -> int:
        return int(self.partition.get(BUCKET_COLUMN, 0))

    def add(self, now: int) -> dict:
        add = {
            "path": self.path,
            "partitionValues": dict(self.partition),
            "size": int(self.size),
            "modificationTime": now,
            "dataChange": True,
            "stats": self.stats,
        }
        if self.dv:
            add["deletionVector"] = dict(self.dv)
        return {"add": add}

    def to_json(self) -> str:
        """For a worker's result (Spark executors to the driver)."""
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "partition": dict(self.partition),
                "stats": self.stats,
                "dv": self.dv,
                "remasks": None if self.remasks is None else [[r.path, r.dv] for r in self.remasks],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> NewFile:
        d = json.loads(text)
        remasks = None if d["remasks"] is None else tuple(Remask(p, dv) for p, dv in d["remasks"])
        return cls(d["path"], int(d["size"]), d["partition"], d["stats"], d["dv"], remasks)


def write_bucket_file(
    table_uri: str, bucket: int, rows: pa.Table, *, bucketed: bool = True, change: int | None = None
) -> NewFile:
    """One new data file of ``bucket`` (not visible until committed): a base file of
    resolved rows, or with ``change`` a change file of that commit version (its name carries
    it, so a bucket's change files sort in commit order: resolve() keeps the first of equal
    positions). With the row count and the position range as Delta statistics; its deletion
    vector is worked out at the commit (:func:`commit`) unless the writer gives it."""
    name = (
        f"{CHANGE_PREFIX}{change:020d}-" if change is not None else BASE_PREFIX
    ) + f"{uuid.uuid4().hex}.parquet"
    rel = f"{BUCKET_COLUMN}={bucket}/{name}" if bucketed else name
    location = _location(table_uri, rel)
    storage.makedirs(storage.parent(location))
    fs, p = storage.filesystem(location)
    if KEY_COLUMN in rows.column_names and key_index.wanted_for(rows[KEY_COLUMN]):
        key_index.write(table_uri, rel, rows[KEY_COLUMN])  # before the file: never a file without it
    pq.write_table(rows, p, filesystem=fs, row_group_size=ROW_GROUP_ROWS)
    size = fs.get_file_info(p).size
    stats: dict = {"numRecords": rows.num_rows}
    if rows.num_rows and POSITION_COLUMN in rows.column_names:
        lo, hi = pc.min_max(rows[POSITION_COLUMN]).values()
        stats.update(
            minValues={POSITION_COLUMN: lo.as_py()},
            maxValues={POSITION_COLUMN: hi.as_py()},
            nullCount={POSITION_COLUMN: 0},
        )
    return NewFile(rel, int(size), {BUCKET_COLUMN: str(bucket)} if bucketed else {}, json.dumps(stats))


#: rows per Parquet row group of the mirror's files: a write that looks up the stored versions
#: of its keys reads only the row groups whose key range holds one (files are sorted by key)
ROW_GROUP_ROWS = 65_536


def discard(table_uri: str, adds: Iterable[NewFile]) -> None:
    """Delete files a writer wrote but could not commit (data files and deletion vectors)."""
    for a in adds:
        names = [a.path, *dvs.referenced_files([a.dv, *(r.dv for r in a.remasks or ())])]
        key_index.delete(table_uri, [a.path])
        for rel in names:
            try:
                storage.delete(_location(table_uri, rel))
            except OSError:  # noqa: PERF203 - vacuum removes what is left
                log.warning("could not delete uncommitted file %s; vacuum removes it", rel)


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
    table_uri: str, paths: Sequence[str], keys: pa.Array, older_than: str | None = None
) -> pa.Table:
    """The stored versions of the canonical ``keys`` (distinct) in the bucket made of ``paths``
    (read order): columns k (index into keys), file (index into paths), row, ``__position``,
    ``__deleted``. Finds the rows through a file's key index (sinks/key_index.py) or else by
    reading the key column of the row groups whose key range holds a wanted key (files are
    sorted by key); reads the position and deleted columns only of row groups with a match
    whose positions are not all older than ``older_than`` (the oldest new row): there the
    position given is the row group's newest (at least the row's own) and deleted is null. A
    changelog apply, newer than everything stored, so reads keys only: its cost follows its
    keys, through the index, or is at most the bucket's key column without one."""
    wanted = sorted(keys.to_pylist())
    parts = []
    for i, rel in enumerate(paths):
        indexed = key_index.lookup(table_uri, rel, keys, wanted)
        fs, p = storage.filesystem(_location(table_uri, rel))
        with fs.open_input_file(p) as fh:
            f = pq.ParquetFile(fh)
            meta = f.metadata
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
            key_col = f.schema_arrow.get_field_index(KEY_COLUMN)
            pos_col = f.schema_arrow.get_field_index(POSITION_COLUMN)
            offset = 0
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                n = group.num_rows
                if indexed is not None:
                    lo, hi = np.searchsorted(indexed.rows, [offset, offset + n])
                    k_of, hit = pa.array(indexed.keys[lo:hi]), pa.array(indexed.rows[lo:hi] - offset)
                else:
                    st = group.column(key_col).statistics if key_col >= 0 else None
                    if st is not None and st.has_min_max:
                        lo = bisect.bisect_left(wanted, st.min)
                        if lo >= len(wanted) or wanted[lo] > st.max:
                            offset += n
                            continue
                    col = f.read_row_group(g, columns=[KEY_COLUMN])[KEY_COLUMN].combine_chunks()
                    idx = pc.index_in(col, value_set=keys)
                    hit = pc.indices_nonzero(pc.is_valid(idx))
                    k_of = pc.take(idx, hit)
                if len(hit):
                    ps = group.column(pos_col).statistics if pos_col >= 0 else None
                    newest = ps.max if ps is not None and ps.has_min_max else None
                    if older_than is not None and isinstance(newest, str) and newest < older_than:
                        position = pa.repeat(pa.scalar(newest, pa.string()), len(hit))
                        deleted = pa.nulls(len(hit), pa.bool_())
                    else:
                        rest = f.read_row_group(g, columns=[POSITION_COLUMN, DELETED_COLUMN])
                        position = pc.take(rest[POSITION_COLUMN], hit).cast(pa.string())
                        deleted = pc.take(rest[DELETED_COLUMN], hit)
                    parts.append(
                        pa.table(
                            [
                                k_of.cast(pa.int32()),
                                pa.array(np.full(len(hit), i, dtype=np.int32)),
                                pc.add(hit.cast(pa.int64()), offset),
                                position,
                                deleted,
                            ],
                            schema=_WINNER_SCHEMA,
                        )
                    )
                offset += n
    if not parts:
        return _WINNER_SCHEMA.empty_table()
    return pa.concat_tables(parts)


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
    found = (
        stored_versions(
            table_uri, paths, rows[KEY_COLUMN].combine_chunks(), pc.min(rows[POSITION_COLUMN]).as_py()
        )
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
        vectors.append(
            np.union1d(dvs.read_vector(table_uri, current.get(rel)), hit_rows[files == i].astype(np.uint64))
        )
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


def commit(
    v: MirrorVersion,
    adds: Sequence[NewFile],
    removed: Iterable[str],
    *,
    operation: str,
    position: str | None = None,
) -> int:
    """Replace ``removed`` (paths of ``v``) by ``adds`` in one commit on top of ``v``, as the
    next ``cdc-mirror`` transaction, with the deletion vectors that keep exactly the live rows
    visible: a bucket that one writer appended one file to takes that writer's vectors (it read
    the bucket's winners of its keys); any other bucket the commit touches has its vectors
    worked out from its files (:func:`bucket_masks`). A mirror of format 1 is upgraded in the
    same commit (protocol, the ``deletionVectors`` feature, every bucket masked), so no version
    has the feature without the masks. The commit records the source position it brings the
    mirror to (``cdc.position`` in its commitInfo, :mod:`sinks.mirror_history`): ``position``,
    or for a write of rows (``upsert``, ``merge``) the newest position among them.
    CommitFailedError when another writer committed since; returns the version committed (-1:
    nothing to commit)."""
    removed = list(removed)
    if not adds and not removed and v.masked:
        return -1
    gone = set(removed)
    per_bucket: dict[int, list[NewFile]] = {}
    for a in adds:
        per_bucket.setdefault(a.bucket if v.bucketed else 0, []).append(a)
    owner = {p: b for b, ps in v.files.items() for p in ps}
    if v.masked:
        redo = {owner[p] for p in gone if p in owner}
        redo |= {b for b, ps in per_bucket.items() if len(ps) > 1 or ps[0].remasks is None}
    else:
        redo = {b for b, ps in v.files.items() if ps} | set(per_bucket)
    given = [a for b, ps in per_bucket.items() if b not in redo for a in ps]
    superseded = [a for b, ps in per_bucket.items() if b in redo for a in ps]  # vectors worked out again
    try:
        done, remasks = _remask_buckets(v, superseded, gone, redo)
    except BaseException:
        discard(v.table_uri, adds)
        raise
    remasks += [r for a in given for r in a.remasks or ()]
    final = [*given, *done]
    now = int(time.time() * 1000)
    actions: list[dict] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "WRITE" if v.masked else "UPGRADE PROTOCOL",
                "operationParameters": {"mode": "Append"},
                "cdc.operation": operation,
                "engineInfo": "airflow-provider-cdc",
                **_position_info(operation, position, adds),
            }
        },
        {"txn": {"appId": WRITER_APP_ID, "version": v.txn + 1, "lastUpdated": now}},
    ]
    if not v.masked:
        actions += _upgrade_actions(v)
    part = (lambda p: {BUCKET_COLUMN: p.split("/", 1)[0].split("=", 1)[1]}) if v.bucketed else (lambda p: {})

    def remove(rel: str) -> dict:
        old = v.adds.get(rel, {})
        r = {
            "path": rel,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": old.get("partitionValues", part(rel)),
            "size": int(old.get("size", v.sizes.get(rel, 0))),
        }
        if old.get("deletionVector"):
            r["deletionVector"] = old["deletionVector"]
        return {"remove": r}

    actions += [remove(p) for p in removed]
    for r in remasks:
        old = dict(v.adds[r.path])
        actions.append(remove(r.path))
        old.pop("deletionVector", None)
        if r.dv:
            old["deletionVector"] = dict(r.dv)
        old["dataChange"] = True
        actions.append({"add": old})
    actions += [a.add(now) for a in final]
    try:
        write_commit(v.table_uri, v.version + 1, actions)
    except BaseException:
        discard(v.table_uri, final)
        raise
    discard_vectors(v.table_uri, superseded)
    _after_commit(v, v.version + 1)
    return v.version + 1


#: the operations that bring the mirror's rows to a source position (mirror_history.py)
ROW_WRITES = ("upsert", "merge")


def _position_info(operation: str, position: str | None, adds: Sequence[NewFile]) -> dict:
    """``cdc.position``: the source position a commit brings the mirror to (none for
    maintenance, which changes no row's content)."""
    if position is None and operation in ROW_WRITES:
        tops = [json.loads(a.stats).get("maxValues", {}).get(POSITION_COLUMN) for a in adds]
        position = max((t for t in tops if t), default=None)
    return {} if position is None else {"cdc.position": position}


def discard_vectors(table_uri: str, files: Iterable[NewFile]) -> None:
    """Delete the vectors a writer wrote that its commit replaced (worked out again)."""
    for a in files:
        for rel in dvs.referenced_files([a.dv, *(r.dv for r in a.remasks or ())]):
            try:
                storage.delete(_location(table_uri, rel))
            except OSError:  # noqa: PERF203 - vacuum removes what is left
                pass


def _upgrade_actions(v: MirrorVersion) -> list[dict]:
    """The protocol and metadata of a format-1 mirror upgraded to deletion vectors (reader 3,
    writer 7 with the ``deletionVectors`` feature and those its old versions implied)."""
    proto = v.dt.protocol()
    implied_writer = {
        2: ["appendOnly", "invariants"],
        3: ["checkConstraints"],
        4: ["changeDataFeed", "generatedColumns"],
        5: ["columnMapping"],
        6: ["identityColumns"],
    }
    writer = set(proto.writer_features or [])
    if proto.min_writer_version < 7:
        for level, feats in implied_writer.items():
            if proto.min_writer_version >= level:
                writer.update(feats)
    reader = set(proto.reader_features or [])
    if proto.min_reader_version == 2:
        reader.add("columnMapping")
    writer.add("deletionVectors")
    reader.add("deletionVectors")
    md = v.dt.metadata()
    config = dict(md.configuration or {})
    config.update({DV_PROPERTY: "true", MIRROR.key: str(MIRROR.version)})
    meta = {
        "id": md.id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": v.dt.schema().to_json(),
        "partitionColumns": list(md.partition_columns or []),
        "configuration": config,
        "createdTime": md.created_time,
    }
    if md.name:
        meta["name"] = md.name
    if md.description:
        meta["description"] = md.description
    return [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": sorted(reader),
                "writerFeatures": sorted(writer),
            }
        },
        {"metaData": meta},
    ]


#: the Delta table property that lets writers add deletion vectors
DV_PROPERTY = "delta.enableDeletionVectors"


def _after_commit(v: MirrorVersion, version: int) -> None:
    """What delta-rs's post-commit hook does after its own commits (delta_log.after_commit)."""
    after_commit(v.table_uri, version, v.props)


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
