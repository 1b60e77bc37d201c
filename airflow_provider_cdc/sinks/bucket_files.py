"""A mirror version's files: what a Delta version holds per bucket, reading a bucket's rows, writing
a new base or change file, and deleting files a writer could not commit."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from .. import storage
from ..core.arrow_types import KEY_COLUMN, POSITION_COLUMN
from ..core.errors import ConfigurationError
from ..core.formats import MIRROR
from . import deletion_vectors as dvs
from . import key_index
from .bucket_tree import (
    BASE_PREFIX,
    BUCKET_COLUMN,
    BUCKETS_PROPERTY,
    CHANGE_PREFIX,
    WRITER_APP_ID,
    check_buckets,
    crc_of,
    nodes_of_keys,
    split_nodes,
)
from .delta_log import log_state

log = logging.getLogger(__name__)


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
