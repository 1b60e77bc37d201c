"""The MySQL or MariaDB server a source reads: its flavour (what differs between the two), the
dialect's one connection (statements serialised by a lock), fresh connections for chunk reads
and the binlog stream, identifier quoting, and the few facts every part asks (server id, binlog
end, GTID position, replica status).
"""

from __future__ import annotations

import re
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, SourceUnreachableError
from ...core.schema import TableName
from ...core.sqlnames import quote_mysql
from ..base import ConnectionParams
from .binlog import BinlogOffset

# --------------------------------------------------------------------------- flavours


@dataclass(frozen=True)
class Flavour:
    """Everything that differs between MariaDB and MySQL, in one place."""

    name: str
    is_mariadb: bool
    #: statement giving the current binlog file and position (MySQL 8.4 removed SHOW MASTER STATUS)
    status_sql: str
    #: GTID state after the last write, for the record in offsets (not used to resume)
    gtid_sql: str
    #: e.g. MariaDB ``0-1-42`` (domain-server-sequence), MySQL ``3E11FA47-...:1-42``
    gtid_format: str
    #: groups of privileges; each group needs one of its names (aliases across versions)
    privileges: tuple[tuple[str, ...], ...]
    grant_hint: str
    #: server-specific settings that must have a value when the server has them:
    #: compressed binlog events are not decoded by mysql-replication
    optional_settings: tuple[tuple[str, str, str], ...] = ()


MARIADB = Flavour(
    name="mariadb",
    is_mariadb=True,
    status_sql="SHOW MASTER STATUS",
    gtid_sql="SELECT @@global.gtid_binlog_pos",
    gtid_format="domain-server-sequence",
    privileges=(("REPLICATION SLAVE",), ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER")),
    grant_hint="GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO <user>",
    optional_settings=(("log_bin_compress", "OFF", "SET GLOBAL log_bin_compress = OFF"),),
)
MYSQL_80 = Flavour(
    name="mysql",
    is_mariadb=False,
    status_sql="SHOW MASTER STATUS",
    gtid_sql="SELECT @@global.gtid_executed",
    gtid_format="source_uuid:interval",
    privileges=(("REPLICATION SLAVE",), ("REPLICATION CLIENT", "SUPER")),
    grant_hint="GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO <user>",
    optional_settings=(
        ("binlog_transaction_compression", "OFF", "SET GLOBAL binlog_transaction_compression = OFF"),
    ),
)
MYSQL_84 = Flavour(**{**MYSQL_80.__dict__, "status_sql": "SHOW BINARY LOG STATUS"})


def flavour_for(version: str) -> Flavour:
    """``SELECT VERSION()`` -> flavour. MySQL gained SHOW BINARY LOG STATUS in 8.2."""
    if "mariadb" in version.lower():
        return MARIADB
    m = re.match(r"(\d+)\.(\d+)", version)
    major, minor = (int(m.group(1)), int(m.group(2))) if m else (8, 0)
    return MYSQL_84 if (major, minor) >= (8, 2) else MYSQL_80


#: pymysql OperationalError codes of a server that refused or dropped the connection: can't
#: connect through the socket (2002) or TCP (2003), server has gone away (2006), lost connection
#: during a query (2013), server shutdown in progress (1053)
CONNECTION_LOST = frozenset({2002, 2003, 2006, 2013, 1053})


def connection_lost(exc: BaseException) -> bool:
    """``exc`` says the server refused or dropped the connection (nothing listens, it stopped,
    it is failing over, the network between), not that it refused a statement or a login."""
    args = getattr(exc, "args", ())
    return isinstance(exc, pymysql.err.OperationalError) and bool(args) and args[0] in CONNECTION_LOST


class ReplicaStatusDenied(Exception):
    """The role may not run SHOW SLAVE STATUS (it needs SLAVE MONITOR; MySQL REPLICATION CLIENT)."""


_BOOL = lambda v: str(v).lower() in ("1", "true", "yes", "on")  # noqa: E731
_PYMYSQL_EXTRA: dict[str, Callable[[Any], Any]] = {
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
    "ssl_verify_cert": _BOOL,
    "ssl_verify_identity": _BOOL,
    "ssl_disabled": _BOOL,
    "unix_socket": str,
    "read_timeout": int,
    "write_timeout": int,
}


class _Connection(pymysql.connections.Connection):
    """pymysql's connection, sharing one SSL context among the connections that give no TLS
    settings. pymysql then tries TLS if the server offers it ("preferred", verifying nothing)
    and builds that context per connection: ``ssl.create_default_context`` reads the system's
    CA store, 50 ms of CPU each, and a capture, a snapshot's chunk task or verify opens several
    connections. The shared context is the one pymysql builds, built once; explicit TLS settings
    still get their own (certificates, verification)."""

    _preferred: ssl.SSLContext | None = None
    _preferred_lock = threading.Lock()

    def _create_ssl_ctx(self, sslp):
        if sslp != {}:
            return super()._create_ssl_ctx(sslp)
        with _Connection._preferred_lock:
            if _Connection._preferred is None:
                _Connection._preferred = super()._create_ssl_ctx({})
            return _Connection._preferred


class MyServer:
    """Connections to one source's server; shared by the dialect's collaborators."""

    def __init__(self, params: ConnectionParams, source: str, *, connect_timeout: int = 10) -> None:
        self.params = params
        self.source = source
        self.connect_timeout = connect_timeout
        self.lock = threading.RLock()  # one statement at a time on the shared connection
        self._conn: pymysql.connections.Connection | None = None
        self._flavour: Flavour | None = None

    # --- connections ------------------------------------------------------------------
    def driver_settings(self) -> dict[str, Any]:
        """Connection-extra settings pymysql understands (TLS, socket, timeouts)."""
        out: dict[str, Any] = {}
        for k, v in self.params.extra.items():
            if k in _PYMYSQL_EXTRA:
                out[k] = _PYMYSQL_EXTRA[k](v)
        return out

    def connect(self, **kw: Any) -> pymysql.connections.Connection:
        """A new connection; :class:`SourceUnreachableError` when the server refuses or drops
        it (:func:`connection_lost`), any other driver error as it is (a refused login...)."""
        p = self.params
        kw = {**self.driver_settings(), **kw}
        try:
            conn = _Connection(
                host=p.host,
                port=p.port or 3306,
                user=p.user or "root",
                password=p.password or "",
                charset="utf8mb4",
                autocommit=True,
                connect_timeout=self.connect_timeout,
                init_command="SET time_zone = '+00:00'",  # TIMESTAMP reads and writes in UTC
                **kw,
            )
            with conn.cursor() as cur:
                # no statement is ever served from an older REPEATABLE READ snapshot
                # (non-stale chunk reads; with autocommit every statement gets a new read view)
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        except pymysql.err.OperationalError as exc:
            if connection_lost(exc):
                raise self.unreachable(exc) from exc
            raise
        return conn

    def unreachable(self, exc: BaseException) -> SourceUnreachableError:
        """The error for a connection the server refused or dropped: host and port, no
        credentials."""
        p = self.params
        args = getattr(exc, "args", ())
        detail = str(args[1]) if len(args) >= 2 else str(exc)
        return SourceUnreachableError.at(
            f"MySQL/MariaDB at {p.host}:{p.port or 3306}", detail, source=self.source
        )

    @property
    def conn(self) -> pymysql.connections.Connection:
        if self._conn is None or not self._conn.open:
            self._conn = self.connect()
        return self._conn

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        """Run one statement, always through pymysql's %-formatting (an empty tuple without
        params): quoted identifiers carry "%%" for "%" (core/sqlnames.py)."""
        with self.lock:
            try:
                with self.conn.cursor() as cur:
                    cur.execute(sql, tuple(params) if params is not None else ())
                    return list(cur.fetchall())
            except pymysql.err.OperationalError as exc:
                self.close()  # a dead connection is reopened by the next call
                if connection_lost(exc):
                    raise self.unreachable(exc) from exc
                raise

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._conn = None

    def stream_settings(self) -> dict[str, Any]:
        """The binlog stream's connection settings (mysql-replication's ``connection_settings``)."""
        from pymysql.constants import CLIENT

        p = self.params
        settings = {
            "host": p.host,
            "port": p.port or 3306,
            "user": p.user or "root",
            "passwd": p.password or "",
            "charset": "utf8mb4",
            **self.driver_settings(),
        }
        # Without TLS settings pymysql tries TLS if the server offers it, and builds a default SSL
        # context for that on every connection (~20 ms: the system's CA store), offered or not. When
        # this dialect's own connection found no TLS on the server, the stream's two connections
        # would fall back to plain text anyway: skip building it (a fixed cost of every capture).
        if not any(k.startswith("ssl") for k in settings) and not self.conn.server_capabilities & CLIENT.SSL:
            settings["ssl_disabled"] = True
        return settings

    # --- identifiers ------------------------------------------------------------------
    @staticmethod
    def quote_ident(name: str) -> str:
        return quote_mysql(name)  # every statement goes through %-formatting (core/sqlnames.py)

    def quote_table(self, table: TableName) -> str:
        return f"{quote_mysql(table.schema)}.{quote_mysql(table.name)}"

    # --- the server -------------------------------------------------------------------
    @property
    def flavour(self) -> Flavour:
        if self._flavour is None:
            self._flavour = flavour_for(self.query("SELECT VERSION()")[0][0])
        return self._flavour

    def server_id(self) -> int:
        """The server's own ``@@server_id`` (not the capture's replication id)."""
        return int(self.query("SELECT @@server_id")[0][0])

    def binlog_end(self, epoch: int = 0) -> BinlogOffset:
        """The current end of the binlog (file and position), always a transaction boundary;
        ``epoch``: the one capture gives this server's positions."""
        rows = self.query(self.flavour.status_sql)
        if not rows or not rows[0][0]:
            raise SourceError(
                f"{self.flavour.status_sql} returned nothing: binary logging is off on the source "
                f"(start the server with --log-bin; see check_prerequisites())"
            )
        return BinlogOffset.of(rows[0][0], rows[0][1], epoch)

    def gtid(self) -> str | None:
        try:
            return str(self.query(self.flavour.gtid_sql)[0][0] or "") or None
        except pymysql.err.MySQLError:
            return None

    def slave_status(self) -> dict | None:
        """``SHOW SLAVE STATUS``'s row; None when the server is not a replica. Raises
        :class:`ReplicaStatusDenied` when the role may not ask."""
        try:
            with self.lock, self.conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute("SHOW SLAVE STATUS")
                return cur.fetchone()
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in (1227, 1045):
                raise ReplicaStatusDenied(str(exc)) from exc
            raise
