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


def test_a_round_caps_its_capture_under_the_worker_bound_unless_told_otherwise():
    from airflow_provider_cdc.core.rounds import RoundCapture

    assert RoundCapture(None, 100_000, 300.0).cap == 90_000  # the apply stays in the worker
    assert RoundCapture(5_000, 100_000, 300.0).cap == 5_000  # CDC_CAPTURE_MAX_EVENTS wins
    assert RoundCapture(None, 0, 300.0).cap is None  # always spark-submit: no cap helps
    assert RoundCapture(None, 100_000, 0.0).cap is None  # CDC_ROUND_CATCH_UP_SECONDS=0: never
    assert RoundCapture(None, 1, 300.0).cap == 1
    # rows an earlier round staged and did not apply count against the bound
    assert RoundCapture(None, 100_000, 300.0, staged=30_000).cap == 60_000
    assert RoundCapture(None, 100_000, 300.0, staged=90_000).cap is None  # spark-submit anyway
    assert RoundCapture(5_000, 100_000, 300.0, staged=90_000).cap == 5_000


def test_a_capped_capture_far_behind_catches_up_in_the_same_round():
    from airflow_provider_cdc.core.rounds import RoundCapture

    default = RoundCapture(None, 100_000, 300.0)
    assert default.catch_up(90_000, 300.0) and default.catch_up(90_512, 4_000.0)
    assert not default.catch_up(90_000, 299.9)  # behind, but a round's worth
    assert not default.catch_up(89_999, 4_000.0)  # the cap did not stop it: it read to the end
    assert not default.catch_up(90_000, None)  # the source cannot tell how far behind
    assert not RoundCapture(90_000, 100_000, 300.0).catch_up(90_000, 4_000.0)  # the user's cap
    assert not RoundCapture(None, 0, 300.0).catch_up(10**9, 4_000.0)  # nothing was capped
    staged = RoundCapture(None, 100_000, 300.0, staged=30_000)
    assert staged.catch_up(60_000, 300.0) and not staged.catch_up(59_999, 300.0)


def test_two_captures_of_a_round_make_one_result():
    from airflow_provider_cdc.operators.changelog_round import joined

    first = {"source": "s", "events": 90, "watermarks": 1, "seconds": 1.5, "segments": ["a", "b"],
             "segment": "b", "start_offset": "0/10", "end_offset": "0/20", "lag_seconds": 400.0}
    rest = {"source": "s", "events": 10, "watermarks": 0, "seconds": 0.5, "segments": ["c"],
            "segment": "c", "start_offset": "0/20", "end_offset": "0/30", "lag_seconds": 0.0}
    assert joined(first, None) is first  # another capture took the lock between them
    both = joined(first, rest)
    assert (both["events"], both["watermarks"], both["seconds"]) == (100, 1, 2.0)
    assert both["segments"] == ["a", "b", "c"] and both["segment"] == "c"
    assert (both["start_offset"], both["end_offset"], both["lag_seconds"]) == ("0/10", "0/30", 0.0)
    empty = dict(rest, events=0, segments=[], segment=None)
    assert joined(first, empty)["segment"] == "b"
