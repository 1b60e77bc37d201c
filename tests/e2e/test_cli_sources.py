"""What a source holds on its server, seen and cleaned up from the CLI (issue 47): ``status --live``
shows the slot of a source no capture has run for (a snapshot creates it), ``drop-source`` drops
it (PostgreSQL: slot and publication; MariaDB: the stored binlog offset), asking first and
refusing while a capture holds the source's lock; ``status --source <typo>`` fails naming the
known sources. ``snapshot pause|stop`` change the progress as the DAG's conf does."""

from __future__ import annotations

import pytest

from airflow_provider_cdc import airflow_variables, cli
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.pipeline.locks import capture_lock, lock_key
from tools import workload as w

from .helpers import Pipeline


@pytest.fixture(params=["pg", "mysql"])
def source(request, unique_name, tmp_path, monkeypatch):
    """A source whose log holder exists (the first read of its log, as a snapshot's start does)
    and for which no capture task ever recorded a lag."""
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    pipe = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(uri, pipe.table, 10)
    pipe.capture_now()
    yield pipe
    pipe.cleanup()


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.run(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _slot_exists(pipe) -> bool:
    with pipe.dialect() as d:
        return bool(d._query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (d.slot_name,)))


def test_status_of_an_unknown_source_fails_naming_the_known_ones(source, capsys):
    code, _out, err = _cli(capsys, "status", "--source", source.source.upper())
    assert code == cli.EXIT_ERROR
    assert f"source {source.source.upper()!r} is not known" in err and f"did you mean {source.source!r}" in err, err
    code, _out, err = _cli(capsys, "status", "--source", source.source)
    assert code == cli.EXIT_OK, err


def test_status_live_shows_the_slot_of_a_source_no_capture_ran_for_and_drop_source_drops_it(source, capsys):
    with source.dialect() as d:
        held = d.slot_name
        offset_file = None if held else d.offset_path(source.data_dir)
    if held:  # PostgreSQL: the slot holds WAL, and nothing else would say so
        code, out, err = _cli(capsys, "status", "--live")
        line = next((x for x in out.splitlines() if x.startswith(source.source)
                     and "no capture has run" in x), None)
        assert line is not None and f"replication slot {held!r}" in line, out + err
        assert "drop-source --source" in line
    # asked first: nothing dropped without --yes
    code, out, _err = _cli(capsys, "drop-source", "--source", source.source)
    assert code == cli.EXIT_MISMATCH and "--yes" in out
    assert (_slot_exists(source) if held else w_exists(offset_file))
    # refused while a capture holds the source's lock
    with source.dialect() as d, capture_lock(d.params, lock_key(d, source.data_dir)) as got:
        assert got
        code, _out, err = _cli(capsys, "drop-source", "--source", source.source, "--yes")
    assert code == cli.EXIT_ERROR and "a capture holds its capture lock" in err, err
    assert (_slot_exists(source) if held else w_exists(offset_file))
    # refused while one of its snapshots runs (its progress as the DAG's plan publishes it)
    running = SnapshotProgress.start(source.source, "snap1", {source.table.id: [FULL_RANGE]}, now=1000.0)
    airflow_variables.publish(source.source, source.table.id, running)
    code, _out, err = _cli(capsys, "drop-source", "--source", source.source, "--yes")
    assert code == cli.EXIT_ERROR and "running snapshots" in err, err
    airflow_variables._delete(airflow_variables.variable_key(source.source, source.table.id))
    code, out, err = _cli(capsys, "drop-source", "--source", source.source, "--yes")
    assert code == cli.EXIT_OK, err
    assert "its last capture reading forgotten" in out and "watermark table" in out, out
    if held:
        assert f"replication slot {held!r} dropped" in out and not _slot_exists(source)
        assert "airflow-cdc resync" in out  # what capturing it again into the same data dir needs
    else:
        assert "forgotten" in out and not w_exists(offset_file)
    # the lake is kept unless asked: --purge-outputs deletes the source's staging, outputs and registers
    from airflow_provider_cdc.pipeline.capture import stage_changelog
    from airflow_provider_cdc.storage.layout import source_roots

    roots = source_roots(source.data_dir, source.source)
    assert any(w_exists(r) for r in roots), roots
    code, out, err = _cli(capsys, "drop-source", "--source", source.source, "--yes", "--purge-outputs")
    assert code == cli.EXIT_OK, err
    assert not any(w_exists(r) for r in roots) and "starts afresh" in out, out
    with source.dialect() as d:  # and a capture of it starts afresh indeed
        stage_changelog(d, source.data_dir)


def w_exists(path: str) -> bool:
    from airflow_provider_cdc import storage

    return storage.exists(path)


def test_snapshot_pause_and_stop_go_through_the_progress(unique_name, tmp_path, capsys, monkeypatch):
    """``airflow-cdc snapshot pause|stop``: the snapshot's progress (the authority its chunk tasks
    read before each chunk) changes as a pause/stop conf of the DAG changes it."""
    source, table, data_dir = f"cdc_snap_{unique_name}", "public.orders", str(tmp_path / "data")
    monkeypatch.setenv("CDC_SOURCE", source)
    started = SnapshotProgress.start(source, "snap1", {table: [FULL_RANGE]}, now=1000.0)
    airflow_variables.update(source, table, data_dir, lambda _current: started)
    try:
        code, out, err = _cli(capsys, "snapshot", "pause", "--table", table, "--source", source, "--data-dir", data_dir)
        assert code == cli.EXIT_OK and "is paused" in out, err
        assert str(airflow_variables.load(source, table, data_dir).status) == "paused"
        code, out, err = _cli(capsys, "snapshot", "stop", "--table", table, "--source", source, "--data-dir", data_dir)
        assert code == cli.EXIT_OK and str(airflow_variables.load(source, table, data_dir).status) == "stopped", err
    finally:
        airflow_variables._delete(airflow_variables.variable_key(source, table))


def test_verify_of_a_table_never_snapshotted_says_so(source, capsys):
    """No mirror yet: verify says "not snapshotted yet" and how to start one (exit 2), instead of
    reporting every source row as missing from the mirror."""
    code, out, err = _cli(capsys, "verify", "--conn-id", source.conn_id, "--table", source.table.id,
                          "--data-dir", source.data_dir)
    assert code == cli.EXIT_ERROR, out + err
    assert f"table {source.table.id} of source {source.source!r} is not snapshotted yet" in err, err
    assert f"airflow-cdc snapshot start --source {source.source} --table {source.table.id}" in err
