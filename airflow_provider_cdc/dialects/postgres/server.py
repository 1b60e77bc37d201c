"""The PostgreSQL server a source reads: its connections (the primary's autocommit one, the chunk
reads' REPEATABLE READ one), one statement at a time, identifier quoting, and the few facts about
the server every part of the dialect asks (hot standby or not, version, WAL geometry).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ...core.errors import SourceError, SourceUnreachableError
from ...core.schema import TableName
from ...core.sqlnames import quote_pg
from ..base import ConnectionParams
from .types import SESSION_OPTIONS, pg_message

APPLICATION_NAME = "airflow-provider-cdc"  # in pg_stat_activity

#: SQLSTATEs of a server that went away under a session: admin_shutdown, crash_shutdown,
#: cannot_connect_now (a primary stopping, restarting or failing over); besides class 08
#: (connection exception)
_GONE_CODES = ("57P01", "57P02", "57P03")
#: a server's own refusal at connect (psycopg2 gives a connect error no SQLSTATE): its FATAL
#: message (a login, a database, pg_hba.conf: the user's to fix), unless that says the server
#: is starting, stopping or recovering
_SERVER_FATAL = re.compile(r"\bFATAL:")
_GOING_AWAY = re.compile(r"the database system is|terminating connection due to", re.I)


def connection_lost(exc: BaseException) -> bool:
    """``exc`` (a psycopg2 error) says the server refused or dropped the connection (nothing
    listens, it stopped, it is failing over, the network between), not that it refused a
    statement or a login: SQLSTATE class 08 or 57P01-57P03, or an OperationalError or
    InterfaceError without a SQLSTATE that is not the server's own refusal."""
    import psycopg2

    code = getattr(exc, "pgcode", None) or ""
    if code:
        return code.startswith("08") or code in _GONE_CODES
    if not isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return False
    text = str(exc)
    return not _SERVER_FATAL.search(text) or _GOING_AWAY.search(text) is not None


class PgServer:
    """Connections to one source's server; shared by the dialect's collaborators."""

    def __init__(
        self, params: ConnectionParams, source: str, read_params: ConnectionParams | None = None
    ) -> None:
        self.params = params
        self.source = source
        #: chunks from a hot standby (connection extra ``chunk_conn_id``); None: from ``params``
        self.read_params = read_params
        self._conn = None
        self._rconn = None
        self._on_standby: bool | None = None
        self._wal_geo: tuple[int, int] | None = None

    # --- connections ------------------------------------------------------------------
    def connect_kwargs(self, params: ConnectionParams | None = None) -> dict[str, Any]:
        p = params or self.params
        kw: dict[str, Any] = dict(p.extra)
        kw.update(host=p.host, port=p.port or 5432, dbname=p.database or "postgres")
        if p.user:
            kw["user"] = p.user
        if p.password:
            kw["password"] = p.password
        kw["options"] = (kw.get("options", "") + " " + SESSION_OPTIONS).strip()
        kw.setdefault("application_name", APPLICATION_NAME)
        kw.setdefault("connect_timeout", 10)
        return kw

    def new_connection(self, params: ConnectionParams | None = None, **extra: Any):
        import psycopg2

        p = params or self.params
        try:
            return psycopg2.connect(**self.connect_kwargs(p), **extra)
        except psycopg2.OperationalError as exc:
            if connection_lost(exc):
                raise self.unreachable(exc, p) from exc
            raise SourceError(
                f"cannot connect to PostgreSQL at {p.host}:{p.port}/{p.database}: {str(exc).strip()}"
            ) from exc

    @property
    def conn(self):
        """Autocommit connection for metadata and watermark writes."""
        if self._conn is None or self._conn.closed:
            self._conn = self.new_connection()
            self._conn.autocommit = True
        return self._conn

    def read_conn(self):
        """Connection for chunk reads: REPEATABLE READ (a chunk's snapshot is recorded by its first
        statement and read by the next, core/visibility.py), every value returned as its text."""
        if self._rconn is None or self._rconn.closed:
            import psycopg2.extensions as ext

            c = self.new_connection(self.read_params)
            c.set_session(
                isolation_level=ext.ISOLATION_LEVEL_REPEATABLE_READ, readonly=True, autocommit=False
            )
            oids = tuple(set(ext.string_types) | set(getattr(ext, "binary_types", {})))
            ext.register_type(ext.new_type(oids, "CDC_RAW_TEXT", lambda value, cur: value), c)
            self._rconn = c
        return self._rconn

    def reset_read_conn(self) -> None:
        c, self._rconn = self._rconn, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - discarding a broken connection
                pass

    def query(self, sql: str, params: Sequence[Any] | None = ()) -> list[tuple]:
        import psycopg2

        try:
            with self.conn.cursor() as cur:
                cur.execute(sql, tuple(params or ()))  # (None: no parameters, as the MySQL server's)
                return cur.fetchall() if cur.description else []
        except psycopg2.Error as exc:
            if connection_lost(exc):
                raise self.unreachable(exc) from exc
            raise SourceError(f"PostgreSQL rejected a statement: {pg_message(exc)}\nSQL: {sql}") from exc

    def unreachable(
        self, exc: BaseException, params: ConnectionParams | None = None
    ) -> SourceUnreachableError:
        """The error for a connection to ``params``' server (default: the source's own) that the
        server refused or dropped (:func:`connection_lost`): host and port, no credentials."""
        p = params or self.params
        return SourceUnreachableError.at(
            f"PostgreSQL at {p.host}:{p.port or 5432}", str(exc), source=self.source
        )

    def close(self) -> None:
        for c in (self._conn, self._rconn):
            if c is not None and not c.closed:
                c.close()
        self._conn = self._rconn = None

    # --- identifiers ------------------------------------------------------------------
    @staticmethod
    def quote_ident(name: str) -> str:
        return quote_pg(name)  # every statement goes through %-formatting (core/sqlnames.py)

    def quote_table(self, table: TableName) -> str:
        return f"{quote_pg(table.schema)}.{quote_pg(table.name)}"

    def qlist(self, tables: Sequence[TableName]) -> str:
        return ", ".join(self.quote_table(t) for t in tables)

    # --- the server -------------------------------------------------------------------
    @property
    def on_standby(self) -> bool:
        """The source's own connection is a hot standby (PostgreSQL 16+ decodes logically there):
        capture's slot is on it, chunks are read there under a standby's rules (core/visibility.py
        ReplayedBefore), nothing is written. Read once (and again by each ``load_offset``, through
        ``server_identity``, which sets it)."""
        if self._on_standby is None:
            self._on_standby = bool(self.query("SELECT pg_is_in_recovery()")[0][0])
        return self._on_standby

    @on_standby.setter
    def on_standby(self, value: bool) -> None:
        self._on_standby = value

    @property
    def server_version(self) -> int:
        """server_version_num, as psycopg2 read it at connect (no query)."""
        return self.conn.server_version

    def wal_end_sql(self, primary_function: str) -> str:
        """``primary_function()`` (pg_current_wal_lsn, _flush_lsn...), or on a hot standby, where
        those fail in recovery, ``pg_last_wal_replay_lsn()``: the WAL its slots can decode."""
        return "pg_last_wal_replay_lsn()" if self.on_standby else f"{primary_function}()"

    def wal_geometry(self) -> tuple[int, int]:
        """(wal_block_size, wal_segment_size) in bytes, read once."""
        if self._wal_geo is None:
            row = self.query(
                "SELECT current_setting('wal_block_size')::bigint, "
                "pg_size_bytes(current_setting('wal_segment_size'))::bigint"
            )[0]
            self._wal_geo = (int(row[0]), int(row[1]))
        return self._wal_geo

    @property
    def chunks_on_standby(self) -> bool:
        """Chunks are read on a hot standby: the one chunk_conn_id names, or the source's own
        server when that is a standby."""
        return self.read_params is not None or self.on_standby
