"""Which follow-up tasks a one-task changelog round starts (operators/changelog_round.py) and
when maintenance is due (pipeline/maintenance.py)."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.operators.changelog_round import (
    LOG_RETENTION,
    MAINTENANCE,
    SCHEMA_STOPS,
    follow_ups,
)
from airflow_provider_cdc.pipeline.maintenance import (
    last_maintenance,
    maintenance_due,
    maintenance_path,
    record_maintenance,
    request_maintenance,
)

pytestmark = pytest.mark.unit


def test_a_quiet_round_starts_no_follow_up():
    assert follow_ups({"events": 5, "retention_risk": None, "schema_stopped": {}}, maintenance_due=False) == []


def test_each_finding_starts_the_task_that_reports_it():
    stopped = {"public.a": "column amount changed type"}
    assert follow_ups({"schema_stopped": stopped}, maintenance_due=False) == [SCHEMA_STOPS]
    assert follow_ups({"retention_risk": "slot 'x' is 90% of max_slot_wal_keep_size"}, maintenance_due=False) == [
        LOG_RETENTION
    ]
    assert follow_ups({"schema_stopped": stopped, "retention_risk": "r"}, maintenance_due=True) == [
        SCHEMA_STOPS,
        LOG_RETENTION,
        MAINTENANCE,
    ]
    # a capture skipped for the lock has no reading: nothing to report
    assert follow_ups({"source": "shop", "apply": None, "schema_stopped": {}}, maintenance_due=False) == []


def test_maintenance_is_due_when_unknown_after_the_interval_or_when_the_clock_went_back():
    assert maintenance_due(None, 1000.0, 300.0)
    assert not maintenance_due(900.0, 1000.0, 300.0)
    assert maintenance_due(700.0, 1000.0, 300.0)
    assert maintenance_due(2000.0, 1000.0, 300.0)
    assert maintenance_due(1000.0, 1000.0, 0.0)  # 0: every round


def test_the_last_maintenance_is_recorded_in_staging_and_an_unreadable_record_means_due(tmp_path):
    data = str(tmp_path / "data")
    assert last_maintenance(data, "shop") is None
    record_maintenance(data, "shop", at=1234.5)
    assert last_maintenance(data, "shop") == 1234.5
    assert last_maintenance(data, "other") is None
    request_maintenance(data, "other")  # nothing recorded: nothing to do
    request_maintenance(data, "shop")  # a finished snapshot: due at the next round
    assert last_maintenance(data, "shop") is None
    record_maintenance(data, "shop", at=1234.5)
    path = maintenance_path(data, "shop")
    assert path.startswith(f"{data}/staging/shop/")
    for junk in ("{not json", '{"finished_at": "soon"}', "[1]", '{"finished_at": true}'):
        with open(path, "w") as f:
            f.write(junk)
        assert last_maintenance(data, "shop") is None, junk
