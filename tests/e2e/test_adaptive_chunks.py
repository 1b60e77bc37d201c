"""Chunks that size themselves, through the real snapshot DAG on both databases: a run's conf
without chunk_size plans an adaptive snapshot (the plan and the work items carry no size),
the chunk tasks size each chunk from the settings read when they run (a tiny
CDC_CHUNK_TARGET_MB here, so the bytes target sizes the chunks deterministically), and the
snapshot ends in verify at 0 mismatched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_cdc.pipeline.snapshot import read_sidecars

from .helpers import ROWS

pytestmark = pytest.mark.timeout(900)


def test_a_snapshot_without_chunk_size_sizes_its_chunks_and_converges(pipeline):
    p = pipeline
    p.mp.setenv("CDC_CHUNK_TARGET_MB", "0.05")  # ~52 KB of staged rows a chunk
    p.mp.setenv("CDC_CHUNK_MIN_ROWS", "1")
    p.mp.setenv("CDC_CHUNK_MAX_ROWS", "2000")  # the probe before a range's first chunk: 2,000 rows
    p.run("cdc_snapshot", {"action": "start", "tables": [p.table.id], "parallelism": 1})
    assert p.progress().status == "done"
    (plan_file,) = Path(p.data_dir).rglob("plan.json")
    assert json.loads(plan_file.read_text())["chunk_size"] is None  # adaptive
    sid = p.progress().snapshot_id
    rows = [s["result"]["rows"] for s in read_sidecars(p.data_dir, p.source, p.table, sid)]
    assert sum(rows) == ROWS and len(rows) > 2
    # the first chunk too is sized to the bytes target (from the probe), not the 2,000-row bound:
    # every chunk but the range's last (the rest) within 2x of each other
    assert max(rows[:-1]) < 2000 and max(rows[:-1]) <= 2 * min(rows[:-1]), rows
    p.catch_up()
    p.assert_equal()
