"""The whole loop as a least-privilege role, through the real DAGs, on both databases, in both
set-ups of docs/connections.md "Grants": the provider creates publication and watermark table (set-up
1), or an administrator did and the role may only read the captured table, write the
watermark row and read the log (set-up 2).

Capture, a snapshot under live writers and verify end at 0 mismatched. A conf naming a
system table or a table outside the capture scope fails the plan: nothing is written for it
(no Variable, no staged chunk, no event-log or mirror files) and the source is unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects.base import ConnectionParams
from tools import workload as w

from ..integration.helpers import my_run, my_setup, pg_run, pg_setup1_admin, pg_setup2_admin
from .helpers import ROWS, Pipeline

pytestmark = pytest.mark.timeout(900)


class LeastPrivilegePipeline(Pipeline):
    """A Pipeline whose connection is a role with only set-up 2's grants; the test itself (the
    application and the administrator) keeps the admin URI."""

    def __init__(self, admin_uri: str, name: str, data_dir: Path, monkeypatch, setup: int,
                 replica_uri: str | None = None) -> None:
        super().__init__(admin_uri, name, data_dir, monkeypatch)
        self.replica_uri = replica_uri
        self.admin_uri = admin_uri
        self.setup = setup
        self.role = f"cdc_lp_{name}"
        self.wm = f"wm_lp_{name}"
        # set-up 1 on PostgreSQL: a schema of its own to create (CREATE on the database suffices)
        self.wm_schema = f"cdc_lp_{name}" if self.scheme == "pg" and setup == 1 else "cdc"
        p = urlsplit(admin_uri)
        w.create_demo_table(admin_uri, self.table, ROWS)
        qt = w.quote_table(ConnectionParams.from_uri(admin_uri), self.table)
        conn = {"conn_type": "postgres" if self.scheme == "pg" else "mysql", "host": p.hostname, "port": p.port,
                "login": self.role, "schema": p.path.lstrip("/"),
                "extra": {"watermark_schema": self.wm_schema, "watermark_table": self.wm}}
        if self.scheme == "pg":
            if setup == 0:  # read-only: watermark strategy "log", no watermark table, no write grant
                pg_run(admin_uri, f"CREATE ROLE {self.role} LOGIN REPLICATION",
                       f"CREATE PUBLICATION {self.source} FOR TABLE {qt} WITH (publish_via_partition_root = true)",
                       f"GRANT USAGE ON SCHEMA public TO {self.role}", f"GRANT SELECT ON {qt} TO {self.role}")
                conn["extra"]["watermark_strategy"] = "log"
            else:
                pg_run(admin_uri, *(pg_setup2_admin(self.role, [qt], f"cdc.{self.wm}", self.source) if setup == 2
                                    else pg_setup1_admin(self.role, p.path.lstrip("/"), [qt])))
            conn["extra"].update(slot_name=self.source, publication_name=self.source)
        else:
            conn["password"] = "pw"
            admin = w.connect(admin_uri)
            admin.autocommit(True)
            if setup == 0:  # read-only: watermark strategy "log", no write grant anywhere
                my_run(admin, *my_setup(self.role, qt, "", provider_creates=True)[:3])
                if replica_uri is not None:  # docs/connections.md "Chunks from a replica or standby": to show the replica's lag
                    my_run(admin, f"GRANT SLAVE MONITOR ON *.* TO '{self.role}'@'%'")
                conn["extra"]["watermark_strategy"] = "log"
            else:
                my_run(admin, *my_setup(self.role, qt, f"`cdc`.`{self.wm}`", provider_creates=setup == 1))
            admin.close()
        if replica_uri is not None:  # the role's grants reach the replica through replication
            r = urlsplit(replica_uri)
            if self.scheme == "pg":  # chunks from the hot standby, named by a connection of its own
                standby = {**conn, "port": r.port, "extra": {}}
                monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}_STANDBY", json.dumps(standby))
                conn["extra"]["chunk_conn_id"] = f"{self.conn_id}_standby"
            else:  # the whole source is the replica: chunks and its own binlog
                conn["port"] = r.port
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}", json.dumps(conn))
        role_uri = admin_uri.replace(f"//{p.username}@", f"//{self.role}{':pw' if self.scheme != 'pg' else ''}@", 1)
        self.uri = role_uri  # what verify and counts read with: the role
        # the role and its grants reach the replica through replication: connect as it only once they have
        self.replica_caught_up()

    def catch_up(self, max_runs: int = 4) -> None:
        self.replica_caught_up()  # the writers stopped: the replica applies the rest first
        super().catch_up(max_runs)

    def replica_caught_up(self, seconds: float = 60) -> None:
        if self.replica_uri is None:
            return
        deadline = time.monotonic() + seconds
        while True:
            if self.scheme == "pg":
                with self.dialect() as d:
                    done = d.replica_lag()[0] == 0
            else:
                admin, rep = w.connect(self.admin_uri), w.connect(self.replica_uri)
                try:
                    with admin.cursor() as a, rep.cursor() as r:
                        a.execute("SELECT @@gtid_binlog_pos")
                        # reached, not equal: the other test session writes to the same primary
                        r.execute("SELECT MASTER_GTID_WAIT(%s, 0.5)", (a.fetchone()[0],))
                        done = r.fetchone()[0] == 0
                finally:
                    admin.close()
                    rep.close()
            if done:
                return
            assert time.monotonic() < deadline, "the replica did not catch up with the primary"
            time.sleep(0.05)

    def cleanup(self) -> None:
        from airflow.models.variable import Variable

        try:
            with self.dialect() as d:
                if self.scheme == "pg":
                    d.drop_slot()
        finally:
            self.uri = self.admin_uri
            if self.scheme == "pg":  # the table goes back to the administrator before the role's things go
                pg_run(self.admin_uri, f"DROP PUBLICATION IF EXISTS {self.source}",
                       f"DROP TABLE IF EXISTS {self.wm_schema}.{self.wm}",
                       f"ALTER TABLE {w.quote_table(ConnectionParams.from_uri(self.admin_uri), self.table)} OWNER TO "
                       f"{urlsplit(self.admin_uri).username}",
                       f"DROP OWNED BY {self.role}", f"DROP ROLE IF EXISTS {self.role}")
            else:
                admin = w.connect(self.admin_uri)
                admin.autocommit(True)
                my_run(admin, f"DROP TABLE IF EXISTS `cdc`.`{self.wm}`", f"DROP USER IF EXISTS '{self.role}'@'%'")
                admin.close()
            self.drop()
            Variable.delete(airflow_variables.variable_key(self.source, self.table.id))


def _pipeline(request, db: str, setup: int, unique_name, tmp_path, monkeypatch, replica: bool = False):
    uri = request.getfixturevalue("pg_uri" if db == "pg" else "mysql_uri")
    replica_uri = request.getfixturevalue("pg_standby_uri" if db == "pg" else "mysql_replica_uri") if replica else None
    p = LeastPrivilegePipeline(uri, unique_name, tmp_path / "data", monkeypatch, setup, replica_uri)
    request.addfinalizer(p.cleanup)
    p.capture_now()
    return p


@pytest.fixture(params=["pg", "mysql"])
def lp(request, unique_name, tmp_path, monkeypatch):
    return _pipeline(request, request.param, 2, unique_name, tmp_path, monkeypatch)


@pytest.mark.parametrize("setup", [1, 2])
@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_the_least_privilege_role_runs_capture_a_snapshot_under_writers_and_verify(
    request, db, setup, unique_name, tmp_path, monkeypatch
):
    _snapshot_under_writers_and_verify(_pipeline(request, db, setup, unique_name, tmp_path, monkeypatch), seed=31)


def _snapshot_under_writers_and_verify(p: LeastPrivilegePipeline, seed: int) -> None:
    with w.BackgroundWriter(p.admin_uri, p.table, threads=2, rate=100, seed=seed) as writer:
        p.snapshot()
        time.sleep(0.5)
    stats = writer.stats()
    assert stats.committed > 0 and stats.errors == [], stats.errors
    assert p.progress().status == "done"
    p.catch_up()
    p.assert_equal()


@pytest.mark.parametrize("replica", [False, True], ids=["primary", "replica"])
@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_a_read_only_role_snapshots_under_writers_without_writing_to_the_source(request, db, replica, unique_name,
                                                                                  tmp_path, monkeypatch):
    """Watermark strategy "log": the role may read the table and the log, nothing else (no write
    grant anywhere); capture, a snapshot under live writers on the primary and verify end at 0
    mismatched, and the source holds nothing of the provider's (no watermark table, no rows). With
    ``replica``, chunks come from the PostgreSQL hot standby (capture stays on the primary), or the
    whole MariaDB source is its replica."""
    p = _pipeline(request, db, 0, unique_name, tmp_path, monkeypatch, replica)
    admin = w.connect(p.admin_uri)
    try:
        with admin.cursor() as cur:
            if db == "pg":
                cur.execute("SELECT count(*) FROM information_schema.table_privileges WHERE grantee = %s AND "
                            "privilege_type <> 'SELECT'", (p.role,))
                assert cur.fetchone()[0] == 0
                cur.execute("SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = %s", (p.role,))
                assert cur.fetchone() == (False, False, False)
                cur.execute("SELECT count(*) FROM pg_database WHERE has_database_privilege(%s, oid, 'CREATE')",
                            (p.role,))
                assert cur.fetchone()[0] == 0
            else:
                cur.execute(f"SHOW GRANTS FOR '{p.role}'@'%'")
                grants = " ".join(r[0] for r in cur.fetchall()).upper()
                for write in ("INSERT", "UPDATE", "DELETE", "CREATE", "ALL PRIVILEGES"):
                    assert write not in grants, grants
        admin.commit()
        _snapshot_under_writers_and_verify(p, seed=37)
        # the capture's lag reading, as `airflow cdc status` shows it, carries the replica's
        replica_lag = airflow_variables.load_lags(p.source)[p.source].get("replica")
        if replica:
            assert replica_lag is not None and replica_lag["seconds"] is not None and replica_lag["seconds"] >= 0
        else:
            assert replica_lag is None
        with admin.cursor() as cur:
            cur.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_name = %s",
                        (p.wm,))
            assert list(cur.fetchall()) == [], "a watermark table was created"
    finally:
        admin.close()


def test_a_conf_cannot_widen_the_scope_to_a_system_table_or_another_table(lp):
    p = lp
    secrets = w.default_table(p.admin_uri, f"secrets_{p.role[-10:]}")
    w.create_demo_table(p.admin_uri, secrets, 10)
    system = "pg_catalog.pg_authid" if p.scheme == "pg" else "mysql.user"
    try:
        for tables in ([system], [secrets.id], [p.table.id, system]):
            p.run("cdc_snapshot", {"action": "start", "tables": tables}, expect="failed")
        for action in ("pause", "stop"):
            p.run("cdc_snapshot", {"action": action, "tables": [secrets.id]}, expect="failed")
    finally:
        w.drop_table(p.admin_uri, secrets)
    for t in (TableName.parse(system), secrets, p.table):
        assert airflow_variables.load(p.source, t.id, p.data_dir) is None
    written = [f for f in Path(p.data_dir).rglob("*") if f.is_file()]
    assert not [f for f in written if "chunk" in f.name or "/events/" in str(f) or "/mirror/" in str(f)], written
    assert not [f for f in written if "pg_authid" in str(f) or "secrets_" in str(f)]
