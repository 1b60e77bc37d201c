"""The merge and commit tasks against the fence (sinks/mirror_delta.py): a stopped or
replaced snapshot's chunks are not merged, a stop that fences a merge out mid-round ends
the task as skipped (not a failure that a retry would repeat), any other fencing is an
error, and a retried commit of a done snapshot still compacts the mirror's tombstones."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowSkipException
from deltalake.exceptions import CommitFailedError

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.errors import FencedError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.operators.snapshot import SnapshotCommitOperator
from airflow_provider_cdc.operators.spark_jobs import SnapshotMergeOperator
from airflow_provider_cdc.pipeline.snapshot import SEQ_STRIDE
from airflow_provider_cdc.sinks import mirror_compaction
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA, write_marker
from airflow_provider_cdc.sinks.mirror_compaction import tombstone_count
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.sinks.mirror_table import horizon
from airflow_provider_cdc.storage.layout import schema_path

from .helpers import committed, progress

T = TableName("public", "orders")


def start(d: str, status: str = "running", snapshot_id: str = "S1") -> None:
    p = SnapshotProgress.start("src", snapshot_id, {T.id: [FULL_RANGE]})
    if status == "stopped":
        p.stop()
    airflow_variables.update("src", T.id, d, lambda _q: p)


def merge_op(tmp_path, chunks) -> SnapshotMergeOperator:
    round_file = tmp_path / "round.json"
    round_file.write_text(json.dumps([c.to_dict() for c in chunks]))
    return SnapshotMergeOperator(task_id="merge", round_file=str(round_file), data_dir=str(tmp_path), source="src")


@pytest.mark.parametrize("how", ["stopped", "replaced"])
def test_merge_leaves_out_a_stopped_or_replaced_snapshot(tmp_path, variables, monkeypatch, how):
    start(str(tmp_path), "stopped" if how == "stopped" else "running", "S1" if how == "stopped" else "S2")
    op = merge_op(tmp_path, [committed(tmp_path, 0, 0, 9, 10, False)])
    monkeypatch.setattr(op, "run_local", lambda: pytest.fail("a dead snapshot's round was merged"))
    with pytest.raises(AirflowSkipException, match="stopped or replaced"):
        op.execute({})


def test_a_stop_that_fences_the_merge_out_ends_it_skipped(tmp_path, variables, monkeypatch):
    start(str(tmp_path))
    op = merge_op(tmp_path, [committed(tmp_path, 0, 0, 9, 10, False)])

    def stopped_while_merging():
        airflow_variables.request("src", T.id, "stop", str(tmp_path))
        raise FencedError("this merge holds epoch 1 but the table's is '2'")

    monkeypatch.setattr(op, "run_local", stopped_while_merging)
    with pytest.raises(AirflowSkipException, match="fenced out"):
        op.execute({})


def test_a_merge_fenced_by_a_newer_attempt_fails(tmp_path, variables, monkeypatch):
    start(str(tmp_path))
    op = merge_op(tmp_path, [committed(tmp_path, 0, 0, 9, 10, False)])

    def fenced():
        raise FencedError("a newer merge attempt claimed the table")

    monkeypatch.setattr(op, "run_local", fenced)
    with pytest.raises(FencedError):
        op.execute({})


def test_a_retried_commit_of_a_done_snapshot_still_compacts(tmp_path, variables, monkeypatch):
    d = str(tmp_path)
    schema = TableSchema(T, (Column("id", "int64"),), ("id",))
    Path(schema_path(d, "src", T)).parent.mkdir(parents=True, exist_ok=True)
    Path(schema_path(d, "src", T)).write_text(schema.to_json())
    rows = [
        {"position": Position(p).encode(), "table": T.id, "op": op, "key": encode_key([k]), "before": None,
         "after": None if op == "d" else encode_row({"id": k}), "ts_ms": p, "watermark": None, "snapshot": False,
         "batch": "b"}
        for p, op, k in [(1, "c", 1), (2, "c", 2), (3, "d", 1)]
    ]
    MirrorDeltaSink(d, "src").write(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA))
    write_marker(d, "src", "mirror", Position(3))
    progress(tmp_path)
    a = committed(tmp_path, 0, 0, 49, 50, True)
    b = committed(tmp_path, SEQ_STRIDE, 1, 100, 51, True)
    op = SnapshotCommitOperator(
        task_id="commit", chunks=[a.to_dict(), b.to_dict()], data_dir=d, source="src", cdc_conn_id="unused"
    )
    real_compact = mirror_compaction.compact_buckets

    def conflict_once(*args, **kwargs):
        monkeypatch.setattr(mirror_compaction, "compact_buckets", real_compact)
        raise CommitFailedError("a concurrent commit won")

    monkeypatch.setattr(mirror_compaction, "compact_buckets", conflict_once)
    with pytest.raises(CommitFailedError):
        op.execute({})  # `done` is stored, then compaction fails
    assert airflow_variables.status("src", T.id, d) == "done" and tombstone_count(d, "src", T) == 1
    assert op.execute({})[T.id]["status"] == "done"  # the retry
    assert tombstone_count(d, "src", T) == 0 and horizon(d, "src", T) == Position(3).encode()
