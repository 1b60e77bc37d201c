"""Schema changes (I2, I10) through the real DAGs on both databases.

- ADD COLUMN and DROP COLUMN during capture: the new column reaches the event log and the
  Delta mirror from its position on (Delta schema evolution); the dropped one stays in the
  mirror, null from then on. No re-snapshot needed: verify at 0 mismatched.
- The same while a snapshot runs (between two chunks of one range task): the snapshot goes on.
- A type change (int -> text) on one of two tables stops only that table: the changelog run
  fails naming it, the other table's changes are applied; a whole-table re-snapshot rebuilds
  the mirror with the new column type and the changelog is green again.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline import snapshot as snapshot_mod
from airflow_provider_cdc.pipeline.verify import read_event_log, verify_table
from airflow_provider_cdc.sinks.mirror_fencing import schema_stopped
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import mirror_dir
from tools import workload as w

from .helpers import BOTH_STRATEGIES, Pipeline, asset_events, qt, run_sql
from .hostile import HostileSource, running

pytestmark = pytest.mark.timeout(900)




def _add_and_drop(p: Pipeline) -> list[str]:
    return [f"ALTER TABLE {qt(p)} ADD COLUMN extra varchar(40)",
            f"UPDATE {qt(p)} SET extra = 'noted', name = 'after add' WHERE id <= 20",  # noqa: S608
            f"ALTER TABLE {qt(p)} DROP COLUMN active",
            f"UPDATE {qt(p)} SET extra = 'after drop' WHERE id > 20 AND id <= 30",  # noqa: S608
            f"INSERT INTO {qt(p)} (id, name, amount, updated_at, extra) VALUES (900001, 'new', 1, "  # noqa: S608
            f"{'now()' if p.scheme == 'pg' else 'NOW(6)'}, 'inserted')",
            f"DELETE FROM {qt(p)} WHERE id = 40"]  # noqa: S608


def _check(p: Pipeline) -> None:
    p.assert_equal()
    live = read_mirror(p.data_dir, p.source, p.table)
    assert live.num_rows == w.count_rows(p.uri, p.table)
    rows = {r["id"]: r for r in live.select(["id", "extra", "active"]).to_pylist()}
    assert rows[900001]["extra"] == "inserted" and rows[5]["extra"] == "noted" and rows[25]["extra"] == "after drop"
    assert rows[25]["active"] is None  # dropped: null from then on, the column kept


def test_add_and_drop_column_during_capture_reach_the_mirror(pipeline):
    p = pipeline
    if p.scheme == "pg":  # both engines: PostgreSQL's rounds through spark-submit, MariaDB's in the worker
        p.mp.setenv("CDC_LOCAL_MAX_ROWS", "0")
    p.snapshot()
    p.catch_up()
    run_sql(p, _add_and_drop(p), one_transaction=False)
    p.catch_up()
    _check(p)
    after = [e for e in read_event_log(p.data_dir, p.source, p.table).to_pylist() if e["op"] == "c"]
    assert after and '"extra":"inserted"' in after[-1]["after"].replace(" ", "")


@BOTH_STRATEGIES
def test_add_and_drop_column_while_the_snapshot_runs(pipeline):
    p = pipeline
    fired = p.on_chunk(3, lambda: run_sql(p, _add_and_drop(p), one_transaction=False))
    p.snapshot()
    assert fired["n"] > 3 and p.progress().status == "done"
    p.catch_up()
    _check(p)


@BOTH_STRATEGIES
def test_a_type_change_while_the_snapshot_runs_stops_it_until_it_starts_again(pipeline):
    p = pipeline
    alter = (f"ALTER TABLE {qt(p)} ALTER COLUMN amount TYPE text" if p.scheme == "pg"
             else f"ALTER TABLE {qt(p)} MODIFY amount varchar(40)")
    real = snapshot_mod.snapshot_chunk
    fired = p.on_chunk(3, lambda: run_sql(p, [alter, f"UPDATE {qt(p)} SET amount = 'n/a' WHERE id <= 5"]))  # noqa: S608
    p.run("cdc_snapshot", {"action": "start", "tables": [p.table.id], "chunk_size": 200, "parallelism": 2},
          expect="failed")
    assert fired["n"] >= 3 and p.progress().status != "done"
    p.mp.setattr(snapshot_mod, "snapshot_chunk", real)
    p.snapshot("stop")
    p.snapshot()  # a new one: reads the new type, rebuilds the mirror if one was written
    assert p.progress().status == "done"
    p.catch_up()
    p.assert_equal()
    live = read_mirror(p.data_dir, p.source, p.table)
    assert live.num_rows == w.count_rows(p.uri, p.table)
    assert str(live.schema.field("amount").type) == "string"
    assert {r["id"]: r["amount"] for r in live.select(["id", "amount"]).to_pylist()}[3] == "n/a"


class TwoTables(HostileSource):
    """Two plain tables of one source, ``a`` and ``b``: (id int primary key, v int)."""

    def __init__(self, uri, name, data_dir, monkeypatch, schema: str) -> None:
        super().__init__(uri, name, data_dir, monkeypatch, [TableName(schema, f"a_{name}"), TableName(schema, f"b_{name}")])

    def create(self) -> None:
        stmts = []
        for t in self.tables:
            stmts.append((f"CREATE TABLE {self.qt(t)} (id int PRIMARY KEY, v int)", ()))
            stmts += [(f"INSERT INTO {self.qt(t)} (id, v) VALUES (%s, %s)", (i, i)) for i in range(1, 101)]  # noqa: S608
        self.sql(stmts)

    def drop(self) -> None:
        self.sql([(f"DROP TABLE IF EXISTS {self.qt(t)}", ()) for t in self.tables])

    def verify(self, t: TableName):
        with self.dialect() as d:
            return verify_table(d, self.data_dir, self.source, t, chunk_rows=1000)


def applied_events(source: str, table_id: str) -> list[dict]:
    """The mirror Asset events the changelog's apply recorded for a table (their extra counts events)."""
    return [e for e in asset_events(source, table_id) if "events" in e]


@pytest.fixture(params=["pg", "mysql"])
def two(request, unique_name, tmp_path, monkeypatch):
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    schema = "public" if request.param == "pg" else urlsplit(uri).path.lstrip("/")
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")
    yield from running(TwoTables(uri, unique_name, tmp_path / "data", monkeypatch, schema), monkeypatch,
                       spark_for_pg=False)


def test_a_type_change_stops_only_its_table_until_a_resnapshot_rebuilds_it(two):
    p = two
    a, b = p.tables
    p.run("cdc_snapshot", {"action": "start", "tables": [a.id, b.id], "chunk_size": 30})
    p.catch_up()
    alter = (f"ALTER TABLE {p.qt(a)} ALTER COLUMN v TYPE text" if p.scheme == "pg"
             else f"ALTER TABLE {p.qt(a)} MODIFY v varchar(40)")
    p.sql([(alter, ()),
           (f"UPDATE {p.qt(a)} SET v = %s WHERE id <= 10", ("text now",)),  # noqa: S608
           (f"UPDATE {p.qt(b)} SET v = -v WHERE id <= 10", ()),  # noqa: S608
           (f"INSERT INTO {p.qt(b)} (id, v) VALUES (%s, %s)", (500, 500))])  # noqa: S608

    # the changelog fails loudly, naming table a; table b's changes are in its mirror, and its
    # mirror Asset event is recorded (apply succeeds; the run fails in mirror_schema_stops)
    applied = {t: len(applied_events(p.source, t.id)) for t in (a, b)}
    Pipeline.run(p, "cdc_changelog", expect="failed")
    assert len(applied_events(p.source, b.id)) == applied[b] + 1
    assert len(applied_events(p.source, a.id)) == applied[a]  # a's mirror did not change
    assert "changed type" in (schema_stopped(mirror_dir(p.data_dir, p.source, a)) or "")
    assert schema_stopped(mirror_dir(p.data_dir, p.source, b)) is None
    res_b = p.verify(b)
    assert res_b.ok and res_b.rows_checked == 101, res_b.summary()
    assert not p.verify(a).ok  # a waits

    # a snapshot of some keys cannot rebuild it: refused, naming the table, nothing written
    Pipeline.run(p, "cdc_snapshot", {"action": "start", "tables": [a.id], "keys": {a.id: [[1]]}}, expect="failed")
    # the whole-table re-snapshot rebuilds a's mirror with the new type
    p.run("cdc_snapshot", {"action": "start", "tables": [a.id], "chunk_size": 30})
    assert airflow_variables.load(p.source, a.id, p.data_dir).status == "done"
    p.sql([(f"UPDATE {p.qt(a)} SET v = %s WHERE id = 50", ("after rebuild",))])  # noqa: S608
    p.catch_up()
    for t in (a, b):
        res = p.verify(t)
        assert res.ok, f"{t}: {res.summary()}: {[m.describe() for m in res.examples]}"
        assert read_mirror(p.data_dir, p.source, t).num_rows == p.count(t)
    live = read_mirror(p.data_dir, p.source, a)
    assert str(live.schema.field("v").type) == "string"
    assert {r["id"]: r["v"] for r in live.to_pylist()}[50] == "after rebuild"
