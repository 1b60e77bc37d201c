"""Secrets out of sight, through the DAGs (issue 31), on the real PostgreSQL:

* the 'postgres' sink takes an Airflow connection (CDC_POSTGRES_SINK_CONN_ID, with a password)
  and works through cdc_snapshot and cdc_changelog: verify finds 0 mismatched rows, and the
  PostgreSQL mirror table holds every row of the Delta mirror at the same position;
* a deferred high-watermark sensor whose data location is on object storage behind an
  Airflow connection (CDC_STORAGE_CONN_ID, a real S3 HTTP server): its trigger reads the
  staged changelog with the connection's credentials, yet nothing of them reaches the
  process environment (the triggerer's is shared by every source's triggers), the task logs
  or a file under the data location.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from urllib.parse import urlsplit

import psycopg2
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
from airflow_provider_cdc.hooks.cdc_storage import storage_environment
from airflow_provider_cdc.operators.spark_jobs import postgres_sink_params
from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from tools import workload as w

from .helpers import CaptureLockHolder, Pipeline, load_dag, mirror_rows, source_rows, xcom_of


def _leaked(secret: str) -> list[str]:
    """Environment variables holding ``secret`` (the tests' own AIRFLOW_CONN_* definitions aside)."""
    return [k for k, v in os.environ.items() if secret in v and not k.startswith("AIRFLOW_CONN_")]


def _plain(value):
    """A mirror value as both mirrors can be compared: bytes for bytea, JSON parsed."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


@pytest.fixture
def pg_sink(pg_uri, unique_name, monkeypatch):
    password = f"pg-sink-pw-{uuid.uuid4().hex}"
    u = urlsplit(pg_uri)
    monkeypatch.setenv("AIRFLOW_CONN_CDC_E2E_PG_SINK", json.dumps({
        "conn_type": "postgres", "host": u.hostname, "port": u.port, "schema": u.path.lstrip("/"),
        "login": u.username or "postgres", "password": password}))
    target = f"pgsink_{unique_name}"
    monkeypatch.setenv("CDC_SINKS", "events,mirror,postgres")
    monkeypatch.setenv("CDC_POSTGRES_SINK_CONN_ID", "cdc_e2e_pg_sink")
    monkeypatch.setenv("CDC_POSTGRES_SINK_SCHEMA", target)
    yield {"password": password, "target": target}
    with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
    conn.close()


@pytest.mark.timeout(300)
def test_the_postgres_sink_through_both_dags_to_0_mismatched(pg_uri, pg_sink, unique_name, tmp_path, monkeypatch,
                                                            capfd):
    p = Pipeline(pg_uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(pg_uri, p.table, 1500)
    try:
        p.capture_now()
        with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=31):
            p.snapshot()
            time.sleep(0.5)
        assert p.progress().status == "done"
        p.catch_up()
        p.assert_equal()  # verify: 0 mismatched against the Delta mirror
        sink = MirrorPostgresSink(postgres_sink_params("cdc_e2e_pg_sink"), p.data_dir, p.source,
                                  target_schema=pg_sink["target"])
        try:
            pg_rows = sink.read(p.table)
        finally:
            sink.close()
        delta = read_mirror(p.data_dir, p.source, p.table, with_meta=True).to_pylist()
        assert len(pg_rows) == w.count_rows(p.uri, p.table) > 1000
        assert [(r["__key"], r["__position"]) for r in pg_rows] == [(r["__key"], r["__position"]) for r in delta]
        names = [n for n in pg_rows[0] if not n.startswith("__")]
        assert [[_plain(r[n]) for n in names] for r in pg_rows] == [[_plain(r[n]) for n in names] for r in delta]
        out = capfd.readouterr()
        assert pg_sink["password"] not in out.out + out.err, "the password was in a task log"
        assert not _leaked(pg_sink["password"])
    finally:
        p.cleanup()


@pytest.mark.timeout(300)
def test_a_deferred_sensor_on_object_storage_leaves_no_secret_behind(pg_source, s3_server, unique_name,  # noqa: F811
                                                                     monkeypatch, capfd):
    src = pg_source
    table_id = f"public.{src['table']}"
    for k in storage.STORAGE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    secret = f"s3-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AIRFLOW_CONN_CDC_E2E_LAKE", json.dumps({
        "conn_type": "aws", "login": "e2e-key", "password": secret,
        "extra": {"endpoint_url": s3_server["endpoint"], "region_name": "us-east-1"}}))
    monkeypatch.setenv("CDC_STORAGE_CONN_ID", "cdc_e2e_lake")
    data_dir = f"s3://{s3_server['bucket']}/deferred-{unique_name}"
    monkeypatch.setenv("CDC_DATA_DIR", data_dir)
    monkeypatch.setenv("CDC_SENSOR_DEFERRABLE", "true")
    monkeypatch.setenv("CDC_SENSOR_POKE_INTERVAL", "1")
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")
    dag = load_dag("cdc_snapshot", unique_name)
    assert dag.task_dict["wait_high_watermarks"].deferrable

    hook = CdcSourceHook(src["conn_id"])
    # the lock holder's capture (a cdc_changelog elsewhere) writes with the connection too
    holder = CaptureLockHolder(hook.connection_params(), hook.get_dialect(), data_dir, capture=True)
    holder.start()
    holder.locked.wait(60)
    assert holder.acquired, f"the test could not take the capture lock: {holder.error!r}"
    try:
        run = dag.test(run_conf={"action": "start", "tables": [table_id], "chunk_size": 1000, "parallelism": 2})
    finally:
        holder.finish.set()
        holder.join(timeout=60)
    assert holder.error is None, f"lock holder failed: {holder.error!r}"
    assert run.state == "success", f"cdc_snapshot ended {run.state}"
    assert holder.deferral is not None, "the sensor never deferred"
    ended = xcom_of(run, "wait_high_watermarks")
    assert ended and ended[0]["trigger_event"] in ("success", "pending")

    # nothing of the connection in the process environment, the logs, or the data location
    assert not _leaked(secret), "the storage secret was written to os.environ"
    assert not any(os.environ.get(k) for k in storage.SECRET_SETTINGS)
    out = capfd.readouterr()
    assert secret not in out.out + out.err, "the storage secret was in a task log"
    with storage.scoped_settings(storage_environment("cdc_e2e_lake")):
        import pyarrow.fs as pafs

        fs, base = storage.filesystem(data_dir)
        files = [i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True)) if i.type == pafs.FileType.File]
        assert files
        for f in files:
            with fs.open_input_stream(f) as stream:
                assert secret.encode() not in stream.read(), f
        assert mirror_rows(data_dir, src["conn_id"], src["table"]) == source_rows(src["uri"], src["table"])
    storage.use_settings(None)
