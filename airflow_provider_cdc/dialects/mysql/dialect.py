"""MySQL and MariaDB as a source: the dialect reads its options, builds its collaborators (server,
catalog, watermark_rows, prerequisites, failover, log with its xa, offsets, chunks, digests; one
module each) and answers the Dialect contract by delegating to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pymysql
import pymysql.cursors

from ...core.errors import ConfigurationError
from ...core.findings import Finding
from ...core.ranges import ChunkRange
from ...core.schema import TableName, TableSchema, split_table_list
from ...core.sqlnames import quote_mysql
from ..base import ConnectionParams, LogActivity
from ..composed import ComposedDialect
from .binlog import BinlogOffset
from .catalog import MyCatalog
from .chunks import MyChunkReader
from .digest import MyDigest
from .failover import MyFailover
from .log_reader import MyLogReader
from .offsets import MyOffsets
from .prerequisites import MyPrerequisites
from .profile import default_server_id
from .server import Flavour, MyServer
from .watermarks import MyWatermarkTable


class MySqlDialect(ComposedDialect):
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
        return f"offset.{self.offset_path(data_dir)}"

    name: ClassVar[str] = "mysql"
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
            raise ConfigurationError(
                f"on_unreadable must be 'fail' (default) or 'skip', got {self.on_unreadable!r}"
            )
        tables = self.options.get("tables")
        if isinstance(tables, str):  # "db.a,db.b" or a JSON list
            tables = split_table_list(tables, "dialect option 'tables'")
        self.tables: frozenset[TableName] | None = (
            None
            if tables is None
            else frozenset(t if isinstance(t, TableName) else TableName.parse(str(t)) for t in tables)
        )
        # the collaborators, each given what it uses (docs/DESIGN.md, "The dialects")
        self.server = MyServer(
            params, self.source, connect_timeout=int(self.options.get("connect_timeout", 10))
        )
        self.catalog = MyCatalog(self.server, self.key_columns)
        self.watermark_rows = MyWatermarkTable(self.server, self.watermark_table)
        self.prerequisites = MyPrerequisites(
            self.server,
            tables=self.tables,
            watermark_table=self.watermark_table,
            watermark_tables=self.watermark_tables,
        )
        self.failover = MyFailover(
            self.server, capture_server_id=self.server_id, resync_hint=self._resync_hint()
        )
        self.log = MyLogReader(
            self.server,
            source=self.source,
            watermark_table=self.watermark_table,
            tables=self.tables,
            key_columns=self.key_columns,
            capture_server_id=self.server_id,
            on_truncate=self.on_truncate,
            on_unreadable=self.on_unreadable,
            rows_decoder=self.options.get("rows_decoder"),
            segment_max_events=self.segment_max_events,
            segment_max_bytes=self.segment_max_bytes,
            require_scope=self.require_capture_scope,
        )
        self.offsets = MyOffsets(self.server, self.failover, self.log.xa)
        self.chunks = MyChunkReader(self.server, self.offsets)
        self.digests = MyDigest(self, self.server)

    # --- the collaborators' public faces (callers keep calling the dialect) ----------------
    # connections
    def _driver_settings(self) -> dict[str, Any]:
        return self.server.driver_settings()

    def open_session(self) -> pymysql.connections.Connection:
        return self.server.connect()

    @property
    def conn(self) -> pymysql.connections.Connection:
        return self.server.conn

    def begin_read_only(self) -> None:
        self._query("SET SESSION TRANSACTION READ ONLY")

    def server_label(self) -> str:
        return self.flavour.name

    def doctor_findings(self) -> list[Finding]:
        from .doctor import findings

        return findings(self)

    def existing_tables(self, tables: Sequence[TableName]) -> dict[TableName, bool]:
        from .doctor import existing_tables

        return existing_tables(self, list(tables))

    @property
    def flavour(self) -> Flavour:
        return self.server.flavour

    def quote_ident(self, name: str) -> str:
        return quote_mysql(name)  # every statement goes through %-formatting (core/sqlnames.py)

    # prerequisites
    def replica_problems(self) -> list[str]:
        return self.prerequisites.replica_problems()

    def replica_of(self) -> str | None:
        return self.prerequisites.replica_of()

    def slave_status(self) -> dict | None:
        return self.server.slave_status()

    def privilege_problems(self, grants: Sequence[str]) -> list[str]:
        return self.prerequisites.privilege_problems(grants)


    # chunks (the rest: composed.py)
    def chunk_query(
        self,
        schema: TableSchema,
        rng: ChunkRange,
        *,
        after_key,
        limit,
        where=None,
        columns=None,
        upper_bound=None,
    ):
        """The shared keyset SELECT, with FLOAT columns widened to DOUBLE (MyChunkReader.widen_floats)."""
        sql, params = super().chunk_query(
            schema,
            rng,
            after_key=after_key,
            limit=limit,
            where=where,
            columns=columns,
            upper_bound=upper_bound,
        )
        return self.chunks.widen_floats(schema, sql, columns), params

    def whole_table_query(self, schema: TableSchema) -> str:
        return self.chunks.widen_floats(schema, super().whole_table_query(schema), None)

    # offsets and the server behind them
    def binlog_end(self, epoch: int = 0) -> BinlogOffset:
        return self.server.binlog_end(epoch)

    def offset_path(self, data_dir: str) -> str:
        return self.offsets.offset_path(data_dir)

    def bind_data_dir(self, data_dir: str) -> None:
        self.offsets.bind_data_dir(data_dir)

    def server_epoch(self, server_id: int) -> int:
        return self.offsets.server_epoch(server_id)

    def server_identity(self) -> dict:
        return self.failover.server_identity()

    def load_offset(self, data_dir: str) -> str:
        """The committed offset (MyOffsets.load_offset), once the capture scope is configured and
        capturable."""
        self.require_capture_scope()
        self.refuse_uncapturable(sorted(self.tables or ()))
        return self.offsets.load_offset(data_dir)

    def log_activity(self, data_dir: str) -> LogActivity | None:
        return self.offsets.log_activity(data_dir)

    # the log: read_log (composed.py)

    stream_max_bytes = True
