"""Fixtures of the integration tier."""

from __future__ import annotations

import os
import sys

import pytest

from .staged_scenario import SPARK_CONF


@pytest.fixture(scope="session")
def spark(s3_server):
    """One SparkSession (a JVM) for the whole test session, shared by the modules that merge
    in-process: starting one per module cost a JVM start each."""
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


@pytest.fixture
def variables(monkeypatch):
    """Airflow Variables as a dict: operators run here outside a task have no API server."""
    from airflow_provider_cdc import airflow_variables

    store: dict[str, str] = {}
    monkeypatch.setattr(airflow_variables, "_get", lambda key: store.get(key))
    monkeypatch.setattr(airflow_variables, "_set", lambda key, value: store.__setitem__(key, value))
    return store
