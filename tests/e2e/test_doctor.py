"""``airflow-cdc doctor`` on real servers (issue 47): a PostgreSQL server with wal_level=replica, a
role missing a grant and a keyless table -> one report naming all three, exit 1, and nothing
created on the source; a MariaDB with binlog_format=STATEMENT, a user missing a grant and a keyless
table -> the same; a healthy least-privilege source (docs/connections.md "Grants", set-up 2) -> exit 0.

The broken servers are private throwaway instances (the shared test servers' globals are never
changed); the healthy sources use the shared servers with a role of their own."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from airflow_provider_cdc import cli
from tests import mariadb_cluster, pg_cluster
from tools import workload as w

from ..integration.helpers import my_run, my_setup, pg_run, pg_setup2_admin
from .conftest import connection_json

pytestmark = pytest.mark.timeout(300)


def _doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.run(["doctor", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _lines(out: str, severity: str, check: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith(severity.upper()) and f" {check}:" in x]


# --- PostgreSQL ----------------------------------------------------------------------------------
@pytest.fixture
def pg_replica_level():
    """A private PostgreSQL 15 with wal_level=replica on a free port (initdb), removed after."""
    bin_dir = pg_cluster.pg_bin(15)
    if bin_dir is None:
        pytest.skip("no PostgreSQL 15 server binaries")
    root = Path(tempfile.mkdtemp(prefix="cdc-doctor-pg-", dir="/var/tmp"))
    root.chmod(0o755)
    if os.getuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    srv = pg_cluster.Server(bin_dir, root / "data", pg_cluster._free_port())
    try:
        pg_cluster._as_pg([str(bin_dir / "initdb"), "-D", str(srv.data), "-U", "postgres", "--auth=trust", "-E",
                           "UTF8", "--locale=C.UTF-8"])
        pg_cluster._append(srv.data / "postgresql.conf", [
            "listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{root}'", "wal_level = replica",
            "fsync = off", "max_slot_wal_keep_size = -1"])
        srv.start()
        srv.sql("CREATE DATABASE cdc_test", database="postgres")
        yield srv
    finally:
        try:
            srv.ctl("-m", "immediate", "-w", "stop")
        except Exception:  # noqa: BLE001 - it did not start
            pass
        shutil.rmtree(root, ignore_errors=True)


def test_doctor_postgres_names_wal_level_a_missing_grant_and_a_keyless_table(pg_replica_level, capsys, monkeypatch):
    srv = pg_replica_level
    srv.sql("CREATE TABLE public.keyed (id int PRIMARY KEY, v text)")
    srv.sql("CREATE TABLE public.keyless (id int, v text)")
    # a role with the replication attribute and its schema, but no SELECT on the keyed table
    for sql in ("CREATE ROLE doc_role LOGIN REPLICATION", "GRANT USAGE ON SCHEMA public TO doc_role",
                "GRANT SELECT ON public.keyless TO doc_role"):
        srv.sql(sql)
    uri = srv.uri.replace("//postgres@", "//doc_role@")
    monkeypatch.setenv("AIRFLOW_CONN_DOC_PG_BROKEN", connection_json(uri))
    code, out, err = _doctor(capsys, "--conn-id", "doc_pg_broken", "--table", "public.keyed", "--table",
                             "public.keyless")
    assert code == cli.EXIT_MISMATCH, out + err
    wal = _lines(out, "error", "wal_level")
    assert wal and "'replica'" in wal[0] and "wal_level = logical" in wal[0], out
    assert any("GRANT SELECT ON public.keyed TO doc_role" in x.replace('"', "") for x in _lines(out, "error", "grants")), out
    keyless = _lines(out, "error", "table public.keyless")
    assert keyless and "no primary key" in keyless[0] and "ADD PRIMARY KEY" in keyless[0], out
    assert not _lines(out, "error", "table public.keyed"), out  # the keyed table's only fault is the grant
    assert _lines(out, "warning", "max_slot_wal_keep_size"), out
    assert out.rstrip().splitlines()[-1].startswith("source 'doc_pg_broken': ") and "error(s)" in out
    # read-only: nothing was created on the source
    assert srv.sql("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert srv.sql("SELECT count(*) FROM pg_publication") == [(0,)]
    assert srv.sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'cdc'") == [(0,)]
    # the same findings as JSON
    code, out, _err = _doctor(capsys, "--conn-id", "doc_pg_broken", "--table", "public.keyed", "--table",
                              "public.keyless", "--json")
    doc = json.loads(out)
    assert code == cli.EXIT_MISMATCH and doc["ok"] is False and doc["conn_id"] == "doc_pg_broken"
    assert {"wal_level", "grants", "table public.keyless"} <= {f["check"] for f in doc["findings"]
                                                              if f["severity"] == "error"}


@pytest.fixture
def pg_least_privilege(pg_uri, unique_name, monkeypatch):
    """Set-up 2 of docs/connections.md "Grants" on the shared server: an administrator created watermark
    table and publication; the role may read its table, write the watermark row, replicate."""
    role, pub, wm = f"cdc_doc_{unique_name}", f"cdc_doc_{unique_name}", f"cdc.wm_doc_{unique_name}"
    table = f"public.doc_{unique_name}"
    pg_run(pg_uri, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)", *pg_setup2_admin(role, [table], wm, pub))
    p = urlsplit(pg_uri)
    conn = {"conn_type": "postgres", "host": p.hostname, "port": p.port, "login": role, "schema": p.path.lstrip("/"),
            "extra": {"slot_name": pub, "publication_name": pub, "watermark_schema": "cdc",
                      "watermark_table": wm.split(".")[1]}}
    conn_id = f"doc_pg_{unique_name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    monkeypatch.setenv("CDC_TABLES", table)
    monkeypatch.setenv("CDC_SOURCE_CONN_ID", conn_id)
    monkeypatch.delenv("CDC_SOURCE", raising=False)
    try:
        yield conn_id, role, table, pub
    finally:
        pg_run(pg_uri, f"DROP PUBLICATION IF EXISTS {pub}", f"DROP TABLE IF EXISTS {table}, {wm}",
               f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def test_doctor_postgres_healthy_least_privilege_source_passes(pg_least_privilege, pg_uri, capsys):
    conn_id, role, table, pub = pg_least_privilege
    code, out, err = _doctor(capsys, "--verbose")  # the environment's source and scope (CDC_TABLES)
    assert code == cli.EXIT_OK, out + err
    assert not [x for x in out.splitlines() if x.startswith("ERROR")], out
    assert _lines(out, "ok", "wal_level") and _lines(out, "ok", "grants") and _lines(out, "ok", f"table {table}")
    assert "ready for CDC" in out.splitlines()[-1]
    assert pg_run(pg_uri, f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{pub}'") == [(0,)]
    # the same role without its table's SELECT: the grant is named, exit 1
    pg_run(pg_uri, f"REVOKE SELECT ON {table} FROM {role}")
    code, out, _err = _doctor(capsys, "--conn-id", conn_id)
    assert code == cli.EXIT_MISMATCH
    assert any(f"GRANT SELECT ON {table} TO {role}" in x.replace('"', "") for x in _lines(out, "error", "grants")), out


def test_doctor_names_an_unknown_connection_and_an_unknown_source(capsys, monkeypatch):
    code, out, _err = _doctor(capsys, "--conn-id", "doc_no_such_conn", "--table", "public.t")
    assert code == cli.EXIT_MISMATCH
    line = _lines(out, "error", "connection")
    assert line and "'doc_no_such_conn' is not defined" in line[0], out
    # a server that is not there: one error naming the connection, on one line
    monkeypatch.setenv("AIRFLOW_CONN_DOC_DOWN", f"postgresql://postgres@127.0.0.1:{pg_cluster._free_port()}/cdc_test")
    code, out, _err = _doctor(capsys, "--conn-id", "doc_down", "--table", "public.t")
    assert code == cli.EXIT_MISMATCH
    line = _lines(out, "error", "connection")
    assert len(line) == 1 and "cannot connect" in line[0] and "connection 'doc_down'" in line[0], out
    assert len(out.strip().splitlines()) == 3, out  # header, the finding, the summary
    code, _out, err = _doctor(capsys, "--source", "doc_no_such_source")
    assert code == cli.EXIT_ERROR and "'doc_no_such_source' is not known" in err and "--conn-id" in err, err


# --- MariaDB -------------------------------------------------------------------------------------
@pytest.fixture
def mariadb_statement_format():
    """A private MariaDB on a free port whose binlog_format is STATEMENT (SET GLOBAL on this
    throwaway instance only), removed after."""
    if mariadb_cluster.mariadbd() is None:
        pytest.skip("mariadbd not found")
    root = Path(tempfile.mkdtemp(prefix="cdc-doctor-mariadb-", dir="/var/tmp"))
    srv = mariadb_cluster.Server(root / "data", mariadb_cluster._free_port(), 1)
    try:
        srv.start()
        srv.sql("SET GLOBAL binlog_format = 'STATEMENT'", database=None)
        srv.sql("CREATE DATABASE cdc_test", database=None)
        yield srv
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def test_doctor_mariadb_names_binlog_format_a_missing_grant_and_a_keyless_table(mariadb_statement_format, capsys,
                                                                                 monkeypatch):
    srv = mariadb_statement_format
    srv.sql("CREATE TABLE keyed (id INT PRIMARY KEY, v TEXT)")
    srv.sql("CREATE TABLE keyless (id INT, v TEXT)")
    # docs/connections.md "Grants" grants but BINLOG MONITOR
    for sql in ("CREATE USER 'doc_user'@'%%' IDENTIFIED BY 'pw'", "GRANT REPLICATION SLAVE ON *.* TO 'doc_user'@'%%'",
                "GRANT SELECT ON cdc_test.* TO 'doc_user'@'%%'"):
        srv.sql(sql, database=None)
    monkeypatch.setenv("AIRFLOW_CONN_DOC_MY_BROKEN", connection_json(
        srv.uri.replace("//root@", "//doc_user:pw@"), watermark_strategy="log"))
    code, out, err = _doctor(capsys, "--conn-id", "doc_my_broken", "--table", "cdc_test.keyed", "--table",
                             "cdc_test.keyless")
    assert code == cli.EXIT_MISMATCH, out + err
    fmt = _lines(out, "error", "binlog_format")
    assert fmt and "'STATEMENT'" in fmt[0] and "ROW" in fmt[0], out
    assert any("BINLOG MONITOR" in x for x in _lines(out, "error", "grants")), out
    keyless = _lines(out, "error", "table cdc_test.keyless")
    assert keyless and "no primary key" in keyless[0], out
    assert not _lines(out, "error", "table cdc_test.keyed"), out
    assert not _lines(out, "error", "binlog_row_image"), out  # FULL on this server: not reported
    # read-only: nothing was created (no watermark database)
    assert srv.sql("SHOW DATABASES LIKE 'cdc'", database=None) == []


@pytest.fixture
def my_least_privilege(mysql_uri, unique_name, monkeypatch):
    """Set-up 2 of docs/connections.md "Grants" on the shared MariaDB: the watermark table exists, the user
    may read its table and write the watermark row."""
    user, table, wm = f"cdc_doc_{unique_name}", f"doc_{unique_name}", f"`cdc`.`wm_doc_{unique_name}`"
    db = urlsplit(mysql_uri).path.lstrip("/")
    admin = w.connect(mysql_uri)
    admin.autocommit(True)
    my_run(admin, f"CREATE TABLE `{db}`.`{table}` (id INT PRIMARY KEY, v TEXT)",
           *my_setup(user, f"`{db}`.`{table}`", wm, provider_creates=False))
    conn_id = f"doc_my_{unique_name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection_json(
        mysql_uri.replace("//root@", f"//{user}:pw@"), watermark_schema="cdc", watermark_table=f"wm_doc_{unique_name}"))
    try:
        yield conn_id, user, f"{db}.{table}"
    finally:
        my_run(admin, f"DROP USER IF EXISTS '{user}'@'%'", f"DROP TABLE IF EXISTS `{db}`.`{table}`, {wm}")
        admin.close()


def test_doctor_mariadb_healthy_least_privilege_source_passes(my_least_privilege, mysql_uri, capsys, monkeypatch):
    conn_id, user, table = my_least_privilege
    code, out, err = _doctor(capsys, "--conn-id", conn_id, "--table", table, "--verbose")
    assert code == cli.EXIT_OK, out + err
    assert not [x for x in out.splitlines() if x.startswith("ERROR")], out
    for check in ("binlog_format", "binlog_row_image", "binlog_row_metadata", "grants", f"table {table}"):
        assert _lines(out, "ok", check), (check, out)
    # a wrong password: the connection id is named, one error, exit 1
    p = urlsplit(mysql_uri)
    monkeypatch.setenv("AIRFLOW_CONN_DOC_MY_BADPW", connection_json(
        f"mysql://{user}:wrong@{p.hostname}:{p.port}{p.path}"))
    code, out, _err = _doctor(capsys, "--conn-id", "doc_my_badpw", "--table", table)
    assert code == cli.EXIT_MISMATCH
    line = _lines(out, "error", "connection")
    assert line and "doc_my_badpw" in line[0] and "refused the login" in line[0], out


# --- chunks from a standby / a replica -------------------------------------------------------------
def test_doctor_checks_the_hot_standby_chunks_are_read_from(pg_uri, pg_standby_uri, unique_name, capsys, monkeypatch):
    table = f"public.doc_{unique_name}"
    pg_run(pg_uri, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    try:
        monkeypatch.setenv("AIRFLOW_CONN_DOC_STANDBY", connection_json(pg_standby_uri))
        monkeypatch.setenv("AIRFLOW_CONN_DOC_PRIMARY_AS_CHUNKS", connection_json(pg_uri))
        monkeypatch.setenv("AIRFLOW_CONN_DOC_WITH_STANDBY", connection_json(pg_uri, chunk_conn_id="doc_standby"))
        monkeypatch.setenv("AIRFLOW_CONN_DOC_WITH_PRIMARY", connection_json(pg_uri, chunk_conn_id="doc_primary_as_chunks"))
        port = urlsplit(pg_standby_uri).port
        code, out, err = _doctor(capsys, "--conn-id", "doc_with_standby", "--table", table, "--verbose")
        assert code == cli.EXIT_OK, out + err
        ok = _lines(out, "ok", f"chunk standby 127.0.0.1:{port}")
        assert ok and "a hot standby" in ok[0], out
        # a chunk connection that is no standby: named, exit 1
        code, out, _err = _doctor(capsys, "--conn-id", "doc_with_primary", "--table", table)
        assert code == cli.EXIT_MISMATCH
        bad = _lines(out, "error", f"chunk standby 127.0.0.1:{urlsplit(pg_uri).port}")
        assert bad and "not a hot standby" in bad[0] and "chunk_conn_id" in bad[0], out
    finally:
        pg_run(pg_uri, f"DROP TABLE {table}")


def test_doctor_on_a_mariadb_replica_checks_its_replication(mysql_uri, mysql_replica_uri, unique_name, capsys,
                                                            monkeypatch):
    """The shared replica (log_slave_updates, GTID): it is named a replica; watermark strategy
    'table' would write watermark rows there (a warning), 'log' writes nothing (README "Chunks
    from a replica")."""
    db = urlsplit(mysql_uri).path.lstrip("/")
    admin = w.connect(mysql_uri)
    admin.autocommit(True)
    my_run(admin, f"CREATE TABLE `{db}`.`doc_{unique_name}` (id INT PRIMARY KEY)")
    try:
        with admin.cursor() as cur:  # the table reaches the replica (MASTER_GTID_WAIT, no sleep)
            cur.execute("SELECT @@gtid_binlog_pos")
            pos = cur.fetchone()[0]
        replica = w.connect(mysql_replica_uri)
        try:
            with replica.cursor() as cur:
                cur.execute("SELECT MASTER_GTID_WAIT(%s, 60)", (pos,))
                assert cur.fetchone()[0] == 0
        finally:
            replica.close()
        table = f"{db}.doc_{unique_name}"
        monkeypatch.setenv("AIRFLOW_CONN_DOC_REPLICA_TABLE", connection_json(mysql_replica_uri))
        monkeypatch.setenv("AIRFLOW_CONN_DOC_REPLICA_LOG", connection_json(mysql_replica_uri, watermark_strategy="log"))
        code, out, err = _doctor(capsys, "--conn-id", "doc_replica_table", "--table", table, "--verbose")
        assert code == cli.EXIT_OK, out + err
        primary_port = urlsplit(mysql_uri).port
        assert any(f"a replica of 127.0.0.1:{primary_port}" in x for x in _lines(out, "ok", "replica")), out
        assert any("watermark_strategy 'table'" in x for x in _lines(out, "warning", "replica")), out
        assert not any("GTID" in x for x in _lines(out, "warning", "replica")), out  # it replicates by GTID
        code, out, err = _doctor(capsys, "--conn-id", "doc_replica_log", "--table", table)
        assert code == cli.EXIT_OK, out + err
        assert not _lines(out, "warning", "replica"), out
    finally:
        my_run(admin, f"DROP TABLE IF EXISTS `{db}`.`doc_{unique_name}`")
        admin.close()
