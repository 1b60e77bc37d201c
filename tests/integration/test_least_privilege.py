"""No harm to the source, no way in (docs/connections.md "Grants"), on the real servers.

- Without a capture scope nothing is captured and nothing is created on the source; the
  FOR ALL TABLES opt-in is refused while a table without a replica identity exists, so an
  application's UPDATE keeps working whatever the provider is told.
- A snapshot reads only tables of the scope: never a system table, never one the role
  cannot read, and the error names the grant.
- The grants of docs/connections.md "Grants" are enough, for both set-ups: the provider creates
  publication and watermark table (set-up 1), or an administrator did and the provider runs
  no DDL (set-up 2); a role missing any one of them gets an error naming it.

The statements below are the docs' (connections.md, "Grants"), with the names filled in: a change to one is a change
to the other.
"""

from __future__ import annotations

from contextlib import closing, contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pymysql
import pytest

from airflow_provider_cdc.core.errors import ConfigurationError, SourceError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.pipeline.capture import stage_changelog

from .helpers import my_run, my_setup, pg_run, pg_setup1_admin, pg_setup2_admin


@pytest.fixture
def pg_db(pg_uri, unique_name):
    """A database of its own (FOR ALL TABLES looks at every table of it), dropped after."""
    name = f"lp_{unique_name}"
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")
    p = urlsplit(pg_uri)
    uri = urlunsplit(p._replace(path=f"/{name}"))
    roles: list[str] = []
    try:
        yield uri, name, roles
    finally:
        with closing(psycopg2.connect(uri)) as c:
            c.autocommit = True
            cur = c.cursor()
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                        (name,))
        admin.cursor().execute(f"DROP DATABASE {name} WITH (FORCE)")
        for role in roles:
            admin.cursor().execute(f"DROP ROLE IF EXISTS {role}")
        admin.close()


def as_role(uri: str, role: str) -> ConnectionParams:
    p = ConnectionParams.from_uri(uri)
    return ConnectionParams(p.scheme, p.host, p.port, role, None, p.database)


@contextmanager
def pg_dialect(params: ConnectionParams, **options):
    d = get_dialect(params, source="lp", **options)
    try:
        yield d
    finally:
        d.close()


def unquoted(err) -> str:
    """An error's text without PostgreSQL's identifier quotes (every name in it is quoted)."""
    return str(err.value).replace('"', "")


def publications(uri: str) -> list:
    return pg_run(uri, "SELECT pubname, puballtables FROM pg_publication")


def test_pg_without_a_scope_nothing_is_captured_or_created_and_the_application_keeps_writing(pg_db, tmp_path):
    uri, _, _ = pg_db
    pg_run(uri, "CREATE TABLE app_log (at timestamptz, line text)",  # no key: no replica identity
           "INSERT INTO app_log VALUES (now(), 'a')", "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    params = ConnectionParams.from_uri(uri)
    with pg_dialect(params) as d, pytest.raises(ConfigurationError, match="has no capture scope: set CDC_TABLES"):
        stage_changelog(d, str(tmp_path))
    with pg_dialect(params, all_tables=True) as d, pytest.raises(ConfigurationError, match=r"public\.app_log"):
        stage_changelog(d, str(tmp_path))
    assert publications(uri) == []
    assert pg_run(uri, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_lp'") == [(0,)]
    with pg_dialect(params, tables=["public.orders"]) as d:
        stage_changelog(d, str(tmp_path))  # the capture starts: a FOR TABLE publication
    assert publications(uri) == [("cdc_lp", False)]
    # the application's UPDATE and DELETE on a table without a replica identity still work
    pg_run(uri, "UPDATE app_log SET line = 'b'", "DELETE FROM app_log")


def test_pg_a_snapshot_never_reads_a_system_table_or_one_the_role_cannot_read(pg_db, tmp_path):
    uri, _, roles = pg_db
    role = "cdc_lp_ro"
    roles.append(role)
    pg_run(uri, "CREATE TABLE orders (id int PRIMARY KEY)", "CREATE TABLE secrets (id int PRIMARY KEY, pw text)",
           f"CREATE ROLE {role} LOGIN REPLICATION", f"GRANT USAGE ON SCHEMA public TO {role}",
           f"GRANT SELECT ON orders TO {role}")
    system = [TableName("pg_catalog", "pg_authid"), TableName("information_schema", "tables"),
              TableName("pg_toast", "x")]
    with pg_dialect(as_role(uri, role), all_tables=True) as d:  # even the widest scope
        for t in system:
            with pytest.raises(ConfigurationError, match=f"table {t} is in system schema"):
                d.check_snapshot_tables([t])
        with pytest.raises(SourceError) as err:
            d.check_snapshot_tables([TableName("public", "orders"), TableName("public", "secrets")])
        assert unquoted(err) == f"role '{role}' may not read table public.secrets: GRANT SELECT ON public.secrets TO {role}"
        d.check_snapshot_tables([TableName("public", "orders")])
    with pg_dialect(as_role(uri, role), tables=["public.orders"]) as d:
        with pytest.raises(ConfigurationError, match="public.secrets is not captured by source 'lp'"):
            d.check_snapshot_tables([TableName("public", "secrets")])
        with pytest.raises(ConfigurationError, match="system table"):
            get_dialect(as_role(uri, role), source="lp", tables=["pg_catalog.pg_authid"]).require_capture_scope()


def test_pg_setup1_the_provider_creates_what_it_needs_with_the_documented_grants(pg_db, tmp_path):
    uri, database, roles = pg_db
    role = "cdc_lp_s1"
    roles.append(role)
    pg_run(uri, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    pg_run(uri, *pg_setup1_admin(role, database, ["public.orders"]))
    with pg_dialect(as_role(uri, role), tables=["public.orders"]) as d:
        d.check_prerequisites()
        stage_changelog(d, str(tmp_path))
        pg_run(uri, "INSERT INTO orders VALUES (1, 'a')")
        d.write_watermark("w1")
        res = stage_changelog(d, str(tmp_path))
        assert res.events == 2 and res.watermarks == 1  # the row and the watermark
        d.drop_slot()
        d.drop_publication()
    pg_run(uri, f"DROP OWNED BY {role}")


# (USAGE on schema public is PUBLIC's by default: not a grant a role can miss there)
PG_SETUP2 = ["REPLICATION", "SELECT ON public.orders", "SELECT, UPDATE ON cdc.wm",
             "USAGE ON SCHEMA cdc", "publication"]


@pytest.mark.parametrize("missing", [None, *PG_SETUP2])
def test_pg_setup2_runs_no_ddl_and_a_missing_grant_names_itself(pg_db, tmp_path, missing):
    uri, _, roles = pg_db
    role = "cdc_lp_s2"
    roles.append(role)
    pg_run(uri, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    statements = pg_setup2_admin(role, ["public.orders"], "cdc.wm", "cdc_lp")
    if missing == "REPLICATION":
        statements[0] = f"CREATE ROLE {role} LOGIN"
    elif missing == "publication":
        statements = [s for s in statements if not s.startswith("CREATE PUBLICATION")]
    elif missing == "USAGE ON SCHEMA cdc":
        statements[statements.index(f"GRANT USAGE ON SCHEMA public, cdc TO {role}")] = f"GRANT USAGE ON SCHEMA public TO {role}"
    elif missing:
        statements = [s for s in statements if s != f"GRANT {missing} TO {role}"]
    pg_run(uri, *statements)
    # the role owns nothing and may create nothing: any DDL the provider tried would fail the test
    with pg_dialect(as_role(uri, role), tables=["public.orders"], watermark_table="wm") as d:
        if missing is None:
            d.check_prerequisites()
            stage_changelog(d, str(tmp_path))
            d.check_snapshot_tables([TableName("public", "orders")])
            d.ensure_watermark_table()
            pg_run(uri, "INSERT INTO orders VALUES (1, 'a')")
            d.write_watermark("w1")
            res = stage_changelog(d, str(tmp_path))
            assert res.events == 2 and res.watermarks == 1  # the row and the watermark
            d.drop_slot()
        else:
            with pytest.raises(SourceError) as err:
                d.check_prerequisites()
            text = unquoted(err)
            want = {"REPLICATION": f"ALTER ROLE {role} WITH REPLICATION",
                    "publication": "CREATE PUBLICATION cdc_lp FOR TABLE public.orders, cdc.wm"}.get(
                missing, f"GRANT {missing} TO {role}")
            assert want in text, text
            with pytest.raises(SourceError) as again:
                stage_changelog(d, str(tmp_path))  # capture checks first: nothing created, named again
            assert "not ready for CDC" in unquoted(again) and want in unquoted(again)
            assert pg_run(uri, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_lp'") == [(0,)]
    pg_run(uri, f"DROP OWNED BY {role}")


# --------------------------------------------------------------------------- MariaDB
DB = "cdc_test"


@pytest.fixture
def my_admin(mysql_uri):
    p = urlsplit(mysql_uri)
    conn = pymysql.connect(host=p.hostname, port=p.port or 3306, user=p.username or "root",
                           password=p.password or "", autocommit=True)
    users: list[str] = []
    try:
        yield conn, users
    finally:
        with conn.cursor() as cur:
            for u in users:
                cur.execute("DROP USER IF EXISTS %s@'%%'", (u,))
        conn.close()


def my_params(mysql_uri: str, user: str) -> ConnectionParams:
    p = ConnectionParams.from_uri(mysql_uri)
    return ConnectionParams("mysql", p.host, p.port, user, "pw", DB)


MY_SETUP2 = ["REPLICATION SLAVE", "BINLOG MONITOR", "SELECT ON table", "SELECT, UPDATE ON wm"]


@pytest.mark.parametrize("provider_creates", [True, False])
@pytest.mark.parametrize("missing", [None, *MY_SETUP2])
def test_mysql_documented_grants_are_enough_and_a_missing_one_names_itself(
    my_admin, mysql_uri, unique_name, tmp_path, provider_creates, missing
):
    if provider_creates and missing == "SELECT, UPDATE ON wm":
        missing = "CREATE ON cdc"
    conn, users = my_admin
    user, t, wm = f"cdc_lp_{unique_name}", f"`{DB}`.`lp_{unique_name}`", f"`cdc`.`wm_lp_{unique_name}`"
    users.append(user)
    my_run(conn, f"CREATE TABLE {t} (id INT PRIMARY KEY, v TEXT)")
    statements = my_setup(user, t, wm, provider_creates=provider_creates)
    if missing == "REPLICATION SLAVE":
        statements = [s.replace("REPLICATION SLAVE, ", "") for s in statements]
    elif missing == "BINLOG MONITOR":
        statements = [s.replace(", BINLOG MONITOR", "") for s in statements]
    elif missing == "SELECT ON table":
        statements = [s for s in statements if not s.startswith(f"GRANT SELECT ON {t}")]
    elif missing == "SELECT, UPDATE ON wm":
        statements = [s for s in statements if not s.startswith(f"GRANT SELECT, UPDATE ON {wm}")]
    elif missing == "CREATE ON cdc":
        statements = [s.replace("CREATE, INSERT, ", "INSERT, ") for s in statements]
    try:
        my_run(conn, *statements)
        d = get_dialect(my_params(mysql_uri, user), source=f"lp_{unique_name}", tables=[f"{DB}.lp_{unique_name}"],
                        watermark_table=f"wm_lp_{unique_name}")
        with closing(d):
            if missing is None:
                d.check_prerequisites()
                d.ensure_watermark_table()
                stage_changelog(d, str(tmp_path))
                d.check_snapshot_tables([TableName(DB, f"lp_{unique_name}")])
                my_run(conn, f"INSERT INTO {t} VALUES (1, 'a')")
                d.write_watermark(f"w-{unique_name}")
                res = stage_changelog(d, str(tmp_path))
                assert res.events == 2 and res.watermarks == 1  # the row and the watermark
            else:
                with pytest.raises(SourceError) as err:
                    d.check_prerequisites()
                want = {"SELECT ON table": f"GRANT SELECT ON {t}", "SELECT, UPDATE ON wm": f"GRANT SELECT, UPDATE ON {wm}",
                        "CREATE ON cdc": "GRANT CREATE ON `cdc`.*"}.get(missing, missing)
                assert want in str(err.value), str(err.value)
    finally:
        my_run(conn, f"DROP TABLE IF EXISTS {t}", f"DROP TABLE IF EXISTS {wm}")


def test_mysql_without_a_scope_nothing_is_read_and_system_tables_are_never_snapshotted(mysql_uri, tmp_path, unique_name):
    params = ConnectionParams.from_uri(mysql_uri)
    d = get_dialect(params, source=f"lp_{unique_name}", watermark_table=f"wm_lp_{unique_name}")
    with closing(d):
        with pytest.raises(ConfigurationError, match="has no capture scope: set CDC_TABLES"):
            stage_changelog(d, str(tmp_path))
        assert not any(tmp_path.iterdir())  # not even an offset
    wide = get_dialect(params, source=f"lp_{unique_name}", all_tables=True)
    with closing(wide):
        for t in ("mysql.user", "MySQL.user", "performance_schema.threads", "sys.version", "information_schema.TABLES"):
            with pytest.raises(ConfigurationError, match="is in system schema"):
                wide.check_snapshot_tables([TableName.parse(t)])
