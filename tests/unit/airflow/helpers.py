"""Helpers shared by the Airflow unit tests (a progress, committed chunks, a task context, staged events)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from airflow_provider_cdc import airflow_variables, storage
from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.formats import PLAN
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.snapshot import (
    write_sidecar,
)
from airflow_provider_cdc.storage.layout import changelog_dir, chunk_path, plan_path
from airflow_provider_cdc.storage.staged import write_segment

T = TableName("public", "orders")


def ctx(conf=None):
    return {"dag_run": SimpleNamespace(conf=conf or {}), "ti": None}


RANGES = [ChunkRange(None, (50,)), ChunkRange((50,), None)]


def progress(tmp_path, status="running", upper=(100,)):
    """A stored snapshot S1 of T over RANGES, with its plan file, in the given status."""
    p = SnapshotProgress.start("src", "S1", {T.id: RANGES}, {T.id: upper})
    {"paused": p.pause, "stopped": p.stop, "failed": lambda: p.fail("boom"), "running": lambda: None}[
        status
    ]()
    airflow_variables.update("src", T.id, str(tmp_path), lambda _q: p)
    plan = {
        "table": T.id,
        "snapshot_id": "S1",
        "ranges": [json.loads(r.to_json()) for r in RANGES],
        "upper_bound": list(upper),
        "where": None,
        "chunk_size": 10,
        "parallelism": 2,
        "delay_seconds": 0.0,
    }
    storage.write_text(plan_path(str(tmp_path), "src", T, "S1"), json.dumps(PLAN.stamp(plan)))
    return p


def committed(
    tmp_path, seq, range_index, last_key, rows, exhausted, merged=False, snapshot_id="S1", after=None
):
    rng = RANGES[range_index]
    path = chunk_path(str(tmp_path), "src", T, snapshot_id, seq, f"hw{seq}")
    after = None if after is None else (after,)
    res = ChunkResult(
        "src",
        T.id,
        snapshot_id,
        seq,
        f"lw{seq}",
        f"hw{seq}",
        path,
        rng,
        after,
        None if last_key is None else (last_key,),
        rows,
        exhausted,
    )
    import pathlib

    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_sidecar(res, range_index, merged=merged)
    return res


def stage(data_dir: str, source: str, *ids: str, start: int = 100) -> None:
    events = [ChangeEvent("public.t", "c", "[1]", Position(start, 0, 0), None, {"id": 1})]
    events += [WatermarkEvent(w, Position(start + 1 + i, 0, 0)) for i, w in enumerate(ids)]
    write_segment(events, changelog_dir(data_dir, source), "cdc.watermark")
