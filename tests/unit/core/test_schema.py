"""Schema contract: table ids with hostile names, canonical keys and rows, schema JSON."""

import json
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.schema import (
    Column,
    TableName,
    TableSchema,
    decode_key,
    decode_row,
    encode_key,
    encode_row,
    validate_logical_type,
)

from .hyp import cases

HOSTILE = ['we"ird', "sp ace", "semi;colon", "back`tick", "dot.ted", "slash/and\\", "ünïcødé", "'quote'", "%2F", "-- x"]


@pytest.mark.parametrize("name", HOSTILE)
def test_table_ids_with_hostile_names(name):
    t = TableName("app", name)
    assert t.id == f"app.{name}" and str(t) == t.id
    assert TableName.parse(t.id) == t  # split on the first dot: dots in the name survive
    seg = t.path_segment
    assert "/" not in seg and "\\" not in seg and unquote(seg) == t.id


@cases(scale=0.1)
@given(st.text(min_size=1).filter(lambda s: "." not in s and "\x00" not in s), st.text(min_size=1).filter(lambda s: "\x00" not in s))
def test_table_id_round_trip(schema, name):
    t = TableName(schema, name)
    assert TableName.parse(t.id) == t and unquote(t.path_segment) == t.id


def test_table_name_errors():
    with pytest.raises(ConfigurationError, match="contains '.'"):
        TableName("a.b", "c")
    with pytest.raises(ConfigurationError, match="needs a schema and a name"):
        TableName("", "c")
    with pytest.raises(ConfigurationError, match="NUL"):
        TableName("a", "c\x00")
    with pytest.raises(ConfigurationError, match="write it as 'schema.table'"):
        TableName.parse("orders")
    assert TableName.parse("orders", default_schema="public") == TableName("public", "orders")


key_values = st.lists(st.one_of(st.integers(), st.text(), st.booleans(), st.none()), min_size=1, max_size=4)


@cases(scale=0.2)
@given(key_values)
def test_canonical_keys_round_trip_and_are_stable(values):
    k = encode_key(values)
    assert decode_key(k) == tuple(values)
    assert encode_key(list(decode_key(k))) == k  # stable: the same values give the same text


def test_key_and_row_encoding_is_compact_and_keeps_unicode():
    assert encode_key([1, "ä"]) == '[1,"ä"]'
    assert encode_row({"b": 1, "a": None}) == '{"b":1,"a":null}'  # row order kept
    assert decode_row(None) is None and decode_row('{"x":"y"}') == {"x": "y"}


def test_logical_types():
    for t in ("int64", "decimal(10,2)", "array<array<string>>", "timestamptz"):
        assert validate_logical_type(t) == t
    for bad in ("integer", "decimal(10)", "array<nope>"):
        with pytest.raises(ValueError, match="unknown logical type"):
            validate_logical_type(bad)


def test_table_schema_json_and_errors():
    s = TableSchema(TableName("app", 'we"ird'), (Column("id", "int64", "bigint", False), Column("v", "string")), ("id",),
                    {"replica_identity": "full"})
    assert TableSchema.from_json(s.to_json()) == s and json.loads(s.to_json())["version"] == 1
    assert s.key_of({"id": 7, "v": "x"}) == "[7]" and s.column("v").type == "string"
    with pytest.raises(ConfigurationError, match="has no column 'w'"):
        s.column("w")
    with pytest.raises(ConfigurationError, match="has no primary key"):
        TableSchema(TableName("a", "b"), (Column("id", "int64"),), ())
    with pytest.raises(ConfigurationError, match=r"primary key column\(s\) \['x'\] not among"):
        TableSchema(TableName("a", "b"), (Column("id", "int64"),), ("x",))
