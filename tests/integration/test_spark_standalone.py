"""The merge job runs unchanged on a Spark standalone cluster.

A master and a worker are started from the pyspark package (``spark-class``) on
127.0.0.1 with free ports; the same staged round is merged once with ``--master
local[2]`` and once with ``--master spark://127.0.0.1:PORT``, and the outputs (event
files and the Delta mirror) must be identical. Both daemons are stopped in a finally.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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

from .helpers import _free_port, _stop, _wait_for


@pytest.fixture
def standalone_cluster(tmp_path):
    spark_class = shutil.which("spark-class")
    if spark_class is None:
        pytest.fail("spark-class is not on PATH: run `source scripts/env.sh` (pyspark's bin/ from the venv)")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    master = worker = None
    try:
        with open(master_log, "wb") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(ui)],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )
        _wait_for(master_log, "I have been elected leader", master)
        url = f"spark://127.0.0.1:{port}"
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port", str(worker_ui),
                 "--cores", "2", "--memory", "1g", "--work-dir", str(tmp_path / "work"), url],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )
        _wait_for(worker_log, "Successfully registered with master", worker)
        yield url
    finally:
        _stop(worker)
        _stop(master)


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
    work = list((tmp_path / "work").glob("app-*"))
    assert work, "the worker ran no application: the job did not use the cluster"
