"""The plan step against real PostgreSQL: the snapshot's upper bound is read only after
the changelog exists, so no row can fall between the chunks and the log."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import urlsplit

import psycopg2

from airflow_provider_cdc.dialects.postgres import PostgresDialect
from airflow_provider_cdc.operators.snapshot import SnapshotPlanOperator


def test_a_row_inserted_before_the_changelog_exists_is_below_the_upper_bound(
    pg_uri, unique_name, tmp_path, monkeypatch, variables
):
    table = f"plan_{unique_name}"
    conn_id = f"cdc_plan_{unique_name}"
    p = urlsplit(pg_uri)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        f"postgresql://{p.username}@{p.hostname}:{p.port}{p.path}?watermark_table=wm_{unique_name}",
    )
    monkeypatch.setenv("CDC_TABLES", f"public.{table}")
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    cur.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY, v text)')
    cur.execute(f"INSERT INTO \"{table}\" SELECT g, 'v' || g FROM generate_series(1, 100) g")

    original = PostgresDialect.load_offset
    calls = []

    def insert_just_before_the_slot(self, data_dir):
        # a concurrent writer commits a row above the current max key right before the
        # slot (and so the changelog) starts: it will never be in the log
        if not calls:
            cur.execute(f'INSERT INTO "{table}" VALUES (1000, %s)', ("late",))
        calls.append(data_dir)
        return original(self, data_dir)

    monkeypatch.setattr(PostgresDialect, "load_offset", insert_just_before_the_slot)
    op = SnapshotPlanOperator(task_id="plan", data_dir=str(tmp_path), cdc_conn_id=conn_id)
    try:
        work = op.execute(
            {"dag_run": SimpleNamespace(conf={"action": "start", "tables": [f"public.{table}"]}), "ti": None}
        )
        assert calls, "the plan never created the changelog"
        assert work and all(w["upper_bound"] == [1000] for w in work), work
    finally:
        with op.hook.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        cur.execute(f'DROP TABLE IF EXISTS "{table}"')
        cur.execute(f'DROP TABLE IF EXISTS cdc."wm_{unique_name}"')
        admin.close()
