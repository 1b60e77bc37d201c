"""The changelog DAG's schedules (issue 49): ``@log`` schedules it on the source's log Asset,
watched by the triggerer; only a periodic schedule has the backfill gate; the apply skips
itself instead of a check task before it."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.dag_builders import changelog_dag
from airflow_provider_cdc.triggers.log_activity import LogActivityTrigger

pytestmark = pytest.mark.unit


def _dag(monkeypatch, schedule: str | None, **env: str):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    overrides = {"CDC_SOURCE_CONN_ID": "shop_pg", "CDC_SOURCE": "shop", "CDC_DATA_DIR": "/data/cdc"}
    if schedule is not None:
        overrides["CDC_CHANGELOG_SCHEDULE"] = schedule
    return changelog_dag("cdc_changelog__shop", overrides)


def test_log_schedules_the_dag_on_the_source_s_log_asset_watched_in_the_triggerer(monkeypatch):
    dag = _dag(monkeypatch, "@log", CDC_CHANGELOG_POLL_SECONDS="1.5", CDC_CHANGELOG_HEARTBEAT_SECONDS="300")
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.name == "cdc/shop/log" and asset.uri == "x-cdc://shop/log"
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, LogActivityTrigger)
    _path, kwargs = watcher.trigger.serialize()
    # ids and the location only: the connection is resolved in the triggerer, never serialised
    assert kwargs == {"conn_id": "shop_pg", "source": "shop", "data_dir": "/data/cdc", "poll_interval": 1.5,
                      "heartbeat": 300.0, "min_interval": 5.0, "storage_conn_id": None}
    assert dag.max_active_runs == 2  # the next run queued while this one ends; each task one at a time
    assert all(t.max_active_tis_per_dag == 1 for t in dag.tasks)
    assert "earlier_intervals_done" not in dag.task_ids  # an asset schedule cannot be backfilled


@pytest.mark.parametrize("schedule", ["@log", "@continuous"])
def test_frequent_schedules_run_a_round_as_one_task_with_follow_ups_it_may_skip(monkeypatch, schedule):
    from airflow.sdk.bases.skipmixin import SkipMixin

    from airflow_provider_cdc.operators.changelog_round import ChangelogRoundOperator

    dag = _dag(monkeypatch, schedule, CDC_CHANGELOG_MIN_INTERVAL_SECONDS="0")
    assert set(dag.task_ids) == {"round", "compact_tombstones", "mirror_schema_stops", "log_retention"}
    round_task = dag.get_task("round")
    assert isinstance(round_task, ChangelogRoundOperator) and isinstance(round_task, SkipMixin)
    assert round_task.upstream_task_ids == set()
    assert round_task.downstream_task_ids == {"compact_tombstones", "mirror_schema_stops", "log_retention"}
    assert {a.name for a in round_task.outlets} == {"cdc/shop/mirror", "cdc/shop/events"}


def test_a_periodic_schedule_keeps_capture_and_apply_apart(monkeypatch):
    dag = _dag(monkeypatch, "*/5 * * * *")
    assert not dag.has_task("round")
    assert dag.get_task("apply").upstream_task_ids == {"capture"}
    assert dag.get_task("apply").trigger_rule == "none_failed"  # also after a capture skipped for the lock


def test_a_cron_schedule_keeps_one_run_and_the_backfill_gate(monkeypatch):
    dag = _dag(monkeypatch, "*/5 * * * *")
    assert dag.max_active_runs == 1
    assert dag.get_task("capture").upstream_task_ids == {"earlier_intervals_done"}
    assert "anything_to_apply" not in dag.task_ids
    assert not _dag(monkeypatch, "none").has_task("earlier_intervals_done")
    assert not _dag(monkeypatch, "@continuous").has_task("earlier_intervals_done")


def test_bad_poll_and_heartbeat_settings_name_the_setting(monkeypatch):
    from airflow_provider_cdc.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="CDC_CHANGELOG_HEARTBEAT_SECONDS"):
        _dag(monkeypatch, "@log", CDC_CHANGELOG_HEARTBEAT_SECONDS="soon")
    with pytest.raises(ConfigurationError, match="CDC_CHANGELOG_POLL_SECONDS"):
        _dag(monkeypatch, "@log", CDC_CHANGELOG_POLL_SECONDS="0")
    monkeypatch.delenv("CDC_CHANGELOG_POLL_SECONDS")
    monkeypatch.delenv("CDC_CHANGELOG_HEARTBEAT_SECONDS")
    with pytest.raises(ConfigurationError, match="CDC_CHANGELOG_MIN_INTERVAL_SECONDS .* >= 0"):
        _dag(monkeypatch, "@log", CDC_CHANGELOG_MIN_INTERVAL_SECONDS="-1")
    monkeypatch.delenv("CDC_CHANGELOG_MIN_INTERVAL_SECONDS")
    with pytest.raises(ConfigurationError, match="CDC_MAINTENANCE_INTERVAL_SECONDS"):
        _dag(monkeypatch, "@log", CDC_MAINTENANCE_INTERVAL_SECONDS="nan")
