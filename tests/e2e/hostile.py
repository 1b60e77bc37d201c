"""A source whose schema, table, key and column names are hostile (quotes, ``%s``, spaces,
non-ASCII), shared by the hostile names, hostile values and schema change tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import pymysql

from airflow_provider_cdc.core.schema import TableName

from .helpers import Pipeline

ROWS = 120


# column names: a hostile key column and hostile value columns (same for both databases)
KEY = "k ey'%s"
COLS = ["a b", 'q"uote', "é;", "%s", "x.y"]


# The test's own SQL always goes through the drivers' parameter formatting (args is always a
# tuple), so a "%" in an identifier is written "%%".
def _q_pg(name: str) -> str:
    return '"' + name.replace('"', '""').replace("%", "%%") + '"'


def _q_my(name: str) -> str:
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"


class HostileSource(Pipeline):
    """Pipeline for several hostile tables of one source (connection extra lists them)."""

    sql_mode: str | None = None  # MariaDB sessions of ``sql``: the server's default

    def __init__(self, uri: str, name: str, data_dir: Path, monkeypatch, tables: list[TableName]) -> None:
        super().__init__(uri, name, data_dir, monkeypatch)
        self.tables = tables
        self.table = tables[0]
        p = urlsplit(uri)
        conn = {
            "conn_type": "postgres" if self.scheme == "pg" else "mysql",
            "host": p.hostname,
            "port": p.port,
            "login": p.username,
            "schema": p.path.lstrip("/"),
            "extra": {},
        }
        if self.scheme == "pg":
            conn["extra"].update(slot_name=f"cdc_e2e_{name}", publication_name=f"cdc_e2e_{name}")
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}", json.dumps(conn))
        monkeypatch.setenv("CDC_TABLES", json.dumps([t.id for t in tables]))

    def run(self, dag_id: str, conf: dict | None = None, *, expect: str = "success"):
        """As Pipeline.run, and no task may have needed a retry: a name that breaks a task once
        (an XCom key, a URL) must not hide behind a successful second try."""
        dr = super().run(dag_id, conf, expect=expect)
        tis = dr.get_task_instances()
        retried = [(ti.task_id, ti.map_index, ti.try_number, str(ti.state)) for ti in tis if (ti.try_number or 1) > 1]
        assert tis and not retried, f"{dag_id}: tasks needed retries: {retried}"
        return dr

    def sql(self, statements: list[tuple[str, tuple]]) -> None:
        if self.scheme == "pg":
            with psycopg2.connect(self.uri) as c, c.cursor() as cur:
                for s, args in statements:
                    cur.execute(s, args)
            return
        p = urlsplit(self.uri)
        c = pymysql.connect(host=p.hostname, port=p.port, user=p.username, password=p.password or "",
                            database=p.path.lstrip("/"), autocommit=True,
                            init_command=None if self.sql_mode is None else f"SET sql_mode = '{self.sql_mode}'")
        try:
            with c.cursor() as cur:
                for s, args in statements:
                    cur.execute(s, args)
        finally:
            c.close()

    def q(self, name: str) -> str:
        return _q_pg(name) if self.scheme == "pg" else _q_my(name)

    def qt(self, t: TableName) -> str:
        return f"{self.q(t.schema)}.{self.q(t.name)}"

    def count(self, t: TableName) -> int:
        if self.scheme == "pg":
            with psycopg2.connect(self.uri) as c, c.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {self.qt(t)}", ())  # noqa: S608 - quoted
                return cur.fetchone()[0]
        p = urlsplit(self.uri)
        c = pymysql.connect(host=p.hostname, port=p.port, user=p.username, password=p.password or "")
        try:
            with c.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {self.qt(t)}", ())  # noqa: S608 - quoted
                return cur.fetchone()[0]
        finally:
            c.close()

    def create(self) -> None:
        ph = "%s"
        stmts = []
        if self.scheme == "pg":
            stmts.append((f"CREATE SCHEMA IF NOT EXISTS {self.q(self.tables[2].schema)}", ()))
        text = "text" if self.scheme == "pg" else "varchar(100)"
        for t in self.tables:
            cols = ", ".join(f"{self.q(c)} {text}" for c in COLS)
            stmts.append((f"CREATE TABLE {self.qt(t)} ({self.q(KEY)} int PRIMARY KEY, {cols})", ()))
            names = ", ".join(self.q(c) for c in [KEY, *COLS])
            values = ", ".join([ph] * (1 + len(COLS)))
            stmts += [
                (f"INSERT INTO {self.qt(t)} ({names}) VALUES ({values})",  # noqa: S608 - quoted, bound
                 (i, *(f"{c}|{i}|'%s;" for c in COLS)))
                for i in range(1, ROWS + 1)
            ]
        self.sql(stmts)

    def change(self) -> None:
        """Inserts, updates (of a hostile column) and deletes in every table."""
        stmts = []
        for t in self.tables:
            stmts += [
                (f"UPDATE {self.qt(t)} SET {self.q(COLS[1])} = %s WHERE {self.q(KEY)} <= %s", ("changed'\"%s", 10)),  # noqa: S608
                (f"DELETE FROM {self.qt(t)} WHERE {self.q(KEY)} > %s", (ROWS - 7,)),  # noqa: S608
                (f"INSERT INTO {self.qt(t)} ({self.q(KEY)}, {self.q(COLS[0])}) VALUES (%s, %s)", (ROWS + 1, "new row")),  # noqa: S608
            ]
        self.sql(stmts)

    def drop(self) -> None:
        stmts = [(f"DROP TABLE IF EXISTS {self.qt(t)}", ()) for t in self.tables]
        if self.scheme == "pg":
            stmts.append((f"DROP SCHEMA IF EXISTS {self.q(self.tables[2].schema)} CASCADE", ()))
        self.sql(stmts)


def running(p: HostileSource, monkeypatch, *, spark_for_pg: bool = True):
    """Fixture body: the source's tables created afresh, its changelog started; cleaned up after.
    With ``spark_for_pg`` both engines run: PostgreSQL's rounds through spark-submit, MariaDB's
    in the worker."""
    if spark_for_pg:
        monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "0" if p.scheme == "pg" else "1000000")
    p.drop()
    p.create()
    p.capture_now()
    yield p
    p.cleanup()
