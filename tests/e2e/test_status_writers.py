"""Two plan runs that start the same table's snapshot at once, on a real source: the second
one's whole plan is forced between the first one's read of the progress and its write. One
snapshot is stored, the other run fails with an error that names it, and nothing the loser
planned is read (the other status-writer races: tests/unit/airflow/test_status_writers.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.errors import StateError
from airflow_provider_cdc.operators.snapshot import SnapshotPlanOperator
from airflow_provider_cdc.pipeline import snapshot_state as authority
from tools import workload as w

from .helpers import ROWS, Pipeline


def plan(p: Pipeline, run_id: str) -> list[dict]:
    op = SnapshotPlanOperator(task_id="plan", data_dir=p.data_dir, cdc_conn_id=p.conn_id, source=p.source)
    conf = {"action": "start", "tables": [p.table.id], "chunk_size": 100}
    return op.execute({"dag_run": SimpleNamespace(conf=conf, run_id=run_id), "run_id": run_id, "ti": None})


def test_two_plan_runs_starting_one_table_store_one_snapshot(pg_uri, unique_name, tmp_path, monkeypatch):
    p = Pipeline(pg_uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(pg_uri, p.table, ROWS)
    try:
        p.capture_now()
        real, won = authority.update, {}

        def update(store, source, table_id, change, **kw):
            def between():
                if "work" not in won:  # once: run B plans and stores its snapshot here
                    won["work"] = []
                    won["work"] = plan(p, "run-B")
            return real(store, source, table_id, change, between=between, written=kw.get("written"))

        monkeypatch.setattr(authority, "update", update)
        with pytest.raises(StateError, match="stored by another run while this one planned"):
            plan(p, "run-A")
        stored = airflow_variables.load(p.source, p.table.id, p.data_dir)
        assert stored.status == "running" and stored.owner == "run-B"
        assert won["work"] and {item["snapshot_id"] for item in won["work"]} == {stored.snapshot_id}
        assert airflow_variables.read(p.source, p.table.id, p.data_dir).version == 1  # A wrote nothing
    finally:
        p.cleanup()
