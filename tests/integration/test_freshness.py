"""The mirror's freshness (issue 49): the apply records in the mirror's marker the newest source
commit time it made visible (from the staged changelog's index), and status.freshness gives the
source time the mirror shows and its age: that commit while staged changes are pending, else
when capture last read the log to its end."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.operators.spark_jobs import emit_freshness
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.pipeline.committed import applied_tables, markers
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.sinks.base import marker_path, read_marker
from airflow_provider_cdc.status import freshness
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.segment_index import read_index, record_through, refresh_index

from .staged_scenario import ITEMS, SOURCE, Stage, item

pytestmark = pytest.mark.integration


def _apply(st: Stage) -> dict:
    sinks = build_sinks("events,mirror", data_dir=st.data_dir, source=SOURCE, database=None, require_schema=False)
    try:
        return arrow_engine.apply_changelog(st.data_dir, SOURCE, sinks)
    finally:
        for s in sinks:
            s.close()


def test_the_mirror_marker_carries_the_newest_commit_and_status_its_age(tmp_path, gauges):
    st = Stage(tmp_path)
    changelog = changelog_dir(st.data_dir, SOURCE)
    for i in range(1, 6):
        st.change(ITEMS, "c", [i], item(i, 0))
    st.stage_log([3])
    refresh_index(changelog)  # capture indexes what it staged
    newest = max(e.ts_ms for e in st.log if isinstance(e, ChangeEvent))
    assert max(i.max_ts_ms for i in read_index(changelog).values()) == newest
    assert freshness(st.data_dir, SOURCE) is None  # nothing applied yet
    last = st.log[-1].position
    record_through(changelog, last, 1_000_000)  # capture read the log to its end at t = 1,000 s

    _apply(st)
    doc = json.loads(storage.read_text(marker_path(st.data_dir, SOURCE, "mirror")))
    assert doc["committed_ms"] == newest
    got = freshness(st.data_dir, SOURCE, now=1_060.0)
    assert got == {"visible_commit_at": newest / 1000, "pending": False, "as_of": 1_000.0, "age_s": 60.0}

    # more changes staged, not applied yet: the mirror shows the source as of its newest commit
    staged_before = len(st.log)
    for i in range(6, 9):
        st.change(ITEMS, "u", [i - 5], item(i - 5, 1))
    from airflow_provider_cdc.storage.staged import write_segment

    from .staged_scenario import SCHEMAS, WM_TABLE

    write_segment(st.log[staged_before:], changelog, WM_TABLE, SCHEMAS)
    refresh_index(changelog)
    record_through(changelog, st.log[-1].position, 2_000_000)
    got = freshness(st.data_dir, SOURCE, now=newest / 1000 + 30)
    assert got["pending"] and got["as_of"] == newest / 1000 and got["age_s"] == pytest.approx(30)
    before = markers(st.data_dir, SOURCE, ["mirror"])
    _apply(st)
    after = max(e.ts_ms for e in st.log if isinstance(e, ChangeEvent))
    # the Asset event of each table this apply covered: the range it made visible and the
    # commit time of the table's newest change in it (what a downstream DAG reads)
    covered = applied_tables(st.data_dir, SOURCE, before)["mirror"]
    (extra,) = covered.values()
    assert extra["from_position"] == before["mirror"].encode() < extra["position"]
    assert extra["position"] == read_marker(st.data_dir, SOURCE, "mirror").encode()
    assert extra["committed_at"] == after / 1000 and extra["events"] == 3
    assert extra["committed_at_iso"].startswith(datetime.fromtimestamp(after / 1000, UTC).isoformat()[:19])
    got = freshness(st.data_dir, SOURCE, now=2_005.0)
    assert got["visible_commit_at"] == after / 1000 and not got["pending"] and got["age_s"] == pytest.approx(5)
    # the metric an apply task sends (operators/spark_jobs.py), tagged with the source
    age = emit_freshness(st.data_dir, SOURCE)
    assert age is not None and age >= 0
    assert [(s, t) for s, _v, t in gauges.gauges] == [("cdc.mirror.freshness_seconds", {"source": SOURCE})]


def test_the_apply_has_work_while_a_segment_ends_past_a_marker_a_watermark_only_one_too(tmp_path):
    """The apply task skips itself (no spark-submit, no task after it to wait for) exactly when
    no staged segment ends past every sink's marker (sinks/base.staged_past_markers)."""
    from airflow_provider_cdc.sinks.base import staged_past_markers
    from airflow_provider_cdc.storage.staged import write_segment

    from .staged_scenario import SCHEMAS, WM_TABLE

    st = Stage(tmp_path)
    sinks = ["events", "mirror"]
    assert not staged_past_markers(st.data_dir, SOURCE, sinks)  # nothing staged
    st.change(ITEMS, "c", [1], item(1, 0))
    st.stage_log([])
    assert staged_past_markers(st.data_dir, SOURCE, sinks)  # no sink applied anything yet
    _apply(st)
    assert not staged_past_markers(st.data_dir, SOURCE, sinks)
    done = len(st.log)
    st.watermark("w-after")  # a segment of a watermark alone: its position moves the markers
    write_segment(st.log[done:], changelog_dir(st.data_dir, SOURCE), WM_TABLE, SCHEMAS)
    assert staged_past_markers(st.data_dir, SOURCE, sinks)
    _apply(st)
    assert not staged_past_markers(st.data_dir, SOURCE, sinks)
