"""``airflow connections test <conn_id>`` for the documented connection URIs (issue 47), run as a
user runs it: the real ``airflow`` CLI in a subprocess, an ``AIRFLOW_CONN_*`` connection, the
real servers. Airflow refuses every test unless ``[core] test_connection = Enabled``; enabled, it
picks the hook by the connection's type, and without apache-airflow-providers-postgres/-mysql no
hook had ``postgres``/``mysql`` ("Unknown hook type"). The provider registers CdcSourceHook for
those types unless another installed provider does (it would otherwise take them: Airflow keeps
the first registration, in package-name order).

A wrong password fails on a PostgreSQL of this test's own that asks for one (the shared server
trusts 127.0.0.1) and on MariaDB with a user of this test's own; the message names the
connection id and what to fix, and never holds a password.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from tests.pg_cluster import Server, _as_pg, _free_port, pg_bin

AIRFLOW = Path(sys.executable).with_name("airflow")
PASSWORD = "s3cret-Pw_for-test"
WRONG = "not-the-Pw_42"


def connections_test(conn_id: str, uri: str, *, enabled: bool = True, extra_env: dict | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    env[f"AIRFLOW_CONN_{conn_id.upper()}"] = uri
    if enabled:
        env["AIRFLOW__CORE__TEST_CONNECTION"] = "Enabled"
    else:
        env.pop("AIRFLOW__CORE__TEST_CONNECTION", None)
    env.update(extra_env or {})
    r = subprocess.run([str(AIRFLOW), "connections", "test", conn_id], env=env, capture_output=True, text=True,
                       timeout=180, check=False)
    return r, r.stdout + r.stderr


def with_password(uri: str, user: str, password: str) -> str:
    p = urlsplit(uri)
    return p._replace(netloc=f"{quote(user)}:{quote(password, safe='')}@{p.hostname}:{p.port}").geturl()


@pytest.fixture(scope="module")
def pg_with_password():
    """A PostgreSQL 15 of this module's own (wal_level=logical) whose TCP logins need a password
    (scram-sha-256): the shared server trusts 127.0.0.1 and accepts any password."""
    bin_dir = pg_bin(15)
    if bin_dir is None:
        pytest.skip("no PostgreSQL 15 server binaries")
    root = Path(tempfile.mkdtemp(prefix="cdc-conntest-pg-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    if os.getuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    srv = Server(bin_dir, root / "data", _free_port())
    try:
        _as_pg([str(bin_dir / "initdb"), "-D", str(srv.data), "-U", "postgres", "--auth-local=trust",
                "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"])
        conf = f"listen_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\nwal_level = logical\n" \
               "max_replication_slots = 4\nmax_wal_senders = 4\nfsync = off\n"
        _as_pg(["tee", "-a", str(srv.data / "postgresql.conf")], input=conf)
        srv.start()
        psql = [str(bin_dir / "psql"), "-h", str(root), "-p", str(srv.port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
        _as_pg([*psql, "-d", "postgres", "-c", "CREATE DATABASE cdc_test"])
        _as_pg([*psql, "-d", "postgres", "-c", f"ALTER ROLE postgres PASSWORD '{PASSWORD}'"])
        yield f"postgresql://postgres@127.0.0.1:{srv.port}/cdc_test"
    finally:
        try:
            srv.ctl("-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mariadb_user(mysql_uri, unique_name):
    """A MariaDB user of this test's own with a password and the CDC grants."""
    import pymysql

    p = urlsplit(mysql_uri)
    admin = pymysql.connect(host=p.hostname, port=p.port, user=p.username or "root", password=p.password or "",
                            autocommit=True)
    user = f"ct_{unique_name}"[:32]
    with admin.cursor() as cur:
        for host in ("localhost", "127.0.0.1", "%"):
            cur.execute(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '{PASSWORD}'")
            cur.execute(f"GRANT SELECT, RELOAD, REPLICATION CLIENT, REPLICATION SLAVE, BINLOG MONITOR, "
                        f"SLAVE MONITOR ON *.* TO '{user}'@'{host}'")
            cur.execute(f"GRANT ALL ON `{p.path.lstrip('/')}`.* TO '{user}'@'{host}'")
            cur.execute(f"GRANT ALL ON `cdc`.* TO '{user}'@'{host}'")
    try:
        yield user
    finally:
        with admin.cursor() as cur:
            for host in ("localhost", "127.0.0.1", "%"):
                cur.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")
        admin.close()


def test_disabled_by_default_says_so(pg_uri):
    """Airflow's default ([core] test_connection = Disabled) refuses the test: the hook's
    docstring says to enable it."""
    from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook

    r, out = connections_test("cdc_ct_off", pg_uri, enabled=False)
    assert r.returncode == 1 and "Testing connections is disabled" in out, out
    assert "test_connection = Enabled" in CdcSourceHook.test_connection.__doc__


def test_postgres_uri_success(pg_uri, monkeypatch):
    r, out = connections_test("cdc_ct_pg", pg_uri)
    assert r.returncode == 0 and "Connection success!" in out, out
    assert "Unknown hook type" not in out
    # the message (which Airflow's UI and API show on success; the CLI does not) names the
    # connection and warns when nothing bounds the slot's WAL (the server's default)
    from airflow_provider_cdc.hooks.cdc_source import CdcPostgresSourceHook

    from .helpers import unbounded_server

    monkeypatch.setenv("AIRFLOW_CONN_CDC_CT_PG", pg_uri)
    ok, message = CdcPostgresSourceHook("cdc_ct_pg").test_connection()
    assert ok is True and message.startswith("connection 'cdc_ct_pg' (PostgreSQL 'postgres'@"), message
    assert ("WARNING: nothing bounds the WAL" in message) == unbounded_server(pg_uri), message


def test_postgres_uri_scheme_postgres_success(pg_with_password):
    """``postgres://`` as well as ``postgresql://``, with a password the server checks."""
    uri = with_password(pg_with_password, "postgres", PASSWORD).replace("postgresql://", "postgres://")
    r, out = connections_test("cdc_ct_pgpw", uri)
    assert r.returncode == 0 and "Connection success!" in out, out


def test_postgres_wrong_password_names_connection_and_fix(pg_with_password):
    r, out = connections_test("cdc_ct_pgbad", with_password(pg_with_password, "postgres", WRONG))
    assert r.returncode == 1 and "Connection failed!" in out, out
    flat = " ".join(out.split())
    assert "connection 'cdc_ct_pgbad'" in flat and "refused the login" in flat, out
    assert "password authentication failed" in flat and "Check the login, password" in flat, out
    assert WRONG not in out and PASSWORD not in out


def test_postgres_unknown_database_and_unreachable_host(pg_with_password):
    r, out = connections_test("cdc_ct_pgdb", with_password(pg_with_password, "postgres", PASSWORD)
                              .replace("/cdc_test", "/no_such_db"))
    flat = " ".join(out.split())
    assert r.returncode == 1 and "connection 'cdc_ct_pgdb'" in flat and "refused the database" in flat, out
    assert "no_such_db" in flat and PASSWORD not in out
    port = _free_port()  # nothing listens there
    r, out = connections_test("cdc_ct_pgport", f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/cdc_test")
    flat = " ".join(out.split())
    assert r.returncode == 1 and f"cannot reach PostgreSQL 'postgres'@127.0.0.1:{port}/cdc_test" in flat, out
    assert "Check the host and port" in flat and PASSWORD not in out


def test_mariadb_uri_success(mysql_uri, mariadb_user):
    """``mysql://`` and ``mariadb://``."""
    r, out = connections_test("cdc_ct_my", with_password(mysql_uri, mariadb_user, PASSWORD))
    assert r.returncode == 0 and "Connection success!" in out, out
    uri = with_password(mysql_uri, mariadb_user, PASSWORD).replace("mysql://", "mariadb://")
    r, out = connections_test("cdc_ct_maria", uri)
    assert r.returncode == 0 and "Connection success!" in out, out


def test_mariadb_wrong_password_names_connection_and_fix(mysql_uri, mariadb_user):
    r, out = connections_test("cdc_ct_mybad", with_password(mysql_uri, mariadb_user, WRONG))
    flat = " ".join(out.split())
    assert r.returncode == 1 and "Connection failed!" in out, out
    assert "connection 'cdc_ct_mybad'" in flat and "refused the login" in flat and "Access denied" in flat, out
    assert "Check the login, password" in flat and WRONG not in out and PASSWORD not in out


def test_cdc_conn_type_with_dialect_extra(mysql_uri, mariadb_user):
    """The provider's own type ``cdc`` names the dialect in its extra."""
    import json

    p = urlsplit(mysql_uri)
    conn = json.dumps({"conn_type": "cdc", "host": p.hostname, "port": p.port, "login": mariadb_user,
                       "password": PASSWORD, "schema": p.path.lstrip("/"), "extra": {"dialect": "mysql"}})
    r, out = connections_test("cdc_ct_cdctype", conn)
    assert r.returncode == 0 and "Connection success!" in out, out
    r, out = connections_test("cdc_ct_cdcnodialect", json.dumps({**json.loads(conn), "extra": {}}))
    assert r.returncode == 1 and "extra 'dialect' is 'missing'" in out and PASSWORD not in out, out


def test_another_provider_keeps_its_connection_type(tmp_path, pg_uri):
    """With a provider installed that registers ``postgres`` (as apache-airflow-providers-postgres
    does; a third-party one here, as Airflow accepts an apache-airflow-providers-* package only
    with classes under airflow.providers), its hook tests postgres connections: this provider does
    not take the type from it, though "airflow-provider-cdc" sorts first, where Airflow keeps the
    first registration."""
    pkg = tmp_path / "fake_pg_provider"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        from airflow.sdk import BaseHook

        def get_provider_info():
            return {"package-name": "fake-airflow-providers-postgres", "name": "Fake PostgreSQL",
                    "description": "test double", "versions": ["99.0.0"],
                    "connection-types": [{"connection-type": "postgres", "hook-name": "Postgres",
                                          "hook-class-name": "fake_pg_provider.FakePostgresHook"}]}

        class FakePostgresHook(BaseHook):
            conn_name_attr = "postgres_conn_id"
            conn_type = "postgres"
            hook_name = "Postgres"

            def __init__(self, postgres_conn_id="postgres_default", **kwargs):
                super().__init__(**kwargs)

            def test_connection(self):
                return False, "tested by the fake postgres provider"
    '''))
    dist = tmp_path / "fake_airflow_providers_postgres-99.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-airflow-providers-postgres\nVersion: 99.0.0\n")
    (dist / "entry_points.txt").write_text("[apache_airflow_provider]\nprovider_info = fake_pg_provider:get_provider_info\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r, out = connections_test("cdc_ct_owned", pg_uri, extra_env=env)
    assert "tested by the fake postgres provider" in out, out
    assert "already registered" not in out and "Inconsistency" not in out, out  # no clash to log
    # the provider's own type stays its own
    r, out = connections_test("cdc_ct_owned_cdc", pg_uri.replace("postgresql://", "cdc://") + "?dialect=postgres",
                              extra_env=env)
    assert r.returncode == 0 and "Connection success!" in out, out


def test_hook_names_match_provider_info():
    """The hook classes registered for each type declare that type (else Airflow logs an
    'Inconsistency!' warning) and the provider info's hook names."""
    import importlib

    from airflow_provider_cdc import connection_types

    for entry in connection_types():
        module, cls = entry["hook-class-name"].rsplit(".", 1)
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == entry["connection-type"] and hook.hook_name == entry["hook-name"]
