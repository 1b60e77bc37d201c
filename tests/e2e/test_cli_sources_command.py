"""``airflow-cdc sources`` (issue 47) on both databases: every source with its slot or binlog
holder, publication, lag and WAL held, including a source that only ever ran a snapshot (its
slot holds WAL though no capture recorded a lag) and one only a Variable names (listed, never
connected to)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from airflow_provider_cdc import airflow_variables, cli
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.dialects.base import ConnectionParams
from tools import workload as w

from .helpers import Pipeline


@pytest.fixture(params=["pg", "mysql"])
def source(request, unique_name, tmp_path, monkeypatch):
    """A source whose log holder exists (the first read of its log, as a snapshot's start does),
    with a snapshot recorded and no capture lag: snapshot-only."""
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    pipe = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(uri, pipe.table, 10)
    pipe.capture_now()
    airflow_variables.publish(pipe.source, pipe.table.id, SnapshotProgress.start(
        pipe.source, "snap1", {pipe.table.id: [FULL_RANGE]}, now=1000.0))
    ghost = f"ghost_{unique_name}"  # a source only a Variable names
    airflow_variables.publish(ghost, "public.t", SnapshotProgress.start(ghost, "snap1", {"public.t": [FULL_RANGE]},
                                                                     now=1000.0))
    try:
        yield pipe, ghost
    finally:
        airflow_variables._delete(airflow_variables.variable_key(ghost, "public.t"))
        pipe.cleanup()


def _sources(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.run(["sources", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sources_lists_a_snapshot_only_source_with_what_its_server_holds(source, capsys):
    pipe, ghost = source
    # changes after the slot / offset: the log it holds grows (held_bytes > 0)
    conn = w.connect(pipe.uri)
    try:
        conn.cursor().execute(f"DELETE FROM {w.quote_table(ConnectionParams.from_uri(pipe.uri), pipe.table)}")
        conn.commit()
    finally:
        conn.close()
    code, out, err = _sources(capsys, "--json")
    assert code == cli.EXIT_OK, err
    rows = {r["source"]: r for r in json.loads(out)}
    row = rows[pipe.source]
    assert row["known"] and row["conn_id"] == pipe.conn_id
    assert row["snapshot_only"] and row["lag"] is None and row["snapshots"] == {pipe.table.id: "running"}
    assert row["server_error"] is None, row
    assert row["holder_exists"] is True and isinstance(row["held_bytes"], int) and row["held_bytes"] > 0, row
    with pipe.dialect() as d:
        slot = d.slot_name
        if slot is not None:
            assert row["database"] == "postgres" and row["holder"] == f"replication slot {slot!r}", row
            assert row["publication"] == d.publication_name
            limit = d._query("SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'")[0][0]
            assert (row["unbounded"] is not None) == (int(limit) < 0), row  # the retention check's warning
        else:
            assert row["database"] == "mysql" and row["holder"] == f"binlog offset {d.offset_path(pipe.data_dir)}"
            assert row["publication"] is None
    # a source only a Variable names is listed, never asked (I15)
    g = rows[ghost]
    assert not g["known"] and g["database"] is None and g["server_error"] is None and "not asked" in g["note"]
    # the text form: one line per source, the snapshot-only one says so and how to clean up
    code, out, _err = _sources(capsys)
    line = next(x for x in out.splitlines() if x.startswith(pipe.source + " "))
    assert "snapshot only: no capture has run" in line and f"drop-source --source {pipe.source}" in line, line
    assert row["holder"] in line
    # once a capture recorded its lag the source is no longer snapshot-only
    airflow_variables.save_lag(pipe.source, {"source": pipe.source, "holder": row["holder"], "bytes": 123,
                                          "seconds": 4.0, "at": 1000.0})
    code, out, _err = _sources(capsys)
    line = next(x for x in out.splitlines() if x.startswith(pipe.source + " "))
    assert "snapshot only" not in line and "capture lag 123 bytes, 4 s" in line, line


def test_sources_offline_asks_no_server(source, capsys, monkeypatch):
    pipe, _ghost = source
    # a connection that cannot be reached: --offline must not try it
    key = f"AIRFLOW_CONN_{pipe.conn_id.upper()}"
    monkeypatch.setenv(key, "postgresql://nobody@127.0.0.1:9/none")
    try:
        code, out, err = _sources(capsys, "--json", "--offline")
        assert code == cli.EXIT_OK, err
        row = {r["source"]: r for r in json.loads(out)}[pipe.source]
        assert row["database"] is None and row["server_error"] is None and row["snapshot_only"], row
        code, out, _err = _sources(capsys, "--json")
        assert code == cli.EXIT_OK
        row = {r["source"]: r for r in json.loads(out)}[pipe.source]
        assert row["server_error"] is not None, row  # asked, and said on its row: not a failed listing
    finally:
        monkeypatch.setenv(key, pipe.uri)  # the cleanup drops the slot through it


@pytest.fixture
def config_sources(pg_uri, mysql_uri, unique_name, tmp_path, monkeypatch):
    """A sources config with one PostgreSQL and one MariaDB source nothing ran for yet: the
    PostgreSQL table has a primary key, the MariaDB one has none."""
    import yaml

    from .conftest import connection_json

    pg_table, my_db = f"public.doc_{unique_name}", urlsplit(mysql_uri).path.lstrip("/")
    my_table = f"{my_db}.doc_{unique_name}"
    w_pg = w.connect(pg_uri)
    w_pg.autocommit = True
    w_pg.cursor().execute(f"CREATE TABLE {pg_table} (id int PRIMARY KEY)")
    w_my = w.connect(mysql_uri)
    w_my.autocommit(True)
    w_my.cursor().execute(f"CREATE TABLE `{my_db}`.`doc_{unique_name}` (id INT, v TEXT)")
    names = {"pg": f"docpg_{unique_name}", "my": f"docmy_{unique_name}"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{names['pg'].upper()}", connection_json(pg_uri))
    monkeypatch.setenv(f"AIRFLOW_CONN_{names['my'].upper()}", connection_json(mysql_uri))
    config = tmp_path / "cdc_sources.yaml"
    config.write_text(yaml.safe_dump({"sources": {
        names["pg"]: {"conn_id": names["pg"], "tables": [pg_table], "data_dir": str(tmp_path / "pg")},
        names["my"]: {"conn_id": names["my"], "tables": [my_table], "data_dir": str(tmp_path / "my")}}}))
    monkeypatch.setenv("CDC_SOURCES_FILE", str(config))
    try:
        yield names, pg_table, my_table
    finally:
        w_pg.cursor().execute(f"DROP TABLE IF EXISTS {pg_table}")
        w_my.cursor().execute(f"DROP TABLE IF EXISTS `{my_db}`.`doc_{unique_name}`")
        w_pg.close()
        w_my.close()


def test_sources_and_doctor_of_sources_config_entries_nothing_ran_for(config_sources, capsys):
    names, pg_table, my_table = config_sources
    code, out, err = _sources(capsys, "--json")
    assert code == cli.EXIT_OK, err
    rows = {r["source"]: r for r in json.loads(out)}
    pg, my = rows[names["pg"]], rows[names["my"]]
    assert pg["known"] and pg["database"] == "postgres" and pg["holder_exists"] is False, pg
    assert pg["holder"] == f"replication slot 'cdc_{names['pg']}'" and pg["publication_exists"] is False, pg
    assert my["known"] and my["database"] == "mysql" and my["holder_exists"] is False, my
    assert not pg["snapshot_only"] and not my["snapshot_only"]
    code, out, _err = _sources(capsys)
    line = next(x for x in out.splitlines() if x.startswith(names["pg"] + " "))
    assert "(not created yet)" in line and "no capture has run" in line, line
    # doctor --source: the entry's connection and scope
    code = cli.run(["doctor", "--source", names["pg"]])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_OK, out + err
    assert f"doctor: source {names['pg']!r}, connection {names['pg']!r}" in out
    code = cli.run(["doctor", "--source", names["my"]])
    out = capsys.readouterr().out
    assert code == cli.EXIT_MISMATCH
    assert any(x.startswith(f"ERROR   table {my_table}:") and "no primary key" in x for x in out.splitlines()), out
    # nothing was created by either command
    code, out, _err = _sources(capsys, "--json")
    rows = {r["source"]: r for r in json.loads(out)}
    assert rows[names["pg"]]["holder_exists"] is False and rows[names["pg"]]["publication_exists"] is False
