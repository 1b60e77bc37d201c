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


def test_captures_prune_what_every_sink_applied_and_a_lost_slot_is_still_noticed(pg_uri, unique_name, tmp_path):
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    t = TableName("public", f"sr_{unique_name}")
    cur.execute(f'CREATE TABLE "{t.name}" (id int PRIMARY KEY)')
    handle = Handle(pg_uri, f"sr_{unique_name}", [t])
    data = str(tmp_path)
    changelog = changelog_dir(data, handle.source)
    policy = RetentionPolicy(0.0, ("events",))  # no horizon: only the marker holds
    try:
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
    finally:
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        cur.execute(f'DROP TABLE "{t.name}"')
        admin.close()
