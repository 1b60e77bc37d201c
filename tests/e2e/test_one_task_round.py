"""One-task changelog rounds (``CDC_CHANGELOG_SCHEDULE=@log``; operators/changelog_round.py)
through the real DAG (``dag.test()``: the task runner, XCom, skips, Asset events).

- The round captures and applies in one task: the mirror equals the source and the apply's
  Asset event is recorded.
- Its follow-ups run only with work: compaction on the first round (never ran), not again
  within CDC_MAINTENANCE_INTERVAL_SECONDS, and again after a snapshot finished; the
  schema-stop and log-retention checks are skipped.
- A type change: the round succeeds (its Asset events are kept), ``mirror_schema_stops`` runs
  and fails the run naming the table.
"""

from __future__ import annotations

import pytest

from airflow_provider_cdc.pipeline.maintenance import last_maintenance
from airflow_provider_cdc.pipeline.round_backlog import backlog_left
from airflow_provider_cdc.sinks.mirror_fencing import schema_stopped
from airflow_provider_cdc.storage.layout import mirror_dir

from .helpers import asset_events, qt, run_sql

pytestmark = pytest.mark.timeout(600)


def states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def round_result(run) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (session.query(XComModel)
               .filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id="round", key="return_value").one())
        return XComModel.deserialize_value(row)


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_a_round_is_one_task_whose_follow_ups_run_only_with_work(pipeline, monkeypatch):
    p = pipeline
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")
    p.snapshot()
    monkeypatch.setenv("CDC_CHANGELOG_SCHEDULE", "@log")
    run_sql(p, [f"UPDATE {qt(p)} SET name = 'round one' WHERE id <= 25",  # noqa: S608
                f"DELETE FROM {qt(p)} WHERE id = 30",  # noqa: S608
                f"INSERT INTO {qt(p)} (id, name, amount, updated_at, active) "  # noqa: S608
                "VALUES (900001, 'new', 1, now(), true)"])
    seen = len(asset_events(p.source, p.table.id))

    run = p.run("cdc_changelog")
    assert states(run) == {"round": "success", "compact_tombstones": "success",
                           "mirror_schema_stops": "skipped", "log_retention": "skipped"}
    got = round_result(run)
    assert got["events"] >= 27 and got["apply"]["engine"] == "local", got
    assert got["follow_ups"] == ["compact_tombstones"]  # maintenance never ran for this source
    assert got["retention_risk"] is None and got["schema_stopped"] == {}
    p.assert_equal()
    (event,) = asset_events(p.source, p.table.id)[seen:]  # the apply's, recorded for the round task
    assert event["events"] >= 27 and event["committed_at"] is not None, event
    assert last_maintenance(p.data_dir, p.source) is not None

    # within CDC_MAINTENANCE_INTERVAL_SECONDS (300): the round alone
    run_sql(p, [f"UPDATE {qt(p)} SET name = 'round two' WHERE id BETWEEN 40 AND 49"])  # noqa: S608
    run = p.run("cdc_changelog")
    assert states(run) == {"round": "success", "compact_tombstones": "skipped",
                           "mirror_schema_stops": "skipped", "log_retention": "skipped"}
    assert round_result(run)["follow_ups"] == []
    p.assert_equal()

    # a snapshot that finishes leaves work for compaction: the next round runs it
    p.snapshot()
    assert last_maintenance(p.data_dir, p.source) is None
    run = p.run("cdc_changelog")
    assert round_result(run)["follow_ups"] == ["compact_tombstones"]
    assert states(run)["compact_tombstones"] == "success"

    # a type change the mirror cannot follow: the round succeeds and keeps its Asset events,
    # mirror_schema_stops fails the run
    run_sql(p, [f"ALTER TABLE {qt(p)} ALTER COLUMN amount TYPE text",
                f"UPDATE {qt(p)} SET amount = 'a text' WHERE id = 5"])  # noqa: S608
    run = p.run("cdc_changelog", expect="failed")
    assert states(run) == {"round": "success", "compact_tombstones": "skipped",
                           "mirror_schema_stops": "failed", "log_retention": "skipped"}
    assert round_result(run)["follow_ups"] == ["mirror_schema_stops"]
    assert "changed type" in (schema_stopped(mirror_dir(p.data_dir, p.source, p.table)) or "")


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_a_round_stops_its_capture_under_the_worker_bound_and_a_far_behind_one_takes_the_rest(
    pipeline, monkeypatch
):
    """Unset CDC_CAPTURE_MAX_EVENTS: a round's capture stops at 90% of CDC_LOCAL_MAX_ROWS (18 of
    20), so its apply runs in the worker and the next round takes the rest; a capture still
    CDC_ROUND_CATCH_UP_SECONDS behind after the cap takes the rest in the same round."""
    p = pipeline
    p.snapshot()
    monkeypatch.setenv("CDC_CHANGELOG_SCHEDULE", "@log")
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "20")
    monkeypatch.setenv("CDC_ROUND_CATCH_UP_SECONDS", "3600")
    monkeypatch.delenv("CDC_CAPTURE_MAX_EVENTS", raising=False)

    def thirty_transactions(name: str) -> None:
        run_sql(p, [f"UPDATE {qt(p)} SET name = '{name}' WHERE id = {i}" for i in range(1, 31)],  # noqa: S608
                one_transaction=False)

    p.run("cdc_changelog")  # what the snapshot staged (its watermarks) applied: nothing pending
    thirty_transactions("capped")
    first = round_result(p.run("cdc_changelog"))
    assert first["events"] == 18 and first["apply"]["engine"] == "local", first
    assert backlog_left(p.data_dir, p.source)  # the @log trigger starts the next round without a write
    second = round_result(p.run("cdc_changelog"))
    assert second["events"] == 12 and second["apply"]["engine"] == "local", second
    assert not backlog_left(p.data_dir, p.source)
    p.assert_equal()

    # behind by more than the setting after the capped capture: the rest in this round
    monkeypatch.setenv("CDC_ROUND_CATCH_UP_SECONDS", "0.001")
    thirty_transactions("caught up")
    got = round_result(p.run("cdc_changelog"))
    assert got["events"] == 30 and got["apply"]["engine"] == "spark", got
    assert got["lag_seconds"] == 0.0 and not backlog_left(p.data_dir, p.source)  # read to the end
    p.assert_equal()
