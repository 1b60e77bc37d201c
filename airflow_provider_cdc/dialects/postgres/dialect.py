"""PostgreSQL as a source: the dialect class, its connections and session (docs/DESIGN.md,
"PostgreSQL"). Each capability is a mixin in its own module: prerequisites, catalog,
watermarks, chunks, offsets (slot and publication), log_reader (the logical stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.errors import ConfigurationError, SourceError
from ...core.position import Position
from ...core.schema import TableName, TableSchema
from ...core.sqlnames import quote_pg
from ..base import ConnectionParams, Dialect
from .catalog import PgCatalog
from .chunks import DEFAULT_COPY_BATCH_ROWS, PgChunkReader
from .digest import PgDigest
from .log_reader import DEFAULT_CAPTURE_STEP_MESSAGES, PgLogReader
from .offsets import PgOffsets
from .prerequisites import APPLICATION_NAME, SLOT_NAME_RE, PgPrerequisites, default_object_name
from .types import SESSION_OPTIONS, PgType, pg_message
from .watermarks import PgWatermarks


class PostgresDialect(PgPrerequisites, PgCatalog, PgWatermarks, PgChunkReader, PgDigest, PgOffsets, PgLogReader,
                      Dialect):
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
    system_schemas = frozenset({"pg_catalog", "information_schema", "pg_toast"})
    default_schema = "public"
    row_value_keyset = True
    placeholder = "%s"

    def __init__(self, params: ConnectionParams, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        o = self.options
        self.slot_name = o.get("slot_name") or default_object_name(self.source)
        if not SLOT_NAME_RE.match(self.slot_name):
            raise ConfigurationError(
                f"slot_name {self.slot_name!r} is not a valid replication slot name: use 1-63 lowercase letters, digits, '_'"
            )
        self.publication_name = o.get("publication_name") or default_object_name(self.source)
        tables = o.get("tables")
        self.tables: list[TableName] | None = (
            None
            if tables is None
            else [t if isinstance(t, TableName) else TableName.parse(str(t), "public") for t in tables]
        )
        # PostgreSQL 17+: the slot is created as a failover slot, so that a standby with
        # sync_replication_slots carries it through a promotion (offsets.py ``_create_slot``)
        failover = str(o.get("failover_slot", True)).strip().lower()
        if failover not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ConfigurationError(f"source {self.source!r}: connection extra failover_slot must be true or false, got "
                                     f"{o.get('failover_slot')!r}")
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
        # (dialects/pgbatch.py); "rows": one message at a time (the reference it is tested against)
        self.capture_decode = str(o.get("capture_decode", "batch"))
        if self.capture_decode not in ("batch", "rows"):
            raise ConfigurationError(f"capture_decode must be 'batch' (default) or 'rows', got {self.capture_decode!r}")
        # chunks from a hot standby: its connection (the glue resolves the connection extra
        # ``chunk_conn_id`` to it); capture, watermarks and metadata stay on the primary
        self.read_params: ConnectionParams | None = o.get("read_params")
        self._conn = None
        self._rconn = None
        self._read_floor: Position | None = None  # chunks from a standby: no older than this
        self._read_upto: int | None = None  # the end a read that stopped at its step bound reads on towards
        self._types: dict[int, PgType] = {}
        self._key_cache: dict[tuple[int, str], tuple[tuple[str, ...] | None, str]] = {}  # (relid, identity) -> _table_key
        self._decoders_cache: dict = {}
        self._last_schema: TableSchema | None = None
        self._last_decoders: tuple = ()
        self._watermark_ready = False

    # --- connections ------------------------------------------------------------------
    def _connect_kwargs(self, params: ConnectionParams | None = None) -> dict[str, Any]:
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

    def _new_connection(self, params: ConnectionParams | None = None, **extra: Any):
        import psycopg2

        p = params or self.params
        try:
            return psycopg2.connect(**self._connect_kwargs(p), **extra)
        except psycopg2.OperationalError as exc:
            raise SourceError(
                f"cannot connect to PostgreSQL at {p.host}:{p.port}/{p.database}: {str(exc).strip()}"
            ) from exc

    def open_session(self):
        conn = self._new_connection()
        conn.autocommit = True
        return conn

    @property
    def conn(self):
        """Autocommit connection for metadata and watermark writes."""
        if self._conn is None or self._conn.closed:
            self._conn = self._new_connection()
            self._conn.autocommit = True
        return self._conn

    def _read_conn(self):
        """Connection for chunk reads: REPEATABLE READ (a chunk's snapshot is recorded by its first
        statement and read by the next, core/visibility.py), every value returned as its text."""
        if self._rconn is None or self._rconn.closed:
            import psycopg2.extensions as ext

            c = self._new_connection(self.read_params)
            c.set_session(isolation_level=ext.ISOLATION_LEVEL_REPEATABLE_READ, readonly=True, autocommit=False)
            oids = tuple(set(ext.string_types) | set(getattr(ext, "binary_types", {})))
            ext.register_type(ext.new_type(oids, "CDC_RAW_TEXT", lambda value, cur: value), c)
            self._rconn = c
        return self._rconn

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        import psycopg2

        try:
            with self.conn.cursor() as cur:
                cur.execute(sql, tuple(params))
                return cur.fetchall() if cur.description else []
        except psycopg2.Error as exc:
            raise SourceError(f"PostgreSQL rejected a statement: {pg_message(exc)}\nSQL: {sql}") from exc

    def close(self) -> None:
        for c in (self._conn, self._rconn):
            if c is not None and not c.closed:
                c.close()
        self._conn = self._rconn = None

    # --- identifiers ------------------------------------------------------------------
    def is_system_schema(self, schema: str) -> bool:
        return schema in self.system_schemas or schema.startswith("pg_")  # pg_* is reserved to the server

    def quote_ident(self, name: str) -> str:
        return quote_pg(name)  # every statement goes through %-formatting (core/sqlnames.py)

    def _qlist(self, tables: Sequence[TableName]) -> str:
        return ", ".join(self.quote_table(t) for t in tables)
