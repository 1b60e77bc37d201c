"""Lag and log retention: a capture says how far behind its source's log it is, and warns
loudly, naming the slot or binlog file and what to do, before the source drops log it has
not read (PostgreSQL ``max_slot_wal_keep_size``, MariaDB binlog expiry).

On the shared PostgreSQL instance a real slot is filled to within a quarter of a small
``max_slot_wal_keep_size`` (set with ALTER SYSTEM for the test, reset after; no checkpoint is
forced, so no slot of another test can be invalidated by it). On an instance of its own, a slot
is filled past the limit and a CHECKPOINT invalidates it: lost, and said so by name.
"""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import RetentionError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams
from airflow_provider_cdc.dialects.base import CaptureResult, LogRetention
from airflow_provider_cdc.operators.capture import check_log_retention
from airflow_provider_cdc.pipeline.capture import capture_lag, run_capture

from .helpers import Handle

pytestmark = pytest.mark.integration

MB = 1024 * 1024


def _xcom(lag) -> dict:
    """The capture task's XCom fields that check_log_retention reads."""
    return {"source": lag.source, "lag_bytes": lag.bytes, "lag_seconds": lag.seconds, "log_holder": lag.holder,
            "retention_risk": lag.risk}


def test_postgres_slot_near_max_slot_wal_keep_size_is_at_risk_until_captured(own_pg, unique_name, tmp_path):
    """On a server of its own (``own_pg``): the shared one's max_slot_wal_keep_size is not changed
    under the tests that run beside this one (`make test` runs two sessions at once)."""
    import psycopg2

    admin = psycopg2.connect(own_pg)
    admin.autocommit = True
    cur = admin.cursor()
    t = TableName("public", f"rt_{unique_name}")
    cur.execute(f'CREATE TABLE "{t.name}" (id int PRIMARY KEY)')
    handle = Handle(own_pg, f"rt_{unique_name}", [t])
    data_dir = str(tmp_path)
    try:
        cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'")
        cur.execute("SELECT pg_reload_conf()")
        first, lag = run_capture(handle, data_dir)  # creates the slot
        assert lag.risk is None and lag.holder.startswith("replication slot 'cdc_") and lag.seconds == 0
        assert lag.warning is None  # a limit is set: nothing to warn about
        for i in range(4):  # ~56 MB of WAL the slot must keep: four segment switches
            cur.execute(f'INSERT INTO "{t.name}" VALUES (%s)', (i,))
            cur.execute("SELECT pg_switch_wal()")
        with handle.get_dialect() as d:
            reading = d.log_retention(first.end_offset)
            slot = d.slot_name
        assert reading.limit_bytes == 64 * MB and reading.lag_bytes > 32 * MB and not reading.lost
        assert reading.safe_bytes == max(0, 64 * MB - reading.lag_bytes) < 16 * MB
        behind = capture_lag(handle.source, reading, first, drained=True)
        assert f"replication slot {slot!r}" in behind.risk and "max_slot_wal_keep_size (64 MB)" in behind.risk
        assert "raise max_slot_wal_keep_size" in behind.risk
        with pytest.raises(RetentionError, match=rf"source 'rt_{unique_name}': replication slot '{slot}' can take"):
            check_log_retention(_xcom(behind))
        # the capture reads the log and confirms the slot to its end: the headroom comes back
        second, lag = run_capture(handle, data_dir)
        assert second.events == 4 and lag.risk is None, lag.describe()
        assert "0 bytes" in check_log_retention(_xcom(lag)) or lag.bytes < 16 * MB
    finally:
        cur.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        cur.execute("SELECT pg_reload_conf()")
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        cur.execute(f'DROP TABLE "{t.name}"')
        cur.execute(f'DROP TABLE IF EXISTS "cdc"."wm_rt_{unique_name}"')
        admin.close()


def test_postgres_default_unbounded_wal_is_a_warning_saying_what_to_set(pg_uri, unique_name, tmp_path):
    """PostgreSQL's default max_slot_wal_keep_size = -1: nothing bounds the WAL a slot holds, so a
    capture that stops lets WAL fill the disk. Not a failed run (risk stays None), but a warning in
    the capture's lag (status, the log_retention task, a metric) naming the slot and what to set.
    Before, the reading said risk: null and nothing else."""
    import psycopg2

    from airflow_provider_cdc.cli import describe_lag

    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    cur.execute("SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'")
    if cur.fetchone()[0] != "-1":
        pytest.skip("this server bounds slot WAL (max_slot_wal_keep_size is set)")
    t = TableName("public", f"rtu_{unique_name}")
    cur.execute(f'CREATE TABLE "{t.name}" (id int PRIMARY KEY)')
    handle = Handle(pg_uri, f"rtu_{unique_name}", [t])
    try:
        _result, lag = run_capture(handle, str(tmp_path))
        with handle.get_dialect() as d:
            slot = d.slot_name
        assert lag.risk is None
        assert f"nothing bounds the WAL replication slot {slot!r} holds (max_slot_wal_keep_size = -1" in lag.warning
        assert "can fill its disk" in lag.warning and "ALTER SYSTEM SET max_slot_wal_keep_size" in lag.warning
        record = lag.record(0.0)
        assert record["warning"] == lag.warning and record["risk"] is None
        assert "WARNING: nothing bounds the WAL" in describe_lag(record)
        said = check_log_retention({**_xcom(lag), "retention_warning": lag.warning})  # does not fail the run
        assert "WARNING: nothing bounds the WAL" in said
    finally:
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        cur.execute(f'DROP TABLE "{t.name}"')
        cur.execute(f'DROP TABLE IF EXISTS "cdc"."wm_rtu_{unique_name}"')
        admin.close()


def test_mariadb_lag_in_bytes_and_the_binlog_expiry(mysql_uri, unique_name, tmp_path):
    import pymysql

    from airflow_provider_cdc.dialects.mysql import BinlogOffset

    p = ConnectionParams.from_uri(mysql_uri)
    db = p.database
    conn = pymysql.connect(host=p.host, port=p.port, user=p.user, password=p.password or "", database=db,
                           autocommit=True)
    t = TableName(db, f"rt_{unique_name}")
    with conn.cursor() as c:
        c.execute(f"CREATE TABLE `{t.name}` (id int PRIMARY KEY, pad varchar(200))")
        c.execute("SELECT @@binlog_expire_logs_seconds")
        expire = float(c.fetchone()[0] or 0)
    handle = Handle(mysql_uri, f"rt_{unique_name}", [t])
    data_dir = str(tmp_path)
    try:
        first, lag = run_capture(handle, data_dir)
        assert lag.risk is None and lag.holder == f"binlog file {BinlogOffset.from_json(first.end_offset).file!r}"
        with conn.cursor() as c:
            c.executemany(f"INSERT INTO `{t.name}` VALUES (%s, %s)", [(i, "x" * 200) for i in range(200)])
        with handle.get_dialect() as d:
            reading = d.log_retention(first.end_offset)
        assert reading.lag_bytes > 200 * 200 and not reading.lost
        assert reading.limit_seconds == (expire or None) and reading.setting == "binlog_expire_logs_seconds"
        second, lag = run_capture(handle, data_dir)
        assert second.events == 200 and lag.bytes < reading.lag_bytes and lag.risk is None
        # a binlog file the server no longer has: lost, whatever the limits
        gone = BinlogOffset.of("no-such-bin.000001", 4).to_json()
        with handle.get_dialect() as d:
            assert d.log_retention(gone).lost
    finally:
        with conn.cursor() as c:
            c.execute(f"DROP TABLE `{t.name}`")
        conn.close()


def _result(newest_ts_ms: int | None) -> CaptureResult:
    return CaptureResult(10, 0, "seg", "a", "b", 1.0, ("seg",), newest_ts_ms)


@pytest.mark.parametrize(
    ("reading", "drained", "risk"),
    [
        (LogRetention("binlog file 'b.000007'", 10, limit_seconds=3600.0, setting="binlog_expire_logs_seconds",
                      fix="raise it"), False,
         r"3,000 s behind and the server purges binlog files older than 3,600 s \(binlog_expire_logs_seconds\); "
         r"binlog file 'b.000007' holds the next change; raise it"),
        (LogRetention("binlog file 'b.000007'", 10, limit_seconds=3600.0, setting="s"), True, None),  # read to the end
        (LogRetention("binlog file 'b.000007'", 10, limit_seconds=7200.0, setting="s"), False, None),
        (LogRetention("replication slot 's'", 10, limit_bytes=100 * MB, safe_bytes=20 * MB, setting="max_slot_wal_keep_size"),
         True, r"replication slot 's' can take 20 MB more WAL before max_slot_wal_keep_size \(100 MB\)"),
        (LogRetention("replication slot 's'", 10, limit_bytes=100 * MB, safe_bytes=30 * MB, setting="m"), True, None),
        (LogRetention("replication slot 's'", 10, setting="m"), True, None),  # no limit
        (LogRetention("replication slot 's'", 10, lost=True, setting="max_slot_wal_keep_size", fix="re-snapshot"),
         True, r"replication slot 's' is lost: the source already dropped log the capture needs "
               r"\(max_slot_wal_keep_size\); re-snapshot"),
    ],
)
def test_the_retention_policy(reading, drained, risk):
    """At risk: the log is lost, less than a quarter of a size limit is left, or the capture is
    behind by more than three quarters of an age limit (its lag bounds the file's age)."""
    now = 10_000_000
    lag = capture_lag("src", reading, _result(now - 3_000_000), drained=drained, now_ms=now)
    assert lag.seconds == (0.0 if drained else 3000.0)
    if risk is None:
        assert lag.risk is None
        assert check_log_retention(_xcom(lag)).startswith("source 'src': 10 bytes and")
    else:
        import re

        assert re.search(risk, lag.risk), lag.risk
        with pytest.raises(RetentionError, match="source 'src'"):
            check_log_retention(_xcom(lag))
    assert check_log_retention(None).startswith("no lag reading")


@pytest.fixture
def own_pg(tmp_path):
    """A PostgreSQL instance of this test alone (scripts/services.sh in a temporary folder, on a
    free port): filling a slot past max_slot_wal_keep_size needs a CHECKPOINT, which would
    invalidate every lagging slot of the shared instance too."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CDC_LOCAL_DIR": str(tmp_path / "local"), "CDC_PG_PORT": str(port)}
    started = subprocess.run([str(root / "scripts" / "services.sh"), "start-pg"], env=env, capture_output=True,
                             text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/cdc_test"
    finally:
        subprocess.run([str(root / "scripts" / "services.sh"), "stop"], env=env, capture_output=True, timeout=120)
        pg = tmp_path / "local" / "pg"
        if pg.is_symlink():  # as root the files live where the postgres user may enter (/var/tmp)
            import shutil

            shutil.rmtree(pg.resolve(), ignore_errors=True)


def test_postgres_slot_filled_past_max_slot_wal_keep_size_is_lost_and_said_so(own_pg, tmp_path):
    """Past the limit a checkpoint invalidates the slot: the lag reading says it is lost, the
    retention check fails naming the slot and the re-snapshot it needs, and the capture itself
    refuses to go on (the changes in between are gone) with the same advice."""
    import psycopg2

    from airflow_provider_cdc.core.errors import CdcError

    admin = psycopg2.connect(own_pg)
    admin.autocommit = True
    cur = admin.cursor()
    t = TableName("public", "lost_slot")
    cur.execute(f'CREATE TABLE "{t.name}" (id int PRIMARY KEY)')
    cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '32MB'")
    cur.execute("SELECT pg_reload_conf()")
    handle = Handle(own_pg, "lost", [t])
    first, lag = run_capture(handle, str(tmp_path))  # creates the slot
    assert lag.risk is None
    for i in range(5):  # ~80 MB of WAL past the slot: more than it may keep
        cur.execute(f'INSERT INTO "{t.name}" VALUES (%s)', (i,))
        cur.execute("SELECT pg_switch_wal()")
    cur.execute("CHECKPOINT")
    with handle.get_dialect() as d:
        slot = d.slot_name
        cur.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        assert cur.fetchone()[0] == "lost"
        reading = d.log_retention(first.end_offset)
    assert reading.lost
    behind = capture_lag(handle.source, reading, first, drained=False)
    with pytest.raises(RetentionError, match=rf"replication slot '{slot}'.*a slot already lost needs airflow-cdc resync"):
        check_log_retention(_xcom(behind))
    with pytest.raises(CdcError, match=rf"replication slot '{slot}' was invalidated \(the WAL it needed was removed.*airflow-cdc resync"):
        run_capture(handle, str(tmp_path))
    admin.close()
