"""``airflow-cdc sources`` (issue 47) on both databases: every source with its slot or binlog
holder, publication, lag and WAL held, including a source that only ever ran a snapshot (its
slot holds WAL though no capture recorded a lag) and one only a Variable names (listed, never
connected to)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc import cli, progress_store
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import FULL_RANGE
from tools import workload as w

from .test_snapshot_invariants import Pipeline


@pytest.fixture(params=["pg", "mysql"])
def source(request, unique_name, tmp_path, monkeypatch):
    """A source whose log holder exists (the first read of its log, as a snapshot's start does),
    with a snapshot recorded and no capture lag: snapshot-only."""
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    pipe = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(uri, pipe.table, 10)
    pipe.capture_now()
    progress_store.publish(pipe.source, pipe.table.id, SnapshotProgress.start(
        pipe.source, "snap1", {pipe.table.id: [FULL_RANGE]}, now=1000.0))
    ghost = f"ghost_{unique_name}"  # a source only a Variable names
    progress_store.publish(ghost, "public.t", SnapshotProgress.start(ghost, "snap1", {"public.t": [FULL_RANGE]},
                                                                     now=1000.0))
    try:
        yield pipe, ghost
    finally:
        progress_store._delete(progress_store.variable_key(ghost, "public.t"))
        pipe.cleanup()


def _sources(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.run(["sources", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sources_lists_a_snapshot_only_source_with_what_its_server_holds(source, capsys):
    pipe, ghost = source
    code, out, err = _sources(capsys, "--json")
    assert code == cli.EXIT_OK, err
    rows = {r["source"]: r for r in json.loads(out)}
    row = rows[pipe.source]
    assert row["known"] and row["conn_id"] == pipe.conn_id
    assert row["snapshot_only"] and row["lag"] is None and row["snapshots"] == {pipe.table.id: "running"}
    assert row["server_error"] is None, row
    assert row["holder_exists"] is True and isinstance(row["held_bytes"], int) and row["held_bytes"] >= 0, row
    with pipe.dialect() as d:
        slot = getattr(d, "slot_name", None)
        if slot is not None:
            assert row["database"] == "postgres" and row["holder"] == f"replication slot {slot!r}", row
            assert row["publication"] == d.publication_name
            limit = d._query("SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'")[0][0]
            assert (row["unbounded"] is not None) == (int(limit) < 0), row  # the retention check's warning
        else:
            assert row["database"] == "mysql" and row["holder"] == f"binlog offset {d._offset_path(pipe.data_dir)}"
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
    progress_store.save_lag(pipe.source, {"source": pipe.source, "holder": row["holder"], "bytes": 123,
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
