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
import runpy
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_cdc import progress_store
from airflow_provider_cdc.dialects import dialect_class
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
from airflow_provider_cdc.pipeline import snapshot as snapshot_mod
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.verify import check_event_log, verify_table
from airflow_provider_cdc.sinks.base import applied_everywhere
from airflow_provider_cdc.sinks.mirror_delta import read_mirror
from airflow_provider_cdc.storage.staged import staged_watermark_position
from tools import workload as w

#: the watermark strategies a test of the snapshot's promises runs under (conftest ``strategy``)
BOTH_STRATEGIES = pytest.mark.parametrize("strategy", ["table", "log"])
#: the e2e core (snapshot under writers, capture, verify) on PostgreSQL 15, PostgreSQL 18 and
#: MariaDB (conftest ``pipeline``; the other tests run on 15 and MariaDB only, to keep CI short)
WITH_PG18 = pytest.mark.parametrize("pipeline", ["pg", "pg18", "mysql"], indirect=True)

ROOT = Path(__file__).resolve().parents[2]
ROWS = 3000
CHUNK = 200
SNAPSHOT_CONF = {"chunk_size": CHUNK, "parallelism": 2}


class Pipeline:
    """One source (its own connection id, slot, staging and Variables), one table, one data dir."""

    def __init__(self, uri: str, name: str, data_dir: Path, monkeypatch) -> None:
        self.uri = uri
        self.scheme = "pg" if uri.startswith("postgres") else "mysql"
        self.conn_id = f"cdc_e2e_{name}"
        self.source = self.conn_id
        self.data_dir = str(data_dir)
        self.table = w.default_table(uri, f"e2e_{name}")
        self.tables = [self.table]  # what cleanup drops (subclasses hold several)
        self.mp = monkeypatch
        # only this test's table (the capture scope, CDC_TABLES below): other tests' tables in the
        # same database (unsupported types, TOASTed updates without REPLICA IDENTITY FULL) must
        # not reach this capture
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}", uri)
        monkeypatch.setenv("CDC_SOURCE_CONN_ID", self.conn_id)
        monkeypatch.delenv("CDC_SOURCE", raising=False)
        monkeypatch.setenv("CDC_DATA_DIR", self.data_dir)
        monkeypatch.setenv("CDC_TABLES", self.table.id)
        monkeypatch.setenv("CDC_CHANGELOG_SCHEDULE", "none")
        # a DAG paused in Airflow pauses its snapshot; these runs must not start paused
        monkeypatch.setenv("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False")
        self.dialect_cls = dialect_class("postgres" if self.scheme == "pg" else "mysql")

    def dialect(self):
        return CdcSourceHook(self.conn_id).get_dialect(source=self.source)

    # --- DAG runs ------------------------------------------------------------------------
    def load_dag(self, dag_id: str):
        """The DAG, from a freshly parsed DAG file (it reads this test's environment)."""
        return runpy.run_path(str(ROOT / "dags" / f"{dag_id}.py"), run_name=f"e2e_{dag_id}_{uuid.uuid4().hex[:6]}")["dag"]

    def run(self, dag_id: str, conf: dict | None = None, *, expect: str = "success"):
        """dag.test() of :meth:`load_dag`'s DAG."""
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        dag = self.load_dag(dag_id)
        dag_id = dag.dag_id
        for task in dag.tasks:  # retries stay as the DAG sets them; only the wait between tries shrinks
            if hasattr(task, "partial_kwargs"):
                task.partial_kwargs["retry_delay"] = timedelta(seconds=1)
            else:
                task.retry_delay = timedelta(seconds=1)
        with create_session() as session:
            session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": False})
        dr = dag.test(run_conf=conf)
        assert dr.state == expect, f"{dag_id} run {dr.run_id} ended {dr.state}, expected {expect}"
        return dr

    def snapshot(self, action: str = "start", **conf):
        return self.run("cdc_snapshot", {"action": action, "tables": [self.table.id], **SNAPSHOT_CONF, **conf})

    def capture_now(self) -> None:
        """A first capture outside the DAGs: the slot / binlog offset exists from here on."""
        with self.dialect() as d:
            stage_changelog(d, self.data_dir)

    def catch_up(self, max_runs: int = 4) -> None:
        """Mark the log's end (a watermark row, or its position under watermark strategy "log") and
        run cdc_changelog until the mark is staged and applied to both sinks."""
        with self.dialect() as d:
            marker = d.mark(f"e2e-catchup-{uuid.uuid4()}")
        for _ in range(max_runs):
            self.run("cdc_changelog")
            pos = staged_watermark_position(self.data_dir, self.source, marker)
            if pos is not None and applied_everywhere(self.data_dir, self.source, pos):
                return
        raise AssertionError(f"catch-up watermark {marker} not staged and applied after {max_runs} cdc_changelog runs")

    def progress(self):
        return progress_store.load(self.source, self.table.id, self.data_dir)

    def assert_equal(self) -> None:
        """I2 and I1: verify reports 0 mismatches, the event log has no violation."""
        with self.dialect() as d:
            res = verify_table(d, self.data_dir, self.source, self.table, chunk_rows=1000)
            pk = d.describe_table(self.table).primary_key
        assert res.ok, f"{res.summary()}: {[m.describe() for m in res.examples]}"
        assert res.rows_checked == w.count_rows(self.uri, self.table) > 0
        rep = check_event_log(self.data_dir, self.source, self.table, primary_key=pk)
        assert rep.ok, f"{rep.summary()}: {rep.violations}"
        assert rep.events >= res.rows_checked  # every live row came through the log or a chunk

    # --- fault injection -----------------------------------------------------------------
    def on_chunk(self, after_calls: int, action):
        """Run ``action()`` after the ``after_calls``-th chunk (lw -> select -> hw) of this test."""
        real = snapshot_mod.snapshot_chunk
        calls = {"n": 0, "after_keys": []}

        def wrapped(dialect, schema, rng, **kw):
            res = real(dialect, schema, rng, **kw)
            calls["n"] += 1
            calls["after_keys"].append((rng.start, kw.get("after_key"), res.last_key))
            if calls["n"] == after_calls:
                action()
            return res

        self.mp.setattr(snapshot_mod, "snapshot_chunk", wrapped)
        return calls

    def kill_select(self, on_call: int):
        """The ``on_call``-th chunk read of this table dies after its first rows reached the
        chunk file: before the file is complete and before the high watermark. (Patched at the
        Parquet write both dialects' chunk reads share; PostgreSQL reads through COPY.)"""
        import pyarrow.parquet as pq

        real_read = self.dialect_cls.read_chunk
        real_write = pq.ParquetWriter.write_table
        table = self.table
        state = {"n": 0, "killed": 0, "armed": False}

        def read_chunk(dialect, schema, *args, **kwargs):
            if schema.table == table:
                state["n"] += 1
                state["armed"] = state["n"] == on_call
            try:
                return real_read(dialect, schema, *args, **kwargs)
            finally:
                state["armed"] = False

        def write_table(writer, tbl, *args, **kwargs):
            real_write(writer, tbl, *args, **kwargs)
            if state["armed"]:
                state["armed"] = False
                state["killed"] += 1
                raise ConnectionError("injected: chunk read killed in the middle (rows read, file incomplete)")

        self.mp.setattr(self.dialect_cls, "read_chunk", read_chunk)
        self.mp.setattr(pq.ParquetWriter, "write_table", write_table)
        return state

    def kill_capture_before_commit(self):
        """The next capture stages its segment, then dies before committing the offset (I6)."""
        real = self.dialect_cls.commit_offset
        state = {"killed": 0, "commits": 0}

        def commit_offset(dialect, offset, data_dir):
            if state["killed"] == 0:
                state["killed"] += 1
                raise ConnectionError("injected: capture killed after staging, before committing its offset")
            state["commits"] += 1
            return real(dialect, offset, data_dir)

        self.mp.setattr(self.dialect_cls, "commit_offset", commit_offset)
        return state

    def cleanup(self) -> None:
        from airflow.models.variable import Variable

        try:
            with self.dialect() as d:
                for name in ("drop_slot", "drop_publication"):
                    fn = getattr(d, name, None)
                    if callable(fn):
                        fn()
        finally:
            self.drop()
            for t in self.tables:
                Variable.delete(progress_store.variable_key(self.source, t.id))
                Variable.delete(progress_store.verify_key(self.source, t.id))
            Variable.delete(progress_store.lag_key(self.source))

    def drop(self) -> None:
        w.drop_table(self.uri, self.table)




@BOTH_STRATEGIES
@WITH_PG18
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
    calls = p.on_chunk(3, lambda: progress_store.request(p.source, p.table.id, "pause", p.data_dir))
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
    p.on_chunk(2, lambda: progress_store.request(p.source, p.table.id, "stop", p.data_dir))
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
    from airflow_provider_cdc.sinks.mirror_delta import compact_inactive, fence_out_merges

    p = pipeline
    p.mp.setenv("CDC_LOCAL_MAX_ROWS", str(10 * ROWS))  # the merge runs in this process
    p.mp.setattr(local_jobs, "merge_round", partial(local_jobs.merge_round, max_batch_rows=CHUNK))
    real_write = common.write_to_sinks
    state = {"groups": 0, "compacted": None}

    def stop_deletes_and_compaction_after_the_first_group(sinks, events):
        real_write(sinks, events)
        state["groups"] += 1
        if state["groups"] != 1:
            return
        progress_store.request(p.source, p.table.id, "stop", p.data_dir)
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
                                         pg_uri=None, pg_schema=None, require_schema=False)
        local_jobs.apply_changelog(p.data_dir, p.source, apply_sinks)
        state["compacted"] = compact_inactive(p.data_dir, p.source, lambda t: progress_store.status(p.source, t, p.data_dir))

    p.mp.setattr(common, "write_to_sinks", stop_deletes_and_compaction_after_the_first_group)
    p.snapshot()
    assert state["compacted"] and state["compacted"][p.table.id] > 0, "the deletes' tombstones must have been compacted"
    assert p.progress().status == "stopped"
    groups_of_the_stopped_merge = state["groups"]
    p.mp.setattr(common, "write_to_sinks", real_write)
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
