"""Snapshot operators without a database: conf validation (nothing written on a bad conf),
pause/stop/resume transitions, committed-chunk sidecars, commit -> done."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_provider_cdc import airflow_variables, storage
from airflow_provider_cdc.core.errors import ConfigurationError, StateError
from airflow_provider_cdc.core.formats import PLAN
from airflow_provider_cdc.core.plans import Throttle
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.operators.capture import ChangelogCaptureOperator
from airflow_provider_cdc.operators.snapshot import (
    SnapshotChunkOperator,
    SnapshotCommitOperator,
    SnapshotPlanOperator,
    _dag_is_paused,
)
from airflow_provider_cdc.pipeline import snapshot_state as authority
from airflow_provider_cdc.pipeline.snapshot import (
    SEQ_STRIDE,
    key_reached,
    range_state,
    read_sidecars,
)
from airflow_provider_cdc.pipeline.snapshot_conf import parse_snapshot_conf
from airflow_provider_cdc.pipeline.snapshot_controller import SnapshotController
from airflow_provider_cdc.storage.layout import plan_path

from .helpers import T, committed, ctx, progress


def plan_op(tmp_path, **kw):
    kw.setdefault("cdc_overrides", {"CDC_TABLES": T.id})  # the capture scope the confs below narrow
    return SnapshotPlanOperator(
        task_id="plan", data_dir=str(tmp_path), cdc_conn_id="unused", source="src", **kw
    )


# --- conf ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"action": "restart", "tables": ["public.t"]},
            "'action' must be one of start, pause, resume, stop, refresh",
        ),
        ({"tables": ["t"]}, "needs a schema"),
        ({"tables": ["public.t"], "chunk_size": 0}, "chunk_size"),
        ({"tables": ["public.t"], "chunk_size": "many"}, "chunk_size"),
        ({"tables": ["public.t"], "parallelism": 100000}, "parallelism"),
        ({"tables": ["public.t"], "where": "id > 1; DROP TABLE x"}, "single condition"),
        ({"tables": ["public.t"], "key_ranges": {"public.u": [[1, 2]]}}, "public.u"),
        ({"tables": ["public.t"], "key_ranges": [[5, 1]]}, "empty"),
        ({"tables": ["public.t"], "delay_seconds": -1}, "delay_seconds"),
        ({"tables": ["public.t"], "chunksize": 10}, "unknown conf key"),
        ({}, "CDC_TABLES"),
        # a conf narrows the capture scope (CDC_TABLES), never widens it: issue 31's report; the
        # message is the one scope check's (core/scope.py), the same at every entry point
        ({"action": "start", "tables": ["pg_catalog.pg_authid", T.id]}, "pg_catalog.pg_authid is in system schema"),
        ({"tables": ["public.secrets"]}, "public.secrets is not captured by source .*outside the capture scope"),
        ({"action": "pause", "tables": ["mysql.user"]}, "mysql.user is in system schema"),
        ({"action": "stop", "tables": ["public.secrets"]}, "outside the capture scope"),
        ({"action": "start", "tables": ["cdc.watermark"]}, "cdc.watermark is the watermark table"),
    ],
)
def test_bad_conf_is_rejected_before_anything_is_written(tmp_path, variables, conf, message):
    scope = {"CDC_TABLES": T.id} if conf else {}  # {}: no conf tables and no CDC_TABLES
    with pytest.raises(ConfigurationError, match=message):
        plan_op(tmp_path, cdc_overrides=scope).execute(ctx(conf))
    assert variables.writes == []
    assert not any(tmp_path.iterdir())


def test_without_a_capture_scope_no_snapshot_runs_and_the_error_says_how_to_set_one(tmp_path, variables):
    with pytest.raises(ConfigurationError, match="no capture scope: set CDC_TABLES"):
        plan_op(tmp_path, cdc_overrides={}).execute(ctx({"tables": [T.id]}))
    assert variables.writes == [] and not any(tmp_path.iterdir())


def test_conf_defaults_and_shapes():
    c = parse_snapshot_conf(
        {"key_ranges": [{"start": 1, "end": 10}], "chunk_size": 7}, default_tables="public.a, public.b"
    )
    assert c.action == "start" and [t.id for t in c.tables] == ["public.a", "public.b"]
    assert c.request.ranges["public.b"] == (ChunkRange((1,), (10,)),)
    assert c.request.throttle.chunk_size == 7 and "chunk_size" in c.given and "parallelism" not in c.given


# --- control actions -------------------------------------------------------------------------
def test_pause_then_resume_keeps_progress(tmp_path, variables):
    progress(tmp_path)
    assert plan_op(tmp_path).execute(ctx({"action": "pause", "tables": [T.id]})) == []
    assert airflow_variables.status("src", T.id, str(tmp_path)) == "paused"
    committed(tmp_path, 0, 0, 9, 10, False, merged=True)
    committed(tmp_path, 1, 0, 19, 10, False, after=9)
    committed(tmp_path, SEQ_STRIDE, 1, None, 0, True, merged=True)  # range 1 read and merged
    work = plan_op(tmp_path).execute(ctx({"action": "resume", "tables": [T.id], "chunk_size": 25}))
    assert [w["range_index"] for w in work] == [0]
    assert work[0]["chunk_size"] == 25 and work[0]["snapshot_id"] == "S1"
    assert airflow_variables.status("src", T.id, str(tmp_path)) == "running"


def test_invalid_transitions_are_clear_errors(tmp_path, variables):
    with pytest.raises(StateError, match="no snapshot"):
        plan_op(tmp_path).execute(ctx({"action": "pause", "tables": [T.id]}))
    progress(tmp_path, status="stopped")
    with pytest.raises(StateError, match="starts over: use action=start"):
        plan_op(tmp_path).execute(ctx({"action": "resume", "tables": [T.id]}))
    progress(tmp_path, status="running")
    with pytest.raises(StateError, match="action=resume, or stop it first"):
        plan_op(tmp_path).execute(ctx({"action": "start", "tables": [T.id]}))
    assert plan_op(tmp_path).execute(ctx({"action": "stop", "tables": [T.id]})) == []
    assert airflow_variables.status("src", T.id, str(tmp_path)) == "stopped"


def test_chunk_task_stops_when_paused_and_returns_unmerged_chunks(tmp_path, variables):
    progress(tmp_path, status="paused")
    res = committed(tmp_path, 0, 0, 9, 10, False)
    work = {
        "table": T.id,
        "snapshot_id": "S1",
        "range_index": 0,
        "ranges_total": 2,
        "range": {"start": None, "end": [50]},
        "upper_bound": [100],
        "where": None,
        "chunk_size": 10,
        "delay_seconds": 0,
    }
    op = SnapshotChunkOperator(
        task_id="c", work=work, data_dir=str(tmp_path), source="src", cdc_conn_id="unused"
    )
    (tmp_path / "staging/src/schemas").mkdir(parents=True)
    from airflow_provider_cdc.core.schema import Column, TableSchema
    from airflow_provider_cdc.storage.layout import schema_path

    with open(schema_path(str(tmp_path), "src", T), "w") as fh:
        fh.write(TableSchema(T, (Column("id", "int64"),), ("id",)).to_json())
    assert op.execute({}) == [
        json.loads(json.dumps(res.to_dict()))
    ]  # no connection was made: paused before the first chunk


# --- sidecars and commit -----------------------------------------------------------------------
def test_range_state_continues_after_the_last_committed_chunk(tmp_path):
    committed(tmp_path, 0, 0, 9, 10, False, merged=True)
    committed(tmp_path, 1, 0, 19, 10, False, after=9)
    st = range_state(read_sidecars(str(tmp_path), "src", T, "S1"), 0, [100])
    assert (st.next_seq, st.after_key, st.exhausted, st.rows, st.chunks) == (2, (19,), False, 20, 2)
    assert [r["seq"] for r in st.unmerged] == [1]
    empty = range_state([], 1, [100])
    assert (empty.next_seq, empty.after_key, empty.exhausted) == (SEQ_STRIDE, None, False)


def test_key_reached():
    assert key_reached((100,), (100,)) and key_reached((101,), [100]) and not key_reached((99,), (100,))
    assert key_reached(("b",), ("b",)) and not key_reached(
        ("c",), ("b",)
    )  # text order belongs to the database
    assert not key_reached(None, (1,)) and not key_reached((1,), None)


def test_commit_marks_merged_and_finishes(tmp_path, variables):
    progress(tmp_path)
    a = committed(tmp_path, 0, 0, 49, 50, True)
    b = committed(tmp_path, SEQ_STRIDE, 1, 100, 51, True)
    op = SnapshotCommitOperator(
        task_id="commit",
        chunks=[[a.to_dict()], [b.to_dict()]],
        data_dir=str(tmp_path),
        source="src",
        cdc_conn_id="unused",
    )
    out = op.execute({})
    assert out[T.id] == {"status": "done", "rows": 101, "chunks": 2}
    assert all(s["merged"] for s in read_sidecars(str(tmp_path), "src", T, "S1"))
    assert op.execute({})[T.id]["status"] == "done"  # a retried commit changes nothing


def test_commit_keeps_a_paused_snapshot_paused(tmp_path, variables):
    progress(tmp_path, status="paused")
    a = committed(tmp_path, 0, 0, 9, 10, False)
    out = SnapshotCommitOperator(
        task_id="commit", chunks=[a.to_dict()], data_dir=str(tmp_path), source="src", cdc_conn_id="unused"
    ).execute({})
    assert out[T.id]["status"] == "paused"
    assert airflow_variables.load("src", T.id, str(tmp_path)).rows == 10


def test_operators_do_no_io_in_init(tmp_path):
    # DAG files are parsed constantly: building operators must not touch connections or files
    ChangelogCaptureOperator(task_id="cap", data_dir=str(tmp_path / "nope"), cdc_conn_id="missing")
    plan_op(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


class FakeTI:
    """Only what _dag_is_paused asks the Task SDK: the DAG's paused flag."""

    dag_id = "cdc_snapshot"

    def __init__(self, paused: bool) -> None:
        self.paused = paused

    def get_dag(self, dag_id):
        return SimpleNamespace(is_paused=self.paused)


def test_dag_pause_stops_a_chunk_task_only_when_it_happens_while_running(tmp_path, variables):
    progress(tmp_path)
    op = SnapshotChunkOperator(
        task_id="c", work={}, data_dir=str(tmp_path), source="src", cdc_conn_id="unused"
    )
    ti = FakeTI(paused=False)
    ctl = op.controller({"ti": ti})
    stop = ctl.chunk_gate(T.id, "S1", lambda: _dag_is_paused({"ti": ti}))
    assert stop() is None
    ti.paused = True  # paused while the task runs
    assert stop() == "the DAG was paused"
    assert airflow_variables.status("src", T.id, str(tmp_path)) == "paused"  # the snapshot's status shows the DAG pause
    assert airflow_variables.request("src", T.id, "resume", str(tmp_path)).status == "running"  # and resume continues it
    # started on a paused DAG on purpose (dag.test, tasks test)
    stop = ctl.chunk_gate(T.id, "S1", lambda: _dag_is_paused({"ti": ti}))
    assert stop() is None
    assert "no longer the current one" in ctl.chunk_gate(T.id, "S0", lambda: True)()
    airflow_variables.request("src", T.id, "pause", str(tmp_path))
    assert stop() == "snapshot S1 of public.orders is paused"


def test_control_from_outside_a_dag_run(tmp_path, variables):
    with pytest.raises(StateError, match="start one first"):
        airflow_variables.request("src", T.id, "pause", str(tmp_path))
    progress(tmp_path)
    assert airflow_variables.request("src", T.id, "pause", str(tmp_path)).status == "paused"
    assert airflow_variables.request("src", T.id, "resume", str(tmp_path)).status == "running"
    assert airflow_variables.request("src", T.id, "stop", str(tmp_path)).status == "stopped"
    with pytest.raises(StateError, match="stopped"):
        airflow_variables.request("src", T.id, "resume", str(tmp_path))
    with pytest.raises(ConfigurationError, match="use one of pause, resume, stop"):
        airflow_variables.request("src", T.id, "restart", str(tmp_path))


def test_commit_keeps_a_pause_that_lands_while_it_runs(tmp_path, variables, monkeypatch):
    """The pause is written between the commit's read and its write: the commit's write
    conflicts, and its change is applied again to the paused snapshot (no lost update)."""
    progress(tmp_path)
    a = committed(tmp_path, 0, 0, 9, 10, False)
    real_update, landed = authority.update, []

    def pause_lands_between(store, source, table_id, change, **kw):
        def between():
            if not landed:  # once (the pause's own update passes through here too)
                landed.append("pause")
                airflow_variables.request(source, table_id, "pause", str(tmp_path))
        return real_update(store, source, table_id, change, between=between, written=kw.get("written"))

    monkeypatch.setattr(authority, "update", pause_lands_between)
    SnapshotCommitOperator(
        task_id="commit", chunks=[a.to_dict()], data_dir=str(tmp_path), source="src", cdc_conn_id="unused"
    ).execute({})
    stored = airflow_variables.read("src", T.id, str(tmp_path))
    assert landed and stored.progress.status == "paused" and stored.progress.rows == 10
    assert stored.version == 3  # the start, the pause, the commit's second attempt


def test_scheduled_runs_refresh_continue_and_leave_paused_alone(tmp_path, variables):
    """A scheduled run (no conf) continues a running snapshot and leaves a paused one paused
    (the ones needing a fresh start need a database; see tests/e2e)."""
    progress(tmp_path)  # running
    committed(tmp_path, 0, 0, 49, 50, True, merged=True)
    scheduled = {"dag_run": SimpleNamespace(conf={}, run_type="scheduled"), "ti": None}
    work = plan_op(tmp_path, default_tables=T.id).execute(scheduled)
    assert [w["range_index"] for w in work] == [1] and airflow_variables.status("src", T.id, str(tmp_path)) == "running"
    airflow_variables.request("src", T.id, "pause", str(tmp_path))
    assert plan_op(tmp_path, default_tables=T.id).execute(scheduled) == []
    assert airflow_variables.status("src", T.id, str(tmp_path)) == "paused"


class FailingTI:
    """What the failure callback asks the Task SDK: the task id and the plan's XCom."""

    task_id = "merge"

    def __init__(self, work) -> None:
        self.work = work

    def xcom_pull(self, task_ids=None, **kw):
        assert task_ids == "plan"
        return self.work


@pytest.mark.parametrize("status", ["running", "paused"])
def test_a_task_that_fails_for_good_marks_the_runs_snapshot_failed_and_resume_continues(tmp_path, variables, status):
    from airflow_provider_cdc.operators.snapshot import record_snapshot_failure

    progress(tmp_path, status)
    op = plan_op(tmp_path)
    work = [{"table": T.id, "snapshot_id": "S1", "range_index": 0}, {"table": T.id, "snapshot_id": "S1"}]
    record_snapshot_failure({"ti": FailingTI(work), "task": op, "exception": RuntimeError("disk full")})
    p = airflow_variables.load("src", T.id, str(tmp_path))
    assert p.status == "failed" and p.error == "task merge failed: disk full"
    # an older snapshot's run failing later does not touch the current one, nor a final state
    record_snapshot_failure({"ti": FailingTI([{"table": T.id, "snapshot_id": "S0"}]), "task": op,
                             "exception": RuntimeError("old")})
    assert airflow_variables.load("src", T.id, str(tmp_path)).error == "task merge failed: disk full"
    # resume (after fixing the cause) works from failed
    plan_op(tmp_path).execute(ctx({"action": "resume", "tables": [T.id]}))
    p = airflow_variables.load("src", T.id, str(tmp_path))
    assert p.status == "running" and p.error is None


def test_the_failure_callback_leaves_done_and_stopped_snapshots_alone(tmp_path, variables):
    from airflow_provider_cdc.operators.snapshot import record_snapshot_failure

    progress(tmp_path, "stopped")
    record_snapshot_failure({"ti": FailingTI([{"table": T.id, "snapshot_id": "S1"}]), "task": plan_op(tmp_path),
                             "exception": RuntimeError("late")})
    assert airflow_variables.load("src", T.id, str(tmp_path)).status == "stopped"


def test_the_snapshot_dag_marks_failures_on_every_task():
    import runpy
    from pathlib import Path

    from airflow_provider_cdc.operators.snapshot import record_snapshot_failure

    dag = runpy.run_path(str(Path(__file__).resolve().parents[3] / "dags" / "cdc_snapshot.py"))["dag"]
    for t in dag.tasks:
        assert record_snapshot_failure in (t.on_failure_callback or []) or t.on_failure_callback == record_snapshot_failure, t.task_id


def run_ctx(run_type, logical_date, run_id, ti=None, conf=None):
    from datetime import datetime

    ld = None if logical_date is None else datetime.fromisoformat(logical_date)
    dr = SimpleNamespace(conf=conf or {}, run_type=run_type, run_id=run_id, logical_date=ld)
    return {"dag_run": dr, "ti": ti, "run_id": run_id, "logical_date": ld}


def test_backfill_and_scheduled_runs_refresh_once_per_logical_date(tmp_path, variables):
    """A done snapshot started for a logical date: a scheduled or backfill run for that date or
    an older one starts no other snapshot (its plan returns no work, the progress is unchanged)."""
    p = progress(tmp_path)
    p.status, p.logical_date, p.owner = "done", "2026-11-20T00:00:00+00:00", "scheduled__2026-11-20"
    airflow_variables.update("src", T.id, str(tmp_path), lambda _q: p)
    before = airflow_variables.load_raw("src", T.id, str(tmp_path))
    for run_type, ld in [("backfill", "2026-11-20T00:00:00+00:00"), ("scheduled", "2026-11-19T00:00:00+00:00"),
                         ("backfill", "2026-11-01T00:00:00")]:
        assert plan_op(tmp_path, default_tables=T.id).execute(run_ctx(run_type, ld, f"{run_type}__{ld}")) == []
    assert airflow_variables.load_raw("src", T.id, str(tmp_path)) == before

    def due(logical_date):
        return SnapshotController(source="src", data_dir=str(tmp_path), connect=None,
                                  progress=airflow_variables.for_source("src", str(tmp_path)),
                                  logical_date=logical_date)._due(T.id, p)

    assert not due("2026-11-19T00:00:00+00:00")
    assert due("2026-11-21T00:00:00+00:00")  # a later date refreshes


def test_a_refresh_keeps_the_chunk_settings_of_the_last_manual_start(tmp_path, variables):
    p = progress(tmp_path)  # its plan: chunk_size 10, parallelism 2, delay 0
    path = plan_path(str(tmp_path), "src", T, "S1")
    plan = json.loads(storage.read_text(path))
    plan.update(where="amount > 5", delay_seconds=0.5)
    storage.write_text(path, json.dumps(PLAN.stamp(plan)))
    op = plan_op(tmp_path).controller({})
    kept = op._inherit(parse_snapshot_conf({"action": "refresh", "tables": [T.id]}), T, p)
    assert (kept.request.throttle, kept.request.where_for(T)) == (Throttle(10, 0.5, 2), "amount > 5")
    new = op._inherit(parse_snapshot_conf({"action": "refresh", "tables": [T.id], "chunk_size": 99,
                                           "where": "amount > 7", "delay_seconds": 0}), T, p)
    assert (new.request.throttle, new.request.where_for(T)) == (Throttle(99, 0.0, 2), "amount > 7")


class RunStateTI:
    """What the plan asks the Task SDK about another run: its state."""

    dag_id = "cdc_snapshot"

    def __init__(self, states) -> None:
        self.states = states

    def get_dagrun_state(self, dag_id, run_id):
        return self.states[run_id]


def test_a_run_never_reads_a_snapshot_another_live_run_owns(tmp_path, variables):
    p = progress(tmp_path)  # running, owned by run A
    p.owner = "A"
    airflow_variables.update("src", T.id, str(tmp_path), lambda _q: p)
    ti = RunStateTI({"A": "running"})
    assert plan_op(tmp_path, default_tables=T.id).execute(run_ctx("scheduled", None, "B", ti)) == []
    assert plan_op(tmp_path).execute(run_ctx("manual", None, "C", ti, {"action": "resume", "tables": [T.id]})) == []
    assert airflow_variables.load("src", T.id, str(tmp_path)).owner == "A"
    # a chunk task of run B stops before reading: A owns the snapshot
    chunk = SnapshotChunkOperator(task_id="c", work={}, data_dir=str(tmp_path), source="src", cdc_conn_id="unused")
    assert "read by DAG run A" in chunk.controller({"ti": None, "run_id": "B"}).stop_reason(T.id, "S1")
    # once A has ended, the next run takes the snapshot over and continues it
    ti.states["A"] = "failed"
    work = plan_op(tmp_path, default_tables=T.id).execute(run_ctx("scheduled", None, "B", ti))
    assert [w["range_index"] for w in work] == [0, 1] and airflow_variables.load("src", T.id, str(tmp_path)).owner == "B"
    assert chunk.controller({"ti": None, "run_id": "B"}).stop_reason(T.id, "S1") is None
