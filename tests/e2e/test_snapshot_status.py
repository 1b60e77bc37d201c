"""The snapshot's status follows the run, end to end on the real PostgreSQL with the real
Airflow task runner (``dag.test``): a task that fails for good leaves the snapshot
``failed`` with its error, and ``resume`` continues it to ``done``. The failure is a
setting read when the task runs (CDC_SINKS changed after the DAG file was parsed), so this
also shows that the tasks read the settings at run time."""

from __future__ import annotations

from airflow_provider_cdc import airflow_variables

from .helpers import load_dag


def test_a_run_that_fails_for_good_sets_failed_and_resume_finishes_it(pg_source, unique_name, monkeypatch):  # noqa: F811
    src = pg_source
    table_id = f"public.{src['table']}"
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")  # merge in the worker: no JVM to wait for
    dag = load_dag("cdc_snapshot", unique_name)
    dag.get_task("merge").retries = 0  # fail for good at once (the DAG's own retries would only wait)
    # read by the merge task when it runs, after the DAG was parsed: a sink it cannot build
    monkeypatch.setenv("CDC_SINKS", "postgres")
    run = dag.test(run_conf={"action": "start", "tables": [table_id], "chunk_size": 1000})
    assert run.state == "failed"
    p = airflow_variables.load(src["conn_id"], table_id, src["data_dir"])
    assert p.status == "failed", p
    assert p.error.startswith("task merge failed:") and "CDC_POSTGRES_SINK_CONN_ID" in p.error

    monkeypatch.delenv("CDC_SINKS")  # the cause fixed
    run = dag.test(run_conf={"action": "resume", "tables": [table_id]})
    assert run.state == "success"
    p = airflow_variables.load(src["conn_id"], table_id, src["data_dir"])
    assert p.status == "done" and p.error is None and p.table(table_id).rows == 3000


def test_backfill_and_scheduled_refreshes_on_the_real_database(pg_source, unique_name, monkeypatch):  # noqa: F811
    """After a manual start (chunk_size 700, parallelism 2) is done: a backfill run for an
    older logical date starts nothing; a scheduled run for a later one starts a new snapshot
    with the manual start's chunk settings, and records its logical date and run."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from airflow_provider_cdc.operators.snapshot import SnapshotPlanOperator, read_plan

    src = pg_source
    table_id = f"public.{src['table']}"
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")
    monkeypatch.setenv("CDC_TABLES", table_id)
    dag = load_dag("cdc_snapshot", unique_name)
    run = dag.test(run_conf={"action": "start", "tables": [table_id], "chunk_size": 700, "parallelism": 2})
    assert run.state == "success"
    done = airflow_variables.load(src["conn_id"], table_id, src["data_dir"])
    assert done.status == "done" and done.owner == run.run_id

    def plan(run_type, logical_date, run_id):
        dr = SimpleNamespace(conf={}, run_type=run_type, run_id=run_id, logical_date=logical_date)
        return SnapshotPlanOperator(task_id="plan").execute(
            {"dag_run": dr, "run_id": run_id, "logical_date": logical_date, "ti": None}
        )

    assert plan("backfill", datetime(2024, 1, 1, tzinfo=UTC), "backfill__2024-01-01") == []  # older: nothing
    assert airflow_variables.load(src["conn_id"], table_id, src["data_dir"]).snapshot_id == done.snapshot_id
    later = datetime(2099, 1, 1, tzinfo=UTC)
    work = plan("scheduled", later, "scheduled__2099-01-01")
    fresh = airflow_variables.load(src["conn_id"], table_id, src["data_dir"])
    assert fresh.snapshot_id != done.snapshot_id and fresh.status == "running"
    assert (fresh.owner, fresh.logical_date) == ("scheduled__2099-01-01", later.isoformat())
    assert {w["chunk_size"] for w in work} == {700} and len(work) == 2  # the manual start's settings
    from airflow_provider_cdc.core.schema import TableName

    assert read_plan(src["data_dir"], src["conn_id"], TableName.parse(table_id), fresh.snapshot_id)["parallelism"] == 2
    # a second run for the same date starts no other snapshot (it continues this one)
    plan("scheduled", later, "scheduled__2099-01-01")
    assert airflow_variables.load(src["conn_id"], table_id, src["data_dir"]).snapshot_id == fresh.snapshot_id
