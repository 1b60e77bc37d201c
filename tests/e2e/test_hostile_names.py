"""Names are data (I10): tables and columns whose names need quoting in SQL and escaping in
paths go through the real DAGs on both databases like ``orders`` does.

One source per database with three hostile tables (a space, a quote, ``%s``, ``;``, a dot,
non-ASCII, a backtick or a double quote in table, schema and column names, a hostile key
column too), snapshotted in one cdc_snapshot run, then changed and caught up through
cdc_changelog. Each table ends with verify at 0 mismatched, the Delta mirror's live row
count equal to the source's, and its folders named by the one path encoder.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.verify import check_event_log, verify_table
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.sinks.mirror_table import mirror_tables
from airflow_provider_cdc.storage.layout import mirror_dir

from .hostile import COLS, KEY, ROWS, HostileSource, running


def _pg_tables(schema: str) -> list[TableName]:
    return [TableName("public", "Order Items"), TableName("public", "a'b %s; é"), TableName(schema, "t.1 \u00fc")]


def _my_tables(db: str) -> list[TableName]:
    return [TableName(db, "Order Items"), TableName(db, "a'b %s; é"), TableName(db, "back`tick")]


@pytest.fixture(params=["pg", "mysql"])
def hostile(request, unique_name, tmp_path, monkeypatch):
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    if request.param == "pg":
        tables = _pg_tables(f"s.p \"{unique_name}\"")
    else:
        tables = _my_tables(urlsplit(uri).path.lstrip("/"))
        tables = [TableName(t.schema, f"{t.name} {unique_name}") for t in tables]
    # a data folder whose own path has a space and non-ASCII too ('%' is refused: settings)
    p = HostileSource(uri, unique_name, tmp_path / "data dir é", monkeypatch, tables)
    yield from running(p, monkeypatch)


def test_hostile_table_schema_and_column_names_round_trip_through_the_dags(hostile):
    p = hostile
    p.run("cdc_snapshot", {"action": "start", "tables": [t.id for t in p.tables], "chunk_size": 50, "parallelism": 2})
    for t in p.tables:
        prog = airflow_variables.load(p.source, t.id, p.data_dir)
        assert prog is not None and prog.status == "done", (t, prog)
    p.change()
    p.catch_up()

    assert sorted(mirror_tables(p.data_dir, p.source)) == sorted(p.tables)
    with p.dialect() as d:
        for t in p.tables:
            res = verify_table(d, p.data_dir, p.source, t, chunk_rows=1000)
            assert res.ok, f"{t}: {res.summary()}: {[m.describe() for m in res.examples]}"
            live = read_mirror(p.data_dir, p.source, t)
            assert live.num_rows == p.count(t) == ROWS - 7 + 1
            assert KEY in live.column_names and all(c in live.column_names for c in COLS)
            rep = check_event_log(p.data_dir, p.source, t, primary_key=(KEY,))
            assert rep.ok and rep.events >= live.num_rows, rep.summary()
            # the mirror lives where the one encoder says, with no '%' anywhere below data_dir
            assert Path(mirror_dir(p.data_dir, p.source, t), "_delta_log").is_dir()
    below = [str(x.relative_to(p.data_dir)) for x in Path(p.data_dir).rglob("*")]
    assert below and not [x for x in below if "%" in x or " " in x]
