"""PostgreSQL as a source: the dialect reads its options, builds its collaborators (server,
catalog, offsets, watermark_rows, prerequisites, chunks, digests, log; one module each) and
answers the Dialect contract by delegating to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.errors import ConfigurationError, SourceBehindError
from ...core.findings import Finding
from ...core.position import Position
from ...core.schema import TableName
from ...core.sqlnames import quote_pg
from ..base import (
    READ_FLOOR_SNAPSHOT,
    ChunkRead,
    ChunkReadResult,
    ConnectionParams,
    LogActivity,
    TableScan,
    WholeTableRead,
)
from ..composed import ComposedDialect
from .catalog import PgCatalog
from .chunks import DEFAULT_COPY_BATCH_ROWS, PgChunkReader
from .digest import PgDigest
from .log_reader import DEFAULT_CAPTURE_STEP_MESSAGES, PgLogReader
from .offsets import PgOffsets
from .prerequisites import SLOT_NAME_RE, PgPrerequisites, PgSettings, default_object_name
from .server import PgServer
from .watermarks import PgWatermarkTable


class PostgresDialect(ComposedDialect):
    """DBLog on PostgreSQL. Options: ``slot_name``, ``publication_name``, ``tables``
    (the capture scope: list of ``schema.table`` / TableName for the publication; none: no
    capture unless ``all_tables``, the opt-in to FOR ALL TABLES),
    ``on_truncate`` ("event" | "fail" | "skip"), ``read_timeout`` (seconds the server may take to
    decode one read step, default 600), ``capture_step_messages`` (messages per read step,
    default 500,000; see :meth:`PostgresDialect.read_log`),
    ``fast_chunks`` (default True: chunk reads through COPY and Arrow), ``copy_batch_rows``
    (rows per Arrow batch of a COPY chunk read, default 2,000: bounds the chunk step's memory),
    ``capture_decode`` ("batch", default: pgoutput decoded a segment at a time, a column at a time;
    "rows": a message at a time)."""

    # 64 bits of the lock name's md5 (hashtext's 32 bits would make unrelated slots share a lock)
    lock_acquire_sql = "SELECT pg_try_advisory_lock(('x' || left(md5(%s), 16))::bit(64)::bigint)"
    lock_release_sql = "SELECT pg_advisory_unlock(('x' || left(md5(%s), 16))::bit(64)::bigint)"

    def capture_lock_key(self, data_dir: str) -> str:
        """What the capture lock protects: the slot (its confirmed position is the offset), so
        two sources configured with one slot never confirm it past each other's changes."""
        return f"slot.{self.slot_name}"

    watermark_strategies = ("table", "log")
    records_visibility = True
    name = "postgres"
    default_schema = "public"
    row_value_keyset = True
    placeholder = "%s"

    def __init__(self, params: ConnectionParams, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._read_names(self.options)
        self._read_options(self.options)
        self._build_collaborators(params)

    def _read_names(self, o: dict[str, Any]) -> None:
        """The slot's and the publication's names and the capture scope, from the options."""
        self.slot_name = o.get("slot_name") or default_object_name(self.source)
        if not SLOT_NAME_RE.match(self.slot_name):
            raise ConfigurationError(
                f"slot_name {self.slot_name!r} is not a valid replication slot name: use 1-63 "
                "lowercase letters, digits, '_'"
            )
        self.publication_name = o.get("publication_name") or default_object_name(self.source)
        tables = o.get("tables")
        self.tables: list[TableName] | None = (
            None
            if tables is None
            else [t if isinstance(t, TableName) else TableName.parse(str(t), "public") for t in tables]
        )

    def _read_options(self, o: dict[str, Any]) -> None:
        """How the slot is created and read and how chunks are read, from the options, each checked."""
        # PostgreSQL 17+: the slot is created as a failover slot, so that a standby with
        # sync_replication_slots carries it through a promotion (offsets.py ``_create_slot``)
        failover = str(o.get("failover_slot", True)).strip().lower()
        if failover not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ConfigurationError(
                f"source {self.source!r}: connection extra failover_slot must be true or false, got "
                f"{o.get('failover_slot')!r}"
            )
        self.failover_slot = failover in ("true", "1", "yes", "on")
        self.on_truncate = o.get("on_truncate", "event")
        if self.on_truncate not in ("event", "fail", "skip"):
            raise ConfigurationError(
                f"on_truncate must be 'event' (default: stage it, the mirror drops the table's older rows), "
                f"'fail' or 'skip', got {self.on_truncate!r}"
            )
        self.read_timeout = float(o.get("read_timeout", 600))  # seconds one read step may take on the server
        self.capture_step_messages = int(o.get("capture_step_messages", DEFAULT_CAPTURE_STEP_MESSAGES))
        if self.capture_step_messages < 1:
            raise ConfigurationError(
                f"capture_step_messages must be a whole number >= 1, got {self.capture_step_messages!r}"
            )
        # rows per Arrow batch of a COPY chunk read (each batch goes to the Parquet file as
        # soon as it is built): the chunk step's peak memory grows by ~4-5 KB of RSS per batch row
        self.copy_batch_rows = int(o.get("copy_batch_rows", DEFAULT_COPY_BATCH_ROWS))
        self.fast_chunks = str(o.get("fast_chunks", True)).lower() not in ("false", "0", "no")
        # "batch": a segment's row messages decoded together, a column at a time
        # (dialects/postgres/pgbatch.py); "rows": one message at a time (the reference it is tested against)
        self.capture_decode = str(o.get("capture_decode", "batch"))
        if self.capture_decode not in ("batch", "rows"):
            raise ConfigurationError(
                f"capture_decode must be 'batch' (default) or 'rows', got {self.capture_decode!r}"
            )
        # chunks from a hot standby: its connection (the glue resolves the connection extra
        # ``chunk_conn_id`` to it); capture, watermarks and metadata stay on the primary
        self.read_params: ConnectionParams | None = o.get("read_params")

    def _build_collaborators(self, params: ConnectionParams) -> None:
        """The collaborators, each given what it uses (docs/DESIGN.md, "The dialects")."""
        self.server = PgServer(params, self.source, self.read_params)
        self.catalog = PgCatalog(self.server, self.key_columns)
        self.offsets = PgOffsets(
            self.server,
            self.catalog,
            slot_name=self.slot_name,
            publication_name=self.publication_name,
            tables=self.tables,
            failover_slot=self.failover_slot,
            read_timeout=self.read_timeout,
            watermark_tables=self.watermark_tables,
            resync_hint=self._resync_hint(),
        )
        self.watermark_rows = PgWatermarkTable(self.server, self.catalog, self.offsets, self.watermark_table)
        self.prerequisites = PgPrerequisites(
            self.server,
            self.offsets,
            self.watermark_rows,
            all_tables=self.all_tables,
            watermark_tables=self.watermark_tables,
        )
        self.chunks = PgChunkReader(
            self.server,
            self.catalog,
            self.offsets,
            max_replica_lag_seconds=self.max_replica_lag_seconds,
            copy_batch_rows=self.copy_batch_rows,
            batch_max_bytes=self.batch_max_bytes,
        )
        self.digests = PgDigest(self, self.server, self.chunks)
        self.log = PgLogReader(
            self.server,
            self.catalog,
            self.offsets,
            watermark_table=self.watermark_table,
            on_truncate=self.on_truncate,
            read_timeout=self.read_timeout,
            capture_step_messages=self.capture_step_messages,
            capture_decode=self.capture_decode,
            segment_max_bytes=self.segment_max_bytes,
        )

    # --- the collaborators' public faces (callers keep calling the dialect) ----------------
    # connections
    def open_session(self):
        conn = self.server.new_connection()
        conn.autocommit = True
        return conn

    @property
    def conn(self):
        """Autocommit connection for metadata and watermark writes."""
        return self.server.conn

    def _new_connection(self, params: ConnectionParams | None = None, **extra: Any):
        return self.server.new_connection(params, **extra)

    def _read_conn(self):
        return self.server.read_conn()

    # identifiers
    def is_system_schema(self, schema: str) -> bool:
        # the profile's catalogs and its reserved pg_* prefix, the name as written: a quoted
        # "PG_CATALOG" is a schema of its own on PostgreSQL
        return schema in self.system_schemas or schema.startswith(self.profile.system_schema_prefixes)

    def quote_ident(self, name: str) -> str:
        return quote_pg(name)  # every statement goes through %-formatting (core/sqlnames.py)

    # prerequisites
    def read_settings(self) -> PgSettings:
        return self.prerequisites.read_settings()

    def privilege_problems(self, s: PgSettings | None = None) -> list[str]:
        return self.prerequisites.privilege_problems(s)

    def check_snapshot_tables(self, tables: Sequence[TableName]) -> None:
        """Also: a table snapshotted while its changes are not published would lose the changes
        inside its chunk windows, so each must be in the publication (added when the role may:
        the scope, not the conf, chose it) before any watermark of the snapshot is written."""
        super().check_snapshot_tables(tables)
        for table in tables:
            if self.catalog.relation(table) is not None:
                self.refuse_uncapturable([table])
                self.watermark_rows.ensure_published(table)

    # catalog
    def begin_read_only(self) -> None:
        self._query("SET default_transaction_read_only = on")

    def doctor_findings(self) -> list[Finding]:
        from .doctor import findings

        return findings(self)

    def existing_tables(self, tables: Sequence[TableName]) -> dict[TableName, bool]:
        return {t: self._relation(t) is not None for t in tables}

    def _relation(self, table: TableName) -> tuple[int, str] | None:
        return self.catalog.relation(table)

    # watermarks
    @property
    def standby_watermark_problem(self) -> str:
        return self.watermark_rows.standby_watermark_problem

    # chunks
    @property
    def read_snapshot_hook(self):
        """Tests only: see PgChunkReader.read_snapshot_hook."""
        return self.chunks.read_snapshot_hook

    @read_snapshot_hook.setter
    def read_snapshot_hook(self, hook) -> None:
        self.chunks.read_snapshot_hook = hook

    def read_whole_table(self, request: TableScan) -> WholeTableRead:
        return self.chunks.read_whole(request, self.whole_table_query(request.schema))

    def read_chunk(self, request: ChunkRead) -> ChunkReadResult:
        """DBLog step 2 through COPY (PgChunkReader.read_chunk); option ``fast_chunks=False``
        uses the generic path (dialects/reads.py)."""
        if not self.fast_chunks:
            return super().read_chunk(request)
        sql, params = self.chunk_query_of(request)
        return self.chunks.read_chunk(request.schema, sql, params, request.path)

    def read_floor(self) -> Position | None:
        return self.chunks.read_floor()

    def read_no_older_than(self, position: Position, why: str = READ_FLOOR_SNAPSHOT) -> None:
        self.chunks.read_no_older_than(position, why)

    # offsets: slot and publication
    @property
    def on_standby(self) -> bool:
        return self.server.on_standby

    @property
    def server_version(self) -> int:
        return self.server.server_version

    def wal_geometry(self) -> tuple[int, int]:
        return self.server.wal_geometry()

    def load_offset(self, data_dir: str) -> str:
        """The slot's confirmed position (PgOffsets.load_offset), once the capture scope is
        configured and capturable: nothing is created on the source before."""
        self.require_capture_scope()
        self.refuse_uncapturable(self.tables or ())
        return self.offsets.load_offset(
            data_dir, check_prerequisites=self.check_prerequisites, prepare_watermarks=self.prepare_watermarks
        )

    def ensure_publication(self) -> None:
        self.require_capture_scope()
        self.offsets.ensure_publication()

    def standby_publication_problem(self, tables: Sequence[TableName] | None = None) -> str | None:
        return self.offsets.standby_publication_problem(tables)

    def server_identity(self) -> dict:
        return self.offsets.server_identity()

    def mark_position(self) -> Position:
        return self.offsets.mark_position()

    def log_activity(self, data_dir: str) -> LogActivity | None:
        return self.offsets.log_activity()

    def wal_keep_limit_mb(self) -> int:
        return self.offsets.wal_keep_limit_mb()

    def unbounded_wal_warning(self) -> str:
        return self.offsets.unbounded_wal_warning()

    def drop_slot(self, timeout: float = 10.0) -> bool:
        return self.offsets.drop_slot(timeout)

    def drop_publication(self) -> bool:
        return self.offsets.drop_publication()

    def publication_exists(self) -> bool:
        return bool(self._query("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication_name,)))

    def held_objects(self, data_dir: str) -> list[str]:
        """What the source holds on its server now, in words (PgOffsets.held)."""
        return self.offsets.held()

    def visibility(self) -> str | None:
        return self.offsets.visibility()

    def settle_running_transactions(self, timeout_seconds: float = 300.0) -> None:
        """Wait until every transaction older than now has ended (its xid is below the oldest a
        new snapshot still sees running): one that changed a table before the table joined the
        publication commits in no log the slot decodes, and must be in the load's snapshot."""
        import time

        horizon = int(self.server.query("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")[0][0])
        deadline = time.monotonic() + timeout_seconds
        while True:
            oldest = int(self.server.query("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")[0][0])
            if oldest >= horizon:
                return
            if time.monotonic() >= deadline:
                who = self.server.query(
                    "SELECT pid, state, now() - xact_start FROM pg_stat_activity WHERE backend_xid IS NOT "
                    "NULL AND backend_xid::text::bigint < %s ORDER BY xact_start LIMIT 3",
                    (horizon & 0xFFFFFFFF,),
                )
                raise SourceBehindError(
                    f"source {self.source!r}: transactions older than the load "
                    f"({who or 'not visible to this role'}: pid, state, age) did not end within "
                    f"{timeout_seconds:.0f} s; a load waits for them so that none of their changes is "
                    "lost. End them, or load again later"
                )
            time.sleep(0.05)

    # the log: read_log (composed.py)
