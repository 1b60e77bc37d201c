"""When the ``@log`` trigger starts a changelog round (triggers/log_activity.round_reason)."""

from __future__ import annotations

from airflow_provider_cdc.dialects.base import LogActivity
from airflow_provider_cdc.triggers.log_activity import UNKNOWN_INTERVAL, round_reason

IDLE = LogActivity("writes 7", 0)


def test_a_watch_starts_a_round_only_when_log_is_pending_or_its_position_unknown():
    assert round_reason(None, IDLE, first=True, since_last=0, heartbeat=600) is None
    assert "3 bytes" in round_reason(None, LogActivity("writes 7", 3), first=True, since_last=0, heartbeat=600)
    assert "not known" in round_reason(None, LogActivity("writes 7", None), first=True, since_last=0, heartbeat=600)
    assert "not known" in round_reason(None, None, first=True, since_last=0, heartbeat=600)


def test_a_new_token_starts_a_round_an_unchanged_one_only_on_the_heartbeat():
    busy = LogActivity("writes 8", 120)
    assert round_reason(IDLE, busy, first=False, since_last=1, heartbeat=600) == "the source wrote to the capture scope"
    # pending bytes alone (WAL of other databases) start nothing
    assert round_reason(IDLE, LogActivity("writes 7", 9_999), first=False, since_last=1, heartbeat=600) is None
    assert round_reason(IDLE, IDLE, first=False, since_last=599.9, heartbeat=600) is None
    assert round_reason(IDLE, IDLE, first=False, since_last=600, heartbeat=600) == "heartbeat"


def test_a_source_that_cannot_be_read_gets_a_round_now_and_then_which_shows_the_error():
    assert round_reason(IDLE, None, first=False, since_last=UNKNOWN_INTERVAL - 1, heartbeat=600) is None
    assert round_reason(IDLE, None, first=False, since_last=UNKNOWN_INTERVAL, heartbeat=600) is not None
    assert round_reason(IDLE, None, first=False, since_last=5, heartbeat=5) == "heartbeat"


def test_writes_start_a_round_only_min_interval_after_the_last_and_are_not_forgotten_meanwhile():
    busy = LogActivity("writes 9", 300)
    # 2 s after the last round: the write waits (the next round takes it) ...
    assert round_reason(IDLE, busy, first=False, since_last=2, heartbeat=600, min_interval=5) is None
    # ... compared with the reading of the last round's start, so a later poll still sees it
    assert round_reason(IDLE, busy, first=False, since_last=5, heartbeat=600, min_interval=5) == (
        "the source wrote to the capture scope"
    )
    # the watch's start and the heartbeat are not held back by it
    assert "300 bytes" in round_reason(None, busy, first=True, since_last=0, heartbeat=600, min_interval=5)
    assert round_reason(IDLE, IDLE, first=False, since_last=600, heartbeat=600, min_interval=900) == "heartbeat"
