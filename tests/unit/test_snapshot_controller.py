"""The snapshot controller without Airflow, on the in-memory progress store: the lifecycle a
run's conf drives (start refused over a live snapshot, pause, resume, stop, resume after stop
refused), the chunk loop's stop checks before it touches the source, and the commit."""

from __future__ import annotations

import json
import pathlib

import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.errors import StateError
from airflow_provider_cdc.core.formats import PLAN
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.snapshot import write_sidecar
from airflow_provider_cdc.pipeline.snapshot_conf import parse_snapshot_conf
from airflow_provider_cdc.pipeline.snapshot_controller import SnapshotController, work_items
from airflow_provider_cdc.pipeline.snapshot_state import MemoryProgressStore, SourceProgress
from airflow_provider_cdc.storage.layout import chunk_path, plan_path

T = TableName("public", "orders")
RANGES = [ChunkRange(None, (50,)), ChunkRange((50,), None)]


def no_source():
    raise AssertionError("the controller connected to the source")


@pytest.fixture
def setup(tmp_path):
    """A running snapshot S1 of T over RANGES in a memory store, its plan file in tmp_path, and
    ``make(run_id)``: a controller of run ``run_id`` over them that may not connect."""
    progress = SourceProgress(MemoryProgressStore(), "src")
    progress.update(T.id, lambda _q: SnapshotProgress.start("src", "S1", {T.id: RANGES}, {T.id: (100,)}))
    plan = {"table": T.id, "snapshot_id": "S1", "ranges": [json.loads(r.to_json()) for r in RANGES],
            "upper_bound": [100], "where": None, "chunk_size": 10, "parallelism": 2, "delay_seconds": 0.0}
    storage.write_text(plan_path(str(tmp_path), "src", T, "S1"), json.dumps(PLAN.stamp(plan)))

    def make(run_id="run-1"):
        return SnapshotController(source="src", data_dir=str(tmp_path), progress=progress, connect=no_source,
                                  run_id=run_id)

    return progress, plan, make


def conf(action, **kw):
    return parse_snapshot_conf({"action": action, "tables": [T.id], **kw})


def chunk(tmp_path, seq, range_index, last_key, rows, exhausted, after=None):
    path = chunk_path(str(tmp_path), "src", T, "S1", seq, f"hw{seq}")
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    res = ChunkResult("src", T.id, "S1", seq, f"lw{seq}", f"hw{seq}", path, RANGES[range_index],
                      None if after is None else (after,), (last_key,), rows, exhausted)
    write_sidecar(res, range_index)
    return res


def test_the_lifecycle_a_runs_conf_drives(setup):
    progress, plan, make = setup
    with pytest.raises(StateError, match="has a running snapshot S1"):
        make().apply(conf("start"))  # refused before it connects
    assert make().apply(conf("pause")) == [] and progress.load(T.id).status == "paused"
    work = make("run-2").apply(conf("resume"))
    assert work == work_items(plan, [0, 1])
    got = progress.load(T.id)
    assert got.status == "running" and got.owner == "run-2"
    assert make().apply(conf("stop")) == [] and progress.load(T.id).status == "stopped"
    with pytest.raises(StateError, match="stopped snapshot starts over"):
        make().apply(conf("resume"))


def test_the_chunk_loop_checks_the_authority_before_it_connects(setup):
    progress, plan, make = setup
    item = work_items(plan, [0])[0]
    progress.update(T.id, lambda q: (q.pause(), q)[1])
    assert make().read_range(item) == []  # paused: nothing read, the source never opened
    progress.update(T.id, lambda q: (q.resume(), setattr(q, "owner", "run-9"), q)[2])
    assert make("run-1").stop_reason(T.id, "S1") == "snapshot S1 of public.orders is read by DAG run run-9 now"
    assert make("run-9").stop_reason(T.id, "S1") is None
    assert "no longer the current one" in make("run-9").stop_reason(T.id, "S0")


def test_a_dag_pause_while_reading_pauses_the_snapshot(setup):
    progress, _plan, make = setup
    paused = [False]
    gate = make().chunk_gate(T.id, "S1", lambda: paused[0])
    assert gate() is None
    paused[0] = True
    assert gate() == "the DAG was paused" and progress.load(T.id).status == "paused"


def test_commit_records_each_merged_chunk_once_and_finishes(setup, tmp_path):
    progress, _plan, make = setup
    a = chunk(tmp_path, 0, 0, 49, 50, True)
    b = chunk(tmp_path, 1_000_000, 1, 100, 51, True)
    summary, done = make().commit([a.to_dict()])
    assert summary[T.id] == {"status": "running", "rows": 50, "chunks": 1} and done == {}
    summary, done = make().commit([a.to_dict(), b.to_dict()])  # a retry carries chunk a again
    assert summary[T.id] == {"status": "done", "rows": 101, "chunks": 2}
    assert done[T.id]["snapshot_done"] is True and done[T.id]["rows"] == 101
    assert progress.load(T.id).status == "done"


class LaggingReplica:
    """What the chunk loop asks of a dialect whose chunks come from a replica: its lag."""

    max_replica_lag_seconds = 60.0

    def __init__(self, lags):
        self.lags = list(lags)

    def replica_lag(self):
        return self.lags.pop(0) if len(self.lags) > 1 else self.lags[0]


def test_replica_lag_throttles_the_chunk_loop_and_pauses_the_snapshot_beyond_its_bound(setup):
    progress, _plan, make = setup
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s

    ctl = make()
    # 40 s behind (more than half the bound): wait; then caught up: read on
    assert ctl._await_replica(LaggingReplica([(10_000, 40.0), (0, 0.0)]), T.id, "S1", "t", lambda: now[0],
                              sleep) is None
    assert slept == [5.0] and progress.load(T.id).status == "running"
    # still beyond the bound after waiting that long: the snapshot pauses, saying why
    why = ctl._await_replica(LaggingReplica([(10_000_000, 90.0)]), T.id, "S1", "t", lambda: now[0], sleep)
    assert "90 s behind" in why and "max_replica_lag_seconds=60" in why
    assert progress.load(T.id).status == "paused"
    assert ctl._await_replica(LaggingReplica([None]), T.id, "S1", "t") is None  # chunks from the source itself


def test_a_replica_that_stopped_replicating_pauses_the_snapshot_saying_so(setup):
    progress, _plan, make = setup
    now = [0.0]

    def sleep(s):
        now[0] += s

    why = make()._await_replica(LaggingReplica([(0, float("inf"))]), T.id, "S1", "t", lambda: now[0], sleep)
    assert "stopped replicating" in why and "resume" in why
    assert progress.load(T.id).status == "paused"


def test_chunks_from_a_replica_wait_for_the_later_of_the_plans_read_floor_and_convergence_mark():
    from airflow_provider_cdc.core.position import Position, position_mark
    from airflow_provider_cdc.pipeline.snapshot_controller import read_floor

    early, late = Position(100, 0, 0), Position(200, 0, 0)
    assert read_floor({"converge_watermark": position_mark(early, 1), "read_floor": late.encode()}) == late
    assert read_floor({"converge_watermark": position_mark(late, 1), "read_floor": early.encode()}) == late
    assert read_floor({"converge_watermark": "a-table-watermark-id", "read_floor": early.encode()}) == early
    assert read_floor({"converge_watermark": None, "read_floor": None}) is None
    assert read_floor({"converge_watermark": position_mark(early, 1)}) == early  # a plan from before read_floor


def test_a_chunk_whose_high_watermark_a_failover_lost_is_read_again_with_the_rest_of_its_range(setup, tmp_path):
    """Issue 57: resume (any read of the range) discards the first chunk whose high watermark is
    on no server any more and every later chunk of its range, and reads on after the last chunk
    that holds; a watermark capture has not passed yet is waited for, not discarded."""
    from dataclasses import replace

    from airflow_provider_cdc.core.events import WatermarkEvent
    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.pipeline.snapshot import read_sidecars, sidecar_path
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.segment_index import record_through
    from airflow_provider_cdc.storage.staged import write_segment

    _progress, plan, make = setup
    staged = changelog_dir(str(tmp_path), "src")
    good = chunk(tmp_path, 0, 0, 10, 10, False)
    lost = replace(chunk(tmp_path, 1, 0, 20, 10, False, after=10), high_position=Position(300, 0, 0).encode())
    write_sidecar(lost, 0)
    last = replace(chunk(tmp_path, 2, 0, 49, 9, True, after=20), high_position=Position(320, 0, 0).encode())
    write_sidecar(last, 0)
    for c in (good, lost, last):
        pathlib.Path(c.path).write_bytes(b"chunk")
    write_segment([WatermarkEvent("hw0", Position(200, 0, 0)), WatermarkEvent("hw2", Position(321, 0, 0))],
                  staged, "cdc.watermark")
    from airflow_provider_cdc.core.schema import Column, TableSchema
    from airflow_provider_cdc.storage.layout import schema_path

    storage.write_text(schema_path(str(tmp_path), "src", T), TableSchema(T, (Column("id", "int64"),), ("id",)).to_json())
    item = work_items(plan, [0])[0]
    record_through(staged, Position(299, 0, 0), 1)
    assert [c["seq"] for c in make().read_range(item)] == [0, 1, 2]  # read already: not lost yet
    record_through(staged, Position(330, 0, 0), 2)
    with pytest.raises(AssertionError, match="connected to the source"):  # reads the range again
        make().read_range(item)
    assert [s["result"]["seq"] for s in read_sidecars(str(tmp_path), "src", T, "S1")] == [0]
    assert not pathlib.Path(lost.path).exists() and not pathlib.Path(sidecar_path(last.path)).exists()
    assert pathlib.Path(good.path).exists()
