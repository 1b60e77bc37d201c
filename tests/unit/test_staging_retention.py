"""Staging retention and the staged changelog's index (issue 33).

Retention removes a staged segment only when every sink's marker, every open snapshot and the
replay horizon are past it: each hold is forced on its own here and shown to keep the segment,
then released and shown to let it go. The index answers the sensor's watermark lookup and the
pending count without opening segments, and is only ever a cache: without it, or with an entry
for a segment that is gone, the answers stay the same.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.formats import PLAN
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.pipeline.retention import RetentionPolicy, prune_staging
from airflow_provider_cdc.sinks.base import write_marker
from airflow_provider_cdc.storage import segment_index, staged
from airflow_provider_cdc.storage.layout import changelog_dir, snapshot_dir
from airflow_provider_cdc.storage.segment_index import (
    INDEX_NAME,
    changelog_used,
    refresh_index,
    staged_segments,
)
from airflow_provider_cdc.storage.staged import (
    find_watermarks,
    list_segments,
    staged_watermarks,
    write_segment,
)

SOURCE = "src"
TABLE = TableName("public", "t")
HOUR = 3600.0


def stage(data_dir: str, n: int) -> list[str]:
    """n segments of 3 rows each: a change, a low and a high watermark ``lw{i}`` / ``hw{i}``
    (segment i spans positions 10*i+1 .. 10*i+3)."""
    out = []
    for i in range(n):
        base = 10 * i
        events = [WatermarkEvent(f"lw{i}", Position(base + 1)),
                  ChangeEvent(TABLE.id, "c", f"[{i}]", Position(base + 2), None, {"id": i}),
                  WatermarkEvent(f"hw{i}", Position(base + 3))]
        out.append(write_segment(events, changelog_dir(data_dir, SOURCE), "cdc.watermark"))
    return out


def names(data_dir: str) -> list[int]:
    """The staged segments left, as their numbers."""
    return [s.first.major // 10 for s in staged_segments(changelog_dir(data_dir, SOURCE))]


def policy(sinks=("events", "mirror"), snapshots=None, horizon=HOUR) -> RetentionPolicy:
    stored = snapshots or {}
    return RetentionPolicy(horizon, tuple(sinks), lambda tid: stored.get(tid))


def later(hours: float = 2) -> float:
    import time

    return time.time() + hours * HOUR


def mark(data_dir: str, segment: int, sinks=("events", "mirror")) -> None:
    for s in sinks:
        write_marker(data_dir, SOURCE, s, Position(10 * segment + 3))


def resumed(folder: str) -> None:
    """The plan rewritten (a resume) after the segments staged so far: only watermarks hold them."""
    import os

    t = later(1)
    os.utime(storage.local_path(storage.join(folder, "plan.json")), (t, t))


def open_snapshot(data_dir: str, sid: str, converge: str | None, unmerged_lw: str | None = None) -> str:
    folder = snapshot_dir(data_dir, SOURCE, TABLE, sid)
    storage.write_text(storage.join(folder, "plan.json"), json.dumps(PLAN.stamp({"table": TABLE.id, "converge_watermark": converge})))
    if unmerged_lw is not None:
        storage.write_text(storage.join(folder, "chunk-000000-x.parquet.json"),
                           json.dumps({"result": {"low_watermark": unmerged_lw}, "range_index": 0, "merged": False}))
    return folder


# --- the index ----------------------------------------------------------------------------------
def test_a_poke_reads_the_index_not_the_segments_and_gets_what_opening_them_gives(tmp_path, monkeypatch):
    data = str(tmp_path)
    stage(data, 6)
    changelog = changelog_dir(data, SOURCE)
    ids = ["hw1", "lw4", "hw5", "nope"]
    truth = find_watermarks(list_segments(changelog), ids)
    opened: list[int] = []
    real = staged.find_watermarks
    monkeypatch.setattr(staged, "find_watermarks", lambda segs, w: opened.append(len(segs)) or real(segs, w))

    assert staged_watermarks(changelog, ids) == truth and opened == [6]  # no index yet: every segment opened
    refresh_index(changelog)
    opened.clear()
    assert staged_watermarks(changelog, ids) == truth and opened == [0]  # the index answers
    stage_more = write_segment([WatermarkEvent("late", Position(1000))], changelog, "cdc.watermark")
    opened.clear()
    assert staged_watermarks(changelog, ["late", "hw1"]) == {"late": (Position(1000).encode(), 0), "hw1": truth["hw1"]}
    assert opened == [1]  # only the segment the index does not name yet
    storage.delete(stage_more)  # an entry whose file is gone is ignored
    refresh_index(changelog)
    assert "late" not in staged_watermarks(changelog, ["late"])


def test_pending_rows_from_the_index_equal_the_footers(tmp_path):
    data = str(tmp_path)
    stage(data, 4)
    mark(data, 1)
    before = arrow_engine.pending_rows(data, SOURCE, ["events", "mirror"])
    refresh_index(changelog_dir(data, SOURCE))
    assert arrow_engine.pending_rows(data, SOURCE, ["events", "mirror"]) == before == 6


def test_an_unreadable_index_costs_reads_never_answers(tmp_path):
    data = str(tmp_path)
    stage(data, 3)
    changelog = changelog_dir(data, SOURCE)
    refresh_index(changelog)
    storage.write_text(storage.join(changelog, INDEX_NAME), "{not json")
    assert staged_watermarks(changelog, ["hw2"]) == {"hw2": (Position(23).encode(), 0)}


# --- retention's holds --------------------------------------------------------------------------
def test_each_sink_marker_holds_what_it_has_not_applied(tmp_path):
    data = str(tmp_path)
    stage(data, 5)
    prune_staging(data, SOURCE, policy(), now=later())
    assert names(data) == [0, 1, 2, 3, 4]  # no marker: a sink that applied nothing holds everything
    mark(data, 3, sinks=("events",))
    mark(data, 1, sinks=("mirror",))
    r = prune_staging(data, SOURCE, policy(), now=later())
    assert names(data) == [2, 3, 4] and r.segments_deleted == 2 and "mirror" in r.held_by
    mark(data, 3, sinks=("mirror",))
    prune_staging(data, SOURCE, policy(), now=later())
    assert names(data) == [4]  # the segment no sink applied yet stays


def test_the_replay_horizon_holds_recent_segments(tmp_path):
    data = str(tmp_path)
    stage(data, 3)
    mark(data, 2)
    r = prune_staging(data, SOURCE, policy(horizon=HOUR), now=later(0.5))
    assert names(data) == [0, 1, 2] and "horizon" in r.held_by
    prune_staging(data, SOURCE, policy(horizon=HOUR), now=later(1.5))
    assert names(data) == []
    assert changelog_used(changelog_dir(data, SOURCE))  # the index outlives them: a lost slot is still noticed


@pytest.mark.parametrize("status", ["running", "paused", "failed"])
def test_an_open_snapshot_holds_from_its_converge_watermark(tmp_path, status):
    data = str(tmp_path)
    stage(data, 5)
    mark(data, 4)
    folder = open_snapshot(data, "20260101T000000-aaaa", converge="lw2")
    resumed(folder)
    stored = {TABLE.id: ("20260101T000000-aaaa", status)}
    r = prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [2, 3, 4] and "snapshot 20260101T000000-aaaa" in r.held_by
    stored[TABLE.id] = ("20260101T000000-aaaa", "done")
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == []


def test_an_unmerged_chunk_holds_from_its_low_watermark_and_a_new_plan_holds_what_followed_it(tmp_path):
    data = str(tmp_path)
    stage(data, 5)
    mark(data, 4)
    folder = open_snapshot(data, "20260101T000000-bbbb", converge=None, unmerged_lw="lw3")
    resumed(folder)
    stored = {TABLE.id: ("20260101T000000-bbbb", "running")}
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [3, 4]
    # a plan written now holds everything staged since (its chunks in flight have no sidecar yet)
    storage.delete(storage.join(folder, "chunk-000000-x.parquet.json"))
    storage.write_text(storage.join(folder, "plan.json"), json.dumps(PLAN.stamp({"table": TABLE.id, "converge_watermark": None})))
    stage_after(data, 5)
    mark(data, 5)  # every sink applied it: only the plan holds it
    r = prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [5] and "snapshot 20260101T000000-bbbb" in r.held_by


def test_an_unmerged_standby_chunk_holds_from_where_its_window_reaches_back_to(tmp_path):
    """A chunk read on a hot standby recorded the replay position read before its snapshot
    (core/visibility.py): its window starts there, before its low watermark, and so does its hold."""
    data = str(tmp_path)
    stage(data, 5)
    mark(data, 4)
    folder = open_snapshot(data, "20260101T000000-cccc", converge=None, unmerged_lw="lw3")
    side = storage.join(folder, "chunk-000000-x.parquet.json")
    storage.write_text(side, json.dumps({"result": {"low_watermark": "lw3", "visibility": "replayed-before:0/C"},
                                         "range_index": 0, "merged": False}))  # 0/C: position 12, in segment 1
    resumed(folder)
    stored = {TABLE.id: ("20260101T000000-cccc", "running")}
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [1, 2, 3, 4]
    storage.write_text(side, json.dumps({"result": {"low_watermark": "lw3", "visibility": "100:110:105"},
                                         "range_index": 0, "merged": False}))  # a primary's snapshot: from lw3
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [3, 4]


def stage_after(data_dir: str, i: int) -> str:
    return write_segment([WatermarkEvent(f"lw{i}", Position(10 * i + 1))], changelog_dir(data_dir, SOURCE),
                         "cdc.watermark")


def test_the_first_held_segment_stops_the_sweep(tmp_path):
    """What is left is one contiguous range of the log: a segment the snapshot does not need,
    after one it does, stays."""
    data = str(tmp_path)
    stage(data, 4)
    mark(data, 3)
    folder = open_snapshot(data, "20260101T000000-cccc", converge="lw1")
    resumed(folder)
    prune_staging(data, SOURCE, policy(snapshots={TABLE.id: ("20260101T000000-cccc", "paused")}), now=later())
    assert names(data) == [1, 2, 3]


def test_a_snapshot_folder_goes_once_closed_and_past_the_horizon(tmp_path):
    data = str(tmp_path)
    stage(data, 1)
    old = open_snapshot(data, "20260101T000000-dddd", converge="lw0")
    new = open_snapshot(data, "20260102T000000-eeee", converge="lw0")
    stored = {TABLE.id: ("20260102T000000-eeee", "running")}
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later(0.5))
    assert storage.exists(old) and storage.exists(new)  # within the horizon
    r = prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert not storage.exists(old) and storage.exists(new) and r.snapshots_deleted == 1


def test_retention_runs_after_every_capture_and_rewrites_the_index_without_what_it_removed(tmp_path):
    data = str(tmp_path)
    stage(data, 3)
    mark(data, 2)
    prune_staging(data, SOURCE, policy(), now=later())
    index = json.loads(storage.read_text(storage.join(changelog_dir(data, SOURCE), INDEX_NAME)))
    assert index["segments"] == {}
    assert segment_index.read_index(changelog_dir(data, SOURCE)) == {}


def test_a_snapshot_file_that_cannot_be_read_holds_everything(tmp_path):
    """An open snapshot whose plan or sidecar cannot be read must not lose its hold: nothing
    goes until it can be read, and the log says which file."""
    data = str(tmp_path)
    stage(data, 3)
    mark(data, 2)
    folder = open_snapshot(data, "20260101T000000-ffff", converge="lw1")
    resumed(folder)
    storage.write_text(storage.join(folder, "chunk-000000-x.parquet.json"), "{damaged")
    stored = {TABLE.id: ("20260101T000000-ffff", "running")}
    r = prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [0, 1, 2] and "cannot be read" in r.held_by and "chunk-000000-x" in r.held_by
    storage.write_text(storage.join(folder, "chunk-000000-x.parquet.json"),
                       json.dumps({"result": {"low_watermark": "lw2"}, "range_index": 0, "merged": False}))
    resumed(folder)
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [1, 2]  # readable again: held from the converge watermark lw1


def test_a_snapshot_done_within_the_horizon_holds_its_converge_watermark_for_its_commit(tmp_path):
    """The commit stores `done` before it sweeps the mirror from the converge watermark (and a
    retried commit sweeps again): the watermark's segment stays for the horizon after `done`."""
    data = str(tmp_path)
    stage(data, 4)
    mark(data, 3)
    folder = open_snapshot(data, "20260101T000000-gggg", converge="lw2")
    resumed(folder)
    stored = {TABLE.id: ("20260101T000000-gggg", "done", later(1.5))}  # done half an hour before `now`
    r = prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == [2, 3] and "its convergence" in r.held_by
    stored[TABLE.id] = ("20260101T000000-gggg", "done", later(0.5))  # done more than the horizon ago
    prune_staging(data, SOURCE, policy(snapshots=stored), now=later())
    assert names(data) == []
