"""What DBLog needs from a database, and the parts every dialect shares.

A dialect implements identifier quoting, metadata, the watermark table, streaming a
query, converting a driver row to canonical values, and reading the changelog from an
opaque offset to the current end. The shared parts here build the chunk SQL, stream a
chunk to Parquet, and run capture in the order invariant I6 demands: read, stage, then
commit the offset.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from ..core.errors import ConfigurationError
from ..core.findings import ERROR, OK, Finding
from ..core.planning import validate_where as _core_validate_where
from ..core.position import Position
from ..core.row_digest import DIGEST_NULL, DIGEST_SIZED  # noqa: F401 - the dialects' SQL builds them
from ..core.schema import TableName, TableSchema, parse_key_columns
from ..core.scope import CaptureScope, no_scope_error
from .digests import Digests
from .profile import DatabaseProfile
from .reads import SharedReads
from .registry import get_profile
from .requests import ChunkRead, LogRead, TableScan  # noqa: F401 - their home for the dialects and callers
from .results import (  # noqa: F401 - their home for the dialects and callers
    READ_FLOOR_MIRROR,
    READ_FLOOR_SNAPSHOT,
    CaptureResult,
    ChunkReadResult,
    ConnectionParams,
    LogActivity,
    LogBatch,
    LogRetention,
    ReadSnapshot,
    SegmentSink,
    WholeTableRead,
    value_bytes,
)
from .watermark_strategy import STRATEGIES, WATERMARK_STRATEGIES, WatermarkStrategy

log = logging.getLogger(__name__)

DEFAULT_FETCH_BATCH_ROWS = 2_000
#: bytes of values one chunk batch may hold before it is typed and written (the driver rows
#: of a generic chunk read, the COPY text of a PostgreSQL one), next to the row count
#: (``fetch_batch_rows`` / ``copy_batch_rows``): a batch of rows holding large values is
#: flushed early, so a chunk step's memory follows the values, not rows x the largest value
DEFAULT_BATCH_MAX_BYTES = 64 * 1024 * 1024
#: events per staged changelog segment (at ~3-5 KB per event in memory before staging,
#: this bounds a capture's memory; 0 or None: one segment per capture run)
DEFAULT_SEGMENT_MAX_EVENTS = 20_000
#: bytes of log messages (as the source sent them) one segment may hold before a transaction
#: larger than that is cut inside (see Dialect.read_log): memory follows this, never a transaction
DEFAULT_SEGMENT_MAX_BYTES = 32 * 1024 * 1024


# verify's digest forms: core/row_digest.py (the dialects build the same text in SQL)


class Dialect(SharedReads, ABC):
    """One source database, as the package uses it. The contract its callers (every module
    outside ``dialects/``) use, by capability; a caller uses nothing else of a dialect, and each
    name here has a caller (tests/unit/test_dialect_contract.py holds both):

    ============  ==========================================================================
    the source    name, source, params, profile, watermark_table, open_session, close,
                  server_label, lock_acquire_sql, lock_release_sql
    its scope     scope_tables, capture_scope, check_in_scope, check_snapshot_tables,
                  require_capture_scope, scope_problems, existing_tables
    its checks    check_prerequisites, doctor_findings, begin_read_only
    its tables    describe_table, render_filter, max_key, sample_keys, key_ranks,
                  settle_running_transactions
    chunk reads   chunk_query, read_chunk, read_whole_table, stream_query, row_to_canonical,
                  batch_max_bytes, max_replica_lag_seconds, replica_lag
    windows       watermarks, prepare_watermarks, mark, mark_position, visibility, read_floor,
                  read_no_older_than, server_identity
    verify        digests (dialects/digests.py)
    the log       load_offset, read_log, commit_offset, current_position, offset_position,
                  log_bytes_between, segment_max_events, log_retention, log_activity
    held objects  slot_name, publication_name, offset_path, bind_data_dir, capture_lock_key,
                  held_objects, drop_slot, drop_publication, publication_exists,
                  wal_keep_limit_mb, unbounded_wal_warning
    ============  ==========================================================================

    Its other members serve a dialect's author: the hooks this module and the collaborators
    call (quote_ident, to_db_value, ensure_watermark_table, write_watermark, whole_table_query,
    ...), each abstract or with a default here."""

    name: ClassVar[str]
    #: row-value keyset comparison ``(a, b) > (?, ?)``; False -> expanded OR form
    row_value_keyset: ClassVar[bool] = True
    placeholder: ClassVar[str] = "%s"
    #: session-level lock statements (one bound parameter: the lock name) for the capture
    #: lock (pipeline/locks.py); released by the server when the session ends
    lock_acquire_sql: ClassVar[str]
    lock_release_sql: ClassVar[str]
    #: :meth:`stream_query` takes ``max_bytes`` (a batch ends once its rows' values reach it,
    #: :func:`value_bytes`): the generic chunk read then bounds its batches in bytes too
    stream_max_bytes: ClassVar[bool] = False

    def __init__(
        self,
        params: ConnectionParams,
        *,
        source: str = "default",
        watermark_schema: str = "cdc",
        watermark_table: str = "watermark",
        **options: Any,
    ) -> None:
        self.params = params
        self.source = source
        self.watermark_table = TableName(watermark_schema, watermark_table)
        self.options = options
        # the capture scope (the docs' security page): the tables a source captures, or every table
        # of the database only on an explicit opt-in; neither: nothing is captured
        self.all_tables = str(options.get("all_tables", False)).lower() in ("1", "true", "yes", "on")
        # the key of scope tables without a primary key (CDC_KEY_COLUMNS), by table
        self.key_columns: dict[TableName, tuple[str, ...]] = {
            t if isinstance(t, TableName) else TableName.parse(str(t), self.default_schema): tuple(cols)
            for t, cols in parse_key_columns(options.get("key_columns"), "CDC_KEY_COLUMNS").items()
        }
        # driver rows fetched per batch of a generic chunk read: each batch becomes Python
        # objects, JSON and Arrow before it is written, so it sets the chunk step's peak
        self.fetch_batch_rows = int(options.get("fetch_batch_rows", DEFAULT_FETCH_BATCH_ROWS))
        # ... and bytes of values per batch (a generic read through a dialect whose
        # stream_query takes ``max_bytes``; PostgreSQL's COPY chunk read)
        self.batch_max_bytes = int(options.get("batch_max_bytes", DEFAULT_BATCH_MAX_BYTES))
        if self.batch_max_bytes < 1:
            raise ConfigurationError(f"batch_max_bytes must be >= 1, got {options.get('batch_max_bytes')!r}")
        # chunks read from a replica (PostgreSQL: a hot standby named by ``chunk_conn_id``; MariaDB:
        # a source that is itself a replica): one further behind than this pauses the snapshot
        try:
            self.max_replica_lag_seconds = float(options.get("max_replica_lag_seconds", 300))
        except (TypeError, ValueError):
            self.max_replica_lag_seconds = -1.0
        if not 0 < self.max_replica_lag_seconds < float("inf"):
            raise ConfigurationError(
                f"source {source!r}: max_replica_lag_seconds must be a number of seconds > 0, "
                f"got {options.get('max_replica_lag_seconds')!r}"
            )
        seg = options.get("segment_max_events", DEFAULT_SEGMENT_MAX_EVENTS)
        self.segment_max_events = int(seg) if seg not in (None, "", "None") else 0
        if self.segment_max_events < 0:
            raise ConfigurationError(f"segment_max_events must be >= 0 (0: no limit), got {seg!r}")
        self.segment_max_bytes = int(options.get("segment_max_bytes", DEFAULT_SEGMENT_MAX_BYTES))
        if self.segment_max_bytes < 1024:
            raise ConfigurationError(f"segment_max_bytes must be >= 1024, got {self.segment_max_bytes!r}")
        # how a chunk's window is bounded (docs/DESIGN.md, "Watermarks without writes"): "table"
        # writes watermark rows (DBLog), "log" writes nothing and reads positions instead
        strategy = str(options.get("watermark_strategy") or "table").strip().lower()
        if strategy not in WATERMARK_STRATEGIES:
            raise ConfigurationError(
                f"source {source!r}: watermark_strategy must be one of "
                f"{', '.join(WATERMARK_STRATEGIES)}, got "
                f"{options.get('watermark_strategy')!r}"
            )
        if strategy not in self.watermark_strategies:
            raise ConfigurationError(
                f"source {source!r}: watermark_strategy {strategy!r} is not available for "
                f"{type(self).__name__} yet ({self.log_watermarks_missing}); use 'table'"
            )
        #: the one choice of strategy: every window, mark and grant check asks this object
        self.watermarks: WatermarkStrategy = STRATEGIES[strategy](self)
        #: verify's SQL (dialects/digests.py); this one computes none, a database's replaces it
        self.digests: Digests = Digests(self)

    # --- connections ------------------------------------------------------------------
    @abstractmethod
    def open_session(self) -> Any:
        """A new autocommit DB-API connection built from this dialect's connection settings
        (TLS and every other extra kept), owned by the caller."""

    # --- identifiers ------------------------------------------------------------------
    @abstractmethod
    def quote_ident(self, name: str) -> str: ...

    def quote_table(self, table: TableName) -> str:
        return f"{self.quote_ident(table.schema)}.{self.quote_ident(table.name)}"

    @property
    def profile(self) -> DatabaseProfile:
        """This database's profile (dialects/registry.py, by the dialect's name): what is known
        of it before connecting, its system catalogs and row-filter rules among them."""
        return get_profile(self.name)

    def render_filter(self, where: str, schema: TableSchema, setting: str = "where") -> tuple[str, list]:
        """A snapshot's row filter as ``(sql, params)`` for this dialect (its profile's
        ``filter_rules``), checked against the table's columns (core/filters.py: untrusted
        input, never pasted into SQL)."""
        from ..core.filters import render_filter

        rules, columns = self.profile.filter_rules, schema.column_names
        return render_filter(where, rules, setting=f"{setting} of {schema.table}", columns=columns)

    # --- capture scope (the docs' security page) ---------------------------------------------
    #: the schema of a table named without one (None: a schema must be given)
    default_schema: ClassVar[str | None] = None

    @property
    def system_schemas(self) -> frozenset[str]:
        """Schemas of the server's own catalogs (its profile's): never captured, never snapshotted."""
        return self.profile.system_schemas

    def is_system_schema(self, schema: str) -> bool:
        return self.profile.is_system_schema(schema)

    def scope_tables(self) -> tuple[TableName, ...] | None:
        """The configured tables (None: not configured; every table only with ``all_tables``)."""
        tables = getattr(self, "tables", None)
        return None if tables is None else tuple(tables)

    def require_capture_scope(self) -> None:
        """Refuse to capture (or to create anything on the source) until a scope is configured:
        a database-wide publication breaks UPDATE and DELETE on tables without a replica
        identity, and a binlog read of every database copies what nobody chose to copy."""
        tables = self.scope_tables()
        if self.all_tables:
            return
        if not tables:
            raise no_scope_error(self.source)
        system = [t for t in tables if self.is_system_schema(t.schema)]
        if system:
            raise ConfigurationError(
                f"source {self.source!r}: CDC_TABLES names system table(s) "
                f"{', '.join(map(str, system))}; the "
                f"server's catalogs ({', '.join(sorted(self.system_schemas))}) are never captured: "
                "remove them"
            )
        outside = sorted(t for t in self.key_columns if t not in set(tables))
        if outside:
            raise ConfigurationError(
                f"source {self.source!r}: CDC_KEY_COLUMNS names {', '.join(map(str, outside))}, which "
                "CDC_TABLES does "
                "not capture: add the table to CDC_TABLES, or remove it from CDC_KEY_COLUMNS (names "
                "are case-sensitive)"
            )

    def refuse_uncapturable(self, tables: Sequence[TableName]) -> None:
        """Before anything is created or published: every table of the scope has a key the log
        carries (PostgreSQL: one its UPDATEs and DELETEs publish; a table without one would break
        the applications that update it once published). Otherwise the whole scope is refused,
        naming each such table and the statements that would fix it."""
        problems = self.scope_problems(tables)
        if problems:
            raise ConfigurationError(
                f"source {self.source!r}: CDC_TABLES names table(s) that cannot be captured; nothing "
                "was created or "
                "published on the source:\n"
                + "\n".join(f"- {p}" for p in problems)
                + "\nor remove them from CDC_TABLES (a table without any key can be refreshed whole instead: "
                "CDC_REFRESH_TABLES, docs: operations, 'Tables without a primary key')"
            )

    def _resync_hint(self) -> str:
        """What a SourceChangedError (I14) tells the user to do."""
        return (
            f"To go on without a full re-snapshot, run: airflow-cdc resync --source {self.source} (it "
            "records the "
            "gap in the event log, starts capture anew on this server, and re-reads only the key "
            "ranges whose rows "
            "differ; docs: operations, 'Failover')"
        )

    def scope_problems(self, tables: Sequence[TableName]) -> list[str]:
        """Why each of ``tables`` cannot be captured, one sentence each with its fix (missing
        tables are left to the checks that name them)."""
        return []

    def capture_scope(self) -> CaptureScope:
        """This source's scope (core/scope.py): the one check snapshot, verify, repair, export
        and the CDC page go through (I15), with this server's catalogs and watermark table."""
        return CaptureScope.of(
            self.source,
            self.scope_tables(),
            catalogs=self.profile.system_catalogs,
            all_tables=self.all_tables,
            watermark_table=self.watermark_table,
        )

    def check_in_scope(self, tables: Sequence[TableName]) -> None:
        """Every one of ``tables`` may be read (:meth:`capture_scope`); nothing is read to tell."""
        self.require_capture_scope()
        self.capture_scope().check_all(tables)

    def check_snapshot_tables(self, tables: Sequence[TableName]) -> None:
        """A snapshot's tables (a DAG-run conf: untrusted) may narrow the capture scope, never
        widen it. Each is checked before anything is written: not a system table, not the
        watermark table, inside the scope (:meth:`check_in_scope`), readable by the role."""
        self.check_in_scope(tables)
        for table in tables:
            self.check_readable(table)

    @abstractmethod
    def check_readable(self, table: TableName) -> None:
        """Raise SourceError naming the grant when the connection's role cannot SELECT ``table``
        (a missing table is left to :meth:`describe_table`, which names it)."""

    def settle_running_transactions(self, timeout_seconds: float = 300.0) -> None:  # noqa: B027 - optional
        """Before a multiset table's load (pipeline/multiset.py): wait until every transaction
        running now has ended, where a transaction that wrote the table before capture began to
        carry it could otherwise be in neither the load's snapshot nor the log (PostgreSQL, a
        table just added to the publication). Nothing to wait for by default."""

    # --- prerequisites and metadata ---------------------------------------------------
    @abstractmethod
    def check_prerequisites(self) -> None:
        """Raise SourceError naming every unmet CDC prerequisite and how to fix it."""

    @abstractmethod
    def describe_table(self, table: TableName, *, keyed: bool = True) -> TableSchema:
        """Columns, logical types and primary key; SourceError for a missing table, no
        primary key, or an unsupported column type (named). ``keyed`` False: for a whole-table
        refresh, no key asked for (core/schema.py, WHOLE_TABLE)."""

    # --- watermarks (DBLog steps 1 and 3) ---------------------------------------------
    #: the strategies this database supports, and why "log" is not among them where it is not
    watermark_strategies: ClassVar[tuple[str, ...]] = ("table",)
    log_watermarks_missing: ClassVar[str] = ""
    #: a chunk read records its snapshot's visibility (PostgreSQL: commit order is not visibility order)
    records_visibility: ClassVar[bool] = False

    @property
    def watermark_strategy(self) -> str:
        """The name of the strategy (``watermarks``), for messages."""
        return self.watermarks.name

    # the strategy's facts, for the collaborators and the doctor checks: they are handed these,
    # never the strategy (tests/unit/test_setting_paths.py)
    def watermark_tables(self) -> list[TableName]:
        """The tables the strategy writes: the watermark table ("table"), none ("log")."""
        return self.watermarks.tables()

    @property
    def chunk_reads_snapshot(self) -> bool:
        """A chunk read reports the snapshot it saw: its log position bounds the window ("log"), or
        the database records its visibility (``records_visibility``)."""
        return self.watermarks.reads_snapshot_position or self.records_visibility

    def prepare_watermarks(self) -> None:
        """What the strategy needs before a snapshot: the watermark table ("table"), nothing ("log")."""
        self.watermarks.prepare()

    def mark(self, watermark_id: str) -> str:
        """A point in the log that everything committed before it precedes: the watermark row
        written as ``watermark_id`` ("table"), or the log's current end as a position mark ("log").
        Returns the id to look it up by in the staged changelog."""
        return self.watermarks.mark(watermark_id)

    def server_identity(self) -> dict | None:
        """Which server this is (its system identifier and timeline, or server id): what a
        failover changes. None where the dialect cannot tell."""
        return None

    def mark_position(self) -> Position:
        """Where a position mark taken now sits ("log"): no later than the mark of any chunk read
        after it, so a chunk never lands before the convergence mark of its own snapshot."""
        return self.current_position()

    def read_floor(self) -> Position | None:
        """Where a snapshot planned now needs its chunks to see at least everything before (see
        :meth:`read_no_older_than`): None when chunks are read where the log is captured."""
        return None

    def read_no_older_than(self, position: Position, why: str = READ_FLOOR_SNAPSHOT) -> None:
        """Chunks (and every other read of rows: verify's) read from here on see at least
        everything before ``position`` (a replica waits until it has replayed that far, at most
        ``max_replica_lag_seconds``, then fails saying it has not replayed up to ``why``); a
        source read directly always does, and so does a MariaDB source that is itself a replica:
        its own binlog, which capture reads, holds only what it has applied."""
        return None

    def replica_lag(self) -> tuple[int, float] | None:
        """(bytes, seconds) the replica that chunks are read from is behind its primary (seconds
        infinite while it does not replicate); None when chunks are read from a primary."""
        return None

    def visibility(self) -> str | None:
        """Which transactions a snapshot taken now sees, where commit order is not visibility
        order (PostgreSQL: core/visibility.py); None where it is."""
        return None

    def offset_position(self, offset: str) -> Position | None:
        """The position an offset stands at (everything before it is in a read that ended
        there), where the log's offsets name one; None otherwise."""
        return None

    def log_bytes_between(self, start: Position, end: Position) -> int | None:
        """Bytes of log the server wrote from ``start`` to ``end`` (0 when ``end`` is not after
        it); None where that is not known."""
        return None

    @abstractmethod
    def ensure_watermark_table(self) -> None: ...

    @abstractmethod
    def write_watermark(self, watermark_id: str) -> None:
        """UPDATE the one watermark row to ``watermark_id`` in its own committed transaction."""

    # --- chunks (DBLog step 2) ----------------------------------------------------------
    @abstractmethod
    def stream_query(self, sql: str, params: Sequence[Any], **options: Any) -> Iterator[list[tuple]]:
        """Run a SELECT as a fresh statement (non-stale) and yield driver rows in batches of
        ``batch_size`` rows (an option; default 10,000), never holding the whole result in
        memory. A dialect with :attr:`stream_max_bytes` also takes ``max_bytes``: a batch ends
        at ``batch_size`` rows or once its rows' :func:`value_bytes` reach ``max_bytes``,
        whichever comes first. ``snapshot``: a list the read's :class:`ReadSnapshot` is
        appended to before the first row (the snapshot the SELECT reads)."""

    @abstractmethod
    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        """Driver row (columns in ``schema.columns`` order) -> column -> canonical value."""

    @abstractmethod
    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        """Canonical key value -> a value the driver binds (e.g. base64 -> bytes)."""

    @abstractmethod
    def max_key(self, schema: TableSchema, where: str | None = None) -> tuple | None:
        """Largest primary key now (canonical values): the snapshot's upper bound."""

    @abstractmethod
    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        """About ``count`` keys spread over the table, sorted: boundaries for parallel ranges."""

    # --- changelog --------------------------------------------------------------------
    @abstractmethod
    def current_position(self) -> Position:
        """The current end of the log as a Position (callers wait until capture passed it)."""

    @abstractmethod
    def load_offset(self, data_dir: str) -> str:
        """The committed changelog offset (opaque text), creating the slot/state if missing."""

    @abstractmethod
    def read_log(self, request: LogRead) -> LogBatch:
        """Events from ``request.offset`` to the current end, whole transactions, in position
        order. Watermark table updates come as WatermarkEvent; other tables as ChangeEvent.

        ``max_events`` stops the read at the first transaction boundary at or past that
        many events. With ``on_segment``, every time the events read since the last call
        reach ``segment_max_events`` at a transaction boundary, they are handed to
        ``on_segment`` (LogEvents or an EventBatch) and dropped here; the returned batch holds
        only the events after the last call. A transaction that would make a segment pass
        twice ``segment_max_events`` events or ``segment_max_bytes`` bytes of messages is cut
        inside, so memory follows the segment, never the transaction: the log sends only
        committed transactions, so their parts may be staged before they end (I6 holds as the
        returned offset still ends at a transaction boundary: a capture killed between parts
        reads the whole transaction again and rewrites the same parts)."""

    @abstractmethod
    def commit_offset(self, offset: str, data_dir: str) -> None:
        """Tell the source it may discard the log before ``offset`` (slot confirm / stored state)."""

    def log_retention(self, offset: str) -> LogRetention | None:
        """How far ``offset`` (a committed offset) is behind the end of the log and how long the
        source keeps the log from there (None: the dialect cannot tell)."""
        return None

    def log_activity(self, data_dir: str) -> LogActivity | None:
        """What the source wrote lately (:class:`LogActivity`), read without creating or
        committing anything; None: the dialect cannot tell (rounds then start on a timer)."""
        return None

    # --- what the source holds on its server and in the data location -------------------
    # (drop-source, resync, the capture lock, the CLI's sources: one contract instead of probes
    # for attributes one database has and another has not)
    #: the replication slot the source reads through (PostgreSQL); None: it holds none (MariaDB)
    slot_name: str | None = None
    #: the publication that slot decodes (PostgreSQL); None without a slot
    publication_name: str | None = None

    def publication_exists(self) -> bool:
        """Whether the publication exists on the server now (False without one)."""
        return False

    def capture_lock_key(self, data_dir: str) -> str:
        """What a capture of this source into ``data_dir`` must hold alone; by default the
        source's name (PostgreSQL: the slot; MariaDB: the offset file)."""
        return f"source.{self.source}"

    def offset_path(self, data_dir: str) -> str | None:
        """Where the committed log offset is kept in ``data_dir``; None when the server keeps it
        (a PostgreSQL slot's confirmed position)."""
        return None

    def bind_data_dir(self, data_dir: str) -> None:  # noqa: B027 - optional: nothing to bind
        """Bind what positions read from now on depend on in ``data_dir`` (MariaDB: the epoch of
        the server read, recorded beside the offset); before a chunk's watermarks or a verify."""

    def held_objects(self, data_dir: str) -> list[str]:
        """What the source holds, in words (the objects drop-source removes): by default its
        committed offset file."""
        path = self.offset_path(data_dir)
        return [f"binlog offset {path}"] if path else []

    def drop_slot(self, timeout: float = 10.0) -> bool:
        """Drop the source's replication slot if it made it; False: there was none (a source
        that holds no slot has none to drop)."""
        return False

    def drop_publication(self) -> bool:
        """Drop the source's publication if this package made it; False: it was left (another
        role owns it) or a source without one has none."""
        return False

    def unbounded_wal_warning(self) -> str:
        """What to tell an operator while nothing bounds the log the source holds
        (:meth:`wal_keep_limit_mb` < 0); "" for a source that holds none."""
        return ""

    def wal_keep_limit_mb(self) -> int | None:
        """The server's bound on the log a slot may hold (PostgreSQL max_slot_wal_keep_size, -1:
        unbounded); None when the source holds no slot."""
        return None

    # --- airflow-cdc doctor: a source checked before its first run ------------------------
    @abstractmethod
    def begin_read_only(self) -> None:
        """Make this dialect's session read-only (doctor's checks never write); it connects,
        so an unreachable server or a refused login is raised here."""

    def server_label(self) -> str:
        """What the connection reaches, in words (``postgres``, ``MariaDB``)."""
        return self.name

    @abstractmethod
    def doctor_findings(self) -> list[Finding]:
        """Every finding of this database's own checks (settings, grants, log retention,
        replication) as core.findings.Finding; doctor.py adds the scope's and the tables'."""

    @abstractmethod
    def existing_tables(self, tables: Sequence[TableName]) -> dict[TableName, bool]:
        """Which of ``tables`` exist (and this role can see), for doctor's table findings."""

    # --- lifecycle --------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional for dialects holding connections
        pass

    def __enter__(self) -> Dialect:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def validate_where(where: str) -> str:
    """The optional chunk filter: one rule, defined in core (see core.planning.validate_where)."""
    return _core_validate_where(where)


def grant_findings(
    dialect: Dialect, who: str, problems: Sequence[str], before: Sequence[Finding]
) -> list[Finding]:
    """Doctor's grant findings of ``who`` (``user 'cdc'``, ``role 'cdc'``): one error per
    problem, named with the watermark strategy whose needs it misses; an ok when neither these
    nor the findings ``before`` found a grant missing."""
    strategy = dialect.watermark_strategy
    out = [Finding(ERROR, "grants", f"{who} (watermark strategy {strategy!r}): {p}") for p in problems]
    if not out and not any(f.check == "grants" for f in before):
        out.append(Finding(OK, "grants", f"{who} has what watermark strategy {strategy!r} needs"))
    return out
