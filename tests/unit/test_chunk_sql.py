"""The one chunk-SQL builder (Dialect.chunk_query over core.planning.chunk_predicates), tested
by exact strings for both dialects, without a database: composite keys, the range bounds,
the snapshot's upper bound and hostile names."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema
from airflow_provider_cdc.dialects import ConnectionParams
from airflow_provider_cdc.dialects.mysql import MySqlDialect
from airflow_provider_cdc.dialects.postgres import PostgresDialect

pytestmark = pytest.mark.unit

SCHEMA = TableSchema(TableName("s", "t"), (Column("a", "int32"), Column("b", "string"), Column("v", "int64")), ("a", "b"))


def pg() -> PostgresDialect:
    return PostgresDialect(ConnectionParams("postgres", database="x"))


def my() -> MySqlDialect:
    return MySqlDialect(ConnectionParams("mysql", database="x"))


def test_postgres_composite_key_after_key_end_and_upper_bound():
    sql, params = pg().chunk_query(SCHEMA, ChunkRange((0, "a"), (9, "z")), after_key=(1, "x"), limit=5,
                                   upper_bound=(8, "q"))
    assert sql == (
        'SELECT "a", "b", "v" FROM "s"."t" WHERE ("a", "b") > (%s, %s) AND ("a", "b") < (%s, %s)'
        ' AND ("a", "b") <= (%s, %s) ORDER BY "a", "b" LIMIT %s'
    )
    assert params == [1, "x", 9, "z", 8, "q", 5]


def test_mysql_composite_key_uses_the_expanded_or_form():
    sql, params = my().chunk_query(SCHEMA, ChunkRange((0, "a"), None), after_key=None, limit=5, upper_bound=(8, "q"))
    assert sql == (
        "SELECT `a`, `b`, `v` FROM `s`.`t` WHERE ((`a` > %s) OR (`a` = %s AND `b` >= %s))"
        " AND ((`a` < %s) OR (`a` = %s AND `b` <= %s)) ORDER BY `a`, `b` LIMIT %s"
    )
    assert params == [0, 0, "a", 8, 8, "q", 5]


def test_a_whole_table_without_bounds_has_no_where():
    one = TableSchema(TableName("public", "o"), (Column("id", "int64"),), ("id",))
    assert pg().chunk_query(one, ChunkRange(), after_key=None, limit=None) == (
        'SELECT "id" FROM "public"."o" ORDER BY "id"', [])


def test_hostile_names_are_quoted_and_percent_doubled():
    odd = TableSchema(TableName("a'b %s; é", 'q"t'), (Column("k%s", "int64"), Column("x`y", "string")), ("k%s",))
    sql, params = pg().chunk_query(odd, ChunkRange(), after_key=(3,), limit=2)
    assert sql == (
        'SELECT "k%%s", "x`y" FROM "a\'b %%s; é"."q""t" WHERE "k%%s" > %s ORDER BY "k%%s" LIMIT %s'
    )
    assert params == [3, 2]
    sql, _ = my().chunk_query(odd, ChunkRange(), after_key=(3,), limit=2)
    assert sql == "SELECT `k%%s`, `x``y` FROM `a'b %%s; é`.`q\"t` WHERE `k%%s` > %s ORDER BY `k%%s` LIMIT %s"
