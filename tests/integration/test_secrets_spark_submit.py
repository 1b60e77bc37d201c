"""A spark-submit by the package's operator with the 'postgres' sink (CDC_POSTGRES_SINK_CONN_ID)
and object storage behind an Airflow connection (CDC_STORAGE_CONN_ID, a real S3 HTTP server):
neither password ever appears on a command line (``/proc/*/cmdline``, what ``ps`` shows,
sampled while the job runs), in any process environment of the job, in the task's log, in a
file under the data location or in the worker's ``os.environ``; the credentials files are
gone when the job ends; and the PostgreSQL mirror equals the Delta mirror (issue 31)."""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.hooks.cdc_storage import storage_environment
from airflow_provider_cdc.operators.spark_jobs import ChangelogApplyOperator, postgres_sink_params
from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.sinks.postgres_target import passfile_line

from .staged_scenario import ITEMS_SCHEMA, OTHER_SCHEMA, SOURCE, build_scenario

pytestmark = pytest.mark.integration


class ProcessWatcher(threading.Thread):
    """Reads every process's command line (what ``ps -eo args`` prints) every 50 ms, and the
    environment of the job's own processes, until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.cmdlines: set[str] = set()
        self.environs: list[bytes] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.cmdlines.add(cmd)
                    if "apply_job.py" in cmd or "pyspark" in cmd:
                        self.environs.append((d / "environ").read_bytes())
                except OSError:
                    continue
            self.stop.wait(0.05)


@pytest.fixture
def secrets(s3_server, pg_uri, monkeypatch, unique_name):
    """Two Airflow connections with passwords of their own (the test server trusts any
    PostgreSQL password and S3 key: what is checked is where the passwords go)."""
    for k in storage.STORAGE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    pg_password, s3_secret = f"pg-pw-{uuid.uuid4().hex}", f"s3-sk-{uuid.uuid4().hex}"
    u = urlsplit(pg_uri)
    monkeypatch.setenv("AIRFLOW_CONN_CDC_SECRET_PG", json.dumps({
        "conn_type": "postgres", "host": u.hostname, "port": u.port, "schema": u.path.lstrip("/"),
        "login": u.username or "postgres", "password": pg_password}))
    monkeypatch.setenv("AIRFLOW_CONN_CDC_SECRET_S3", json.dumps({
        "conn_type": "aws", "login": "secret-test-key", "password": s3_secret,
        "extra": {"endpoint_url": s3_server["endpoint"], "region_name": "us-east-1"}}))
    target = f"mirror_secret_{unique_name}"
    monkeypatch.setenv("CDC_STORAGE_CONN_ID", "cdc_secret_s3")
    monkeypatch.setenv("CDC_POSTGRES_SINK_CONN_ID", "cdc_secret_pg")
    monkeypatch.setenv("CDC_POSTGRES_SINK_SCHEMA", target)
    yield {"pg": pg_password, "s3": s3_secret, "target": target}
    storage.use_settings(None)
    with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
    conn.close()


def test_libpq_reads_the_password_from_the_passfile_the_operator_writes(tmp_path, pg_uri):
    """The passfile handed to a spark-submit is read by libpq (escaped ':' and '\\' included)."""
    password = "p:w\\d-" + uuid.uuid4().hex
    passfile = tmp_path / "pgpass"
    passfile.write_text(passfile_line(password))
    passfile.chmod(0o600)
    conn = psycopg2.connect(pg_uri, passfile=str(passfile))
    try:
        assert conn.info.password == password
    finally:
        conn.close()


def test_a_spark_submit_never_shows_a_password(secrets, s3_server, tmp_path, pg_uri, capfd, caplog):
    data_dir = f"s3://{s3_server['bucket']}/secrets-{tmp_path.name}"
    with storage.scoped_settings(storage_environment("cdc_secret_s3")):
        st = build_scenario(data_dir)
    op = ChangelogApplyOperator(task_id="apply", conn_id="spark_default", data_dir=data_dir, source=SOURCE,
                                sinks="events,mirror,postgres", local_max_rows=0,
                                conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    caplog.set_level(logging.DEBUG)
    watcher = ProcessWatcher()
    watcher.start()
    try:
        op.pre_execute({})
        summary = op.execute({})
    finally:
        watcher.stop.set()
        watcher.join(10)
    out = capfd.readouterr()  # the task's log: structlog and the hook's spark-submit lines, at the fd level
    logs = [out.out, out.err, caplog.text]
    assert summary["engine"] == "spark"

    jobs = [c for c in watcher.cmdlines if "apply_job.py" in c]
    assert jobs, "the watcher never saw the spark-submit"
    assert any("--storage-credentials" in c and "passfile=" in c for c in jobs), jobs
    assert any("Spark-Submit cmd" in text for text in logs), "the task log was not captured"
    for secret in (secrets["pg"], secrets["s3"]):
        assert not [c for c in watcher.cmdlines if secret in c], "a password was on a command line"
        # (the test defines its Airflow connections as AIRFLOW_CONN_* variables, which every child inherits)
        assert not [v for e in watcher.environs for v in e.split(b"\0")
                    if secret.encode() in v and not v.startswith(b"AIRFLOW_CONN_")], "a password was in a job's environment"
        assert not [text for text in logs if secret in text], "a password was in the task log"
        assert not [k for k, v in os.environ.items() if secret in v and not k.startswith("AIRFLOW_CONN_")], \
            "a password was exported to the worker's environment"
    # the private folder of the credentials files went with the job
    folders = {a.rsplit("/", 1)[0] for c in jobs for a in c.split() if a.endswith("/storage.json")}
    assert folders and not any(os.path.exists(f) for f in folders)

    # no file under the data location holds a password
    with storage.scoped_settings(storage_environment("cdc_secret_s3")):
        import pyarrow.fs as pafs

        fs, base = storage.filesystem(data_dir)
        files = [i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True)) if i.type == pafs.FileType.File]
        assert files
        for f in files:
            with fs.open_input_stream(f) as stream:
                blob = stream.read()
            assert secrets["pg"].encode() not in blob and secrets["s3"].encode() not in blob, f

        # the PostgreSQL mirror holds what the Delta mirror holds
        sink = MirrorPostgresSink(postgres_sink_params("cdc_secret_pg"), data_dir, SOURCE, target_schema=secrets["target"])
        try:
            for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
                pg_rows = sink.read(schema.table)
                delta = read_mirror(st.data_dir, SOURCE, schema.table, with_meta=True).to_pylist()
                assert pg_rows and [(r["__key"], r["__position"]) for r in pg_rows] == [
                    (r["__key"], r["__position"]) for r in delta]
        finally:
            sink.close()
