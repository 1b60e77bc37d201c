"""When the ``@log`` trigger starts a changelog round (triggers/log_activity.round_reason)."""

from __future__ import annotations

from airflow_provider_cdc.dialects.base import LogActivity
from airflow_provider_cdc.triggers.log_activity import UNKNOWN_INTERVAL, round_reason

IDLE = LogActivity("writes 7", 0)


def _first_events(trigger, clock: list[float], n: int) -> list[tuple[float, str]]:
    """The trigger's first ``n`` events, each with the scripted clock when it came."""
    import asyncio

    loop = asyncio.new_event_loop()
    agen = trigger.run()
    try:
        got = []
        for _ in range(n):
            event = loop.run_until_complete(asyncio.wait_for(agen.__anext__(), 10))
            got.append((clock[0], event.payload["reason"]))
        return got
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


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


def test_the_watch_holds_writes_for_min_interval_then_starts_one_round_for_them(monkeypatch):
    """The trigger's loop, on scripted readings and a clock that moves 1 s a poll: a write
    2 s after the last round waits until 3 s have passed, compared with the reading taken when
    the last round started, so it is not lost."""
    from types import SimpleNamespace

    from airflow_provider_cdc.triggers import log_activity
    from airflow_provider_cdc.triggers.log_activity import LogActivityTrigger

    clock = [0.0]
    script = iter(["w1", "w2", "w2", "w2", "w3", "w3", "w3"])
    monkeypatch.setattr(log_activity, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    trigger = LogActivityTrigger(conn_id="c", source="s", data_dir="/d", poll_interval=0, heartbeat=3600, min_interval=3)

    def read():
        clock[0] += 1.0
        return LogActivity(next(script), 0)

    monkeypatch.setattr(trigger, "_read", read)
    # w2 read at 2 s waits to 3 s; w3 read at 5 s (2 s after that round) waits to 6 s
    wrote = "the source wrote to the capture scope"
    assert _first_events(trigger, clock, 2) == [(3.0, wrote), (6.0, wrote)]


def test_a_capture_left_at_its_cap_starts_the_next_round_without_a_write():
    """No write announces the log a capped capture left behind: the backlog record starts the
    next round min_interval after the last (pipeline/round_backlog.py)."""
    reason = round_reason(IDLE, IDLE, first=False, since_last=5, heartbeat=600, min_interval=5, backlog=True)
    assert reason == "the last round's capture stopped at its cap: log is left to capture"
    assert round_reason(IDLE, IDLE, first=False, since_last=4.9, heartbeat=600, min_interval=5, backlog=True) is None
    assert round_reason(IDLE, IDLE, first=False, since_last=5, heartbeat=600, min_interval=5) is None
    busy = LogActivity("writes 8", 120)  # a write says it first
    assert round_reason(IDLE, busy, first=False, since_last=5, heartbeat=600, backlog=True) == (
        "the source wrote to the capture scope"
    )


def test_the_backlog_record_is_left_by_a_capped_capture_and_removed_by_one_that_read_to_the_end(tmp_path):
    from airflow_provider_cdc.pipeline.round_backlog import backlog_left, record_backlog

    data = str(tmp_path)
    assert not backlog_left(data, "shop")
    record_backlog(data, "shop", left=False)  # nothing to remove: fine
    record_backlog(data, "shop", left=True, offset="0/1A")
    assert backlog_left(data, "shop") and not backlog_left(data, "other")
    record_backlog(data, "shop", left=False)
    assert not backlog_left(data, "shop")


def test_the_watch_starts_rounds_while_the_backlog_record_stays_and_reads_it_only_when_it_could(monkeypatch):
    """The trigger's loop on an unchanged log: rounds every min_interval while the record is
    there, none once it went; the record is not read within min_interval of the last round."""
    from types import SimpleNamespace

    from airflow_provider_cdc.triggers import log_activity
    from airflow_provider_cdc.triggers.log_activity import LogActivityTrigger

    clock = [0.0]
    monkeypatch.setattr(log_activity, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    trigger = LogActivityTrigger(conn_id="c", source="s", data_dir="/d", poll_interval=0, heartbeat=30, min_interval=3)
    asked = []

    def read():
        clock[0] += 1.0
        return IDLE

    def backlog():
        asked.append(clock[0])
        return clock[0] < 8  # the round that started at 6 s read to the end

    monkeypatch.setattr(trigger, "_read", read)
    monkeypatch.setattr(trigger, "_backlog", backlog)
    left = "the last round's capture stopped at its cap: log is left to capture"
    assert _first_events(trigger, clock, 3) == [(3.0, left), (6.0, left), (36.0, "heartbeat")]
    assert asked[:2] == [3.0, 6.0] and 4.0 not in asked and 5.0 not in asked
