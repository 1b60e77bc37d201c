"""Staging and outputs on object storage, through the real DAGs: CDC_DATA_DIR is
``s3://bucket/prefix`` on a real S3 HTTP server (moto_server on 127.0.0.1), endpoint and
credentials from the standard AWS variables. Capture, a snapshot under live writes, the
changelog catch-up and verify all run on it (the Arrow engine: rounds stay under
CDC_LOCAL_MAX_ROWS), on PostgreSQL and on MariaDB, and nothing lands on the local disk."""

from __future__ import annotations

import os
import time

import pyarrow.fs as pafs
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.storage.layout import changelog_dir, events_dir, mirror_dir
from tools import workload as w

from .helpers import ROWS, Pipeline

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["pg", "mysql"])
def s3_pipeline(request, unique_name, s3_server, tmp_path, monkeypatch):
    for k, v in s3_server["env"].items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")  # every round and apply in the worker (Arrow engine)
    monkeypatch.chdir(tmp_path)  # a location mistaken for a local path would land here
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    p = Pipeline(uri, unique_name, f"s3://{s3_server['bucket']}/e2e {unique_name}/data", monkeypatch)
    w.create_demo_table(uri, p.table, ROWS)
    p.capture_now()
    yield p
    p.cleanup()


def _objects(location: str) -> list[str]:
    fs, base = storage.filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return [i.path for i in infos if i.type == pafs.FileType.File]


def test_capture_snapshot_and_verify_on_s3(s3_pipeline, tmp_path):
    p = s3_pipeline
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=3) as writer:
        p.snapshot()
        time.sleep(0.3)
    assert writer.stats().committed > 0 and writer.stats().errors == []
    assert p.progress().status == "done"
    p.catch_up()
    p.assert_equal()  # verify: 0 mismatches, event log consistent per key
    assert any(o.endswith(".parquet") for o in _objects(changelog_dir(p.data_dir, p.source)))
    assert any(o.endswith(".parquet") for o in _objects(events_dir(p.data_dir, p.source)))
    assert any("/_delta_log/" in o for o in _objects(mirror_dir(p.data_dir, p.source, p.table)))
    assert os.listdir(tmp_path) == [], f"data written to the local disk: {os.listdir(tmp_path)}"


def test_the_demo_runs_on_s3(s3_server, tmp_path, monkeypatch):
    """`make demo` with CDC_DEMO_DATA_DIR=s3://bucket/demo: the same PASS, data on the server."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    location = f"s3://{s3_server['bucket']}/demo-{tmp_path.name}"
    for k, v in s3_server["env"].items():
        monkeypatch.setenv(k, v)
    env = dict(os.environ, CDC_DEMO_DATA_DIR=location, CDC_DEMO_ROWS="3000", CDC_DEMO_CHUNK_SIZE="1000",
               CDC_DEMO_WRITER_TPS="20")
    proc = subprocess.run([sys.executable, "-m", "tools.demo"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "PASS: demo of 3,000 rows" in proc.stdout, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert any("/_delta_log/" in o for o in _objects(location))
