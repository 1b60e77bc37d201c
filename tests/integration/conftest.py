"""Fixtures of the integration tier."""

from __future__ import annotations

import os
import sys

import pytest

from .staged_scenario import SPARK_CONF


@pytest.fixture(scope="module")
def spark(s3_server):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("test_spark_jobs")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    # the executors' own identity for the test's S3 server (closures carry no credentials):
    # what a cluster's executors get from their hosts, here given to the local ones
    for k, v in s3_server["env"].items():
        builder = builder.config(f"spark.executorEnv.{k}", v)
    session = builder.getOrCreate()
    yield session
    session.stop()


