"""Object-storage credentials from an Airflow connection named by CDC_STORAGE_CONN_ID
(hooks/cdc_storage.py), against a real S3 HTTP server: without the connection the
location cannot be reached; once a task starts (the operators' pre_execute), storage,
deltalake and child processes get the endpoint and keys from it."""

from __future__ import annotations

import contextlib
import json
import os
from urllib.parse import urlsplit

import psycopg2
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.hooks.cdc_storage import StorageConnectionMixin, storage_environment
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.triggers.high_watermark import HighWatermarkTrigger

from .helpers import write_mirror_equal_to_source

pytestmark = pytest.mark.integration

AWS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
       "AWS_REGION", "AWS_DEFAULT_REGION")


@pytest.fixture
def no_aws_env(monkeypatch):
    for k in AWS:
        monkeypatch.delenv(k, raising=False)  # restored (removed again) after the test
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_task_takes_the_storage_connection_from_the_settings(s3_server, no_aws_env, monkeypatch, tmp_path):
    conn = {"conn_type": "aws", "login": "test", "password": "test",
            "extra": {"endpoint_url": s3_server["endpoint"], "region_name": "us-east-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_CDC_TEST_S3", json.dumps(conn))
    monkeypatch.setenv("CDC_STORAGE_CONN_ID", "cdc_test_s3")
    location = f"s3://{s3_server['bucket']}/conn-{tmp_path.name}/probe.txt"
    with pytest.raises(OSError):
        storage.write_text(location, "x")  # no endpoint, no keys: the real AWS, unreachable here

    class Probe(StorageConnectionMixin):
        def pre_execute(self, context):
            return super().pre_execute(context)

    class Base:
        def pre_execute(self, context):
            return None

    class Task(Probe, Base):
        pass

    Task().pre_execute({})
    storage.write_text(location, "hello")
    assert storage.read_text(location) == "hello"


def test_a_bad_extra_names_the_connection_and_the_key(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CDC_BAD_S3", json.dumps({"conn_type": "aws", "extra": {"endpoint_url": 7}}))
    with pytest.raises(ConfigurationError, match=r"connection 'cdc_bad_s3'.*'endpoint_url'"):
        storage_environment("cdc_bad_s3")


def test_the_trigger_carries_the_connection_id_never_its_secrets():
    t = HighWatermarkTrigger(data_dir="s3://b/x", source="s", watermark_ids=["hw"], storage_conn_id="cdc_test_s3")
    path, kwargs = t.serialize()
    assert kwargs["storage_conn_id"] == "cdc_test_s3"
    assert "test" not in json.dumps(kwargs).replace("cdc_test_s3", "")
    assert HighWatermarkTrigger(**kwargs).storage_conn_id == "cdc_test_s3"


def test_the_cli_reads_connections_kept_in_airflows_metadata_database(pg_uri, unique_name, tmp_path):
    """Issue 58: a connection made in the UI or with ``airflow connections add`` lives in the
    metadata database; a task reads it through the API server, and the package's CLI, outside a
    task, reads it there too, as ``airflow connections get`` does (before, only AIRFLOW_CONN_*
    variables were seen)."""
    import subprocess

    from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
    from airflow_provider_cdc.hooks.cdc_storage import storage_environment

    conn_id = f"meta_{unique_name}"
    store_id = f"meta_store_{unique_name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    for cid, uri in ((conn_id, pg_uri), (store_id, "aws://AKIDEXAMPLE:s3cr3t@/?region_name=eu-west-1")):
        subprocess.run(["airflow", "connections", "add", cid, "--conn-uri", uri], check=True, env=env,
                       capture_output=True, timeout=120)
    from airflow_provider_cdc.hooks.connections import read_metadata_database

    try:
        # a DAG file's parse (not the CLI) does not load Airflow's database models for it
        read_metadata_database(False)  # (an earlier in-process CLI test may have switched it on)
        with pytest.raises(Exception, match="isn't defined"):
            CdcSourceHook(conn_id).connection_params()
        read_metadata_database()  # as the CLI does for its commands
        params = CdcSourceHook(conn_id).connection_params()
        assert (params.host, params.port) == (urlsplit(pg_uri).hostname, urlsplit(pg_uri).port)
        assert storage_environment(store_id)["AWS_ACCESS_KEY_ID"] == "AKIDEXAMPLE"
        out = subprocess.run(["airflow-cdc", "doctor", "--conn-id", conn_id, "--source", unique_name],
                             env=env, capture_output=True, text=True, timeout=300)
        assert "is not defined" not in out.stdout + out.stderr, out.stdout + out.stderr
        # drop-source's dry run connects to list what the source holds on that server
        out = subprocess.run(["airflow-cdc", "drop-source", "--source", conn_id],
                             env={**env, "CDC_SOURCE_CONN_ID": conn_id}, capture_output=True, text=True, timeout=300)
        assert out.returncode == 1 and f"source {conn_id!r} holds: nothing" in out.stdout, out.stdout + out.stderr
        # verify and resync through the same lookup, each doing its work: verify compares a mirror
        # equal to the source; resync, after a capture whose slot was then lost, records the gap and
        # starts capture anew. An id no store holds stops each at "is not defined".
        table = TableName("public", f"meta_{unique_name}")
        source, data_dir = unique_name, str(tmp_path / "data")
        with psycopg2.connect(pg_uri) as c, c.cursor() as cur:
            cur.execute(f"CREATE TABLE {table.id} (id int PRIMARY KEY, v text)")
            cur.execute(f"INSERT INTO {table.id} SELECT g, 'v' || g FROM generate_series(1, 10) g")
        write_mirror_equal_to_source(pg_uri, table, source, data_dir)
        with get_dialect(ConnectionParams.from_uri(pg_uri), source=source, tables=[table]) as d:
            stage_changelog(d, data_dir)  # the slot exists and capture has staged from it
            d.drop_slot()  # lost, as a promotion the slot did not follow loses it
        scoped = {**env, "CDC_TABLES": table.id, "CDC_DATA_DIR": data_dir}

        def cli(*argv: str, conn: str) -> subprocess.CompletedProcess:
            return subprocess.run(["airflow-cdc", *argv, "--conn-id", conn, "--source", source],
                                  env={**scoped, "CDC_SOURCE_CONN_ID": conn}, capture_output=True, text=True,
                                  timeout=300)

        for argv in (["verify", "--table", table.id], ["resync"]):
            out = cli(*argv, conn=f"nope_{unique_name}")
            assert out.returncode == 2 and "is not defined" in out.stderr, out.stdout + out.stderr
        out = cli("verify", "--table", table.id, conn=conn_id)
        assert out.returncode == 0 and "10 rows checked, 0 mismatched" in out.stdout, out.stdout + out.stderr
        with psycopg2.connect(pg_uri) as c, c.cursor() as cur:
            cur.execute(f"INSERT INTO {table.id} VALUES (11, 'after')")  # the log moves past what was staged
        out = cli("resync", conn=conn_id)
        assert out.returncode == 0 and f"source {source!r}: resynced" in out.stdout, out.stdout + out.stderr
        out = cli("verify", "--table", table.id, conn=conn_id)  # the row written in the gap, found
        assert out.returncode == 1 and "missing from the mirror: 1" in out.stdout, out.stdout + out.stderr
        # snapshot start reads no connection itself (the snapshot DAG's tasks do, through Airflow,
        # which sees the metadata database): it goes on to ask Airflow for the DAG
        # (a DAG of the test's own name, which no deployment knows: nothing is triggered)
        dag = f"cdc_snapshot_{unique_name}"
        out = subprocess.run(["airflow-cdc", "snapshot", "start", "--table", table.id, "--source", conn_id,
                              "--snapshot-dag", dag], env={**scoped, "CDC_SOURCE_CONN_ID": conn_id},
                             capture_output=True, text=True, timeout=300)
        assert "is not defined" not in out.stdout + out.stderr and f"does not know DAG {dag!r}" in out.stderr, (
            out.stdout + out.stderr)
        with pytest.raises(Exception, match="isn't defined"):
            CdcSourceHook(f"nope_{unique_name}").connection_params()
    finally:
        read_metadata_database(False)
        with get_dialect(ConnectionParams.from_uri(pg_uri), source=unique_name) as d:
            for drop in (d.drop_slot, d.drop_publication):  # (none if the test stopped before its capture)
                with contextlib.suppress(Exception):
                    drop()
        with psycopg2.connect(pg_uri) as c, c.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS public.meta_{unique_name}")
        for cid in (conn_id, store_id):
            subprocess.run(["airflow", "connections", "delete", cid], env=env, capture_output=True, timeout=120)
