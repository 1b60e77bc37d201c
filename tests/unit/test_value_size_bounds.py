"""Memory does not depend on value size beyond the value (issue 32): building an array from
buffers costs a small constant per value (core/arrow_types.gather_slices, the bytea hex
decode of dialects/postgres/pgcopy), and chunk batches are bounded in bytes as well as rows
(``batch_max_bytes``: the generic read through MySQL's unbuffered cursor here; the
PostgreSQL COPY read and both databases for real in tests/integration/test_chunk_batch_bytes.py)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.core.arrow_types import gather_slices, slices_array
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema
from airflow_provider_cdc.dialects import ChunkRead, ConnectionParams, get_dialect
from airflow_provider_cdc.dialects.base import DEFAULT_BATCH_MAX_BYTES, value_bytes
from airflow_provider_cdc.dialects.mysql import bounded_batches
from airflow_provider_cdc.dialects.postgres import pgcopy

MB = 2**20


def _reference(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The former implementation (an int64 index per byte): what the results must equal."""
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if not total:
        return np.zeros(0, dtype=np.uint8), offsets
    return buf[np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)], offsets


def _same(buf, starts, lengths) -> None:
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    got, got_off = gather_slices(buf, starts, lengths)
    want, want_off = _reference(buf, starts, lengths)
    assert got.dtype == np.uint8 and got_off.dtype == np.int64
    assert got.tobytes() == want.tobytes()
    assert got_off.tolist() == want_off.tolist()


@pytest.fixture(params=["take", "small"], autouse=False)
def gather_path(request, monkeypatch):
    """Both paths of gather_slices: Arrow's take (any size past a few KB; forced here on
    small inputs) and the one numpy gather of a few KB."""
    from airflow_provider_cdc.core import arrow_types

    if request.param == "take":
        monkeypatch.setattr(arrow_types, "_SMALL_GATHER", 0)
    return request.param


def test_gather_slices_equals_the_per_byte_gather_on_random_layouts(gather_path):
    rng = np.random.default_rng(7)
    buf = rng.integers(0, 256, 50_000, dtype=np.uint8)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        lengths = rng.integers(0, 300, n)
        lengths[rng.random(n) < 0.3] = 0  # nulls and empty values
        gaps = rng.integers(0, 6, n)  # headers between values, sometimes none
        starts = np.cumsum(gaps) + np.concatenate(([0], np.cumsum(lengths)[:-1]))
        # an empty range (a null) may point anywhere: pgoutput's nulls start at their kind byte
        wild = (lengths == 0) & (rng.random(n) < 0.5)
        starts = np.where(wild, rng.integers(0, 50_000, n), starts)
        if int((starts + lengths).max()) > len(buf):
            continue
        _same(buf, starts, lengths)


def test_gather_slices_edge_cases(gather_path):
    buf = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    _same(buf, [], [])  # no range
    _same(buf, [3, 9], [0, 0])  # only empty ranges
    _same(buf, [0], [16])  # the whole buffer
    _same(buf, [5, 2, 7], [0, 3, 0])  # empty ranges around one, pointing before and after it
    _same(buf, [10, 0, 4], [3, 2, 5])  # out of order: the per-range copy
    _same(buf, [0, 2, 1], [4, 4, 9])  # overlapping
    _same(buf, [16, 0], [0, 16])  # an empty range at the very end, then the whole buffer
    # the result builds the same string array as before
    data, offsets = gather_slices(buf, np.array([0, 4, 4]), np.array([4, 0, 2]))
    arr = slices_array(pa.string(), data, offsets, np.array([True, False, True]))
    assert arr.to_pylist() == ["0123", None, "45"]
    with pytest.raises(ValueError, match="negative"):
        gather_slices(buf, np.array([0]), np.array([-1]))
    with pytest.raises(IndexError):
        gather_slices(buf, np.array([10]), np.array([10]))


def _traced_peak(fn):
    """(result, peak bytes allocated while ``fn`` ran: numpy and Python through tracemalloc,
    plus what Arrow's memory pool holds after it, which tracemalloc does not see)."""
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak + max(pa.total_allocated_bytes() - arrow_before, 0)


def test_gather_slices_of_one_large_value_costs_the_value_not_an_index_per_byte():
    size = 32 * MB
    buf = np.zeros(size + 10, dtype=np.uint8)
    buf[5:5 + size] = 7
    starts, lengths = np.array([2, 5], dtype=np.int64), np.array([3, size], dtype=np.int64)
    (data, offsets), peak = _traced_peak(lambda: gather_slices(buf, starts, lengths))
    assert len(data) == size + 3 and offsets.tolist() == [0, 3, size + 3]
    assert peak < 2.5 * size, f"{peak / MB:.0f} MB for one {size / MB:.0f} MB value"  # was ~16x
    # the per-range copy (ranges out of order) is bounded the same way
    (data2, _), peak2 = _traced_peak(lambda: gather_slices(buf, starts[::-1].copy(), lengths[::-1].copy()))
    assert len(data2) == size + 3 and peak2 < 2.5 * size


def _hex_column(values: list[bytes | None]) -> pa.Array:
    return pa.array([None if v is None else "\\x" + v.hex() for v in values], pa.string())


def test_bytea_hex_decode_is_byte_identical_across_blocks(monkeypatch, gather_path):
    rng = np.random.default_rng(3)
    values = [rng.integers(0, 256, int(k), dtype=np.uint8).tobytes() for k in rng.integers(0, 40, 50)]
    values[3] = None
    values[7] = b""
    values.insert(10, rng.integers(0, 256, 1000, dtype=np.uint8).tobytes())  # larger than a block
    monkeypatch.setattr(pgcopy, "HEX_BLOCK_BYTES", 64)  # many runs, and one value in parts
    got = pgcopy._typed_binary(_hex_column(values))
    assert got.type == pa.binary() and got.to_pylist() == values
    upper = pa.array(["\\x" + values[10].hex().upper()], pa.string())  # upper-case hex digits too
    assert pgcopy._typed_binary(upper).to_pylist() == [values[10]]
    # a non-hex digit inside a part, or the escape format: the decoder's path (None)
    assert pgcopy._typed_binary(pa.array(["\\x" + "00" * 100 + "zz"], pa.string())) is None
    assert pgcopy._typed_binary(pa.array(["ab\\000"], pa.string())) is None


def test_bytea_hex_decode_of_one_large_value_costs_the_value():
    size = 16 * MB
    value = bytes(range(256)) * (size // 256)
    col = _hex_column([value])
    out, peak = _traced_peak(lambda: pgcopy._typed_binary(col))
    assert out[0].as_buffer() == value
    # the output and one block of digits and their values; the former decode held the
    # digits, an int64 index per digit and several whole-size temporaries (> 20x)
    assert peak < 2.5 * size, f"{peak / MB:.0f} MB for one {size / MB:.0f} MB value"


# --------------------------------------------------------------------------- batches in bytes
class _Cursor:
    """An unbuffered cursor's fetch: one row at a time."""

    def __init__(self, rows):
        self.rows = list(rows)
        self.fetched = 0

    def fetchone(self):
        if self.fetched == len(self.rows):
            return None
        self.fetched += 1
        return self.rows[self.fetched - 1]


def test_value_bytes_counts_text_and_bytes_only():
    assert value_bytes((1, "abc", b"\x00" * 5, None, 2.5, bytearray(2))) == 10


def test_bounded_batches_end_at_the_byte_bound_or_the_row_count():
    big = b"x" * (8 * MB)
    rows = [(i, big) for i in range(5)] + [(i, "s") for i in range(5, 9)]
    sizes = [len(b) for b in bounded_batches(_Cursor(rows), 1000, 20 * MB)]
    assert sizes == [3, 2 + 4]  # 24 MB with the third row; then 16 MB and the small rows to the end
    assert [len(b) for b in bounded_batches(_Cursor(rows), 2, 20 * MB)] == [2, 2, 2, 2, 1]
    assert [len(b) for b in bounded_batches(_Cursor(rows), 1000, 1)] == [1] * 5 + [1] * 4
    assert list(bounded_batches(_Cursor([]), 10, 10)) == []


class _FakeConn:
    def __init__(self, rows, seen):
        self._rows, self._seen = rows, seen

    def cursor(self):
        conn = self

        class Cur(_Cursor):
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def execute(self, sql, params):
                conn._seen.append(sql)

            def fetchmany(self, n):
                out = []
                while len(out) < n and (row := self.fetchone()) is not None:
                    out.append(row)
                return out

        return Cur(self._rows)

    def close(self):
        pass


def _mysql_chunk(tmp_path, rows, name: str, **options):
    schema = TableSchema(TableName("db", "t"), (Column("id", "int64", "bigint"), Column("v", "binary", "longblob")), ("id",))
    d = get_dialect(ConnectionParams.from_uri("mysql://root@127.0.0.1:1/db"), source="s", tables=[schema.table], **options)
    seen: list[str] = []
    d.server.connect = lambda **kw: _FakeConn(rows, seen)
    path = str(tmp_path / f"{name}.parquet")
    res = d.read_chunk(ChunkRead(schema, FULL_RANGE, after_key=None, limit=100, path=path))
    return res, pq.ParquetFile(path)


def test_generic_chunk_read_flushes_batches_by_bytes(tmp_path):
    rows = [(i, bytes([i]) * (3 * MB)) for i in range(1, 5)] + [(i, b"s") for i in range(5, 8)]
    small, f_small = _mysql_chunk(tmp_path, rows, "small", batch_max_bytes=4 * MB)
    whole, f_whole = _mysql_chunk(tmp_path, rows, "whole")
    assert (small.rows, small.last_key) == (whole.rows, whole.last_key) == (7, (7,))
    # 4 MB: every second 3 MB value ends a batch (two batches), then the small rows; the
    # default bound: one batch. Each batch is one row group of the staged chunk
    assert f_small.metadata.num_row_groups == 3 and f_whole.metadata.num_row_groups == 1
    a, b = f_small.read(), f_whole.read()
    assert a.equals(b)
    assert [r["v"] for r in a.column("after").to_pylist()] == [v for _, v in rows]
    # no min/max statistics of the values (they copy a large value several times), kept for
    # the key and the fixed-size columns
    rg = f_small.metadata.row_group(0)
    stats = {rg.column(i).path_in_schema: rg.column(i).is_stats_set for i in range(rg.num_columns)}
    assert stats == {"key": True, "after.id": True, "after.v": False}


def test_statistics_columns():
    from airflow_provider_cdc.core.arrow_types import statistics_columns

    schema = pa.schema([("key", pa.string()), ("position", pa.string()), ("ts", pa.timestamp("us")),
                        ("after", pa.struct([("id", pa.int64()), ("v", pa.binary()), ("s", pa.large_string()),
                                             ("n", pa.struct([("d", pa.decimal128(5, 2)), ("t", pa.string())])),
                                             ("l", pa.list_(pa.int64()))]))])
    assert statistics_columns(schema, ("key",)) == ["key", "ts", "after.id", "after.n.d"]


def test_batch_max_bytes_option():
    p = ConnectionParams.from_uri("mysql://root@127.0.0.1:1/db")
    assert get_dialect(p, source="s", tables=[TableName("db", "t")]).batch_max_bytes == DEFAULT_BATCH_MAX_BYTES
    assert get_dialect(p, source="s", tables=[TableName("db", "t")], batch_max_bytes="1000").batch_max_bytes == 1000
    with pytest.raises(ConfigurationError, match="batch_max_bytes"):
        get_dialect(p, source="s", tables=[TableName("db", "t")], batch_max_bytes=0)
    pg = ConnectionParams.from_uri("postgresql://postgres@127.0.0.1:1/db")
    assert get_dialect(pg, source="s", tables=[TableName("public", "t")], batch_max_bytes=5).batch_max_bytes == 5
