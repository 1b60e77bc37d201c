"""The CLI as a user runs it (subprocess), on real databases, through both entry points: the
``airflow-cdc`` console command and ``airflow cdc`` (the provider's CLI registration).

The mirror is built from the source's rows through the real sink code (a snapshot's
``r`` events), then the source is changed behind the mirror's back: verify must notice.
The pipeline that builds mirrors for real is covered by test_snapshot_invariants.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cdc.dialects import ConnectionParams
from tools import workload as w

from ..integration.helpers import write_mirror_equal_to_source
from .helpers import CLI

AIRFLOW = Path(sys.executable).with_name("airflow")


def command_line(name: str) -> list[str]:
    """The command line that starts the CLI by ``name``: "airflow-cdc" or "airflow cdc"."""
    if name == "airflow cdc":
        return [str(AIRFLOW), "cdc"]
    return [str(CLI)] if CLI.exists() else [sys.executable, "-m", "airflow_provider_cdc.cli"]


def run_cli(entry: list[str], *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*entry, *args], env=env, capture_output=True, text=True, timeout=300, check=False)


#: each database once and each entry point once (pairwise): the entry points differ only in how the
#: command line reaches cli.main, which test_airflow_cdc_parses_what_airflow_cdc_parses holds equal
PAIRS = [("pg", "airflow-cdc"), ("mysql", "airflow cdc")]


@pytest.fixture(params=PAIRS, ids=[f"{db}-{name}" for db, name in PAIRS])
def pair(request):
    return request.param


@pytest.fixture
def uri(request, pair):
    return request.getfixturevalue("pg_uri" if pair[0] == "pg" else "mysql_uri")


@pytest.fixture
def paired_entry(pair) -> list[str]:
    """The entry point paired with the test's database."""
    return command_line(pair[1])


@pytest.fixture
def mirrored(uri, unique_name, tmp_path):
    """A 2,500-row demo table and a mirror equal to it; yields (table, conn_id, data_dir, env)."""
    table = w.default_table(uri, f"cli_{unique_name}")
    w.create_demo_table(uri, table, 2500)
    conn_id = f"cdc_cli_{unique_name}"
    data_dir = str(tmp_path / "data")
    write_mirror_equal_to_source(uri, table, conn_id, data_dir)
    env = dict(os.environ)
    env[f"AIRFLOW_CONN_{conn_id.upper()}"] = uri
    env["CDC_TABLES"] = table.id  # the capture scope: verify reads only its tables (I15)
    yield table, conn_id, data_dir, env
    w.drop_table(uri, table)


def test_verify_equal_mirror_exits_0(mirrored, paired_entry):
    table, conn_id, data_dir, env = mirrored
    r = run_cli(paired_entry, "verify", "--conn-id", conn_id, "--table", table.id, "--data-dir", data_dir, "--chunk-rows", "700", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2500 rows checked, 0 mismatched" in r.stdout
    assert "4 chunks compared, 0 differed" in r.stdout


def test_verify_finds_changes_made_behind_the_mirror(uri, mirrored, paired_entry):
    table, conn_id, data_dir, env = mirrored
    p = ConnectionParams.from_uri(uri)
    t = w.quote_table(p, table)
    conn = w.connect(uri)
    try:
        cur = conn.cursor()
        cur.execute(f"UPDATE {t} SET {w.quote_ident(p, 'amount')} = %s WHERE {w.quote_ident(p, 'id')} = %s", ("0.01", 1700))
        cur.execute(f"DELETE FROM {t} WHERE {w.quote_ident(p, 'id')} = %s", (42,))
        conn.commit()
    finally:
        conn.close()
    r = run_cli(paired_entry, "verify", "--conn-id", conn_id, "--table", table.id, "--data-dir", data_dir, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2500 rows checked, 2 mismatched" in r.stdout
    assert "key [1700]: different (amount:" in r.stdout
    assert "key [42]: in the mirror, not in the source" in r.stdout

    r = run_cli(paired_entry, "verify", "--conn-id", conn_id, "--table", table.id, "--data-dir", data_dir, "--json", env=env)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert (out["rows_checked"], out["mismatched"], out["different"], out["extra"], out["ok"]) == (2500, 2, 1, 1, False)


def test_verify_errors_exit_2_and_say_why(mirrored, paired_entry):
    table, conn_id, data_dir, env = mirrored
    r = run_cli(paired_entry, "verify", "--conn-id", conn_id, "--table", "no_schema_given", "--data-dir", data_dir, env=env)
    assert r.returncode == 2 and "schema.table" in r.stderr
    r = run_cli(paired_entry, "verify", "--conn-id", "cdc_cli_no_such_conn", "--table", table.id, "--data-dir", data_dir, env=env)
    assert r.returncode == 2 and "cdc_cli_no_such_conn" in r.stderr


def test_verify_refuses_a_system_table_and_one_outside_the_scope_before_reading_anything(uri, mirrored, paired_entry,
                                                                                          unique_name):
    """Issue 46: verify went straight to describe_table and full-table reads of any table the
    connection could see (``pg_catalog.pg_authid`` included). Now it asks the one scope check
    first, with the same message the snapshot's plan and export give; nothing is read: with the
    connection pointing at a closed port the answer is still the scope's, so no connection was
    even opened."""
    from airflow_provider_cdc.core.schema import TableName

    table, conn_id, data_dir, env = mirrored
    other = w.default_table(uri, f"cli_other_{unique_name}")  # a real table the role may read, not captured
    w.create_demo_table(uri, other, 10)
    system = TableName("pg_catalog", "pg_authid") if uri.startswith("postgres") else TableName("mysql", "user")
    closed = dict(env)  # the same source, its server unreachable: any read would fail differently
    closed[f"AIRFLOW_CONN_{conn_id.upper()}"] = re.sub(r":\d+/", ":1/", uri, count=1)
    try:
        wants = {system: f"error: table {system} is in system schema {system.schema!r}: the server's catalogs are never "
                         "read by CDC (snapshot, verify, repair, export, the CDC page)",
                 other: f"error: table {other} is not captured by source {conn_id!r}: it is outside the capture scope "
                        f"(CDC_TABLES, or the sources config's 'tables': {table})"}
        for t, want in wants.items():  # the same text the plan and export give (tests/unit/core/test_scope.py)
            for e in (env, closed):
                r = run_cli(paired_entry, "verify", "--conn-id", conn_id, "--table", t.id, "--data-dir", data_dir, env=e)
                assert r.returncode == 2 and want in r.stderr, r.stdout + r.stderr
                assert "rows checked" not in r.stdout
        r = run_cli(paired_entry, "verify", "--conn-id", conn_id, "--table", table.id, "--data-dir", data_dir, env=closed)
        assert r.returncode == 2 and "is not captured" not in r.stderr  # a table of the scope is read (and fails here)
    finally:
        w.drop_table(uri, other)


def test_status_prints_each_tables_progress(unique_name):
    """Every case through ``airflow-cdc``; ``airflow cdc status`` once, which must print the same
    (the entry points differ only in how the command line reaches cli.main: each case through
    both cost a minute of Airflow CLI start-ups and checked nothing more)."""
    from airflow.models.variable import Variable

    from airflow_provider_cdc import airflow_variables
    from airflow_provider_cdc.core.chunk import ChunkResult
    from airflow_provider_cdc.core.progress import SnapshotProgress
    from airflow_provider_cdc.core.ranges import ChunkRange
    from airflow_provider_cdc.status import snapshot_dag_paused

    entry = command_line("airflow-cdc")
    source = f"cdc_cli_{unique_name}"
    ranges = [ChunkRange(None, (500,)), ChunkRange((500,), None)]
    running = SnapshotProgress.start(source, "snap-1", {"public.orders": ranges}, now=1000.0)
    chunk = ChunkResult(source, "public.orders", "snap-1", 0, "lw", "hw", "p", ranges[1], None, (734,), 234, False)
    assert running.record_chunk(chunk, now=1010.0)
    done = SnapshotProgress.start(source, "snap-2", {"public.items": [ChunkRange()]}, now=1000.0)
    done.record_chunk(ChunkResult(source, "public.items", "snap-2", 0, "lw", "hw", "p", ChunkRange(), None, (9,), 10, True))
    done.finish()
    # the status command shows what the tasks publish to the Variables (the authority's copy)
    airflow_variables.publish(source, "public.orders", running)
    airflow_variables.publish(source, "public.items", done)
    airflow_variables.save_lag(source, {"bytes": 123456, "seconds": 7.0, "holder": "replication slot 's'",
                                     "risk": "slot near its limit; capture more often", "at": 1000.0})
    try:
        r = run_cli(entry, "status", "--source", source, env=dict(os.environ))
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stdout.splitlines() if source in ln]
        assert len(lines) == 3, r.stdout
        assert lines[2].split() == [source, "capture", "lag", "123,456", "bytes,", "7", "s", "behind", "the", "log",
                                    "(replication", "slot", "'s'),", "read", "1970-01-01", "00:16:40Z;", "AT", "RISK:",
                                    "slot", "near", "its", "limit;", "capture", "more", "often"], lines[2]
        assert lines[0].startswith(f"{source}:public.items") and "done, ranges done 1/1, 10 rows in 1 chunks" in lines[0]
        # a paused cdc_snapshot DAG (registered in this Airflow's database by an earlier run) is said
        paused = " (DAG cdc_snapshot is paused: no task runs until it is unpaused)" if snapshot_dag_paused() else ""
        assert f"running{paused}, ranges done 0/2, 234 rows in 1 chunks" in lines[1], lines[1]
        assert "continues after start, [734]" in lines[1] and "snapshot snap-1" in lines[1]
        r = run_cli(entry, "status", "--source", source, "--json", env=dict(os.environ))
        items = json.loads(r.stdout)
        through_airflow = run_cli(command_line("airflow cdc"), "status", "--source", source, "--json",
                                  env=dict(os.environ))
        assert through_airflow.returncode == 0, through_airflow.stderr
        assert json.loads(through_airflow.stdout) == items
        assert [(i["table"], i["status"], i["rows"]) for i in items] == [
            ("public.items", "done", 10), ("public.orders", "running", 234)
        ]
        assert items[0]["source_lag"]["bytes"] == 123456 and items[1]["source_lag"]["holder"] == "replication slot 's'"
        # chunks read from a replica: the capture records its lag too, and status says it
        airflow_variables.save_lag(source, {"bytes": 10, "seconds": 0.0, "holder": "replication slot 's'", "risk": None,
                                         "at": 1000.0, "replica": {"bytes": 2048, "seconds": 42.0}})
        r = run_cli(entry, "status", "--source", source, env=dict(os.environ))
        assert "; the replica chunks are read from is 2,048 bytes, 42 s behind its primary" in r.stdout, r.stdout
        airflow_variables.save_lag(source, {"bytes": 10, "seconds": 0.0, "holder": "replication slot 's'", "risk": None,
                                         "at": 1000.0, "replica": {"bytes": 0, "seconds": None}})
        r = run_cli(entry, "status", "--source", source, env=dict(os.environ))
        assert "the replica chunks are read from is not replicating" in r.stdout, r.stdout
        # a source nothing names (a typo) fails, naming the close and the known sources (issue 47)
        r = run_cli(entry, "status", "--source", f"{source}_none", env=dict(os.environ))
        assert r.returncode == 2 and f"source '{source}_none' is not known" in r.stderr, r.stderr
        assert f"did you mean {source!r}" in r.stderr and "Known sources: " in r.stderr
    finally:
        for t in ("public.orders", "public.items"):
            Variable.delete(airflow_variables.variable_key(source, t))
        Variable.delete(airflow_variables.lag_key(source))


def test_airflow_cdc_parses_what_airflow_cdc_parses():
    """Both entry points take the same commands and options, with the same defaults."""
    import argparse

    from airflow_provider_cdc.cli import _parser, get_cli_commands

    (group,) = get_cli_commands()
    assert group.name == "cdc"
    ours = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(c.name for c in group.subcommands) == sorted(ours)
    for command in group.subcommands:
        airflow_side = argparse.ArgumentParser()
        for arg in command.args:
            arg.add_to_parser(airflow_side)
        want = {a.dest: (a.option_strings, a.default, a.required) for a in ours[command.name]._actions if a.dest != "help"}
        got = {a.dest: (a.option_strings, a.default, a.required) for a in airflow_side._actions if a.dest != "help"}
        assert got == want, command.name


@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_status_says_when_the_mirror_has_caught_up_to_a_moment_without_a_watermark(request, db, unique_name,
                                                                                    tmp_path, monkeypatch):
    """Watermark strategy "log" (nothing may be written to the source, so no watermark to wait
    for): read the server's position at a moment, then poll ``status --caught-up-to`` until every
    change committed before it is in the event log and the mirror (README "Status")."""
    from .conftest import connection_json
    from .helpers import Pipeline

    uri = request.getfixturevalue("pg_uri" if db == "pg" else "mysql_uri")
    p = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    monkeypatch.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}", connection_json(uri, watermark_strategy="log"))
    w.create_demo_table(uri, p.table, 100)
    cli = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "airflow_provider_cdc.cli"]

    def status(*args: str) -> subprocess.CompletedProcess:
        return run_cli(cli, "status", "--source", p.source, *args, env=dict(os.environ))

    try:
        p.capture_now()
        params = ConnectionParams.from_uri(uri)
        conn = w.connect(uri)
        try:
            cur = conn.cursor()
            cur.execute(f"UPDATE {w.quote_table(params, p.table)} SET {w.quote_ident(params, 'note')} = 'moved' "
                        f"WHERE {w.quote_ident(params, 'id')} <= 10")
            conn.commit()
            # the moment: the server's log position now (every commit above lies before it)
            cur.execute("SELECT pg_current_wal_lsn()::text" if db == "pg" else "SHOW MASTER STATUS")
            row = cur.fetchone()
            target = row[0] if db == "pg" else f"{row[0]}:{row[1]}"
            conn.commit()
        finally:
            conn.close()

        r = status("--caught-up-to", target)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "not yet: caught up to " in r.stdout and f"before {target} (the changelog is not captured that far " \
               "yet)" in r.stdout, r.stdout
        p.capture_now()  # staged, not applied
        r = status("--caught-up-to", target)
        assert r.returncode == 1 and "staged segment(s) to apply" in r.stdout, r.stdout + r.stderr
        p.run("cdc_changelog")  # capture and apply
        r = status("--caught-up-to", target)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{p.source}: caught up: every change committed before {target} is applied" in r.stdout, r.stdout
        r = status("--caught-up-to", target, "--json")
        doc = json.loads(r.stdout)
        assert (doc["caught_up"], doc["target"]) == (True, target) and doc["position"] >= doc["target_encoded"], doc

        # the same, compared with the server's position now (it reads the source)
        r = status("--live")
        assert r.returncode == 0, r.stderr
        (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith(p.source) and "caught up to" in ln]
        assert "every change committed before it is applied" in line and "; the server is at " in line, line
        assert ("nothing more to apply" in line) or re.search(r"[\d,]+ bytes further", line), line

        other = "binlog.000001:4" if db == "pg" else "0/3000148"
        r = status("--caught-up-to", other)
        assert r.returncode == 2 and ("the source is PostgreSQL" if db == "pg" else "reads a binlog") in r.stderr, \
            r.stdout + r.stderr
    finally:
        p.cleanup()
