"""The Spark engine distributed: a standalone cluster (a master and two workers of one core
and 1 GB each, from the pyspark package) merges a snapshot round and applies a changelog
held on a real S3 HTTP server (moto_server on 127.0.0.1), with a 512 MB driver whose
``spark.driver.maxResultSize`` is 2 MB while the round holds ~20 times that: the executors
read staging, run the window and write the event log and the mirror's buckets through
pyarrow.fs; the driver only commits file metadata. The outputs equal core's reference."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.pipeline.spark.common import spark_submit_command
from airflow_provider_cdc.storage.layout import changelog_dir, events_dir
from airflow_provider_cdc.storage.staged import read_log_events

from .helpers import standalone_spark
from .staged_scenario import OTHER, OTHER_SCHEMA, SOURCE, Stage, expected_mirror_list, mirror_list

pytestmark = pytest.mark.integration

CHUNKS, CHUNK_ROWS, CHANGES = 4, 50_000, 20_000
LIMITS = {"spark.driver.memory": "512m", "spark.driver.maxResultSize": "2m", "spark.ui.enabled": "false",
          "spark.executor.memory": "768m", "spark.sql.shuffle.partitions": "4"}


@pytest.fixture
def cluster(tmp_path, s3_server):
    # the workers' own identity: the driver ships them the storage's endpoint, never its keys
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **s3_server["env"])
    with standalone_spark(tmp_path, env, [(1, "1g"), (1, "1g")]) as url:
        yield url


def _event_log_rows(data_dir: str) -> int:
    """Events in the event log, through each table's Delta log (sinks/event_log_table.py)."""
    import pyarrow.parquet as pq

    from airflow_provider_cdc.sinks.event_log import event_files

    total = 0
    root = events_dir(data_dir, SOURCE)
    for name in storage.list_names(root, files_only=False):
        if name.startswith("table="):
            folder = storage.join(root, name)
            for f in event_files(folder):
                fs, path = storage.filesystem(storage.join(folder, f))
                with fs.open_input_file(path) as fh:
                    total += pq.ParquetFile(fh).metadata.num_rows
    return total


def _submit(job: str, args: list[str], master: str) -> str:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(spark_submit_command(job, args, master=master, conf=LIMITS), capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, f"spark-submit {job} failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_a_round_larger_than_the_driver_merges_and_applies_on_a_cluster_from_s3(cluster, s3_server, monkeypatch, tmp_path):
    for k, v in s3_server["env"].items():
        monkeypatch.setenv(k, v)
    rnd = random.Random(7)
    st = Stage(f"s3://{s3_server['bucket']}/cluster-{tmp_path.name}")
    for c in range(CHUNKS):
        st.watermark(f"lw{c}")
    for c in range(CHUNKS):  # changed inside every window: those keys leave their chunk
        for j in rnd.sample(range(CHUNK_ROWS), 5):
            k = c * CHUNK_ROWS + j
            st.change(OTHER, "u", [f"k{k:07d}"], {"code": f"k{k:07d}", "n": -k})
    for c in range(CHUNKS):
        st.watermark(f"hw{c}")
    for _ in range(CHANGES):  # the changelog after the snapshot: updates and some deletes
        k = rnd.randrange(CHUNKS * CHUNK_ROWS)
        if rnd.random() < 0.05:
            st.change(OTHER, "d", [f"k{k:07d}"], None)
        else:
            st.change(OTHER, "u", [f"k{k:07d}"], {"code": f"k{k:07d}", "n": rnd.randrange(10**6)})
    for c in range(CHUNKS):
        rows = [{"code": f"k{k:07d}", "n": k} for k in range(c * CHUNK_ROWS, (c + 1) * CHUNK_ROWS)]
        st.chunk(OTHER, c, f"lw{c}", f"hw{c}", rows, "code")
    st.stage_log(cuts=[len(st.log) // 3, 2 * len(st.log) // 3])
    args = ["--data-dir", st.data_dir, "--source", SOURCE, "--sinks", "events,mirror"]
    _submit("merge", ["--chunks", st.round_file(), *args], cluster)
    _submit("apply", args, cluster)
    assert mirror_list(st.data_dir, OTHER_SCHEMA) == expected_mirror_list(st, OTHER_SCHEMA)
    changes = sum(1 for e in read_log_events(changelog_dir(st.data_dir, SOURCE)) if getattr(e, "table", None) == OTHER.id)
    assert _event_log_rows(st.data_dir) == len(st.expected_merge()) + changes
    assert any((tmp_path / f"work{i}").glob("app-*") for i in range(2)), "the workers ran no application"
