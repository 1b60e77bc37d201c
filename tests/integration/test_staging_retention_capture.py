"""Staging retention after real captures (issue 33): run_capture keeps the segment index and,
with a retention policy, removes the segments every sink applied; a slot that vanished is still
noticed once every segment it staged is gone (the index outlives them)."""

from __future__ import annotations

import time

import psycopg2
import pytest

from airflow_provider_cdc.core.errors import CdcError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.capture import run_capture
from airflow_provider_cdc.pipeline.retention import RetentionPolicy
from airflow_provider_cdc.sinks.base import write_marker
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.segment_index import read_index, staged_segments

from .helpers import Handle

pytestmark = pytest.mark.integration


@pytest.fixture
def source(pg_uri, unique_name):
    """A cursor on the shared PostgreSQL, a table of one key column, and a source capturing it
    (its slot, publication and the table dropped after)."""
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    t = TableName("public", f"sr_{unique_name}")
    cur.execute(f'CREATE TABLE "{t.name}" (id int PRIMARY KEY)')
    handle = Handle(pg_uri, f"sr_{unique_name}", [t])
    try:
        yield cur, t, handle
    finally:
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        cur.execute(f'DROP TABLE "{t.name}"')
        admin.close()


def test_captures_prune_what_every_sink_applied_and_a_lost_slot_is_still_noticed(source, tmp_path):
    cur, t, handle = source
    data = str(tmp_path)
    changelog = changelog_dir(data, handle.source)
    policy = RetentionPolicy(0.0, ("events",))  # no horizon: only the marker holds
    run_capture(handle, data, retention=policy)  # creates the slot
    for i in range(3):
        cur.execute(f'INSERT INTO "{t.name}" VALUES (%s)', (i,))
        result, _lag = run_capture(handle, data, retention=policy)
        assert result.events == 1
    staged = staged_segments(changelog)
    assert len(staged) == 3 and all(s.info is not None for s in staged)  # indexed as captured
    assert set(read_index(changelog)) == {s.name for s in staged}
    write_marker(data, handle.source, "events", staged[1].last)  # the sink applied two of them
    time.sleep(0.01)
    run_capture(handle, data, retention=policy)
    assert [s.name for s in staged_segments(changelog)] == [staged[2].name]
    write_marker(data, handle.source, "events", staged[2].last)
    run_capture(handle, data, retention=policy)
    assert staged_segments(changelog) == []
    with handle.get_dialect() as d:
        d.drop_slot()
    with pytest.raises(CdcError, match="does not exist although capture read through it before"):
        run_capture(handle, data, retention=policy)


def test_a_segment_write_that_fails_in_the_background_leaves_the_offset_and_the_next_capture_stages_all(
    source, tmp_path, monkeypatch
):
    """I6 with the background segment writer: the second segment's write fails while the read
    goes on; the capture fails, the slot's offset does not move, and the next capture stages
    every event once (the first attempt's segment is rewritten under the same name)."""
    from airflow_provider_cdc.pipeline import capture
    from airflow_provider_cdc.pipeline.capture import stage_changelog
    from airflow_provider_cdc.storage.staged import read_log_events

    cur, t, handle = source
    data = str(tmp_path)
    with handle.get_dialect() as d:
        start = d.load_offset(data)  # creates the slot
    for i in range(30):
        cur.execute(f'INSERT INTO "{t.name}" VALUES (%s)', (i,))
    writes = []

    def fail_second() -> None:
        writes.append(1)
        if len(writes) == 2:
            raise OSError("object storage refused the write")

    monkeypatch.setattr(capture, "_segment_write_pause", fail_second)
    with handle.get_dialect() as d, pytest.raises(OSError, match="refused the write"):
        stage_changelog(d, data, segment_max_events=10)
    assert len(writes) >= 2
    with handle.get_dialect() as d:
        assert d.load_offset(data) == start  # nothing committed past a segment not written
    monkeypatch.setattr(capture, "_segment_write_pause", None)
    with handle.get_dialect() as d:
        res = stage_changelog(d, data, segment_max_events=10)
    assert res.events == 30 and len(res.segments) == 3
    keys = [e.key for e in read_log_events(changelog_dir(data, handle.source)) if e.table == t.id]
    assert sorted(keys) == sorted(f"[{i}]" for i in range(30))  # each once
