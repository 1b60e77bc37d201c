"""Chunk planning: keyset predicates by exact SQL, the request, and range planning."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.planning import (
    KeysetPredicate,
    SnapshotRequest,
    chunk_predicates,
    even_ranges,
    keys_to_ranges,
    plan_ranges,
    render_predicates,
    sampled_ranges,
    validate_where,
)
from airflow_provider_cdc.core.plans import Throttle
from airflow_provider_cdc.core.ranges import FULL_RANGE, ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema

from .hyp import cases


def pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def my_quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# --- predicates: exact SQL ------------------------------------------------------------------


def test_single_column_predicate():
    p = KeysetPredicate(("id",), ">", (5,))
    assert p.sql(pg_quote, row_values=True) == '"id" > %s'
    assert p.sql(pg_quote, row_values=False) == '"id" > %s'
    assert p.params(row_values=False) == [5]


def test_composite_row_value_form():
    p = KeysetPredicate(("a", "b", "c"), ">", (1, "x", 3))
    assert p.sql(pg_quote, row_values=True) == '("a", "b", "c") > (%s, %s, %s)'
    assert p.params(row_values=True) == [1, "x", 3]


def test_composite_expanded_form():
    p = KeysetPredicate(("a", "b", "c"), ">", (1, "x", 3))
    assert p.sql(my_quote, row_values=False, placeholder="?") == (
        "((`a` > ?) OR (`a` = ? AND `b` > ?) OR (`a` = ? AND `b` = ? AND `c` > ?))"
    )
    assert p.params(row_values=False) == [1, 1, "x", 1, "x", 3]


@pytest.mark.parametrize(
    ("op", "expanded"),
    [
        (">=", '(("a" > %s) OR ("a" = %s AND "b" >= %s))'),
        ("<", '(("a" < %s) OR ("a" = %s AND "b" < %s))'),
        ("<=", '(("a" < %s) OR ("a" = %s AND "b" <= %s))'),
    ],
)
def test_composite_other_operators(op, expanded):
    p = KeysetPredicate(("a", "b"), op, (1, 2))
    assert p.sql(pg_quote, row_values=False) == expanded
    assert p.sql(pg_quote, row_values=True) == f'("a", "b") {op} (%s, %s)'


def test_hostile_column_names_are_quoted():
    p = KeysetPredicate(('we"ird', "x`y"), ">", (1, 2))
    assert p.sql(pg_quote, row_values=True) == '("we""ird", "x`y") > (%s, %s)'
    assert p.sql(my_quote, row_values=False) == "((`we\"ird` > %s) OR (`we\"ird` = %s AND `x``y` > %s))"


def test_convert_maps_canonical_values_to_driver_values():
    p = KeysetPredicate(("id", "blob"), ">", (1, "AAE="))
    conv = lambda col, v: bytes([0, 1]) if col == "blob" else v  # noqa: E731
    assert p.params(row_values=False, convert=conv) == [1, 1, b"\x00\x01"]


def test_predicate_errors_name_the_problem():
    with pytest.raises(ConfigurationError, match="has 1 value.*has 2 column"):
        KeysetPredicate(("a", "b"), ">", (1,))
    with pytest.raises(ConfigurationError, match="operator must be one of"):
        KeysetPredicate(("a",), "=", (1,))


def test_chunk_predicates_and_rendering():
    rng = ChunkRange((1, "a"), (9, "z"))
    preds = chunk_predicates(("a", "b"), rng)
    assert [p.op for p in preds] == [">=", "<"]
    sql, params = render_predicates(preds, pg_quote, row_values=True)
    assert sql == '("a", "b") >= (%s, %s) AND ("a", "b") < (%s, %s)'
    assert params == [1, "a", 9, "z"]
    # keyset continuation replaces the start; open end takes the upper bound (inclusive)
    preds = chunk_predicates(("id",), ChunkRange((100,), None), after_key=(150,), upper_bound=(900,))
    assert render_predicates(preds, my_quote, row_values=False) == ("`id` > %s AND `id` <= %s", [150, 900])
    # a range with an end does not need the bound; no predicates at all for a full read
    assert [p.op for p in chunk_predicates(("id",), ChunkRange(None, (5,)), upper_bound=(900,))] == ["<", "<="]
    assert render_predicates(chunk_predicates(("id",), FULL_RANGE), pg_quote, row_values=True) == ("", [])


# --- the request ------------------------------------------------------------------------------


def test_request_from_dict_round_trip():
    d = {
        "tables": ["public.orders", "shop.items"],
        "ranges": {"public.orders": [{"start": [1], "end": [100]}, {"start": [200], "end": None}]},
        "keys": {"shop.items": [[1, 5], [1, 6], [2, 1]]},
        "where": {"public.orders": "status <> 'x'"},
        "chunk_size": 500,
        "parallelism": 4,
        "delay_seconds": 1.5,
    }
    r = SnapshotRequest.from_dict(d)
    assert r.to_dict() == d
    assert SnapshotRequest.from_dict(r.to_dict()) == r
    assert r.where_for(TableName("public", "orders")) == "status <> 'x'" and r.where_for("shop.items") is None
    assert r.requested_ranges("shop.items") == (ChunkRange((1, 5), (1, 7)), ChunkRange((2, 1), (2, 2)))
    assert r.requested_ranges("public.orders")[1] == ChunkRange((200,), None)


def test_request_defaults_and_scalars():
    r = SnapshotRequest.from_dict({"tables": "t", "keys": {"t": [3, 4, 9]}, "where": "x > 1"}, default_schema="public")
    # no chunk_size: adaptive (None); a number fixes it; "auto" asks for adaptive explicitly
    assert r.tables == (TableName("public", "t"),) and r.throttle == Throttle()
    assert SnapshotRequest.from_dict({"tables": ["a.b"], "chunk_size": 500}).throttle.chunk_size == 500
    assert SnapshotRequest.from_dict({"tables": ["a.b"], "chunk_size": "auto"}).throttle.chunk_size is None
    assert r.requested_ranges("public.t") == (ChunkRange((3,), (5,)), ChunkRange((9,), (10,)))
    assert r.where_for("public.t") == "x > 1"
    assert SnapshotRequest.from_dict({"tables": ["a.b"]}).requested_ranges("a.b") == (FULL_RANGE,)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"tables": []}, "names no tables"),
        ({"tables": ["a.b", "a.b"]}, r"table\(s\) \['a.b'\] more than once"),
        ({"tables": ["a.b"], "chunk_size": 0}, "chunk_size must be a whole number from 1 to 10000000 .* or 'auto'"),
        ({"tables": ["a.b"], "chunk_size": "100"}, "chunk_size must be a whole number"),
        ({"tables": ["a.b"], "chunk_size": "fast"}, "chunk_size must be a whole number .* or 'auto'"),
        ({"tables": ["a.b"], "parallelism": 1000}, "parallelism must be from 1 to 256"),
        ({"tables": ["a.b"], "chunksize": 5}, r"unknown snapshot setting\(s\) \['chunksize'\]"),
        ({"tables": ["a.b"], "keys": {"a.c": [[1]]}}, r"keys given for table\(s\) \['a.c'\]"),
        ({"tables": ["a.b"], "keys": {"a.b": []}}, "keys for table a.b is empty"),
        ({"tables": ["a.b"], "keys": {"a.b": [[1]]}, "ranges": {"a.b": [[None, None]]}}, "both chosen keys and key ranges"),
        ({"tables": ["a.b"], "ranges": {"a.b": [{"start": [5], "end": [5]}]}}, "is empty: start must be below end"),
        ({"tables": ["a.b"], "ranges": {"a.b": [[[1], [10]], [[5], None]]}}, "overlap"),
        ({"tables": ["a.b"], "ranges": {"a.b": [{"from": 1}]}}, "must be {'start'"),
        ({"tables": ["a.b"], "where": "1=1; DROP TABLE x"}, "single condition"),
        ({"tables": ["a.b"], "where": {"a.b": "  "}}, r"filter 'where\[a.b\]' is empty"),
        ({"tables": ["t"]}, "needs a schema"),
    ],
)
def test_request_errors_name_the_setting(conf, message):
    with pytest.raises(ConfigurationError, match=message):
        SnapshotRequest.from_dict(conf)


def test_request_checks_key_arity_against_the_schema():
    schema = TableSchema(TableName("a", "b"), (Column("x", "int64"), Column("y", "string")), ("x", "y"))
    SnapshotRequest.from_dict({"tables": ["a.b"], "keys": {"a.b": [[1, "2"]]}}).check_schema(schema)
    with pytest.raises(ConfigurationError, match=r"chosen key \[1\] of table a.b has 1 value"):
        SnapshotRequest.from_dict({"tables": ["a.b"], "keys": {"a.b": [[1]]}}).check_schema(schema)
    with pytest.raises(ConfigurationError, match="key range bound"):
        SnapshotRequest.from_dict({"tables": ["a.b"], "ranges": {"a.b": [[["k"], None]]}}).check_schema(schema)


def test_validate_where():
    """The request-time check (core/filters.py has the whole allowlist): one row condition."""
    assert validate_where("  a = 1 ") == "a = 1"
    for bad, message in (("a;b", "single condition"), ("a = 1) OR (1 = 1", "syntax error at column 6"), ("sleep(5) = 0", "SLEEP")):
        with pytest.raises(ConfigurationError, match=message):
            validate_where(bad)


# --- range planning ---------------------------------------------------------------------------


def assert_exact_cover(ranges: list[ChunkRange], within: ChunkRange, probes) -> None:
    """Ordered, adjacent (each end is the next start), starting and ending where ``within``
    does, no empty range, and every probe inside ``within`` is in exactly one range."""
    assert ranges[0].start == within.start and ranges[-1].end == within.end
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert a.end is not None and a.end == b.start
        assert a.start is None or a.start < a.end
    for p in probes:
        hits = sum(r.contains(p) for r in ranges)
        assert hits == (1 if within.contains(p) else 0), (p, ranges)


@cases(scale=0.2)
@given(st.integers(-1000, 1000), st.integers(0, 5000), st.integers(1, 70), st.booleans())
def test_even_split_covers_exactly(lo, width, parts, bounded):
    hi = lo + width
    within = ChunkRange((lo,), (hi + 1,)) if bounded else FULL_RANGE
    ranges = even_ranges(lo, hi, parts, within)
    assert 1 <= len(ranges) <= parts
    assert_exact_cover(ranges, within, [(k,) for k in range(lo - 3, hi + 4, max(1, width // 200))] + [(hi,), (lo,)])
    if width + 1 >= parts:  # balanced: sizes differ by at most one
        sizes = [min(r.end[0] if r.end else hi + 1, hi + 1) - max(r.start[0] if r.start else lo, lo) for r in ranges]
        assert len(ranges) == parts and max(sizes) - min(sizes) <= 1


def test_even_split_example():
    assert even_ranges(1, 100, 4) == [
        ChunkRange(None, (26,)), ChunkRange((26,), (51,)), ChunkRange((51,), (76,)), ChunkRange((76,), None)
    ]
    assert even_ranges(5, 5, 8) == [FULL_RANGE]


sample_st = st.lists(st.integers(0, 10**6), min_size=0, max_size=300).map(lambda xs: sorted((x,) for x in xs))


@cases(scale=0.2)
@given(sample_st, st.integers(1, 40), st.booleans())
def test_sampled_ranges_cover_exactly(sample, parts, bounded):
    within = ChunkRange((-1,), (10**6 + 1,)) if bounded else FULL_RANGE
    ranges = sampled_ranges(sample, parts, within)
    assert 1 <= len(ranges) <= parts
    assert_exact_cover(ranges, within, sample + [(-5,), (10**6 + 7,)])


def test_skewed_integer_keys_balance_by_sample():
    # 90% of the rows sit in 1..1000, the rest spread to 10^9: an even split puts almost
    # everything in one range; sampled boundaries give each range about the same count
    keys = list(range(1, 9001)) + list(range(1000, 10**9, 10**9 // 1000))
    sample = sorted((k,) for k in keys[::10])
    ranges = plan_ranges(4, sample=sample, min_max=(1, 10**9))
    counts = [sum(r.contains((k,)) for k in keys) for r in ranges]
    assert len(ranges) == 4 and sum(counts) == len(keys)
    assert max(counts) < 1.2 * len(keys) / 4, counts
    even = plan_ranges(4, min_max=(1, 10**9))
    assert max(sum(r.contains((k,)) for k in keys) for r in even) > 0.9 * len(keys)


def test_text_uuid_and_composite_keys_from_samples_keep_database_order():
    # the database's collation may order text unlike Python: boundaries come from the
    # sample as given, never re-sorted
    text = [("Apple",), ("banana",), ("Cherry",), ("date",), ("Eel",), ("fig",)]  # case-insensitive order
    assert sampled_ranges(text, 3) == [
        ChunkRange(None, ("Cherry",)), ChunkRange(("Cherry",), ("Eel",)), ChunkRange(("Eel",), None)
    ]
    uuids = sorted((str(uuid.UUID(int=i * (2**128 // 64))),) for i in range(64))
    r = plan_ranges(8, sample=uuids)
    assert len(r) == 8 and [x.start for x in r[1:]] == [uuids[i * 8] for i in range(1, 8)]
    comp = sorted((a, b) for a in ("eu", "us") for b in range(50))
    r = plan_ranges(4, sample=comp, within=ChunkRange(("eu", 0), None))
    assert_exact_cover(r, ChunkRange(("eu", 0), None), comp)
    assert [x.start for x in r] == [("eu", 0), ("eu", 25), ("us", 0), ("us", 25)]


def test_duplicate_and_tiny_samples():
    assert sampled_ranges([(1,)] * 50, 8) == [FULL_RANGE]
    assert sampled_ranges([], 8) == [FULL_RANGE]
    assert sampled_ranges([(1,), (2,)], 8) == [ChunkRange(None, (2,)), ChunkRange((2,), None)]


def test_plan_ranges_dispatch_and_errors():
    assert plan_ranges(1, min_max=(1, 100)) == [FULL_RANGE]
    assert plan_ranges(4) == [FULL_RANGE]
    assert plan_ranges(2, min_max=((1,), (10,))) == [ChunkRange(None, (6,)), ChunkRange((6,), None)]
    assert plan_ranges(2, min_max=(None, None)) == [FULL_RANGE]  # empty table
    with pytest.raises(ConfigurationError, match="pass sampled keys for text"):
        plan_ranges(2, min_max=("a", "z"))
    with pytest.raises(ConfigurationError, match="parts must be"):
        plan_ranges(0)


@cases(scale=0.2)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-20, 20)), min_size=1, max_size=60))
def test_chosen_keys_become_exactly_their_ranges(keys):
    ranges = keys_to_ranges(keys)
    chosen = set(keys)
    for a in range(-1, 5):
        for b in range(-25, 25):
            assert sum(r.contains((a, b)) for r in ranges) == ((a, b) in chosen)
    assert len(ranges) <= len(chosen)


def test_chosen_text_keys_are_refused_with_advice():
    assert keys_to_ranges([(1,), (2,), (3,), (7,)]) == [ChunkRange((1,), (4,)), ChunkRange((7,), (8,))]
    with pytest.raises(ConfigurationError, match="give key ranges"):
        keys_to_ranges([("abc",)])


def test_ranges_checked_in_the_database_order_for_any_key_type():
    from airflow_provider_cdc.core.planning import check_ranges_ranked

    rank = {("a",): 1, ("B",): 2, ("c",): 3, ("d",): 4}.__getitem__
    r = lambda a, b: ChunkRange(None if a is None else (a,), None if b is None else (b,))  # noqa: E731
    check_ranges_ranked("s.t", [r(None, "a"), r("a", "c"), r("c", None)], rank)  # touching, in any order
    check_ranges_ranked("s.t", [r("c", None), r(None, "a")], rank)
    with pytest.raises(ConfigurationError, match="empty or inverted"):
        check_ranges_ranked("s.t", [r("c", "a")], rank)
    with pytest.raises(ConfigurationError, match="empty or inverted"):
        check_ranges_ranked("s.t", [r("B", "B")], rank)
    with pytest.raises(ConfigurationError, match="overlap"):
        check_ranges_ranked("s.t", [r("a", "d"), r("B", "c")], rank)
    with pytest.raises(ConfigurationError, match="overlap"):
        check_ranges_ranked("s.t", [r(None, "B"), r(None, "d")], rank)


def test_conf_keys_must_have_the_key_columns_json_types():
    from airflow_provider_cdc.core.schema import Column

    schema = TableSchema(TableName("s", "t"), (Column("id", "int64"), Column("name", "string"), Column("d", "date")),
                         ("id", "name"))
    ok = SnapshotRequest.from_dict({"tables": ["s.t"], "ranges": {"s.t": [[[1, "a"], [2, "b"]]]}})
    ok.check_schema(schema)
    for bad, message in (([["1", "a"], None], "column 'id' is int64"), ([[1, 2], None], "column 'name' is string"),
                         ([[True, "a"], None], "column 'id'")):
        with pytest.raises(ConfigurationError, match=message):
            SnapshotRequest.from_dict({"tables": ["s.t"], "ranges": {"s.t": [bad]}}).check_schema(schema)
    with pytest.raises(ConfigurationError, match="chosen key"):
        SnapshotRequest.from_dict({"tables": ["s.t"], "keys": {"s.t": [[1, None]]}}).check_schema(schema)
