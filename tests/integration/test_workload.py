"""The demo/benchmark workload against the real databases: bulk load and background writer."""

from __future__ import annotations

import time

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.schema import TableName
from tools import workload as w


@pytest.fixture(params=["pg", "mysql"])
def source(request):
    return request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")


@pytest.fixture
def table(source, unique_name):
    # a hostile name: quote, space and unicode must survive quoting everywhere
    t = w.default_table(source, f'wl "q" é {unique_name}')
    yield t
    w.drop_table(source, t)


def _rows(source, table, sql_tail="", params=()):
    conn = w.connect(source)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT * FROM {w.quote_table(w._params(source), table)} {sql_tail}", params)
        return cur.fetchall()
    finally:
        conn.close()


def _wait_for(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_create_demo_table_loads_mixed_types(source, table):
    n = w.create_demo_table(source, table, 1234)
    assert n == 1234
    rows = _rows(source, table, "ORDER BY 1")
    assert [r[0] for r in rows] == list(range(1, 1235))
    row = rows[6]  # id 7
    assert row[1] == "customer 00000007"
    assert str(row[2]) == f"{(7 * 7919) % 1000000 / 100:.2f}"
    assert row[3].microsecond != 0 or row[3].second != 0
    assert bool(row[4]) is True and bool(rows[2][4]) is False  # id 3 -> false
    assert '"tier"' in (row[5] if isinstance(row[5], str) else __import__("json").dumps(row[5]))
    assert len(bytes(row[6])) == 16
    assert rows[9][7] is None and isinstance(row[7], str)  # id 10 -> NULL note
    # re-creating replaces the table
    assert w.create_demo_table(source, table, 10) == 10


def test_writer_commits_all_kinds_and_reuses_keys(source, table):
    w.create_demo_table(source, table, 200)
    writer = w.BackgroundWriter(source, table, threads=3, rate=None, seed=7)
    with writer:
        _wait_for(lambda: writer.stats().ops["reinsert"] >= 3 and writer.stats().ops["update"] >= 10)
    stats = writer.stats()
    assert stats.committed > 0 and stats.errors == [], stats.errors
    assert stats.ops["insert"] > 0 and stats.ops["delete"] > 0
    ids = {r[0] for r in _rows(source, table)}
    assert any(i > 200 for i in ids), "new keys above the loaded range"
    assert len(ids & set(range(1, 201))) < 200, "some loaded keys deleted"
    # the writer stopped: the table no longer changes
    before = sorted(_rows(source, table), key=lambda r: r[0])
    time.sleep(0.3)
    assert sorted(_rows(source, table), key=lambda r: r[0]) == before


def test_writer_updates_touch_the_loaded_range(source, table):
    w.create_demo_table(source, table, 50)
    orig = {r[0]: r for r in _rows(source, table)}
    writer = w.BackgroundWriter(source, table, threads=2, rate=None, mix={"update": 1}, seed=3)
    with writer:
        _wait_for(lambda: writer.committed >= 40)
    now = {r[0]: r for r in _rows(source, table)}
    assert set(now) == set(orig)  # updates only
    assert sum(1 for k in orig if now[k] != orig[k]) >= 10


def test_writer_rejects_bad_settings(source):
    t = TableName("x", "y")
    with pytest.raises(ConfigurationError, match="threads"):
        w.BackgroundWriter(source, t, threads=0)
    with pytest.raises(ConfigurationError, match="rate"):
        w.BackgroundWriter(source, t, rate=0)
    with pytest.raises(ConfigurationError, match="unknown writer op"):
        w.BackgroundWriter(source, t, mix={"truncate": 1})
