"""Readers of the mirror (sinks/mirror_readers.py): Spark without Delta jars, duckdb, pandas
and pyarrow all see the live rows, never older file versions or tombstones; vacuum leaves
a plain folder glob with exactly the current files."""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import mirror_readers
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.mirror_compaction import compact
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

pytestmark = pytest.mark.integration

SOURCE = "s"
T = TableName("public", "read me")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("v", "string")), ("id",))


def ev(pos: int, op: str, key: int, value: str | None = None) -> dict:
    return {
        "position": Position(pos).encode(), "table": T.id, "op": op, "key": encode_key([key]), "before": None,
        "after": None if op == "d" else encode_row({"id": key, "v": value}), "ts_ms": pos, "watermark": None,
        "snapshot": False, "batch": f"b{pos}",
    }


@pytest.fixture
def mirror(tmp_path) -> str:
    """Three versions: inserts, updates, deletes (tombstones)."""
    data_dir = str(tmp_path)
    storage.write_text(schema_path(data_dir, SOURCE, T), SCHEMA.to_json())
    sink = MirrorDeltaSink(data_dir, SOURCE)
    sink.write(pa.Table.from_pylist([ev(i, "c", i, f"v{i}") for i in range(1, 11)], schema=EVENT_SCHEMA))
    sink.write(pa.Table.from_pylist([ev(20 + i, "u", i, f"w{i}") for i in range(1, 4)], schema=EVENT_SCHEMA))
    sink.write(pa.Table.from_pylist([ev(40 + i, "d", i) for i in (2, 5)], schema=EVENT_SCHEMA))
    return data_dir


EXPECTED = sorted([(1, "w1"), (3, "w3")] + [(i, f"v{i}") for i in (4, 6, 7, 8, 9, 10)])


def plain_glob_rows(data_dir: str) -> int:
    files = glob.glob(os.path.join(mirror_dir(data_dir, SOURCE, T), "**", "*.parquet"), recursive=True)
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files if "_delta_log" not in f)


def test_every_reader_sees_the_live_rows_only(mirror, spark):
    assert plain_glob_rows(mirror) > len(EXPECTED)  # what a folder glob would wrongly read
    pyarrow_rows = sorted((r["id"], r["v"]) for r in read_mirror(mirror, SOURCE, T).to_pylist())
    spark_rows = sorted((r["id"], r["v"]) for r in mirror_readers.read_spark(spark, mirror, SOURCE, T).collect())
    import duckdb

    duck_rows = sorted(mirror_readers.read_duckdb(duckdb.connect(), mirror, SOURCE, T).fetchall())
    pandas_rows = sorted(mirror_readers.read_pandas(mirror, SOURCE, T)[["id", "v"]].itertuples(index=False, name=None))
    assert pyarrow_rows == spark_rows == duck_rows == pandas_rows == EXPECTED
    with_meta = mirror_readers.read_spark(spark, mirror, SOURCE, T, meta=True)
    assert {"__key", "__position"} <= set(with_meta.columns) and "__deleted" not in with_meta.columns


def test_compaction_and_vacuum_leave_a_plain_folder_with_the_current_files(mirror):
    compact(mirror, SOURCE, T, retention_hours=0)  # tests only: production keeps >= 1 h
    files = mirror_readers.live_files(mirror, SOURCE, T)
    on_disk = [f for f in glob.glob(os.path.join(mirror_dir(mirror, SOURCE, T), "**", "*.parquet"), recursive=True)
               if "_delta_log" not in f]
    assert sorted(os.path.basename(f) for f in on_disk) == sorted(os.path.basename(f) for f in files)
    assert plain_glob_rows(mirror) == len(EXPECTED)  # tombstones compacted, old versions vacuumed
    assert sorted((r["id"], r["v"]) for r in read_mirror(mirror, SOURCE, T).to_pylist()) == EXPECTED


def test_an_absent_mirror_reads_empty(tmp_path, spark):
    assert mirror_readers.live_files(str(tmp_path), SOURCE, T) == []
    assert mirror_readers.read_spark(spark, str(tmp_path), SOURCE, T).count() == 0


def test_a_broken_bucket_count_is_a_clear_error_and_nothing_is_written(mirror):
    from airflow_provider_cdc.core.errors import ConfigurationError
    from airflow_provider_cdc.sinks.mirror_table import _delta, _set_properties

    path = mirror_dir(mirror, SOURCE, T)
    before = read_mirror(mirror, SOURCE, T).to_pylist()
    _set_properties(_delta(path), {"cdc.buckets": "many"})
    version = _delta(path).version()
    with pytest.raises(ConfigurationError, match=r"table property cdc\.buckets \('many'"):
        MirrorDeltaSink(mirror, SOURCE).write(pa.Table.from_pylist([ev(90, "u", 1, "x")], schema=EVENT_SCHEMA))
    with pytest.raises(ConfigurationError, match=r"table property cdc\.buckets \('many'"):
        read_mirror(mirror, SOURCE, T)  # a reader needs the bucket tree too, and says so
    assert _delta(path).version() == version
    _set_properties(_delta(path), {"cdc.buckets": "8"})
    assert read_mirror(mirror, SOURCE, T).to_pylist() == before


def test_the_typed_event_log_reads_across_an_add_column_as_the_readme_says(tmp_path, spark):
    """Event-log files written before and after an ADD COLUMN have different ``after`` structs;
    Spark (mergeSchema), duckdb (union_by_name) and pyarrow (unified schema) read them as one."""
    import duckdb
    import pyarrow.dataset as ds

    from airflow_provider_cdc.sinks.event_log import EventLogSink, table_dir
    from airflow_provider_cdc.storage.layout import log_schema_path

    data = str(tmp_path)
    storage.write_text(log_schema_path(data, SOURCE, T), SCHEMA.to_json())
    EventLogSink(data, SOURCE).write(pa.Table.from_pylist([ev(1, "c", 1, "a")], schema=EVENT_SCHEMA))
    wider = TableSchema(T, (*SCHEMA.columns, Column("n", "int32")), ("id",))
    storage.write_text(log_schema_path(data, SOURCE, T), wider.to_json())
    row = ev(2, "c", 2) | {"after": encode_row({"id": 2, "v": "b", "n": 7})}
    EventLogSink(data, SOURCE).write(pa.Table.from_pylist([row], schema=EVENT_SCHEMA))
    folder = table_dir(data, SOURCE, T)
    want = [(1, "a", None), (2, "b", 7)]

    got = spark.read.option("mergeSchema", True).parquet(folder).select("after.id", "after.v", "after.n").collect()
    assert sorted(tuple(r) for r in got) == want
    got = duckdb.sql(f"SELECT after.id, after.v, after.n FROM read_parquet('{folder}/*.parquet', union_by_name=true)")
    assert sorted(got.fetchall()) == want
    files = sorted(glob.glob(os.path.join(folder, "*.parquet")))
    unified = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    t = ds.dataset(files, schema=unified, format="parquet").to_table()
    assert sorted((r["id"], r["v"], r["n"]) for r in t["after"].to_pylist()) == want
