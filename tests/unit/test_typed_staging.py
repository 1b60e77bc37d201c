"""Typed staging (storage/staged.py): chunks and segments hold the table's typed columns, the
engines hand them to the sinks as they are, and nothing on the merge or apply path parses
JSON."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core import arrow_types as at
from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.sinks.base import join_table_events
from airflow_provider_cdc.sinks.event_log import EventLogSink, read_events
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import changelog_dir, chunk_path, schema_path
from airflow_provider_cdc.storage.staged import (
    ChunkWriter,
    atomic_write_table,
    read_chunk_rows,
    read_log_events,
    segment_tables,
    write_segment,
)

pytestmark = pytest.mark.unit

SOURCE = "src"
A = TableName("public", "a'b %s; é")
B = TableName("shop", "b")
A_SCHEMA = TableSchema(A, (Column("id", "int64"), Column("price", "decimal(12,2)"), Column("at", "timestamptz"),
                           Column("d", "date"), Column("blob", "binary"), Column("tags", "array<int32>")), ("id",))
B_SCHEMA = TableSchema(B, (Column("code", "string"), Column("n", "int32")), ("code",))


def a_row(i: int, v: int = 0) -> dict:
    return {"id": i, "price": f"{i}.{v:02d}", "at": f"2024-01-0{1 + v}T12:00:00.000001Z", "d": "2024-02-03",
            "blob": "AAEC/w==", "tags": [i, v]}


def change(table: TableName, op: str, key, pos: int, after: dict | None, before: dict | None = None) -> ChangeEvent:
    return ChangeEvent(table.id, op, encode_key(key), Position(pos), before, after, ts_ms=pos)


def test_a_segment_holds_each_tables_typed_columns_and_the_schema_it_was_typed_with(tmp_path):
    d = str(tmp_path)
    events = [WatermarkEvent("lw", Position(1), 1), change(A, "c", [1], 2, a_row(1)), change(B, "c", ["x"], 3, {"code": "x", "n": 7}),
              change(A, "d", [1], 4, None, {"id": 1})]
    path = write_segment(events, d, "cdc.watermark", {A.id: A_SCHEMA, B.id: B_SCHEMA})
    t = pq.read_table(path)
    assert "after" not in t.column_names and "before" not in t.column_names  # no JSON text images
    assert t.schema.field("after_0").type == pa.struct([pa.field(c.name, at.arrow_type(c.type)) for c in A_SCHEMA.columns])
    assert t.schema.field("after_1").type == pa.struct([("code", pa.string()), ("n", pa.int32())])
    assert [(tid, s, text) for tid, s, text in segment_tables(t.schema.metadata)] == [(A.id, A_SCHEMA, []), (B.id, B_SCHEMA, [])]
    assert t["after_0"].to_pylist()[1]["price"] == Decimal("1.00")
    assert t["after_0"].is_valid().to_pylist() == [False, True, False, False]  # other tables' rows and the delete: null
    # the canonical form comes back unchanged (the reference engine and checks read it)
    got = [(e.table, e.op, e.before, e.after) for e in read_log_events(d) if isinstance(e, ChangeEvent)]
    assert got == [(A.id, "c", None, a_row(1)), (B.id, "c", None, {"code": "x", "n": 7}), (A.id, "d", {"id": 1}, None)]


def test_a_chunk_is_typed_and_a_value_its_type_cannot_hold_makes_that_column_text_in_the_whole_file(tmp_path):
    path = str(tmp_path / "c.parquet")
    schema = TableSchema(A, (Column("id", "int64"), Column("price", "decimal(12,2)")), ("id",))
    with ChunkWriter(schema, path) as w:  # one row group per batch: the first is written typed
        w.add(pa.array(["[1]"]), pa.array([encode_row({"id": 1, "price": "1.50"})]))
        w.add(pa.array(["[2]"]), [{"id": 2, "price": "NaN"}])  # numeric NaN: no decimal128 holds it
        w.add(pa.array(["[3]"]), pa.array([encode_row({"id": 3, "price": "3.00"})]))
    assert w.rows == 3
    t = pq.read_table(path)
    assert t.schema.field("after").type == pa.struct([("id", pa.int64()), ("price", pa.string())])
    assert at.metadata_schema(t.schema.metadata) == (schema, ["price"])
    assert read_chunk_rows(path, A.id) == [("[1]", {"id": 1, "price": "1.50"}), ("[2]", {"id": 2, "price": "NaN"}),
                                           ("[3]", {"id": 3, "price": "3.00"})]


def test_images_typed_at_different_positions_join_under_the_newest_columns():
    """ADD COLUMN between two segments: one table, every column; a column whose older values
    the newer type cannot hold (INT -> TEXT with text values later) becomes text."""
    old = TableSchema(B, (Column("code", "string"), Column("n", "int32")), ("code",))
    new = TableSchema(B, (Column("code", "string"), Column("n", "int64"), Column("extra", "date")), ("code",))

    def part(schema, rows, pos):
        events = pa.table({"position": [Position(p).encode() for p in pos], "table": [B.id] * len(rows),
                           "op": ["c"] * len(rows), "key": [encode_key([r["code"]]) for r in rows],
                           "before": pa.nulls(len(rows), pa.string()),
                           "after": [encode_row(r) for r in rows]})
        from airflow_provider_cdc.sinks.base import type_json_events

        return type_json_events(B.id, events, schema)

    joined = join_table_events([part(old, [{"code": "a", "n": 1}], [1]),
                                part(new, [{"code": "b", "n": 2**40, "extra": "2024-01-01"}], [2])])
    assert len(joined) == 1
    te = joined[0]
    assert te.events.schema.field("after").type == pa.struct([("code", pa.string()), ("n", pa.int64()), ("extra", pa.date32())])
    assert te.canonical("after") == [{"code": "a", "n": 1}, {"code": "b", "n": 2**40, "extra": "2024-01-01"}]
    texty = TableSchema(B, (Column("code", "string"), Column("n", "int32")), ("code",))
    joined = join_table_events([part(texty, [{"code": "a", "n": 1}], [1]),
                                part(texty, [{"code": "b", "n": "two"}], [2])])  # "two" became text in its part
    te = joined[0]
    assert "n" in te.text_columns and te.canonical("after") == [{"code": "a", "n": "1"}, {"code": "b", "n": "two"}]


CHUNK_ROWS = 1000  # enough rows that a parse per row would dwarf the per-file and per-commit metadata


def _stage_round(d: str) -> list[ChunkResult]:
    for s in (A_SCHEMA, B_SCHEMA):
        storage.write_text(schema_path(d, SOURCE, s.table), s.to_json())
    path = chunk_path(d, SOURCE, A, "snap", 1, "hw")
    ids = range(1, CHUNK_ROWS + 1)
    with ChunkWriter(A_SCHEMA, path) as w:
        w.add(pa.array([encode_key([i]) for i in ids]), pa.array([encode_row(a_row(i)) for i in ids]))
    log = [WatermarkEvent("lw", Position(10), 10), change(A, "u", [2], 11, a_row(2, 1), a_row(2)),
           WatermarkEvent("hw", Position(12), 12), change(A, "d", [3], 13, None, {"id": 3}),
           change(B, "c", ["x"], 14, {"code": "x", "n": 7})]
    write_segment(log, changelog_dir(d, SOURCE), "cdc.watermark", {A.id: A_SCHEMA, B.id: B_SCHEMA})
    return [ChunkResult(SOURCE, A.id, "snap", 1, "lw", "hw", path, ChunkRange(), None, (CHUNK_ROWS,), CHUNK_ROWS, True)]


def test_merge_and_apply_of_typed_staging_parse_no_json(tmp_path, monkeypatch):
    """Every decoder of JSON images is made to fail, and ``json.loads`` is counted: a merge
    round of a 300-row chunk and an apply over typed staging write the event log and the
    mirror with the right rows, and parse JSON only for file metadata (a few calls per file,
    none per row)."""
    d = str(tmp_path)
    chunks = _stage_round(d)

    def no_json(*_a, **_k):
        raise AssertionError("JSON images parsed on the merge/apply path")

    import json as json_module

    import pyarrow.json as pa_json

    from airflow_provider_cdc.core import schema as core_schema
    from airflow_provider_cdc.sinks import mirror_delta

    for target, name in ((pa_json, "read_json"), (core_schema, "decode_row"), (core_schema, "decode_key"),
                         (mirror_delta, "decode_key"), (at, "json_rows_to_struct"), (at, "json_rows_to_arrays")):
        monkeypatch.setattr(target, name, no_json)
    calls = [0]
    loads = json_module.loads

    def counted(*a, **k):
        calls[0] += 1
        return loads(*a, **k)

    monkeypatch.setattr(json_module, "loads", counted)
    sinks = [EventLogSink(d, SOURCE), MirrorDeltaSink(d, SOURCE)]
    merged = arrow_engine.merge_round(chunks, data_dir=d, source=SOURCE, sinks=sinks)
    applied = arrow_engine.apply_changelog(d, SOURCE, sinks)
    monkeypatch.undo()
    assert calls[0] < CHUNK_ROWS // 5, f"json.loads called {calls[0]} times for {CHUNK_ROWS} rows"
    assert merged["emitted"] == CHUNK_ROWS - 1 and applied["events"] == 3  # key 2 changed inside the window: dropped
    mirror = sorted(read_mirror(d, SOURCE, A).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["price"]) for r in mirror[:3]] == [(1, Decimal("1.00")), (2, Decimal("2.01")), (4, Decimal("4.00"))]
    assert len(mirror) == CHUNK_ROWS - 1  # 3 deleted
    assert read_mirror(d, SOURCE, B).to_pylist()[0]["n"] == 7
    ops = sorted((r["op"], r["key"]) for r in read_events(d, SOURCE, A).to_pylist() if r["op"] != "r")
    assert ops == [("d", "[3]"), ("u", "[2]")]


def test_staged_files_without_their_typed_metadata_are_refused_by_name(tmp_path):
    """Staged files carry the schema they were typed with; JSON-text files (before the first
    release) are not read, and the error names the file and what to do."""
    from airflow_provider_cdc.core.errors import StateError
    from airflow_provider_cdc.core.event_batch import SEGMENT_SCHEMA
    from airflow_provider_cdc.storage.staged import read_chunk, segment_images

    path = str(tmp_path / "chunk.parquet")
    atomic_write_table(pa.table({"key": ["[1]"], "after": [encode_row(a_row(1))]}), path)
    with pytest.raises(StateError, match=f"{path} names no schema.*start a new one"):
        read_chunk(path, A.id)
    old = pa.Table.from_pylist([{"position": Position(1).encode(), "table": A.id, "op": "c", "key": "[1]",
                                 "before": None, "after": encode_row(a_row(1))}], schema=pa.schema(
        [*(SEGMENT_SCHEMA.field(c) for c in ("position", "table", "op", "key")),
         ("before", pa.string()), ("after", pa.string())]))
    with pytest.raises(StateError, match="without the cdc.tables metadata"):
        segment_images(old)
