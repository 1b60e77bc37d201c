"""Shared e2e fixtures."""

from __future__ import annotations

import json
from urllib.parse import unquote, urlsplit

import pytest

from tools import workload as w

from .test_snapshot_invariants import ROWS, Pipeline


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
#: promises adds PostgreSQL 18 (test_snapshot_invariants.WITH_PG18)
PIPELINE_SERVERS = {"pg": "pg_uri", "mysql": "mysql_uri", "pg18": "pg18_uri"}


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
