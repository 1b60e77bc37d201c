"""Shared e2e fixtures."""

from __future__ import annotations

import json
import time
from urllib.parse import unquote, urlsplit

import psycopg2
import pytest

from airflow_provider_cdc import airflow_variables
from tools import workload as w

from .helpers import ROWS, Pipeline


@pytest.fixture
def strategy() -> str:
    """The source's watermark strategy (connection extra ``watermark_strategy``). A test that
    must hold under both runs with ``@pytest.mark.parametrize("strategy", ["table", "log"])``."""
    return "table"


def connection_json(uri: str, **extra) -> str:
    """An Airflow connection (JSON form) for ``uri`` with ``extra``."""
    p = urlsplit(uri)
    conn = {"conn_type": "postgres" if uri.startswith("postgres") else "mysql", "host": p.hostname, "port": p.port,
            "login": unquote(p.username or ""), "schema": p.path.lstrip("/"), "extra": extra}
    if p.password:
        conn["password"] = unquote(p.password)
    return json.dumps(conn)


#: the servers ``pipeline`` runs on: PostgreSQL 15 and MariaDB for every test; a test of the core
#: promises adds PostgreSQL 16, 17 and 18 (test_snapshot_invariants.WITH_PG16_TO_18)
PIPELINE_SERVERS = {"pg": "pg_uri", "mysql": "mysql_uri", "pg16": "pg16_uri", "pg17": "pg17_uri", "pg18": "pg18_uri"}


@pytest.fixture(params=["pg", "mysql"])
def pipeline(request, strategy, unique_name, tmp_path, monkeypatch):
    """One source and one demo table of ROWS rows, on each database; its changelog exists.
    Under ``strategy`` "log" nothing is written to the source for its watermarks."""
    uri = request.getfixturevalue(PIPELINE_SERVERS[request.param])
    p = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    wm = f"wm_{unique_name}"  # a watermark table of its own, which "log" must never create
    if strategy != "table":
        monkeypatch.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}",
                           connection_json(uri, watermark_strategy=strategy, watermark_table=wm))
    w.create_demo_table(uri, p.table, ROWS)
    p.capture_now()
    yield p
    try:
        if strategy == "log":
            conn = w.connect(uri)
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT table_schema FROM information_schema.tables WHERE table_name = %s", (wm,))
                    assert list(cur.fetchall()) == [], f"watermark strategy 'log' created a watermark table {wm}"
            finally:
                conn.close()
    finally:
        p.cleanup()  # before monkeypatch's undo: it needs the test's connection


@pytest.fixture
def pg_source(pg_uri, unique_name, tmp_path, monkeypatch):
    """A small table, a connection for it (own slot and publication), and clean-up."""
    table, conn_id = f"dags_{unique_name}", f"cdc_e2e_{unique_name}"
    slot = f"cdc_e2e_{unique_name}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "127.0.0.1",
                "port": int(pg_uri.rsplit(":", 1)[1].split("/")[0]),
                "login": "postgres",
                "schema": pg_uri.rsplit("/", 1)[1],
                "extra": {"slot_name": slot, "publication_name": slot},
            }
        ),
    )
    monkeypatch.setenv("CDC_TABLES", f"public.{table}")
    monkeypatch.setenv("CDC_SOURCE_CONN_ID", conn_id)
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CDC_CHANGELOG_SCHEDULE", "none")
    monkeypatch.delenv("CDC_SOURCE", raising=False)
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    cur.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY, v text, amount numeric(12,2), at timestamptz)')
    cur.execute(
        f'INSERT INTO "{table}" SELECT g, md5(g::text), g * 1.25, now() FROM generate_series(1, 3000) g'  # noqa: S608
    )
    yield {"uri": pg_uri, "table": table, "conn_id": conn_id, "data_dir": str(tmp_path / "data")}
    for _ in range(30):  # a slot stays active for a moment after its stream closes
        try:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            )
            break
        except psycopg2.Error:
            time.sleep(0.5)
    from airflow.models.variable import Variable

    Variable.delete(airflow_variables.variable_key(conn_id, f"public.{table}"))
    cur.execute(f'DROP PUBLICATION IF EXISTS "{slot}"')
    cur.execute(f'DROP TABLE IF EXISTS "{table}"')
    admin.close()
