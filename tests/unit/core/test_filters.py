"""The row filter is untrusted input: parsed, allowlisted, rendered with bound literals."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.filters import check_filter, render_filter
from airflow_provider_cdc.core.planning import SnapshotRequest

COLS = ["n", "name", "a b'%s", "flag"]


@pytest.mark.parametrize(("dialect", "text", "sql", "params"), [
    ("postgres", "n < 100", '("n" < %s)', [100]),
    ("mysql", "n < 100", "(`n` < %s)", [100]),
    ("postgres", "n >= -2.5 AND NOT name = 'it''s'", '(("n" >= %s) AND (NOT ("name" = %s)))', [Decimal("-2.5"), "it's"]),
    ("postgres", "n IN (1, 2) OR name LIKE 'a%' OR n BETWEEN 3 AND 4",
     '((("n" IN (%s, %s)) OR ("name" LIKE %s)) OR ("n" BETWEEN %s AND %s))', [1, 2, "a%", 3, 4]),
    ("postgres", "name IS NOT NULL AND flag", '((NOT ("name" IS NULL)) AND ("flag"))', []),
    ("postgres", '"a b\'%s" <> TRUE', '("a b\'%%s" <> %s)', [True]),
    ("mysql", "`a b'%s` = 'x\\\\y'", "(`a b'%%s` = %s)", ["x\\y"]),
    ("postgres", "name ILIKE 'A%'", '("name" ILIKE %s)', ["A%"]),
    ("mysql", "n % 10 = 0 AND n * 2 > n - 1", "(((`n` %% %s) = %s) AND ((`n` * %s) > (`n` - %s)))", [10, 0, 2, 1]),
    # division and modulo in both databases: sqlglot marks each with the dialect's own semantics
    # (MySQL: x / 0 and x % 0 are NULL), which the rendering for that same database keeps
    ("mysql", "n / 4 > 1 OR n % 3 = 1", "(((`n` / %s) > %s) OR ((`n` %% %s) = %s))", [4, 1, 3, 1]),
    ("postgres", "n / 4 > 1 OR n % 3 = 1", '((("n" / %s) > %s) OR (("n" %% %s) = %s))', [4, 1, 3, 1]),
    ("postgres", "name NOT LIKE 'a' AND n NOT IN (1) AND n NOT BETWEEN 1 AND 2",
     '(((NOT ("name" LIKE %s)) AND (NOT ("n" IN (%s)))) AND (NOT ("n" BETWEEN %s AND %s)))', ["a", 1, 1, 2]),
])
def test_allowed_filters_render_exactly(dialect, text, sql, params):
    assert render_filter(text, dialect, columns=COLS) == (sql, params)


@pytest.mark.parametrize(("text", "names"), [
    ("n < 100) OR (n > 0", "syntax error at column 8"),
    ("pg_sleep(1) IS NULL", "pg_sleep(1)"),
    ("n IN (SELECT 1)", "IN takes a list of literals"),
    ("1=1; DROP TABLE x", "single condition"),
    ("n = (SELECT max(n) FROM other)", "only columns and literals"),
    ("other.n = 1", "without a table"),
    ("CAST(n AS text) = '1'", "only columns and literals"),
    ("name LIKE 'a!%' ESCAPE '!'", "Escape is not a row condition"),
    ("n = ANY(ARRAY[1])", "only columns and literals"),
    ("n = 1 -- x", None),  # a comment is dropped by the parser: the rendered filter holds no comment
    ("", "empty"),
])
def test_hostile_filters_are_refused_naming_the_part(text, names):
    if names is None:
        sql, params = render_filter(text, "postgres", columns=COLS)
        assert "--" not in sql and sql == '("n" = %s)' and params == [1]
        return
    with pytest.raises(ConfigurationError, match="filter") as err:
        render_filter(text, "postgres", setting="where[public.t]", columns=COLS)
    assert names.lower() in str(err.value).lower() and "where[public.t]" in str(err.value)


def test_unknown_columns_are_named_with_the_table_columns():
    with pytest.raises(ConfigurationError, match=r"column 'secret'.*columns: \['n'"):
        render_filter("secret = 1", "mysql", columns=COLS)


def test_ilike_is_postgres_only():
    with pytest.raises(ConfigurationError):
        render_filter("name ILIKE 'a'", "mysql", columns=COLS)


def test_the_request_refuses_an_escaping_filter_before_anything_runs():
    with pytest.raises(ConfigurationError, match="where"):
        SnapshotRequest.from_dict({"tables": ["public.t"], "where": "n < 100) OR (n > 0"})
    with pytest.raises(ConfigurationError, match=r"where\[public.t\]"):
        SnapshotRequest.from_dict({"tables": ["public.t"], "where": {"public.t": "pg_terminate_backend(1)"}})
    assert check_filter("  n < 5 ") == "n < 5"


_COL = st.sampled_from(["n", "name", "a b'%s"])
_LIT = st.integers(-10**6, 10**6) | st.text(max_size=6)


def _quoted(c):
    return '"' + c.replace('"', '""') + '"'


def _lit(v):
    return str(v) if isinstance(v, int) else "'" + v.replace("'", "''") + "'"


_ATOM = st.builds(lambda c, op, v: f"{_quoted(c)} {op} {_lit(v)}", _COL, st.sampled_from(["=", "<", ">=", "<>"]), _LIT)
_EXPR = st.recursive(_ATOM, lambda inner: st.builds(lambda a, w, b: f"({a}) {w} ({b})", inner,
                                                     st.sampled_from(["AND", "OR"]), inner) | inner.map(lambda a: f"NOT ({a})"),
                     max_leaves=8)


@given(_EXPR)
def test_rendering_is_stable_and_binds_every_literal(text):
    sql, params = render_filter(text, "postgres", columns=COLS)
    assert "'" not in sql.replace("a b'%%s", "")  # no literal text in the statement: all bound
    # the rendered SQL (its %% and %s restored to literals) parses back to the same rendering
    pieces = [p.replace("\x00", "%") for p in sql.replace("%%", "\x00").split("%s")]
    assert len(pieces) == len(params) + 1
    rebuilt = pieces[0] + "".join(_lit(int(p) if isinstance(p, Decimal) else p) + rest for p, rest in zip(params, pieces[1:], strict=True))
    assert render_filter(rebuilt, "postgres", columns=COLS) == (sql, params)
