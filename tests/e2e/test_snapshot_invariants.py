"""The whole DBLog loop through the real DAGs (dag.test, tasks in this process, Spark through
spark-submit), on PostgreSQL and on MariaDB, ending with verify: mirror == source (I2) and
the event log consistent per key (I1).

Faults that a real part cannot produce on demand are injected in-process: a chunk SELECT
that dies after reading (the connection drops mid-stream) and a capture that dies after
staging but before committing its offset. Pause and stop go through the progress
Variable between chunks, as the pause/stop actions do.

Small tables (a few thousand rows, 200-row chunks) keep a scenario to a few Spark jobs.
"""

from __future__ import annotations

import json
import time

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from tools import workload as w

from .helpers import BOTH_STRATEGIES, CHUNK, ROWS

#: the e2e core (snapshot under writers, capture, verify) on PostgreSQL 15 to 18 and MariaDB
#: (conftest ``pipeline``; the other tests run on 15 and MariaDB only, to keep CI short)
#: (PostgreSQL 15 and MariaDB under both watermark strategies; 16, 17 and 18 each under one, in turn:
#: the dialect suite runs both strategies on every version, tests/integration/test_postgres_dialect.py)
WITH_PG16_TO_18 = pytest.mark.parametrize(("pipeline", "strategy"), [
    *((server, strategy) for server in ("pg", "mysql") for strategy in ("table", "log")),
    ("pg16", "log"), ("pg17", "table"), ("pg18", "log")], indirect=["pipeline"])


@WITH_PG16_TO_18
def test_snapshot_under_concurrent_writers_with_a_killed_chunk_and_a_killed_capture(pipeline):
    """Writers on 3 connections during the snapshot; the 3rd chunk SELECT dies mid-stream and its
    task is retried; then the catch-up capture dies before its commit and is retried."""
    p = pipeline
    killed = p.kill_select(on_call=3)
    with w.BackgroundWriter(p.uri, p.table, threads=3, rate=150, seed=11) as writer:
        p.snapshot()
        time.sleep(0.5)
    stats = writer.stats()
    assert stats.committed > 0 and stats.errors == [], stats.errors
    assert killed["killed"] == 1, "the injected SELECT failure must have fired"
    assert p.progress().status == "done"

    capture = p.kill_capture_before_commit()
    p.catch_up()
    assert capture["killed"] == 1 and capture["commits"] >= 1
    p.assert_equal()


@BOTH_STRATEGIES
def test_pause_mid_snapshot_then_resume(pipeline):
    p = pipeline
    calls = p.on_chunk(3, lambda: airflow_variables.request(p.source, p.table.id, "pause", p.data_dir))
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=5):
        p.snapshot()
        assert p.progress().status == "paused"
        read_before = calls["n"]
        assert read_before == 3, "chunk tasks must stop at the pause, before their next chunk"
        committed = {start: last for start, _after, last in calls["after_keys"]}
        p.snapshot("resume")
    assert p.progress().status == "done"
    # the resume continued each range after its last committed chunk: nothing read twice
    resumed = calls["after_keys"][read_before:]
    for start, after, _last in resumed:
        if start in committed:
            assert after == committed.pop(start), "a resumed range must continue after its last committed key"
    p.catch_up()
    p.assert_equal()


@BOTH_STRATEGIES
def test_stop_then_start_over(pipeline):
    p = pipeline
    p.on_chunk(2, lambda: airflow_variables.request(p.source, p.table.id, "stop", p.data_dir))
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=9):
        p.snapshot()
        first = p.progress()
        assert first.status == "stopped"
        # a stopped snapshot commits nothing more (its merge in flight is fenced out and its
        # unmerged chunks are dropped): the mirror is incomplete
        assert len(read_mirror(p.data_dir, p.source, p.table)) < w.count_rows(p.uri, p.table)
        p.snapshot("start")
    second = p.progress()
    assert second.status == "done" and second.snapshot_id != first.snapshot_id
    p.catch_up()
    p.assert_equal()


def test_stop_during_the_merge_never_brings_deleted_rows_back(pipeline):
    """The stop-during-merge bug, in-process: the merge writes its first group of chunk rows,
    then `stop` lands (as the stop action does it), the source deletes every other row, and
    the changelog is captured, applied and compacted (the stopped snapshot no longer holds
    the tombstones back) before the merge goes on with groups read before the deletes.
    Unfenced, those groups re-inserted the deleted rows and no later snapshot removed them."""
    from functools import partial

    from airflow_provider_cdc.pipeline import arrow_engine as local_jobs
    from airflow_provider_cdc.pipeline.spark import common
    from airflow_provider_cdc.sinks.mirror_compaction import compact_inactive
    from airflow_provider_cdc.sinks.mirror_fencing import fence_out_merges

    p = pipeline
    p.mp.setenv("CDC_LOCAL_MAX_ROWS", str(10 * ROWS))  # the merge runs in this process
    p.mp.setattr(local_jobs, "merge_round", partial(local_jobs.merge_round, max_batch_rows=CHUNK))
    real_write = local_jobs.write_to_sinks
    state = {"groups": 0, "compacted": None, "applying": False}

    def stop_deletes_and_compaction_after_the_first_group(sinks, events):
        real_write(sinks, events)
        if state["applying"]:  # the changelog's apply below writes its batches through it too
            return
        state["groups"] += 1
        if state["groups"] != 1:
            return
        airflow_variables.request(p.source, p.table.id, "stop", p.data_dir)
        fence_out_merges(p.data_dir, p.source, p.table)
        params = w.ConnectionParams.from_uri(p.uri)
        conn = w.connect(params)
        try:
            conn.cursor().execute(f"DELETE FROM {w.quote_table(params, p.table)} WHERE {w.quote_ident(params, 'id')} % 2 = 0")
            conn.commit()
        finally:
            conn.close()
        p.capture_now()
        apply_sinks = common.build_sinks("events,mirror", data_dir=p.data_dir, source=p.source, database=None,
                                         require_schema=False)
        state["applying"] = True
        try:
            local_jobs.apply_changelog(p.data_dir, p.source, apply_sinks)
        finally:
            state["applying"] = False
        state["compacted"] = compact_inactive(p.data_dir, p.source, lambda t: airflow_variables.status(p.source, t, p.data_dir))

    p.mp.setattr(local_jobs, "write_to_sinks", stop_deletes_and_compaction_after_the_first_group)
    p.snapshot()
    assert state["compacted"] and state["compacted"][p.table.id] > 0, "the deletes' tombstones must have been compacted"
    assert p.progress().status == "stopped"
    groups_of_the_stopped_merge = state["groups"]
    p.mp.setattr(local_jobs, "write_to_sinks", real_write)
    p.snapshot("start")
    assert p.progress().status == "done"
    p.catch_up()
    p.assert_equal()  # no deleted row came back (unfenced: 1,400 of 1,500 deleted rows came back)
    assert groups_of_the_stopped_merge == 1, "the stopped snapshot's merge must not write another group"


def test_a_table_keyed_by_a_unique_index_snapshots_under_writers_and_verifies(pipeline):
    """No primary key: a unique index on NOT NULL ``id`` keys the table, named in
    CDC_KEY_COLUMNS (PostgreSQL: under REPLICA IDENTITY FULL). Snapshot through the DAGs under
    writers, catch up, verify 0 mismatched and an event log without violations."""
    p = pipeline
    params = ConnectionParams.from_uri(p.uri)
    t, ux = w.quote_table(params, p.table), w.quote_ident(params, f"ux_{p.table.name}")
    conn = w.connect(params)
    try:
        with conn.cursor() as cur:
            if p.scheme == "pg":
                cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'", (t,))
                cur.execute(f"ALTER TABLE {t} DROP CONSTRAINT {w.quote_ident(params, cur.fetchone()[0])}")
                cur.execute(f"CREATE UNIQUE INDEX {ux} ON {t} (id)")
            else:
                cur.execute(f"ALTER TABLE {t} DROP PRIMARY KEY, ADD UNIQUE KEY {ux} (id)")
        conn.commit()
    finally:
        conn.close()
    p.mp.setenv("CDC_KEY_COLUMNS", json.dumps({p.table.id: ["id"]}))
    with p.dialect() as d:
        assert d.describe_table(p.table).primary_key == ("id",)
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=150, seed=5) as writer:
        p.snapshot()
        time.sleep(0.5)
    stats = writer.stats()
    assert stats.committed > 0 and stats.errors == [], stats.errors
    assert p.progress().status == "done"
    p.catch_up()
    p.assert_equal()
