"""Watermark strategy "log": a chunk's window bounded by a log position the source reported
(a position mark) instead of watermark rows written to it. The pure window with marks, how a
mark is found in the staged changelog (once capture is complete through its position), and
the strategy option's checks."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position, marked_position, position_mark
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.dialects.watermark_strategy import LogWatermarks, TableWatermarks
from airflow_provider_cdc.storage.segment_index import record_through, staged_through
from airflow_provider_cdc.storage.staged import staged_watermarks

T = "public.t"


def upd(n: int, key: int, v: int) -> ChangeEvent:
    return ChangeEvent(T, "u", f"[{key}]", Position(1, n, 0), None, {"id": key, "v": v})


def test_a_mark_names_its_position_and_time_and_nothing_else_is_one():
    p = Position.binlog("binlog.000007", 4242, 0)
    mark = position_mark(p, 1_700_000_000_123)
    assert marked_position(mark) == (p, 1_700_000_000_123)
    assert marked_position("3f2c1a9e-uuid-of-a-row") is None and marked_position("converge-abc") is None
    with pytest.raises(ValueError, match="not a position mark"):
        marked_position("pos-123-4")


def test_a_chunk_at_a_mark_is_emitted_there_between_the_changes_before_and_after_it():
    """The snapshot holds every change before its position and none after: the window is
    empty, the rows go out at the mark, older changes lose to them and newer ones win."""
    mark = position_mark(Position(1, 5, 0), 77)
    log = [upd(3, 1, 10), upd(4, 2, 20), WatermarkEvent("an-unrelated-row-watermark", Position(1, 6, 0), 0),
           upd(7, 2, 21), upd(8, 3, 30)]
    chunk = {"[1]": {"id": 1, "v": 10}, "[2]": {"id": 2, "v": 20}}  # what the snapshot at 5 saw
    reads = merge_window([WindowChunk(T, mark, mark, chunk)], log)
    assert [(e.key, e.position, e.ts_ms, e.watermark) for e in reads] == [
        ("[1]", Position(1, 5, 0), 77, mark), ("[2]", Position(1, 5, 0), 77, mark)]
    state = mirror_apply({}, [e for e in log if isinstance(e, ChangeEvent)])
    mirror_apply(state, reads)
    assert mirror_rows(state, T) == {"[1]": {"id": 1, "v": 10}, "[2]": {"id": 2, "v": 21}, "[3]": {"id": 3, "v": 30}}


def test_a_mark_is_staged_once_the_changelog_is_complete_through_it(tmp_path):
    changelog = str(tmp_path / "changelog")
    early, late = position_mark(Position(3, 100, 0), 1), position_mark(Position(3, 200, 0), 2)
    assert staged_watermarks(changelog, [early, late]) == {}  # nothing captured yet
    record_through(changelog, Position(3, 150, 0), 1000)
    assert staged_watermarks(changelog, [early, late, "a-row-watermark"]) == {
        early: (Position(3, 100, 0).encode(), 1)}
    record_through(changelog, Position(3, 120, 0), 2000)  # never moves back
    assert staged_through(changelog) == (Position(3, 150, 0), 1000)
    record_through(changelog, Position(3, 200, 0), 3000)  # a read that ended exactly at the mark
    assert set(staged_watermarks(changelog, [early, late])) == {early, late}


def test_the_strategy_option_is_checked_where_the_source_is_built():
    mysql = ConnectionParams.from_uri("mysql://u@127.0.0.1:1/db")
    with pytest.raises(ConfigurationError, match="watermark_strategy must be one of table, log, got 'rows'"):
        get_dialect(mysql, source="s", watermark_strategy="rows")
    my = get_dialect(mysql, source="s", watermark_strategy="LOG")
    assert isinstance(my.watermarks, LogWatermarks) and my.watermarks.tables() == [] and my.watermark_strategy == "log"
    pg = get_dialect(ConnectionParams.from_uri("postgresql://u@127.0.0.1:1/db"), source="s", watermark_strategy="log")
    assert isinstance(pg.watermarks, LogWatermarks) and pg.records_visibility
    table = get_dialect(mysql, source="s")  # the default: watermark rows in the watermark table
    assert isinstance(table.watermarks, TableWatermarks) and table.watermarks.tables() == [table.watermark_table]


def test_a_bad_replica_lag_bound_is_refused_naming_it():
    pg = ConnectionParams.from_uri("postgresql://u@127.0.0.1:1/db")
    for bad in ("soon", 0, -5, "inf"):
        with pytest.raises(ConfigurationError, match="max_replica_lag_seconds must be a number of seconds > 0"):
            get_dialect(pg, source="s", max_replica_lag_seconds=bad)
    assert get_dialect(pg, source="s", max_replica_lag_seconds="30").max_replica_lag_seconds == 30.0


def test_a_bad_failover_slot_option_is_refused_naming_it():
    pg = ConnectionParams.from_uri("postgresql://u@127.0.0.1:1/db")
    with pytest.raises(ConfigurationError, match="failover_slot must be true or false, got 'flase'"):
        get_dialect(pg, source="s", failover_slot="flase")
    assert get_dialect(pg, source="s", failover_slot="false").failover_slot is False
    assert get_dialect(pg, source="s").failover_slot is True
