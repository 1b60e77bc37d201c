"""Reading a mirror's live rows from any engine, Delta jars or not: pyarrow (:func:`read_mirror`,
a file at a time), Spark, duckdb, pandas. A mirror masks every row that is not live with Delta
deletion vectors, so any Delta reader that implements them sees the live rows as they are
(docs/outputs.md); these readers take the current files from the Delta log and skip the masked
rows (pyarrow), or keep the newest version of each key and drop tombstones (Spark and duckdb
without a Delta reader: the same rows, docs/DESIGN.md, "The mirror").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.arrow_types import (
    DELETED_COLUMN,
    KEY_COLUMN,
    POSITION_COLUMN,
)
from ..core.errors import ConfigurationError
from ..core.position import Position, parse_position
from ..core.schema import TableName
from ..storage.layout import mirror_dir
from .deletion_vectors import keep_mask
from .delta_buckets import (
    BUCKET_COLUMN,
    MirrorVersion,
    conform,
    live,
    read_bucket,
    resolve,
)
from .mirror_table import _open, _rows, _version, bucket_unit, open_mirror


def _table(table: str | TableName) -> TableName:
    return table if isinstance(table, TableName) else TableName.parse(table)


def live_files(data_dir: str, source: str, table: str | TableName) -> list[str]:
    """URIs of the data files the mirror's current version is made of (empty: no mirror)."""
    dt = open_mirror(mirror_dir(data_dir, source, _table(table)))
    return [] if dt is None else list(dt.file_uris())


def _drop(meta: bool) -> list[str]:
    return [DELETED_COLUMN] if meta else [KEY_COLUMN, POSITION_COLUMN, DELETED_COLUMN]


def read_spark(spark: Any, data_dir: str, source: str, table: str | TableName, *, meta: bool = False):
    """The live rows as a Spark DataFrame, read by Spark itself (on its executors). A
    location on object storage needs Hadoop's connector for its scheme on Spark's classpath."""
    files = live_files(data_dir, source, table)
    if not files:
        return spark.createDataFrame([], "__empty string").drop("__empty")
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(*files)  # Spark may read the bucket folders as a column: dropped too
    newest = Window.partitionBy(KEY_COLUMN).orderBy(F.col(POSITION_COLUMN).desc())
    df = df.withColumn("__rank", F.row_number().over(newest))
    return df.where((F.col("__rank") == 1) & ~df[DELETED_COLUMN]).drop("__rank", *_drop(meta), BUCKET_COLUMN)


def read_duckdb(con: Any, data_dir: str, source: str, table: str | TableName, *, meta: bool = False):
    """The live rows as a duckdb relation of connection ``con`` (``duckdb.connect()``)."""
    files = live_files(data_dir, source, table)
    if not files:
        return con.sql("SELECT 1 WHERE false")
    keep = ", ".join('"' + c.replace('"', '""') + '"' for c in _drop(meta))
    # file URIs and column names are bound or quoted, never pasted as SQL text
    rel = con.read_parquet(files, hive_partitioning=False)
    newest = rel.select(
        f'*, row_number() OVER (PARTITION BY "{KEY_COLUMN}" ORDER BY "{POSITION_COLUMN}" DESC) AS __rank'
    )
    return newest.filter(f'__rank = 1 AND NOT "{DELETED_COLUMN}"').select(f"* EXCLUDE ({keep}, __rank)")


def read_pandas(data_dir: str, source: str, table: str | TableName, *, meta: bool = False):
    """The live rows as a pandas DataFrame."""
    return read_mirror(data_dir, source, _table(table), with_meta=meta).to_pandas()


def _keyed_columns(schema: pa.Schema) -> list[str]:
    """The table's columns and ``__key``: what a reader of live rows gets."""
    return [n for n in schema.names if n not in (DELETED_COLUMN, BUCKET_COLUMN, POSITION_COLUMN)]


def current_batches(
    v: MirrorVersion,
    *,
    batch_rows: int = 100_000,
    columns: Sequence[str] | None = None,
    tombstones: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The current rows of the mirror version ``v`` (live only, or with ``tombstones``). Live
    rows of a mirror with deletion vectors: each file's unmasked rows, a batch at a time (what
    any Delta reader sees). Otherwise (tombstones wanted, or a mirror of format 1) a bucket at
    a time (memory: one bucket, bounded by the unit): a bucket of one file is
    streamed as stored (one file never holds a key twice), a bucket with change files is
    resolved first (the newest position per key wins); a bucket that grew past twice the unit
    before compaction spread it is resolved in parts of about a unit, by key hash, one pass
    over its files each."""
    cols = list(columns or v.schema.names)
    need = list(dict.fromkeys([*cols, DELETED_COLUMN]))
    if v.masked and not tombstones:
        yield from _unmasked_batches(v, cols, batch_rows)
        return
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


def _unmasked_batches(v: MirrorVersion, cols: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Each current file's rows its deletion vector keeps, in ``cols``, a batch at a time."""
    want = pa.schema([v.schema.field(n) for n in cols])
    for b in sorted(v.files):
        for rel in v.files[b]:
            info = v.info[rel]
            if info.rows is not None and info.masked >= info.rows:
                continue  # every row masked (tombstones, superseded versions)
            fs, p = storage.filesystem(storage.join(v.table_uri, *rel.split("/")))
            with fs.open_input_file(p) as fh:
                f = pq.ParquetFile(fh)
                keep = keep_mask(v.table_uri, info.dv, f.metadata.num_rows)
                present = [c for c in cols if c in f.schema_arrow.names]
                start = 0
                for batch in f.iter_batches(batch_size=batch_rows, columns=present):
                    t = pa.Table.from_batches([batch])
                    if keep is not None:
                        t = t.filter(pa.array(keep[start : start + batch.num_rows]))
                    start += batch.num_rows
                    if t.num_rows:
                        yield from conform(t, want).to_batches()


def read_mirror(
    data_dir: str,
    source: str,
    table: str | TableName,
    *,
    with_meta: bool = False,
    as_of: Position | str | None = None,
) -> pa.Table:
    """Live rows of a mirror table (tombstones and superseded versions left out), typed,
    sorted by ``__key``; ``with_meta`` keeps ``__key`` and ``__position``. An absent mirror
    reads as an empty table with no columns. ``as_of``: the table as the source had it at
    that position (a :class:`Position` or the text :func:`core.position.parse_position`
    reads), from the mirror version that equals it (sinks/mirror_history.py);
    ConfigurationError when none does."""
    version = None
    if as_of is not None:
        version = _version_as_of(data_dir, source, table, as_of)
    v = _version(data_dir, source, table, version)
    if v is None:
        return pa.table({})
    cols = [
        n
        for n in v.schema.names
        if n != DELETED_COLUMN and (with_meta or n not in (KEY_COLUMN, POSITION_COLUMN))
    ]
    keyed = list(dict.fromkeys([*cols, KEY_COLUMN]))
    parts = list(current_batches(v, columns=keyed))
    want = pa.schema([v.schema.field(n) for n in keyed])
    data = pa.Table.from_batches(parts, schema=want) if parts else want.empty_table()
    return data.sort_by([(KEY_COLUMN, "ascending")]).select(cols)


def _version_as_of(data_dir: str, source: str, table: str | TableName, as_of: Position | str) -> int:
    from .mirror_history import version_at

    try:
        position = as_of if isinstance(as_of, Position) else parse_position(as_of, "as_of")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    found = version_at(data_dir, source, table, position)
    if found is None:
        raise ConfigurationError(
            f"table {_table(table)}: no mirror version the Delta log still holds was brought to a source "
            f"position at or before {as_of} (the log keeps CDC_MIRROR_LOG_RETENTION_HOURS of versions)"
        )
    if found.exact is False:
        raise ConfigurationError(found.describe())
    return found.version


def mirror_batches(
    data_dir: str, source: str, table: str | TableName, *, batch_rows: int = 100_000
) -> tuple[int, Iterable[pa.RecordBatch]]:
    """Live rows of a mirror table with ``__key``, typed, a batch at a time in no particular
    order (a bucket held at a time), and at most how many there are (the stored rows, read
    from the Delta statistics): for readers of a table too large to hold (verify). An absent
    mirror: ``(0, [])``."""
    v = _version(data_dir, source, table)
    if v is None:
        return 0, []
    return _rows(v, [p for f in v.files.values() for p in f]), current_batches(
        v, batch_rows=batch_rows, columns=_keyed_columns(v.schema)
    )


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
    """Every stored row version of the current files, superseded ones and tombstones included
    (masked or not), with its bucket: what the package's own position guard reads."""
    v = _version(data_dir, source, table)
    if v is None:
        return pa.table({})
    parts = []
    for b, paths in sorted(v.files.items()):
        rows = read_bucket(v.table_uri, paths, v.schema)
        parts.append(rows.append_column(BUCKET_COLUMN, pa.array([b] * rows.num_rows, pa.int32())))
    return pa.concat_tables(parts) if parts else pa.table({})


def read_delta(data_dir: str, source: str, table: str | TableName, *, version: int | None = None) -> pa.Table:
    """The mirror as deltalake (delta-rs) reads it, deletion vectors applied: what any Delta
    reader sees (``version``: time travel to that Delta version)."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    dt = _open(mirror_dir(data_dir, source, t))
    if dt is None:
        return pa.table({})
    if version is not None:
        dt.load_as_version(version)
    return pa.table(dt.scan())
