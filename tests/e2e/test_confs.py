"""Confs are untrusted input and work is bounded, through the real DAGs on both databases.

- A ``where`` that tries to leave its parentheses (``id < 100) OR (id > 0``, which made a
  snapshot endless), calls a function or runs a subquery fails the plan task naming the part,
  before anything is written (no progress Variable, no staged chunk).
- A valid ``where`` with hostile literals (quotes, a backslash, ``%``) copies exactly the rows
  it selects; a whole-table snapshot after it ends in verify at 0 mismatched.
- Inverted key ranges fail the plan task.
- A chunk that does not advance past the previous one (a fault no real part produces now:
  injected) stops the range task with an error instead of reading forever.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_cdc import airflow_variables, storage
from airflow_provider_cdc.pipeline import snapshot as snapshot_mod
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from tools import workload as w

from .helpers import SNAPSHOT_CONF, Pipeline, qt

pytestmark = pytest.mark.timeout(900)




def snap(p: Pipeline, expect: str = "success", **conf):
    return p.run("cdc_snapshot", {"action": "start", "tables": [p.table.id], **SNAPSHOT_CONF, **conf}, expect=expect)


def _nothing_written(p: Pipeline) -> None:
    assert airflow_variables.load(p.source, p.table.id, p.data_dir) is None
    assert not [x for x in Path(p.data_dir).rglob("chunk-*.parquet")]


@pytest.mark.parametrize("where", ["id < 100) OR (id > 0", "{sleep} = 0", "id IN (SELECT 1)",
                                   "id < 10; DELETE FROM t", "secret_column > 1"])
def test_a_hostile_where_fails_the_plan_before_anything_is_written(pipeline, where):
    p = pipeline
    where = where.format(sleep="pg_sleep(1)::text" if p.scheme == "pg" else "sleep(1)")
    snap(p, "failed", where=where)
    _nothing_written(p)


def test_inverted_key_ranges_fail_the_plan(pipeline):
    p = pipeline
    snap(p, "failed", key_ranges=[{"start": [500], "end": [100]}])
    _nothing_written(p)


def test_a_where_with_hostile_literals_copies_exactly_its_rows(pipeline):
    p = pipeline
    odd = "it's \\ 50% \"odd\""
    conn = w.connect(p.uri)
    try:
        conn.cursor().execute(f"UPDATE {qt(p)} SET name = %s WHERE id IN (7, 8, 2900)", (odd,))  # noqa: S608
        conn.commit()
    finally:
        conn.close()
    name = "name" if p.scheme == "mysql" else '"name"'
    literal = odd.replace("'", "''").replace("\\", "\\\\" if p.scheme == "mysql" else "\\")  # the SQL a user writes
    snap(p, where=f"{name} = '{literal}' OR (id BETWEEN 10 AND 12 AND {name} LIKE '%10')")
    assert p.progress().status == "done"
    got = sorted(r["id"] for r in read_mirror(p.data_dir, p.source, p.table).to_pylist())
    assert got == [7, 8, 10, 2900], got  # of ids 10..12 only 'customer 00000010' ends in 10
    p.snapshot()  # then the whole table
    p.catch_up()
    p.assert_equal()
    assert read_mirror(p.data_dir, p.source, p.table).num_rows == w.count_rows(p.uri, p.table)


def test_a_chunk_that_does_not_advance_stops_the_range(pipeline, monkeypatch):
    p = pipeline
    real = snapshot_mod.snapshot_chunk
    calls = {"n": 0}

    def stuck(dialect, schema, rng, **kw):
        res = real(dialect, schema, rng, **kw)
        calls["n"] += 1
        if kw.get("after_key") is not None and res.last_key is not None:
            from dataclasses import replace

            return replace(res, last_key=tuple(kw["after_key"]), exhausted=False)  # read the same keys again
        return res

    monkeypatch.setattr(snapshot_mod, "snapshot_chunk", stuck)
    snap(p, "failed", parallelism=1)
    assert calls["n"] <= 2 * 4  # the second chunk of each try stopped it (retries included)
    assert p.progress().status != "done"


def test_columns_only_case_apart_fail_the_plan_for_the_mirror_and_snapshot_to_events(pg_uri, unique_name, tmp_path,
                                                                                     monkeypatch, capfd):
    """PostgreSQL holds "Þ" and "þ" as two columns; the Delta mirror cannot (it compares names
    without case). With the mirror among the sinks the plan fails naming both columns, before
    anything is written; with the event log alone the snapshot runs."""
    p = Pipeline(pg_uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(pg_uri, p.table, 300)
    conn = w.connect(pg_uri)
    try:
        conn.cursor().execute(f'ALTER TABLE {qt(p)} ADD COLUMN "Þ" boolean DEFAULT true, ADD COLUMN "þ" boolean')
        conn.commit()
    finally:
        conn.close()
    p.capture_now()
    try:
        snap(p, "failed")
        out, err = capfd.readouterr()
        assert "has columns 'Þ' and 'þ', whose names differ only in case" in out + err
        _nothing_written(p)
        monkeypatch.setenv("CDC_SINKS", "events")
        snap(p)
        assert p.progress().status == "done"
        # Delta cannot hold both columns either: this table's event log stays plain files, all read
        from airflow_provider_cdc.sinks.event_log import read_events, table_dir

        assert not storage.exists(storage.join(table_dir(p.data_dir, p.source, p.table), "_delta_log"))
        assert read_events(p.data_dir, p.source, p.table).num_rows == 300
    finally:
        p.cleanup()
