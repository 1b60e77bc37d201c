"""Sinks without Spark: typed decoding, the event log's idempotent files, the Delta mirror's
position guard and tombstones (against core.window.mirror_apply, the reference), and the
PostgreSQL mirror against the real server."""

from __future__ import annotations

import base64
import itertools
import json
import math
import random
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.core.arrow_types import decode_column, mirror_schema, rows_to_table
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.core.window import mirror_apply, mirror_rows
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.event_log import EventLogSink, canonical_images, file_schema, read_events
from airflow_provider_cdc.sinks.mirror_compaction import compact
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink, newest_per_key
from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink
from airflow_provider_cdc.sinks.mirror_readers import read_mirror, read_mirror_raw
from airflow_provider_cdc.storage.layout import events_dir, log_schema_path, mirror_dir, schema_path

SOURCE = "s"
T = TableName("public", "typed")
TYPED = TableSchema(
    T,
    (
        Column("id", "int64"),
        Column("flag", "bool"),
        Column("small", "int16"),
        Column("big", "uint64"),
        Column("f4", "float32"),
        Column("f8", "float64"),
        Column("money", "decimal(38,10)"),
        Column("huge", "decimal(60,2)"),
        Column("anynum", "decimal"),
        Column("name", "string"),
        Column("bin", "binary"),
        Column("d", "date"),
        Column("tm", "time"),
        Column("ts", "timestamp"),
        Column("tstz", "timestamptz"),
        Column("u", "uuid"),
        Column("doc", "json"),
        Column("arr", "array<int32>"),
    ),
    ("id",),
)


def typed_row(i: int, v: int = 0) -> dict:
    return {
        "id": i,
        "flag": bool((i + v) % 2),
        "small": -32768 if i == 1 else i,
        "big": 18446744073709551615 if i == 1 else i * 1000 + v,
        "f4": 1.5,
        "f8": ["NaN", "Infinity", "-Infinity", 0.1][i % 4],
        "money": "1234567890123456789012345678.0123456789",
        "huge": "1" * 58 + ".25",
        "anynum": "3.14159265358979323846264338327950288419716939937510",
        "name": f"naïve 名前 {i}/{v}",
        "bin": base64.b64encode(bytes([0, 255, i % 256, v % 256])).decode(),
        "d": "0001-01-01" if i == 1 else "2024-02-29",
        "tm": "-838:59:59.000000" if i == 1 else "23:59:59.999999",
        "ts": "2024-03-31T02:30:00.000001",
        "tstz": "1999-12-31T23:59:59.999999Z",
        "u": "123e4567-e89b-12d3-a456-426614174000",
        "doc": '{"b": 1, "a": [true, null]}',
        "arr": [[1, 2], [3, 4]] if i == 1 else [i, v],
    }


def ev(pos: int, op: str, key, after: dict | None, *, table: TableName = T, batch: str = "b", snapshot=False, wm=None):
    return {
        "position": Position(pos).encode(), "table": table.id, "op": op, "key": encode_key([key]), "before": None,
        "after": None if after is None else encode_row(after), "ts_ms": pos, "watermark": wm, "snapshot": snapshot,
        "batch": batch,
    }


def stage_schema(data_dir: str, schema: TableSchema) -> None:
    p = Path(schema_path(data_dir, SOURCE, schema.table))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(schema.to_json())


# --- typed decoding --------------------------------------------------------------------------
def test_every_logical_type_decodes_without_loss():
    rows = [typed_row(1), typed_row(2, 5)]
    t = pa.Table.from_arrays(rows_to_table(TYPED, rows), schema=pa.schema([mirror_schema(TYPED).field(c) for c in TYPED.column_names]))
    r1, r2 = t.to_pylist()
    assert t.schema.field("money").type == pa.decimal128(38, 10) and r1["money"] == Decimal("1234567890123456789012345678.0123456789")
    assert t.schema.field("huge").type == pa.string() and r1["huge"] == "1" * 58 + ".25"  # beyond decimal128: exact text
    assert r1["anynum"] == typed_row(1)["anynum"]
    assert r1["big"] == Decimal(18446744073709551615) and r1["small"] == -32768
    assert r1["f8"] == math.inf and r2["f8"] == -math.inf
    assert math.isnan(decode_column(["NaN", 0.1], "float64").to_pylist()[0])
    assert r1["bin"] == bytes([0, 255, 1, 0])
    assert r1["d"] == date(1, 1, 1) and r1["tm"] == "-838:59:59.000000"
    assert r1["ts"] == datetime(2024, 3, 31, 2, 30, 0, 1) and t.schema.field("ts").type == pa.timestamp("us")
    assert r1["tstz"] == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert t.schema.field("tstz").type == pa.timestamp("us", tz="UTC")
    assert r1["doc"] == '{"b": 1, "a": [true, null]}' and json.loads(r1["arr"]) == [[1, 2], [3, 4]]
    assert r1["name"] == "naïve 名前 1/0"


def test_bad_canonical_value_names_table_and_column():
    with pytest.raises(ConfigurationError, match=r"public\.typed, column 'money'"):
        rows_to_table(TYPED, [{**typed_row(1), "money": "not a number"}])
    with pytest.raises(ConfigurationError):
        decode_column(["x"], "int32")
    bad = TableSchema(T, (Column("id", "int64"), Column("__position", "string")), ("id",))
    with pytest.raises(ConfigurationError, match="reserves"):
        mirror_schema(bad)


def test_columns_differing_only_in_case_stop_the_mirror_with_their_names(tmp_path):
    """PostgreSQL holds "Þ" and "þ" as two columns; Delta Lake compares names without case and
    refuses the table (delta-rs: "Duplicate field name (case-insensitive)"). The mirror refuses
    first, naming the table and both columns, before anything is written."""
    from airflow_provider_cdc.sinks.mirror_fencing import reconcile_schema

    clash = TableSchema(T, (Column("id", "int64"), Column("Þ", "bool"), Column("þ", "bool")), ("id",))
    with pytest.raises(ConfigurationError, match=r"public\.typed has columns 'Þ' and 'þ'.*differ only in case"):
        mirror_schema(clash)
    # the changelog path: the table's events skip the mirror (logged), the other tables go on
    data = str(tmp_path)
    other = TableSchema(TableName("public", "other"), (Column("id", "int64"),), ("id",))
    for sch in (clash, other):
        stage_schema(data, sch)
    sink = MirrorDeltaSink(data, SOURCE, require_schema=False)
    sink.write(pa.Table.from_pylist([ev(1, "c", 1, {"id": 1, "Þ": True, "þ": False}),
                                     ev(2, "c", 1, {"id": 1}, table=other.table)], schema=EVENT_SCHEMA))
    assert "differ only in case" in sink.schema_stopped[T.id]
    assert read_mirror(data, SOURCE, other.table).num_rows == 1
    assert reconcile_schema(mirror_dir(data, SOURCE, T), clash, whole_table=True) == "none"  # nothing was created


# --- event log ----------------------------------------------------------------------------
def test_event_log_is_partitioned_enveloped_and_idempotent(tmp_path):
    other = TableName("sales", "orders")
    events = pa.Table.from_pylist(
        [ev(3, "u", 1, typed_row(1), batch="c-1-3"), ev(1, "c", 1, typed_row(1), batch="c-1-3"),
         ev(2, "c", "x", {"k": "x"}, table=other, batch="c-1-3"),
         ev(9, "r", 5, typed_row(5), batch="r-9-hw", snapshot=True, wm="hw")],
        schema=EVENT_SCHEMA,
    )
    stage_schema(str(tmp_path), TYPED)
    sink = EventLogSink(str(tmp_path), SOURCE, database="shop")
    sink.write(events)
    base = Path(events_dir(str(tmp_path), SOURCE))
    files = sorted(str(p.relative_to(base)) for p in base.rglob("*.parquet") if "_delta_log" not in p.parts)
    assert files == ["table=public.typed/c-1-3.parquet", "table=public.typed/r-9-hw.parquet", "table=sales.orders/c-1-3.parquet"]
    first = {f: pq.read_table(base / f).to_pylist() for f in files}
    rows = first["table=public.typed/c-1-3.parquet"]
    assert [r["source"]["position"] for r in rows] == [Position(1).encode(), Position(3).encode()]  # position order
    assert rows[0]["source"] == {"connector": None, "db": "shop", "schema": "public", "table": "typed", "position": Position(1).encode(),
                                 "snapshot": False, "watermark": None, "tx": None, "lsn": None, "last_commit_lsn": None,
                                 "server_id": None, "thread": None, "file": None,  # no origin staged for these
                                 "pos": None, "row": None}  # not a binlog source
    assert rows[1]["op"] == "u" and rows[1]["before"] is None
    typed = pq.read_table(base / files[0])
    # before/after: structs of the table's typed columns (the mirror's types), the schema in the file
    assert typed.schema.field("after").type == pa.struct(list(mirror_schema(TYPED))[: len(TYPED.columns)])
    assert file_schema(typed) == (TYPED, [])
    assert rows[1]["after"]["tstz"] == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert canonical_images(typed, "after")[1] == typed_row(1)  # every type round-trips without loss
    # a table with neither a log nor a staged schema: text columns named by its rows
    orders = pq.read_table(base / files[2])
    assert orders.schema.field("after").type == pa.struct([("k", pa.string())])
    snap = first["table=public.typed/r-9-hw.parquet"][0]
    assert snap["source"]["snapshot"] is True and snap["source"]["watermark"] == "hw"
    sink.write(events)  # a retried task: each batch's file replaced by one of the same contents
    from airflow_provider_cdc.sinks.event_log import event_files

    again = sorted(f"{d}/{n}" for d in ("table=public.typed", "table=sales.orders") for n in event_files(str(base / d)))
    # new names (version 0 still reads its own files), the same contents
    assert [re.sub(r"\.g1-[0-9a-f]{8}\.parquet$", ".parquet", f) for f in again] == files
    assert [pq.read_table(base / f).to_pylist() for f in again] == [first[f] for f in files]
    assert {f: pq.read_table(base / f).to_pylist() for f in files} == first
    assert len(read_events(str(tmp_path), SOURCE, TableName("public", "typed"))) == 3  # nothing twice
    assert not list(base.rglob("*.tmp"))


def test_event_log_types_events_with_the_log_schema_and_keeps_what_a_type_cannot_hold(tmp_path):
    """Capture's log schema wins over the staged one (it follows ADD/DROP COLUMN and type
    changes the mirror cannot); a value its column's type cannot hold (an event from before
    the column changed type) is kept as text in that file, in both images; a key-only
    before-image reads as its key."""
    data = str(tmp_path)
    staged = TableSchema(T, (Column("id", "int64"), Column("n", "int32")), ("id",))
    logged = TableSchema(T, (Column("id", "int64"), Column("n", "int32"), Column("gone", "string"),
                             Column("added", "date")), ("id",))
    stage_schema(data, staged)
    Path(log_schema_path(data, SOURCE, T)).parent.mkdir(parents=True, exist_ok=True)
    Path(log_schema_path(data, SOURCE, T)).write_text(logged.to_json())

    def event(pos, op, before, after, batch):
        return ev(pos, op, 1, after, batch=batch) | {"before": None if before is None else encode_row(before)}

    sink = EventLogSink(data, SOURCE)
    sink.write(pa.Table.from_pylist([
        event(1, "c", None, {"id": 1, "n": 5, "gone": "x"}, "c-1"),
        event(2, "u", {"id": 1}, {"id": 1, "n": 6, "added": "2024-01-02"}, "c-1"),
    ], schema=EVENT_SCHEMA))
    t = pq.read_table(Path(events_dir(data, SOURCE)) / f"table={T.path_segment}" / "c-1.parquet")
    assert t.schema.field("after").type == pa.struct([("id", pa.int64()), ("n", pa.int32()), ("gone", pa.string()),
                                                     ("added", pa.date32())])
    assert file_schema(t) == (logged, [])
    assert t["after"].to_pylist()[1] == {"id": 1, "n": 6, "gone": None, "added": date(2024, 1, 2)}
    assert canonical_images(t, "before") == [None, {"id": 1}]  # the key-only before-image of REPLICA IDENTITY DEFAULT

    sink.write(pa.Table.from_pylist([  # n became text at the source; these events straddle the change
        event(3, "u", {"id": 1, "n": 6}, {"id": 1, "n": "six"}, "c-3"),
        event(4, "u", {"id": 1, "n": "six"}, {"id": 1, "n": "7"}, "c-3"),
    ], schema=EVENT_SCHEMA))
    t = pq.read_table(Path(events_dir(data, SOURCE)) / f"table={T.path_segment}" / "c-3.parquet")
    assert t.schema.field("before").type.field("n").type == pa.string() == t.schema.field("after").type.field("n").type
    assert file_schema(t) == (logged, ["n"])
    assert [r["n"] for r in canonical_images(t, "before")] == ["6", "six"]
    assert [r["n"] for r in canonical_images(t, "after")] == ["six", "7"]
    # Delta holds one type per column: n became text in the table's typing, and the file written
    # before was rewritten under it in the same commit (its events as they were, n as text)
    ev_table = read_events(data, SOURCE, T)
    files = sorted(ev_table["file"].to_pylist())
    assert ev_table.num_rows == 4 and files[2:] == ["c-3.parquet"] * 2 and re.fullmatch(r"c-1\.g1-[0-9a-f]{8}\.parquet", files[0])
    folder = Path(events_dir(data, SOURCE)) / f"table={T.path_segment}"
    rewritten = pq.read_table(folder / files[0])
    assert file_schema(rewritten) == (logged, ["n"])
    assert canonical_images(rewritten, "after") == [{"id": 1, "n": "5", "gone": "x"}, {"id": 1, "n": "6", "added": "2024-01-02"}]
    from deltalake import DeltaTable

    plain = DeltaTable(str(folder)).to_pyarrow_table()
    assert sorted(plain["after"].to_pylist(), key=lambda r: r["n"]) == [
        {"id": 1, "n": "5", "gone": "x", "added": None}, {"id": 1, "n": "6", "gone": None, "added": date(2024, 1, 2)},
        {"id": 1, "n": "7", "gone": None, "added": None}, {"id": 1, "n": "six", "gone": None, "added": None}]


def test_the_event_log_keeps_columns_its_log_schema_lacks(tmp_path):
    """A column the staged schema has and the log schema not yet (added while no change of the
    table was captured; a snapshot's chunks read it) is typed from the staged schema; a column
    neither schema knows is kept as text, named in the file's metadata. Nothing in the events
    is dropped."""
    data = str(tmp_path)
    logged = TableSchema(T, (Column("id", "int64"), Column("n", "int32")), ("id",))
    staged = TableSchema(T, (*logged.columns, Column("added", "date")), ("id",))
    stage_schema(data, staged)
    Path(log_schema_path(data, SOURCE, T)).parent.mkdir(parents=True, exist_ok=True)
    Path(log_schema_path(data, SOURCE, T)).write_text(logged.to_json())
    rows = [ev(1, "r", 1, {"id": 1, "n": 5, "added": "2024-01-02"}, batch="r-1", snapshot=True),
            ev(2, "c", 2, {"id": 2, "n": 6, "added": "2024-01-03", "mystery": [1, "x"]}, batch="c-2")]
    EventLogSink(data, SOURCE).write(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA))
    folder = Path(events_dir(data, SOURCE)) / f"table={T.path_segment}"
    snap = pq.read_table(folder / "r-1.parquet")
    # one write types a table's events once: the snapshot row's file has the unknown column too (null)
    assert snap.schema.field("after").type == pa.struct([("id", pa.int64()), ("n", pa.int32()), ("added", pa.date32()),
                                                        ("mystery", pa.string())])
    assert canonical_images(snap, "after") == [{"id": 1, "n": 5, "added": "2024-01-02"}]
    change = pq.read_table(folder / "c-2.parquet")
    assert change.schema.field("after").type.field("mystery").type == pa.string()
    schema, text = file_schema(change)
    assert schema.column_names == ("id", "n", "added", "mystery") and text == []
    assert canonical_images(change, "after") == [{"id": 2, "n": 6, "added": "2024-01-03", "mystery": '[1,"x"]'}]


# --- Delta mirror ----------------------------------------------------------------------------
def _random_history(rnd: random.Random, keys: int, n: int) -> list[dict]:
    out, pos = [], 10
    for _ in range(n):
        pos += rnd.randint(1, 5)
        k = rnd.randint(1, keys)
        op = rnd.choice("cuudr")
        out.append(ev(pos, op, k, None if op == "d" else typed_row(k, pos), snapshot=op == "r"))
    return out


def _reference(events: list[dict]) -> dict:
    state: dict = {}
    mirror_apply(state, [
        ChangeEvent(e["table"], e["op"], e["key"], Position.decode(e["position"]), None, json.loads(e["after"]) if e["after"] else None)
        for e in events
    ])
    return mirror_rows(state, T.id)


def _typed_truth(rows: dict) -> list[dict]:
    ordered = [rows[k] for k in sorted(rows, key=lambda k: json.loads(k)[0])]
    if not ordered:
        return []
    return pa.Table.from_arrays(
        rows_to_table(TYPED, ordered), schema=pa.schema([mirror_schema(TYPED).field(c) for c in TYPED.column_names])
    ).to_pylist()


def _live(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])


def _eq(a: list[dict], b: list[dict]) -> bool:
    """Row lists equal, NaN == NaN."""
    return json.dumps(a, default=str, sort_keys=True) == json.dumps(b, default=str, sort_keys=True)


@pytest.mark.parametrize("seed", [7, 8])
def test_delta_mirror_converges_in_any_batch_order(tmp_path, seed):
    rnd = random.Random(seed)
    history = _random_history(rnd, keys=12, n=80)
    truth = _typed_truth(_reference(history))
    batches = [history[i : i + 13] for i in range(0, len(history), 13)]
    states = []
    for order_no, order in enumerate([batches, batches[::-1], rnd.sample(batches, len(batches))]):
        d = str(tmp_path / f"o{order_no}")
        stage_schema(d, TYPED)
        sink = MirrorDeltaSink(d, SOURCE)
        for b in order:
            sink.write(pa.Table.from_pylist(b, schema=EVENT_SCHEMA))
        sink.write(pa.Table.from_pylist(batches[0], schema=EVENT_SCHEMA))  # a replayed batch changes nothing
        live = _live(read_mirror(d, SOURCE, T).to_pylist())
        assert _eq(live, truth)
        states.append(read_mirror_raw(d, SOURCE, T).to_pylist())
    assert _eq(states[0], states[1]) and _eq(states[0], states[2])  # tombstones and positions alike


def test_tombstone_blocks_a_late_chunk_row_until_compaction(tmp_path):
    d = str(tmp_path)
    stage_schema(d, TYPED)
    sink = MirrorDeltaSink(d, SOURCE)
    sink.write(pa.Table.from_pylist([ev(5, "c", 1, typed_row(1)), ev(6, "c", 2, typed_row(2)), ev(20, "d", 1, None)], schema=EVENT_SCHEMA))
    sink.write(pa.Table.from_pylist([ev(10, "r", 1, typed_row(1, 1), snapshot=True)], schema=EVENT_SCHEMA))  # late chunk row
    assert [r["id"] for r in read_mirror(d, SOURCE, T).to_pylist()] == [2]
    meta = read_mirror(d, SOURCE, T, with_meta=True).to_pylist()
    assert meta[0]["__key"] == "[2]" and meta[0]["__position"] == Position(6).encode()
    assert compact(d, SOURCE, T, upto_position=Position(19).encode()) == 0  # tombstone newer than the bound
    assert compact(d, SOURCE, T) == 1
    assert [r["__key"] for r in read_mirror_raw(d, SOURCE, T).to_pylist()] == ["[2]"]
    with pytest.raises(ConfigurationError, match="upto_position"):
        compact(d, SOURCE, T, upto_position="1 OR true")


def test_newest_per_key_keeps_the_highest_position_per_table_and_key():
    other = TableName("x", "y")
    t = pa.Table.from_pylist(
        [ev(3, "u", 1, {"a": 3}), ev(1, "c", 1, {"a": 1}), ev(2, "c", 1, {"a": 2}, table=other), ev(7, "d", 2, None)],
        schema=EVENT_SCHEMA,
    )
    got = {(r["table"], r["key"]): r["position"] for r in newest_per_key(t).to_pylist()}
    assert got == {(T.id, "[1]"): Position(3).encode(), (other.id, "[1]"): Position(2).encode(), (T.id, "[2]"): Position(7).encode()}


def test_a_value_the_mirror_cannot_hold_stops_only_its_table_on_the_changelog_path(tmp_path):
    """numeric(p,s) NaN: the apply stops that table's mirror (naming table, column, key) and
    writes the others; a snapshot merge (fenced) fails instead; a whole-table re-snapshot
    (reconcile_schema) rebuilds the stopped mirror."""
    from airflow_provider_cdc.sinks.mirror_fencing import MergeFence, reconcile_schema, schema_stopped
    from airflow_provider_cdc.storage.layout import mirror_dir

    d = str(tmp_path)
    a, b = TableName("public", "a"), TableName("public", "b")
    for t in (a, b):
        stage_schema(d, TableSchema(t, (Column("id", "int64"), Column("n", "decimal(20,6)")), ("id",)))
    sink = MirrorDeltaSink(d, SOURCE)
    sink.write(pa.Table.from_pylist([ev(1, "c", 1, {"id": 1, "n": "1.000000"}, table=a),
                                     ev(2, "c", 1, {"id": 1, "n": "2.000000"}, table=b)], schema=EVENT_SCHEMA))
    sink.write(pa.Table.from_pylist([ev(3, "u", 1, {"id": 1, "n": "NaN"}, table=a),
                                     ev(4, "c", 2, {"id": 2, "n": "3.000000"}, table=b)], schema=EVENT_SCHEMA))
    assert list(sink.schema_stopped) == [a.id]
    assert re.search(r"table public\.a, column 'n', key \[1\]", schema_stopped(mirror_dir(d, SOURCE, a)))
    assert read_mirror(d, SOURCE, b).num_rows == 2 and read_mirror(d, SOURCE, a).to_pylist()[0]["n"] == Decimal("1")
    fenced = MirrorDeltaSink(d, SOURCE, fence=MergeFence(d, SOURCE))
    with pytest.raises(ConfigurationError, match="key \\[1\\]"):
        fenced.write(pa.Table.from_pylist([ev(5, "r", 1, {"id": 1, "n": "NaN"}, table=b, snapshot=True)], schema=EVENT_SCHEMA))
    schema_a = TableSchema(a, (Column("id", "int64"), Column("n", "decimal(20,6)")), ("id",))
    assert reconcile_schema(mirror_dir(d, SOURCE, a), schema_a, whole_table=True) == "rebuilt"
    assert schema_stopped(mirror_dir(d, SOURCE, a)) is None and read_mirror(d, SOURCE, a).num_rows == 0


def test_mirror_without_a_staged_schema(tmp_path):
    rows = pa.Table.from_pylist([ev(1, "c", 1, typed_row(1))], schema=EVENT_SCHEMA)
    MirrorDeltaSink(str(tmp_path), SOURCE).write(rows)  # changelog apply: skipped, event log only
    assert read_mirror(str(tmp_path), SOURCE, T).num_rows == 0
    with pytest.raises(ConfigurationError, match="plan the snapshot of this table first"):
        MirrorDeltaSink(str(tmp_path), SOURCE, require_schema=True).write(rows)


# --- PostgreSQL mirror -------------------------------------------------------------------------
@pytest.fixture
def pg_target(pg_uri, unique_name):
    schema = f"mirror_{unique_name}"
    yield schema
    with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    conn.close()


def test_postgres_mirror_position_guard_types_and_tombstones(tmp_path, pg_uri, pg_target):
    d = str(tmp_path)
    stage_schema(d, TYPED)
    rnd = random.Random(3)
    history = _random_history(rnd, keys=10, n=60)
    history.append(ev(1000, "c", 1, typed_row(1)))  # row 1 carries the extreme values
    truth = _reference(history)
    batches = [history[i : i + 11] for i in range(0, len(history), 11)]
    results = []
    for n, order in enumerate([batches, batches[::-1]]):
        sink = MirrorPostgresSink(pg_uri, d, SOURCE, target_schema=f"{pg_target}" if n == 0 else f"{pg_target}_b")
        try:
            for b in order:
                sink.write(pa.Table.from_pylist(b, schema=EVENT_SCHEMA))
            sink.write(pa.Table.from_pylist(batches[-1], schema=EVENT_SCHEMA))  # replay
            live = sink.read(T)
            results.append(sink.read(T, with_tombstones=True))
            assert {r["__key"] for r in live} == set(truth)
            r1 = next(r for r in live if r["id"] == 1)
            assert r1["money"] == Decimal("1234567890123456789012345678.0123456789")
            assert r1["huge"] == Decimal("1" * 58 + ".25") and r1["big"] == Decimal(18446744073709551615)
            assert r1["tstz"] == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
            assert bytes(r1["bin"]) == bytes([0, 255, 1, 0]) and r1["tm"] == "-838:59:59.000000"
            assert r1["doc"] == {"b": 1, "a": [True, None]} and r1["arr"] == [[1, 2], [3, 4]]
            with sink.conn.cursor() as cur:  # json keeps the source's text exactly (jsonb would not)
                cur.execute(f"SELECT doc::text FROM {sink.target(T)} WHERE id = 1")
                assert cur.fetchone()[0] == '{"b": 1, "a": [true, null]}'
            sink.conn.rollback()
            assert r1["d"] == date(1, 1, 1) and r1["small"] == -32768
            for r in live:
                want = truth[r["__key"]]
                assert r["name"] == want["name"] and r["__position"] == max(
                    e["position"] for e in history if e["key"] == r["__key"]
                )
            tombs = [r for r in results[-1] if r["__deleted"]]
            assert sink.compact(T) == len(tombs)
            assert len(sink.read(T, with_tombstones=True)) == len(live)
        finally:
            sink.close()
    strip = [[{k: bytes(v) if isinstance(v, memoryview) else v for k, v in r.items()} for r in res] for res in results]
    assert json.dumps(strip[0], default=str) == json.dumps(strip[1], default=str)
    with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{pg_target}_b" CASCADE')
    conn.close()


def test_postgres_mirror_older_event_never_overwrites(tmp_path, pg_uri, pg_target):
    d = str(tmp_path)
    stage_schema(d, TYPED)
    sink = MirrorPostgresSink(pg_uri, d, SOURCE, target_schema=pg_target)
    try:
        for pos, v in itertools.chain([(50, 5)], [(40, 4), (50, 9), (10, 1)]):
            sink.write(pa.Table.from_pylist([ev(pos, "u", 3, typed_row(3, v))], schema=EVENT_SCHEMA))
        (row,) = sink.read(T)
        assert row["name"] == typed_row(3, 5)["name"] and row["__position"] == Position(50).encode()
    finally:
        sink.close()


# --- the Delta log stays bounded (issue 33) ----------------------------------------------------
def test_the_delta_log_is_checkpointed_and_old_entries_go_while_the_mirror_reads_the_same(tmp_path, monkeypatch):
    """Every mirror gets a checkpoint interval and a log retention: a reader loads the newest
    checkpoint and the commits after it, and log entries past the retention go at the next
    checkpoint. Shown with an interval of 5 and on a mirror made without the properties
    (an earlier version's), which compact_inactive brings up to date."""
    import os
    import time

    from deltalake import DeltaTable

    from airflow_provider_cdc.sinks import mirror_compaction, mirror_table
    from airflow_provider_cdc.sinks.base import write_marker

    monkeypatch.setattr(mirror_table, "CHECKPOINT_INTERVAL", 5)
    d = str(tmp_path)
    stage_schema(d, TYPED)
    sink = MirrorDeltaSink(d, SOURCE)
    path = mirror_dir(d, SOURCE, T)
    sink.write(pa.Table.from_pylist([ev(1, "c", 1, typed_row(1))], schema=EVENT_SCHEMA))
    dt = DeltaTable(path)
    for key in ("delta.checkpointInterval", "delta.logRetentionDuration", "delta.deletedFileRetentionDuration"):
        dt.alter.set_table_properties({key: ""}, raise_if_not_exists=False)  # as an earlier version left it
    assert DeltaTable(path).metadata().configuration.get("delta.checkpointInterval") == ""
    write_marker(d, SOURCE, "mirror", Position(1))
    mirror_compaction.compact_inactive(d, SOURCE, lambda _tid: None, retention_hours=1)
    conf = DeltaTable(path).metadata().configuration
    assert conf["delta.checkpointInterval"] == "5" and conf["delta.logRetentionDuration"] == "interval 172800 seconds"
    assert conf["delta.deletedFileRetentionDuration"] == "interval 2 hours"  # twice vacuum's horizon
    for i in range(2, 14):
        sink.write(pa.Table.from_pylist([ev(i, "c", i, typed_row(i))], schema=EVENT_SCHEMA))
    log_dir = Path(path) / "_delta_log"
    last = json.loads((log_dir / "_last_checkpoint").read_text())["version"]
    assert last >= 9 and list(log_dir.glob("*.checkpoint.parquet"))
    old = time.time() - 3 * 24 * 3600  # every entry so far older than the log retention
    for f in log_dir.iterdir():
        os.utime(f, (old, old))
    for i in range(14, 20):
        sink.write(pa.Table.from_pylist([ev(i, "c", i, typed_row(i))], schema=EVENT_SCHEMA))
    assert not (log_dir / f"{0:020d}.json").exists()  # cleaned at a checkpoint past the retention
    assert sorted(r["id"] for r in read_mirror(d, SOURCE, T).to_pylist()) == list(range(1, 20))
    assert DeltaTable(path).metadata().configuration.get("cdc.buckets")  # the package's own properties stay
