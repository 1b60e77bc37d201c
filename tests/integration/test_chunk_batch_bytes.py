"""Chunk batches bounded in bytes (``batch_max_bytes``, issue 32) on the real databases: rows
holding 6 MB values are written in more, smaller batches (one Parquet row group each) and
the staged chunk is the same as with the default bound; PostgreSQL's COPY read and the
generic read through MariaDB's unbuffered cursor."""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ChunkRead, ConnectionParams, get_dialect

MB = 2**20
VALUES = [bytes([i]) * (6 * MB) for i in (1, 2, 3)] + [b"", None, b"\x00small"]


def _table(uri: str, kind: str, unique: str) -> TableName:
    from tools.workload import connect, default_table, quote_table

    t = default_table(uri, f"batch_bytes_{unique}")
    p = ConnectionParams.from_uri(uri)
    conn = connect(uri)
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {quote_table(p, t)} (id BIGINT PRIMARY KEY, v {'bytea' if kind == 'pg' else 'LONGBLOB'})")
        for i, v in enumerate(VALUES, 1):
            if kind == "pg" and v is not None:
                import psycopg2

                v = psycopg2.Binary(v)
            cur.execute(f"INSERT INTO {quote_table(p, t)} VALUES (%s, %s)", (i, v))
            conn.commit()
    finally:
        conn.close()
    return t


def _read(uri: str, t: TableName, path: str, **options) -> tuple[int, pq.ParquetFile]:
    with get_dialect(ConnectionParams.from_uri(uri), source="batch_bytes", tables=[t], **options) as d:
        res = d.read_chunk(ChunkRead(d.describe_table(t), FULL_RANGE, after_key=None, limit=100, path=path))
    assert (res.rows, res.last_key) == (len(VALUES), (len(VALUES),))
    return res.rows, pq.ParquetFile(path)


@pytest.mark.parametrize("kind", ["pg", "mysql"])
def test_large_values_flush_batches_by_bytes(kind, request, tmp_path, unique_name):
    from tools.workload import drop_table

    uri = request.getfixturevalue("pg_uri" if kind == "pg" else "mysql_uri")
    t = _table(uri, kind, unique_name)
    try:
        _, bounded = _read(uri, t, str(tmp_path / "bounded.parquet"), batch_max_bytes=10 * MB)
        _, whole = _read(uri, t, str(tmp_path / "whole.parquet"))
        # PostgreSQL's COPY text holds a value as hex (12 MB): each large row is a batch, then
        # the small rows; MariaDB counts the 6 MB values: a batch ends at the second of two
        want = 4 if kind == "pg" else 2
        assert bounded.metadata.num_row_groups == want
        assert whole.metadata.num_row_groups == 1
        a, b = bounded.read(), whole.read()
        assert a.equals(b)
        assert [r["v"] for r in a.column("after").to_pylist()] == VALUES
        if kind == "pg":  # the generic path (no byte bound on PostgreSQL's named cursor): the same chunk
            _, generic = _read(uri, t, str(tmp_path / "generic.parquet"), fast_chunks=False)
            assert generic.read().equals(b)
    finally:
        drop_table(uri, t)
