"""The merge job runs unchanged on a Spark standalone cluster.

A master and a worker are started from the pyspark package (``spark-class``) on
127.0.0.1 with free ports; the same staged round is merged once with ``--master
local[2]`` and once with ``--master spark://127.0.0.1:PORT``, and the outputs (event
files and the Delta mirror) must be identical. Both daemons are stopped in a finally.
"""

from __future__ import annotations

import os
import sys

import pytest

from airflow_provider_cdc.sinks.mirror_readers import read_mirror_raw
from tests.integration.staged_scenario import (
    ITEMS,
    OTHER,
    SOURCE,
    build_scenario,
    common_args,
    event_files,
    submit,
)

from .helpers import standalone_spark


@pytest.fixture
def standalone_cluster(tmp_path):
    with standalone_spark(tmp_path, dict(os.environ, PYSPARK_PYTHON=sys.executable), [(2, "1g")]) as url:
        yield url


def test_merge_job_on_standalone_cluster_matches_local_mode(tmp_path, standalone_cluster):
    local = build_scenario(tmp_path / "local")
    cluster = build_scenario(tmp_path / "cluster")
    got_local = submit("merge", ["--chunks", local.round_file(), *common_args(local)])
    got_cluster = submit("merge", ["--chunks", cluster.round_file(), *common_args(cluster)], master=standalone_cluster)
    assert got_cluster["emitted"] == got_local["emitted"] > 0
    assert got_cluster["chunks"] == got_local["chunks"] == 3
    assert event_files(cluster.data_dir) == event_files(local.data_dir)
    for t in (ITEMS, OTHER):
        assert read_mirror_raw(cluster.data_dir, SOURCE, t).to_pylist() == read_mirror_raw(local.data_dir, SOURCE, t).to_pylist()
    work = list((tmp_path / "work0").glob("app-*"))
    assert work, "the worker ran no application: the job did not use the cluster"
