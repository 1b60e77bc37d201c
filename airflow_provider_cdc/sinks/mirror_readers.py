"""Reading a mirror's live rows from any engine, Delta jars or not.

A mirror is a Delta table whose rows carry ``__key``, ``__position`` and ``__deleted``
(tombstones of deletes, kept while a snapshot of the table may still bring an older row).
It is merge-on-read (sinks/delta_buckets.py): a key changed since its bucket was last
compacted has several row versions, and its live row is the one with the highest
``__position``, unless that one is a tombstone. Its folder also holds files of older
Delta versions until vacuum removes them, so a plain glob of ``*.parquet`` reads rows
twice. Every reader here takes the *current* file list from the Delta log, keeps the
newest version of each key and then drops tombstones (in that order: filtering tombstones
first would bring a deleted key's older version back):

- :func:`live_files`: the data files of the current version (URIs);
- :func:`read_spark`: a Spark DataFrame (no Delta jars: ``spark.read.parquet`` of those
  files, filtered);
- :func:`read_duckdb`: a duckdb relation;
- :func:`read_pandas`: a pandas DataFrame (through deltalake);
- ``sinks.mirror_delta.read_mirror``: a pyarrow Table.

``meta=True`` keeps ``__key`` and ``__position``.
"""

from __future__ import annotations

from typing import Any

from ..core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from ..core.schema import TableName
from ..storage.layout import mirror_dir
from .delta_buckets import BUCKET_COLUMN
from .mirror_delta import open_mirror, read_mirror


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
    newest = rel.select(f'*, row_number() OVER (PARTITION BY "{KEY_COLUMN}" ORDER BY "{POSITION_COLUMN}" DESC) AS __rank')
    return newest.filter(f'__rank = 1 AND NOT "{DELETED_COLUMN}"').select(f"* EXCLUDE ({keep}, __rank)")


def read_pandas(data_dir: str, source: str, table: str | TableName, *, meta: bool = False):
    """The live rows as a pandas DataFrame."""
    return read_mirror(data_dir, source, _table(table), with_meta=meta).to_pandas()
