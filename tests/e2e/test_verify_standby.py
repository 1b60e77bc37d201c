"""verify through a hot standby (the connection extra ``chunk_conn_id``) never reports the
standby's lag as mismatches: it first waits until the standby has replayed past what the mirror
has applied, at most ``max_replica_lag_seconds``, then fails naming the standby (issue 44).

The standby's replay is paused (``pg_wal_replay_pause()``) while the primary changes and the
changelog DAG captures and applies the changes: the mirror is then ahead of the standby. Before
the wait, verify read the paused standby and reported every changed row (110 of them here) as
mismatched, proposing a whole-table repair.

(A MariaDB source read from its replica needs no wait: capture reads that replica's own binlog,
so the mirror never holds a change the replica has not applied.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.sinks.base import read_marker
from tools import workload as w

from ..integration.helpers import _replay_paused
from .conftest import connection_json
from .helpers import CLI, ROWS, Pipeline

pytestmark = pytest.mark.timeout(900)


def _pipeline_through_standby(pg_uri: str, standby_uri: str, name: str, tmp_path, monkeypatch,
                              **extra) -> Pipeline:
    """A PostgreSQL source (watermark strategy "log") whose chunks and verify reads come from the
    hot standby, named by a connection of its own."""
    p = Pipeline(pg_uri, name, tmp_path / "data", monkeypatch)
    standby_id = f"{p.conn_id}_standby"
    monkeypatch.setenv(f"AIRFLOW_CONN_{standby_id.upper()}", connection_json(standby_uri))
    monkeypatch.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}",
                       connection_json(pg_uri, watermark_strategy="log", chunk_conn_id=standby_id, **extra))
    return p


def _verify(p: Pipeline, *args: str) -> subprocess.Popen:
    entry = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "airflow_provider_cdc.cli"]
    return subprocess.Popen([*entry, "verify", "--conn-id", p.conn_id, "--table", p.table.id, "--data-dir",
                             p.data_dir, *args], env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _change_behind_the_standby(p: Pipeline, updates: range, deletes: range) -> None:
    conn = w.connect(p.uri)
    try:
        with conn.cursor() as cur:
            cur.execute(f'UPDATE {w.quote_table(ConnectionParams.from_uri(p.uri), p.table)} SET "amount" = "amount" + 1000, "note" = %s '
                        'WHERE "id" BETWEEN %s AND %s', ("changed", updates.start, updates.stop - 1))
            assert cur.rowcount == len(updates)
            cur.execute(f'DELETE FROM {w.quote_table(ConnectionParams.from_uri(p.uri), p.table)} WHERE "id" BETWEEN %s AND %s',
                        (deletes.start, deletes.stop - 1))
            assert cur.rowcount == len(deletes)
        conn.commit()
    finally:
        conn.close()


def _standby_note(standby_uri: str, p: Pipeline, key: int):
    conn = w.connect(standby_uri)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT "note" FROM {w.quote_table(ConnectionParams.from_uri(standby_uri), p.table)} WHERE "id" = %s', (key,))
            row = cur.fetchone()
        conn.rollback()
    finally:
        conn.close()
    return None if row is None else row[0]


def test_verify_through_a_lagging_standby_waits_and_finds_no_false_mismatch(pg_uri, pg_standby_uri, unique_name,
                                                                           tmp_path, monkeypatch):
    """The issue's case: a snapshot read from the standby, its replay paused, 100 updates and 10
    deletes on the primary, one cdc_changelog run (capture and apply). verify waits until the
    standby has replayed past what the mirror applied (replay resumes 3 s into the verify) and
    reports 0 mismatched, as the same verify through the primary does."""
    p = _pipeline_through_standby(pg_uri, pg_standby_uri, unique_name, tmp_path, monkeypatch,
                                  max_replica_lag_seconds=120)
    w.create_demo_table(pg_uri, p.table, ROWS)
    try:
        p.capture_now()
        p.snapshot()
        assert p.progress().status == "done"
        p.catch_up()
        with _replay_paused(pg_standby_uri):
            _change_behind_the_standby(p, range(1001, 1101), range(2001, 2011))
            before = read_marker(p.data_dir, p.source, "mirror")
            p.run("cdc_changelog")
            after = read_marker(p.data_dir, p.source, "mirror")
            assert after is not None and (before is None or after > before)  # the mirror applied the changes
            assert _standby_note(pg_standby_uri, p, 1001) != "changed"  # ... the standby has not
            assert _standby_note(pg_standby_uri, p, 2001) is not None
            started = time.monotonic()
            verify = _verify(p)
            time.sleep(3)
            assert verify.poll() is None, "verify did not wait for the standby: " + "".join(verify.communicate())
        out, err = verify.communicate(timeout=300)
        waited = time.monotonic() - started
        assert verify.returncode == 0, out + err
        assert f"{ROWS - 10} rows checked, 0 mismatched" in out, out
        assert waited >= 3
        # the same through the primary
        monkeypatch.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}", connection_json(pg_uri, watermark_strategy="log"))
        primary = _verify(p)
        out, err = primary.communicate(timeout=300)
        assert primary.returncode == 0 and f"{ROWS - 10} rows checked, 0 mismatched" in out, out + err
    finally:
        p.cleanup()


def test_verify_through_a_standby_that_stays_behind_fails_naming_it(pg_uri, pg_standby_uri, unique_name, tmp_path,
                                                                    monkeypatch):
    """Replay stays paused: past max_replica_lag_seconds the verify fails (exit 2) naming the
    standby's address and connection extra, how far behind it is, that its replay is paused and
    the setting; it compares nothing (no false mismatch, no repair proposed)."""
    p = _pipeline_through_standby(pg_uri, pg_standby_uri, unique_name, tmp_path, monkeypatch,
                                  max_replica_lag_seconds=2)
    w.create_demo_table(pg_uri, p.table, 50)
    try:
        p.capture_now()
        p.snapshot()  # a mirror to verify (a table never snapshotted is refused before any read)
        p.catch_up()
        with _replay_paused(pg_standby_uri):
            _change_behind_the_standby(p, range(1, 11), range(41, 43))
            p.run("cdc_changelog")
            verify = _verify(p)
            out, err = verify.communicate(timeout=120)
        assert verify.returncode == 2, out + err
        standby = urlsplit(pg_standby_uri)
        assert f"the hot standby chunks are read from ({standby.hostname}:{standby.port}, the connection extra " \
               "chunk_conn_id) has not replayed up to what the mirror has applied" in err, err
        assert re.search(r"[\d,]+ bytes behind it, its replay is paused", err), err
        assert "within max_replica_lag_seconds=2;" in err and "verify again" in err, err
        assert "mismatched" not in out and "to repair" not in out, out
    finally:
        p.cleanup()
