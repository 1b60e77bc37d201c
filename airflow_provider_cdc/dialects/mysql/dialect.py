"""MySQL and MariaDB as a source: the dialect class, its connections and flavour (docs/DESIGN.md,
"MySQL and MariaDB"). Each capability is a mixin in its own module: prerequisites, catalog,
watermarks, chunks, offsets (binlog coordinates), failover (another server behind the source),
log_reader (the binlog), xa.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pymysql
import pymysql.cursors

from ...core.errors import ConfigurationError
from ...core.schema import TableName, TableSchema, split_table_list
from ...core.sqlnames import quote_mysql
from ..base import ConnectionParams, Dialect
from .catalog import MyCatalog
from .chunks import MyChunkReader
from .digest import MyDigest
from .failover import MyFailover
from .log_reader import MyLogReader
from .offsets import MyOffsets
from .prerequisites import SYSTEM_SCHEMAS, Flavour, MyPrerequisites, flavour_for
from .profile import default_server_id
from .watermarks import MyWatermarks
from .xa import MyXa

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


class MySqlDialect(MyPrerequisites, MyCatalog, MyWatermarks, MyChunkReader, MyDigest, MyOffsets, MyFailover, MyLogReader,
                   MyXa, Dialect):
    """MySQL / MariaDB source. Options: ``server_id`` (replication id of the capture,
    default derived from the source name; must be unique among the server's replicas
    and readers), ``tables`` (``schema.table`` ids to capture; default every table with
    a primary key outside the system schemas and the watermark database), ``connect_timeout``,
    ``on_truncate`` ("event" (default): a TRUNCATE TABLE statement of a captured table is
    staged as an event ``op = "t"`` at its binlog position, and the mirror drops every row of
    the table older than it; "fail": capture stops naming the statement; "skip": a warning),
    ``watermark_strategy`` ("table" (default): watermark rows; "log": MariaDB only, nothing
    written, each chunk read in a consistent snapshot at a binlog position)."""

    lock_acquire_sql = "SELECT GET_LOCK(%s, 0)"
    lock_release_sql = "SELECT RELEASE_LOCK(%s)"
    watermark_strategies: ClassVar[tuple[str, ...]] = ("table", "log")

    def capture_lock_key(self, data_dir: str) -> str:
        """What the capture lock protects: the staged offset file (the binlog is only read, and
        the server keeps no per-reader state; readers are told apart by their server_id)."""
        return f"offset.{self._offset_path(data_dir)}"

    name: ClassVar[str] = "mysql"
    system_schemas: ClassVar[frozenset[str]] = SYSTEM_SCHEMAS
    # MariaDB's optimizer does not turn ``(a, b) > (?, ?)`` into an index range; the
    # expanded OR form is a range scan on both MariaDB and MySQL.
    row_value_keyset: ClassVar[bool] = False

    def __init__(self, params: ConnectionParams, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        sid = self.options.get("server_id")
        self.server_id = int(sid) if sid is not None else default_server_id(self.source)
        if not 1 <= self.server_id < 2**32:
            raise ConfigurationError(f"server_id must be in 1..4294967295, got {self.server_id}")
        self.on_truncate = self.options.get("on_truncate", "event")
        if self.on_truncate not in ("event", "fail", "skip"):
            raise ConfigurationError(
                f"on_truncate must be 'event' (default: stage it, the mirror drops the table's older rows), "
                f"'fail' or 'skip', got {self.on_truncate!r}"
            )
        # a binlog event whose changes capture cannot read (statement-logged DML, an XA COMMIT of
        # a prepare never read, compressed or incident events): "fail" stops naming it; "skip",
        # set for one run once the tables it changed are re-snapshotted, warns and passes it
        self.on_unreadable = self.options.get("on_unreadable", "fail")
        if self.on_unreadable not in ("fail", "skip"):
            raise ConfigurationError(f"on_unreadable must be 'fail' (default) or 'skip', got {self.on_unreadable!r}")
        tables = self.options.get("tables")
        if isinstance(tables, str):  # "db.a,db.b" or a JSON list
            tables = split_table_list(tables, "dialect option 'tables'")
        self.tables: frozenset[TableName] | None = (
            None
            if tables is None
            else frozenset(t if isinstance(t, TableName) else TableName.parse(str(t)) for t in tables)
        )
        self._conn: pymysql.connections.Connection | None = None
        self._flavour: Flavour | None = None
        self._lock = threading.RLock()
        self._converters: dict[int, tuple[TableSchema, list]] = {}
        self._replica_status_denied = False  # SHOW SLAVE STATUS refused once: replica lag is not shown

    # --- connections ------------------------------------------------------------------
    def _driver_settings(self) -> dict[str, Any]:
        """Connection-extra settings pymysql understands (TLS, socket, timeouts)."""
        out: dict[str, Any] = {}
        for k, v in self.params.extra.items():
            if k in _PYMYSQL_EXTRA:
                out[k] = _PYMYSQL_EXTRA[k](v)
        return out

    def _connect(self, **kw: Any) -> pymysql.connections.Connection:
        p = self.params
        kw = {**self._driver_settings(), **kw}
        conn = pymysql.connect(
            host=p.host,
            port=p.port or 3306,
            user=p.user or "root",
            password=p.password or "",
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=int(self.options.get("connect_timeout", 10)),
            init_command="SET time_zone = '+00:00'",  # TIMESTAMP reads and writes in UTC
            **kw,
        )
        with conn.cursor() as cur:
            # no statement is ever served from an older REPEATABLE READ snapshot
            # (non-stale chunk reads; with autocommit every statement gets a new read view)
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn

    def open_session(self) -> pymysql.connections.Connection:
        return self._connect()

    @property
    def conn(self) -> pymysql.connections.Connection:
        if self._conn is None or not self._conn.open:
            self._conn = self._connect()
        return self._conn

    def _query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        """Run one statement, always through pymysql's %-formatting (an empty tuple without
        params): quoted identifiers carry "%%" for "%" (core/sqlnames.py)."""
        with self._lock:
            try:
                with self.conn.cursor() as cur:
                    cur.execute(sql, tuple(params) if params is not None else ())
                    return list(cur.fetchall())
            except pymysql.err.OperationalError:
                self.close()  # a dead connection is reopened by the next call
                raise

    @property
    def flavour(self) -> Flavour:
        if self._flavour is None:
            self._flavour = flavour_for(self._query("SELECT VERSION()")[0][0])
        return self._flavour

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._conn = None

    # --- identifiers ------------------------------------------------------------------
    def quote_ident(self, name: str) -> str:
        return quote_mysql(name)  # every statement goes through %-formatting (core/sqlnames.py)

    stream_max_bytes = True
