"""The mirror's vectorised decoding (arrow_types.json_rows_to_arrays) gives exactly what the
per-row reference (rows_to_table over json.loads) gives, or declines and lets it run."""

from __future__ import annotations

import base64
import string

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.core.arrow_types import json_rows_to_arrays, mirror_schema, rows_to_table
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import (
    Column,
    TableName,
    TableSchema,
    decode_key,
    decode_row,
    encode_key,
    encode_row,
)
from airflow_provider_cdc.sinks.mirror_delta import _mirror_table, events_to_mirror_rows

pytestmark = pytest.mark.unit

T = TableName("public", 'we"ird table')
COLUMNS = (
    Column("id", "int64"),
    Column("flag", "bool"),
    Column("small", "int16"),
    Column("mid", "int32"),
    Column("big", "uint64"),
    Column("f4", "float32"),
    Column("f8", "float64"),
    Column("money", "decimal(38,10)"),
    Column("price", "decimal(12,2)"),
    Column("huge", "decimal(60,2)"),
    Column("anynum", "decimal"),
    Column("na me", "string"),
    Column("bin", "binary"),
    Column("d", "date"),
    Column("tm", "time"),
    Column("ts", "timestamp"),
    Column("tstz", "timestamptz"),
    Column("u", "uuid"),
    Column("doc", "json"),
)
FAST = TableSchema(T, COLUMNS, ("id",))
WITH_ARRAY = TableSchema(T, (*COLUMNS, Column("arr", "array<int32>")), ("id",))


def row(i: int) -> dict:
    return {
        "id": i,
        "flag": bool(i % 2),
        "small": -32768 if i == 1 else i,
        "mid": 2**31 - 1 if i == 2 else -i,
        "big": 18446744073709551615 if i == 1 else i * 1000,
        "f4": 0.1 if i % 3 else 1,
        "f8": 1e-300 if i == 1 else 0.1 * i,
        "money": "1234567890123456789012345678.0123456789" if i == 1 else f"{i}.5",
        "price": "-0.01" if i == 1 else "12.3",  # fewer digits than the scale: padded by both paths
        "huge": "1" * 58 + ".25",
        "anynum": "3.14159265358979323846264338327950288419716939937510",
        "na me": f"naïve 名前 \n\t\"q\" \u2028 😀 {i}",
        "bin": base64.b64encode(bytes([0, 255, i % 256])).decode(),
        "d": "0001-01-01" if i == 1 else "2024-02-29",
        "tm": "-838:59:59.000000" if i == 1 else "23:59:59.999999",
        "ts": "2024-03-31T02:30:00.000001",
        "tstz": "1999-12-31T23:59:59.999999Z",
        "u": "123e4567-e89b-12d3-a456-426614174000",
        "doc": '{"b": 1, "a": [true, null]}',
    }


def texts(rows: list[dict]) -> pa.Array:
    return pa.array([encode_row(r) for r in rows], pa.string())


def reference(schema: TableSchema, rows: list[dict]) -> pa.Table:
    return pa.Table.from_arrays(rows_to_table(schema, rows), names=schema.column_names)


def vectorised(schema: TableSchema, rows: list[dict]) -> pa.Table | None:
    arrays = json_rows_to_arrays(schema, texts(rows))
    return None if arrays is None else pa.Table.from_arrays(arrays, names=schema.column_names)


def events(rows: list[tuple[str, int, dict | None]]) -> pa.Table:
    return pa.table({
        "op": [op for op, _k, _r in rows],
        "key": [encode_key([k]) for _op, k, _r in rows],
        "after": [None if r is None else encode_row(r) for _op, _k, r in rows],
        "position": [Position(i + 1).encode() for i in range(len(rows))],
    })


def test_every_vectorised_type_equals_the_reference():
    rows = [row(i) for i in range(1, 8)]
    rows[3] = {**rows[3], "doc": None, "bin": None, "money": None, "ts": None}  # nulls
    del rows[4]["tstz"]  # a column missing from the row (e.g. an unchanged TOASTed value): null
    got = vectorised(FAST, rows)
    assert got is not None, "the canonical rows should take the vectorised path"
    assert got.equals(reference(FAST, rows)), "vectorised decoding differs from the per-row reference"
    assert got.schema.equals(pa.schema([mirror_schema(FAST).field(c) for c in FAST.column_names]))


def test_rows_longer_than_a_reader_block():
    rows = [row(1), {**row(2), "na me": "x" * 3_000_000}, row(3)]
    got = vectorised(FAST, rows)
    assert got is not None and got.equals(reference(FAST, rows))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"f8": "NaN"}, "a special float is a string among numbers"),
        ({"small": 70000}, "int16 out of range"),
        ({"price": "123456789012.5"}, "decimal(12,2) overflow"),
        ({"price": "1.234"}, "decimal scale would lose a digit"),
        ({"na me": 5}, "a number where the canonical value is text"),
    ],
)
def test_declines_what_it_cannot_reproduce(change, why):
    rows = [row(1), {**row(2), **change}]
    assert json_rows_to_arrays(FAST, texts(rows)) is None, why


def test_array_columns_take_the_per_row_path():
    rows = [{**row(1), "arr": [[1, 2], [3]]}, {**row(2), "arr": [5]}]
    assert json_rows_to_arrays(WITH_ARRAY, texts(rows)) is None
    mirrored = events_to_mirror_rows(WITH_ARRAY, events([("r", 1, rows[0]), ("u", 2, rows[1])]))
    assert mirrored.column("arr").to_pylist() == ["[[1,2],[3]]", "[5]"]


def test_events_with_deletes_keep_event_order_and_match_the_reference():
    evs = events([
        ("c", 5, row(5)), ("d", 2, None), ("r", 7, row(7)), ("u", 1, row(1)), ("d", 9, None), ("r", 3, row(3)),
    ])
    is_delete = pa.array([op == "d" for op in evs["op"].to_pylist()])
    got = events_to_mirror_rows(FAST, evs)
    # the reference: each event's JSON decoded in Python, a delete's key columns from its key
    rows = [dict(zip(FAST.primary_key, decode_key(k), strict=True)) if op == "d" else decode_row(a)
            for op, k, a in zip(evs["op"].to_pylist(), evs["key"].to_pylist(), evs["after"].to_pylist(), strict=True)]
    assert got.equals(_mirror_table(FAST, rows_to_table(FAST, rows), evs, is_delete))
    assert got.column("__key").to_pylist() == evs["key"].to_pylist()
    assert got.column("__deleted").to_pylist() == [False, True, False, False, True, False]
    assert got.column("id").to_pylist() == [5, 2, 7, 1, 9, 3]  # a tombstone keeps its key columns


def test_a_bad_value_still_fails_naming_table_and_column():
    evs = events([("r", 1, row(1)), ("r", 2, {**row(2), "price": "not a number"})])
    with pytest.raises(ConfigurationError, match=r"column 'price', key \[2\]"):
        events_to_mirror_rows(FAST, evs)


def test_a_value_arrow_cannot_hold_names_table_column_and_key():
    """numeric(p,s) NaN (decimal128 has none) and a timestamp past year 294247 are refused
    with the table, the column and the row's key, never written as something else."""
    schema = TableSchema(TableName("s", "t"), (Column("id", "int64"), Column("n", "decimal(20,6)"),
                                               Column("ts", "timestamp")), ("id",))
    ok = {"id": 1, "n": "1.500000", "ts": "-0043-03-15T12:00:00.500000"}
    with pytest.raises(ConfigurationError, match=r"table s\.t, column 'n', key \[7\]: .*NaN"):
        rows_to_table(schema, [ok, {**ok, "id": 7, "n": "NaN"}])
    with pytest.raises(ConfigurationError, match=r"table s\.t, column 'ts', key \[8\]: .*294247"):
        rows_to_table(schema, [ok, {**ok, "id": 8, "ts": "294270-01-01T00:00:00.000000"}])


def test_a_live_event_without_after_still_fails():
    evs = events([("r", 1, row(1)), ("u", 2, None)])
    with pytest.raises(ConfigurationError, match="has no 'after' row"):
        events_to_mirror_rows(FAST, evs)


# --- property: random canonical rows ---------------------------------------------------------------
PROP = TableSchema(
    TableName("s", "p"),
    (Column("id", "int64"), Column("b", "bool"), Column("i2", "int16"), Column("u8", "uint64"),
     Column("f4", "float32"), Column("f8", "float64"), Column("dec", "decimal(18,4)"), Column("s", "string"),
     Column("bin", "binary"), Column("d", "date"), Column("ts", "timestamp"), Column("tz", "timestamptz")),
    ("id",),
)
finite = st.floats(allow_nan=False, allow_infinity=False)
prop_rows = st.lists(
    st.fixed_dictionaries({
        "id": st.integers(-(2**63), 2**63 - 1),
        "b": st.none() | st.booleans(),
        "i2": st.none() | st.integers(-(2**15), 2**15 - 1),
        "u8": st.none() | st.integers(0, 2**64 - 1),
        "f4": st.none() | st.floats(width=32, allow_nan=False, allow_infinity=False) | finite,
        "f8": st.none() | finite,
        "dec": st.none() | st.decimals(min_value=-(10**13), max_value=10**13, places=4).map(str),
        "s": st.none() | st.text(),
        "bin": st.none() | st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode()),
        "d": st.none() | st.dates().map(lambda d: d.isoformat()),
        "ts": st.none() | st.datetimes().map(lambda t: t.isoformat(timespec="microseconds")),
        "tz": st.none() | st.datetimes().map(lambda t: t.isoformat(timespec="microseconds") + "Z"),
        "x": st.text(string.ascii_letters, max_size=3),  # a field the schema does not have: ignored by both
    }),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(prop_rows)
def test_property_vectorised_equals_reference(rows):
    got = vectorised(PROP, rows)
    assert got is not None
    assert got.equals(reference(PROP, rows))
