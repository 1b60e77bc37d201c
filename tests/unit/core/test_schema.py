"""Schema contract: table ids with hostile names, canonical keys and rows, schema JSON."""

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.schema import (
    Column,
    TableName,
    TableSchema,
    decode_key,
    decode_path_segment,
    decode_row,
    encode_key,
    encode_path_segment,
    encode_row,
    follow_log_schema,
    validate_logical_type,
)

from .hyp import cases

HOSTILE = ['we"ird', "sp ace", "semi;colon", "back`tick", "dot.ted", "slash/and\\", "ünïcødé", "'quote'", "%2F", "-- x"]


SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9~-][A-Za-z0-9._~-]*$")


def assert_safe_segment(seg: str) -> None:
    """One path segment every medium keeps as is: no separator, no "%" (delta-rs, Hadoop and
    Hive partition discovery URL-decode it), not hidden (leading "." or "_"), fits a file name."""
    assert SAFE_SEGMENT.match(seg), seg
    assert len(seg.encode()) <= 255


@pytest.mark.parametrize("name", HOSTILE)
def test_table_ids_with_hostile_names(name):
    t = TableName("app", name)
    assert t.id == f"app.{name}" and str(t) == t.id
    assert TableName.parse(t.id) == t  # split on the first dot: dots in the name survive
    seg = t.path_segment
    assert_safe_segment(seg)
    assert decode_path_segment(seg) == t.id and TableName.from_path_segment(seg) == t


def test_path_segments_are_plain_for_plain_names_and_escaped_otherwise():
    assert TableName("public", "order_items").path_segment == "public.order_items"
    assert TableName("public", "Order Items").path_segment == "public.Order~20Items"
    assert TableName("public", "a'b %s; é").path_segment == "public.a~27b~20~25s~3B~20~C3~A9"
    assert encode_path_segment("_hidden") == "~5Fhidden" and encode_path_segment(".x") == "~2Ex"
    assert encode_path_segment("_x", leading_dot_ok=True) == "_x"
    assert encode_path_segment("a~b") == "a~7Eb"  # the escape character itself is escaped
    with pytest.raises(ConfigurationError, match="empty"):
        encode_path_segment("")


def test_schemas_with_dots_or_quotes_are_quoted_in_the_id():
    t = TableName("my.schema", "t.x")
    assert t.id == '"my.schema".t.x' and TableName.parse(t.id) == t
    q = TableName('"q"', "n")
    assert q.id == '"""q""".n' and TableName.parse(q.id) == q
    with pytest.raises(ConfigurationError, match="quoted schema must be closed"):
        TableName.parse('"open.t')


def test_long_names_are_hashed_to_fit_a_file_name():
    a, b = TableName("s", "ü" * 60 + "a"), TableName("s", "ü" * 60 + "b")
    assert len(a.path_segment) <= 200 and a.path_segment != b.path_segment
    assert_safe_segment(a.path_segment)
    assert decode_path_segment(a.path_segment) is None  # the whole name is kept elsewhere


names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=70)


@cases(scale=0.2)
@given(names, names)
def test_table_id_and_segment_round_trip(schema, name):
    """Any Unicode schema and table name (dots, quotes, separators, "%", "~", surrogate-free
    code points of every plane): the id parses back, the segment is safe and decodes back,
    and two different tables never share a segment."""
    t = TableName(schema, name)
    assert TableName.parse(t.id) == t
    seg = t.path_segment
    assert_safe_segment(seg)
    decoded = decode_path_segment(seg)
    assert decoded is None or TableName.parse(decoded) == t
    other = TableName(schema, name + "x")
    assert other.path_segment != seg


def test_table_name_errors():
    with pytest.raises(ConfigurationError, match="needs a schema and a name"):
        TableName("", "c")
    with pytest.raises(ConfigurationError, match="NUL"):
        TableName("a", "c\x00")
    with pytest.raises(ConfigurationError, match="lone surrogate"):
        TableName("a", "c\ud800")
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


def test_table_lists_from_settings():
    from airflow_provider_cdc.core.schema import split_table_list

    assert split_table_list("s.a, s.b", "CDC_TABLES") == ["s.a", "s.b"]
    assert split_table_list('["s.a,b", "\\"x.y\\".z"]', "CDC_TABLES") == ["s.a,b", '"x.y".z']
    assert split_table_list(["s.a"], "x") == ["s.a"]
    with pytest.raises(ConfigurationError, match="CDC_TABLES: not a JSON list"):
        split_table_list("[s.a", "CDC_TABLES")
    with pytest.raises(ConfigurationError, match="extra 'tables' must be a list"):
        split_table_list({"s": 1}, "extra 'tables'")


def test_progress_variable_keys_are_url_safe_and_distinct():
    from airflow_provider_cdc.airflow_variables import variable_key

    assert variable_key("src", "public.orders") == "cdc_snapshot__src__public.orders"
    k = variable_key("src", "public.a'b %s; é/x?#")
    assert re.match(r"^[A-Za-z0-9._~-]+$", k), k
    assert k != variable_key("src", "public.a'b %s; é/x?")


def test_the_log_schema_keeps_every_column_ever_seen_with_its_newest_type():
    t = TableName("s", "t")
    v1 = TableSchema(t, (Column("id", "int64"), Column("n", "int32", "integer", False), Column("gone", "string")), ("id",))
    assert follow_log_schema(None, v1) == v1
    # DROP gone, ALTER n TYPE text, ADD added: the dropped column stays (nullable), n takes its new type
    v2 = TableSchema(t, (Column("id", "int64"), Column("added", "date"), Column("n", "string", "text")), ("id",),
                     {"replica_identity": "full"})
    out = follow_log_schema(v1, v2)
    assert out.columns == (Column("id", "int64"), Column("n", "string", "text"), Column("gone", "string", "", True),
                           Column("added", "date"))
    assert out.primary_key == ("id",) and out.extra == {"replica_identity": "full"}
    assert follow_log_schema(out, v2) == out  # nothing new: unchanged (capture writes nothing)
    # a new primary key is taken as it is (the event log keys events by the current key)
    v3 = TableSchema(t, (Column("id", "int64"), Column("added", "date")), ("id", "added"))
    assert follow_log_schema(out, v3).primary_key == ("id", "added")


def test_a_schema_names_its_connector_from_what_its_dialect_recorded():
    t = TableName("s", "t")
    cols, pk = (Column("id", "int64"),), ("id",)
    assert TableSchema(t, cols, pk, {"connector": "mysql", "flavour": "mariadb"}).connector == "mysql"
    # schemas staged before the dialects recorded it
    assert TableSchema(t, cols, pk, {"flavour": "MariaDB"}).connector == "mariadb"
    assert TableSchema(t, cols, pk, {"flavour": "mysql"}).connector == "mysql"
    assert TableSchema(t, cols, pk, {"replica_identity": "default"}).connector == "postgresql"
    assert TableSchema(t, cols, pk).connector is None
