"""One table of CDC_TABLES missing on PostgreSQL (a typo, a table not created yet) does not stop
the capture of the others (issue 47): the publication is created or extended with the tables
that exist, a warning names the missing one (and the same name in another case, if the server
has it), and once it exists the next capture adds it. Before, the capture failed for every table
with "PostgreSQL rejected a statement ... ALTER PUBLICATION" (or "given in option 'tables' does
not exist" on the first run)."""

from __future__ import annotations

import logging

import psycopg2

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.capture import run_capture
from tools import workload as w

from .helpers import Handle


def test_a_missing_table_is_named_and_the_others_are_captured(pg_uri, unique_name, tmp_path, caplog):
    present = w.default_table(pg_uri, f"mst_{unique_name}")
    w.create_demo_table(pg_uri, present, 3)
    cased = TableName("public", f"Mst_Late_{unique_name}")  # created later, under another case first
    typo = TableName("public", f"mst_late_{unique_name}")
    handle = Handle(pg_uri, f"mst_{unique_name}", [present, typo], own_watermark_table=False)
    conn = psycopg2.connect(pg_uri)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE TABLE "{cased.name}" (id int PRIMARY KEY)')
        with caplog.at_level(logging.WARNING):
            run_capture(handle, str(tmp_path))  # the first run creates the publication
        said = caplog.text
        assert f"table {typo} of its capture scope (CDC_TABLES) does not exist" in said, said
        assert f"did you mean {cased}?" in said
        with conn.cursor() as cur:
            cur.execute(f'UPDATE "{present.name}" SET name = %s', ("after",))
        result, _lag = run_capture(handle, str(tmp_path))
        assert result.events >= 1  # the existing table's change is captured
        # once it exists, the next capture adds it to the publication and captures it
        with conn.cursor() as cur:
            cur.execute(f'CREATE TABLE "{typo.name}" (id int PRIMARY KEY)')
        run_capture(handle, str(tmp_path))
        with conn.cursor() as cur:
            cur.execute(f'INSERT INTO "{typo.name}" VALUES (1)')
        result, _lag = run_capture(handle, str(tmp_path))
        assert result.events >= 1
        with conn.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
                        (handle.get_dialect().publication_name,))
            assert typo.name in {r[0] for r in cur.fetchall()}
    finally:
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        with conn.cursor() as cur:
            for t in (typo, cased):
                cur.execute(f'DROP TABLE IF EXISTS "{t.name}"')
        conn.close()
        w.drop_table(pg_uri, present)
