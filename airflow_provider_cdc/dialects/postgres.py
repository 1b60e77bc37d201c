"""PostgreSQL: watermarks, chunk reads and changelog capture through a logical slot (pgoutput).

Type parity by construction. Both paths see every value as the text its type's output
function renders, under the same session settings (``TimeZone=UTC``, ISO dates, hex
bytea, shortest-exact floats): chunks are read with ``COPY (SELECT ...) TO STDOUT``
(CSV of the same output texts; :mod:`.pgcopy` builds the JSON per column, byte-equal to
the per-row path, which ``stream_query`` serves with typecasters that return the raw
text), and pgoutput sends text values. One function per logical type (:func:`decoder`)
turns that text into the canonical value, for both paths.

Capture uses the streaming replication protocol (psycopg2 ``LogicalReplicationConnection``)
rather than ``pg_logical_slot_peek_binary_changes`` + ``pg_replication_slot_advance``:
the SQL functions materialise the whole result on the server before the first row and
the advance decodes the same WAL a second time, while the stream decodes once and
arrives incrementally (measured here: the stream delivers 40-60k messages/s to Python, our
per-event decoding costs ~25 us of CPU, so decoding, not transport, bounds capture). I6 holds because the slot is confirmed only by
``send_feedback(flush_lsn=...)`` in :meth:`PostgresDialect.commit_offset`, after the
segment is staged; a capture that dies before that leaves the slot where it was and the
next one receives the same transactions again.

"Current end": the WAL flush position when the read starts. The read stops between
transactions once the server reports (in a data or keepalive message) that it has
decoded past that point, so every transaction that committed before the read started is
in the batch, whole, and the confirmed position is exactly where the next read begins.

REPLICA IDENTITY. With ``DEFAULT`` an UPDATE carries no old row (``before`` is None
unless the key changed) and a DELETE only the key (``before`` = key columns). Unchanged
TOASTed values (large text/bytea/json not touched by an UPDATE) are then not in the log
at all: they are filled from the old row when the table has ``REPLICA IDENTITY FULL``,
otherwise capture fails naming the table and telling the user to set FULL; it never
emits a guessed value. :meth:`PostgresDialect.describe_table` reports the identity in
``TableSchema.extra["replica_identity"]``. An UPDATE that changes the primary key is
emitted as a delete of the old key followed by a create of the new one. TRUNCATE of a
captured table (one message may name several, CASCADE included) is staged as an event
``op = "t"`` per table at its place in the transaction: the event log carries it and the
mirror drops every row of the table older than it (``on_truncate="event"``, the default);
``"fail"`` stops capture instead and ``"skip"`` logs a warning and goes on (re-snapshot).

Publication: ``publication_name`` (default ``cdc_<source>``) is created when missing,
``FOR TABLE`` the option ``tables`` (the capture scope) plus the watermark table. Without
``tables`` nothing is captured, unless ``all_tables`` opts in to ``FOR ALL TABLES`` (needs
superuser, and is refused while any table lacks a replica identity: PostgreSQL would fail
the applications' UPDATE and DELETE on it; tables without a primary key or with an
unsupported column type are then skipped by capture with a warning). Nothing is created
before every prerequisite holds, and nothing when an administrator created it already
(README "Security"). Slot: ``slot_name`` (default ``cdc_<source>``, or, for a name that had
to be folded to fit, that plus a hash of the exact name: see default_object_name), plugin
pgoutput.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

import numpy as np

from ..core import temporal
from ..core.errors import ConfigurationError, SourceError, TableNotFoundError, WatermarkError
from ..core.events import ChangeEvent, LogEvent, Op, WatermarkEvent
from ..core.position import Position, int_to_lsn, lsn_to_int
from ..core.ranges import ChunkRange
from ..core.schema import Column, TableName, TableSchema, encode_key
from ..core.sqlnames import quote_pg
from . import pgbatch, pgoutput
from .base import ChunkReadResult, ConnectionParams, Dialect, LogBatch, LogRetention, SegmentSink

log = logging.getLogger(__name__)

#: Session settings that fix how values are rendered as text (both paths use them).
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1 "
    "-c bytea_output=hex -c client_encoding=UTF8"
)
APPLICATION_NAME = "airflow-provider-cdc"
MIN_SERVER_VERSION = 130000  # pg_replication_slots.wal_status

# --- types --------------------------------------------------------------------------------

_BASE_TYPES = {
    "bool": "bool",
    "int2": "int16",
    "int4": "int32",
    "int8": "int64",
    "oid": "int64",
    "float4": "float32",
    "float8": "float64",
    "text": "string",
    "varchar": "string",
    "bpchar": "string",
    "name": "string",
    "char": "string",
    "citext": "string",
    "bytea": "binary",
    "date": "date",
    "time": "time",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
    "uuid": "uuid",
    "json": "json",
    "jsonb": "json",
    # stable text renderings under the fixed session settings, carried as strings
    "timetz": "string",
    "interval": "string",
    "inet": "string",
    "cidr": "string",
    "macaddr": "string",
    "macaddr8": "string",
    "bit": "string",
    "varbit": "string",
    "xml": "string",
}
SUPPORTED_TYPES = (*sorted(_BASE_TYPES), "numeric", "enums", "domains and arrays of these")


class UnsupportedType(Exception):
    def __init__(self, type_name: str) -> None:
        super().__init__(type_name)
        self.type_name = type_name


@dataclass(frozen=True)
class PgType:
    oid: int
    name: str
    namespace: str
    typtype: str
    elem: int
    basetype: int
    typmod: int
    category: str


def _numeric_type(typmod: int) -> str:
    if typmod < 4:
        return "decimal"
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (typmod - 4) & 0x7FF
    if (typmod - 4) & 0x400:  # negative scale (PostgreSQL 15): no decimal(p,s) form
        return "decimal"
    return f"decimal({precision},{scale})"


def logical_type(oid: int, typmod: int, types: Callable[[int], PgType]) -> str:
    """PostgreSQL type (oid, typmod) -> logical type; UnsupportedType names the type."""
    t = types(oid)
    if t.typtype == "d":
        return logical_type(t.basetype, t.typmod if t.typmod >= 0 else typmod, types)
    if t.typtype == "e":
        return "string"
    if t.category == "A" and t.elem:
        return f"array<{logical_type(t.elem, typmod, types)}>"
    if t.name == "numeric" and t.namespace == "pg_catalog":
        return _numeric_type(typmod)
    if t.name in _BASE_TYPES and (t.namespace == "pg_catalog" or t.name == "citext"):
        return _BASE_TYPES[t.name]
    raise UnsupportedType(t.name if t.namespace == "pg_catalog" else f"{t.namespace}.{t.name}")


# --- text -> canonical --------------------------------------------------------------------


def _float(s: str) -> float | str:
    if s in ("NaN", "Infinity", "-Infinity"):
        return s
    return float(s)


_b2a = binascii.b2a_base64  # base64.b64encode without the wrapper


def _bytea(s: str) -> str:
    if s[:2] != "\\x":
        raise SourceError(f"bytea value not in hex format: {s[:20]!r}; the session must use bytea_output=hex")
    return _b2a(bytes.fromhex(s[2:]), newline=False).decode("ascii")


def _frac6(s: str) -> str:
    """'HH:MM:SS[.f]' -> 'HH:MM:SS.ffffff'."""
    head, dot, frac = s.partition(".")
    return f"{head}.{frac.ljust(6, '0')}" if dot else f"{head}.000000"


_TS_RE = re.compile(r"^(-?\d{4,}-\d\d-\d\d) (\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d(?::?\d\d(?::?\d\d)?)?)?$")


def _not_temporal(s: str, logical: str) -> SourceError:
    return SourceError(f"PostgreSQL rendered a {logical} value as {s!r}, which is not a form this package knows; "
                       "the session must use DateStyle ISO and TimeZone UTC")


def _date(s: str) -> str:
    """ISO date, ``infinity``/``-infinity``, BC (``-0043-03-15``: astronomical years, core/temporal.py)."""
    bc = temporal.pg_bc_to_canonical(s)
    return s if bc is None else bc


def _timestamp(s: str) -> str:
    if len(s) in (19, 21, 22, 23, 24, 25, 26) and s[10] == " " and s[4] == "-" and s[-3] != " ":  # fast path
        t = s[11:]
        return f"{s[:10]}T{t}.000000" if len(t) == 8 else f"{s[:10]}T{t.ljust(15, '0')}"
    if s in ("infinity", "-infinity"):
        return s
    m = _TS_RE.match(temporal.pg_bc_to_canonical(s) or s)  # BC -> astronomical year; 5+ digit years
    if not m or m.group(3):
        raise _not_temporal(s, "timestamp")
    return f"{m.group(1)}T{_frac6(m.group(2))}"


def _timestamptz(s: str) -> str:
    if s[-3:] == "+00" and s[10:11] == " " and s[4] == "-" and len(s) <= 29:  # fast path: UTC, 4-digit year
        t = s[11:-3]
        return f"{s[:10]}T{t}.000000Z" if len(t) == 8 else f"{s[:10]}T{t.ljust(15, '0')}Z"
    if s in ("infinity", "-infinity"):
        return s
    m = _TS_RE.match(temporal.pg_bc_to_canonical(s) or s)
    if not m or not m.group(3):
        raise _not_temporal(s, "timestamptz")
    off = m.group(3)
    if off in ("+00", "+00:00", "-00"):
        return f"{m.group(1)}T{_frac6(m.group(2))}Z"
    # not rendered in UTC (should not happen with TimeZone=UTC): normalise
    if len(off) == 3:
        off += ":00"
    dt = datetime.fromisoformat(f"{m.group(1)}T{_frac6(m.group(2))}{off}")
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _identity(s: str) -> str:
    return s


def _bool(s: str) -> bool:
    return s == "t"


def parse_array(text: str, element: Callable[[str], Any]) -> list:
    """PostgreSQL array text (``{1,2,NULL}``, ``{{"a b",c},{d,NULL}}``, ``[0:1]={..}``) -> nested list."""
    if text.startswith("["):
        text = text[text.index("=") + 1 :]
    pos = 0
    n = len(text)

    def parse_level() -> list:
        nonlocal pos
        if text[pos] != "{":
            raise SourceError(f"malformed array value {text[:40]!r}")
        pos += 1
        out: list = []
        if text[pos] == "}":
            pos += 1
            return out
        while True:
            c = text[pos]
            if c == "{":
                out.append(parse_level())
            elif c == '"':
                pos += 1
                buf = []
                while text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    buf.append(text[pos])
                    pos += 1
                pos += 1
                out.append(element("".join(buf)))
            else:
                start = pos
                while text[pos] not in ",}":
                    pos += 1
                raw = text[start:pos]
                out.append(None if raw == "NULL" else element(raw))
            c = text[pos]
            pos += 1
            if c == "}":
                return out
            if c != ",":
                raise SourceError(f"malformed array value {text[:40]!r}")

    try:
        result = parse_level()
    except IndexError:
        raise SourceError(f"malformed array value {text[:40]!r}") from None
    if pos != n:
        raise SourceError(f"malformed array value {text[:40]!r}")
    return result


_SCALAR_DECODERS: dict[str, Callable[[str], Any]] = {
    "bool": _bool,
    "int16": int,
    "int32": int,
    "int64": int,
    "float32": _float,
    "float64": _float,
    "string": _identity,
    "json": _identity,
    "uuid": str.lower,
    "date": _date,
    "binary": _bytea,
    "time": _frac6,
    "timestamp": _timestamp,
    "timestamptz": _timestamptz,
}


@cache
def decoder(logical: str) -> Callable[[str], Any]:
    """The one text -> canonical function for a logical type, used by chunk reads and
    by the changelog alike (NULL is handled by the caller)."""
    if logical.startswith("array<"):
        inner = decoder(logical[6:-1])
        return lambda s: parse_array(s, inner)
    if logical.startswith("decimal"):
        return _identity
    return _SCALAR_DECODERS[logical]


# --- prerequisites (a pure check, testable with any settings row) -------------------------


@dataclass(frozen=True)
class PgSettings:
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    slots_used: int
    slot_exists: bool
    user: str
    replication_role: bool
    superuser: bool
    server_version_num: int
    publication_exists: bool
    all_tables: bool  # the dialect would create FOR ALL TABLES


def prerequisite_problems(s: PgSettings, slot_name: str) -> list[str]:
    """Every unmet CDC prerequisite, each with its fix."""
    problems = []
    if s.server_version_num < MIN_SERVER_VERSION:
        problems.append(
            f"server version {s.server_version_num} is too old: PostgreSQL 13 or newer is required"
        )
    if s.wal_level != "logical":
        problems.append(
            f"wal_level is {s.wal_level!r}: run ALTER SYSTEM SET wal_level = logical (or set it in "
            "postgresql.conf) and restart the server"
        )
    if not (s.replication_role or s.superuser):
        problems.append(
            f"user {s.user!r} may not use replication slots: ALTER ROLE {s.user} WITH REPLICATION "
            "(or, on a managed service, grant its replication role, e.g. rds_replication)"
        )
    if not s.slot_exists:
        if s.max_replication_slots == 0:
            problems.append(
                "max_replication_slots is 0: set it to at least 1 (plus one per other consumer) and restart"
            )
        elif s.slots_used >= s.max_replication_slots:
            problems.append(
                f"all {s.max_replication_slots} replication slots are in use and slot {slot_name!r} does not exist: "
                "raise max_replication_slots and restart, or drop an unused slot (pg_drop_replication_slot)"
            )
    if s.max_wal_senders < 1:
        problems.append(
            "max_wal_senders is 0: set it to at least 1 (capture streams through a WAL sender) and restart"
        )
    if not s.publication_exists and s.all_tables and not s.superuser:
        problems.append(
            f"user {s.user!r} is not a superuser, so it cannot create a publication FOR ALL TABLES: set CDC_TABLES "
            "to the tables to capture instead (CDC_CAPTURE_ALL_TABLES unset), or have a superuser create the "
            "publication"
        )
    return problems


# --- the dialect --------------------------------------------------------------------------

_SLOT_NAME_RE = re.compile(r"^[a-z0-9_]{1,63}$")
DEFAULT_COPY_BATCH_ROWS = 2_000
DEFAULT_CAPTURE_STEP_MESSAGES = 500_000


_HASHED_NAME_RE = re.compile(r"__[0-9a-f]{12}$")


def default_object_name(source: str) -> str:
    """``cdc_<source>`` when that is a valid slot name (lowercase letters, digits, ``_``, at
    most 63 characters), so existing slots keep their names. Any other source is folded to
    what a slot name allows, cut short, and ends in ``__`` + 12 hex digits of a hash of the
    exact source name: ``orders-eu`` and ``orders_eu`` no longer share a slot. A source whose
    name already ends like such a hash is hashed too, so a kept name never equals a folded one."""
    name = "cdc_" + source
    if _SLOT_NAME_RE.match(name) and not _HASHED_NAME_RE.search(name):
        return name
    import hashlib

    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]
    folded = "cdc_" + re.sub(r"[^a-z0-9_]", "_", source.lower())
    return f"{folded[: 63 - 14]}__{digest}"


@dataclass
class _RelInfo:
    table: TableName
    kind: str  # "table", "watermark", "skip", "error"
    names: tuple[str, ...] = ()
    decoders: tuple = ()
    key_idx: tuple[int, ...] = ()
    value_idx: int = -1  # watermark value column
    replica_identity: str = "d"
    problem: str | None = None  # set for kind "error": raised on the first change
    logicals: tuple[str, ...] = ()
    table_id: str = ""
    key_names: tuple[str, ...] = ()
    conversions: tuple = ()  # (index, decoder) of columns whose text needs decoding
    batch: pgbatch.Relation | None = None  # what the batch decode needs (kind "table")

    def __post_init__(self) -> None:
        self.table_id = self.table.id
        self.key_names = tuple(self.names[i] for i in self.key_idx)
        self.conversions = tuple((i, d) for i, d in enumerate(self.decoders) if d is not _identity)
        if self.kind == "table":
            self.batch = pgbatch.Relation(self.table, self.names, self.logicals, self.decoders, self.key_names,
                                          self.replica_identity)


_IDENT = {"d": "default", "n": "nothing", "f": "full", "i": "index"}
_UNSET = Position(0)  # the position of an event made one at a time, until its segment is built


class PostgresDialect(Dialect):
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

    name = "postgres"
    system_schemas = frozenset({"pg_catalog", "information_schema", "pg_toast"})
    row_value_keyset = True
    placeholder = "%s"

    def __init__(self, params: ConnectionParams, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        o = self.options
        self.slot_name = o.get("slot_name") or default_object_name(self.source)
        if not _SLOT_NAME_RE.match(self.slot_name):
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
        self._conn = None
        self._rconn = None
        self._read_upto: int | None = None  # the end a read that stopped at its step bound reads on towards
        self._types: dict[int, PgType] = {}
        self._pk_cache: dict[int, tuple[str, ...] | None] = {}
        self._decoders_cache: dict = {}
        self._last_schema: TableSchema | None = None
        self._last_decoders: tuple = ()
        self._watermark_ready = False

    # --- connections ------------------------------------------------------------------
    def _connect_kwargs(self) -> dict[str, Any]:
        p = self.params
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

    def _new_connection(self, **extra: Any):
        import psycopg2

        try:
            return psycopg2.connect(**self._connect_kwargs(), **extra)
        except psycopg2.OperationalError as exc:
            raise SourceError(
                f"cannot connect to PostgreSQL at {self.params.host}:{self.params.port}/{self.params.database}: "
                f"{str(exc).strip()}"
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
        """Connection for chunk reads: READ COMMITTED, every value returned as its text."""
        if self._rconn is None or self._rconn.closed:
            import psycopg2.extensions as ext

            c = self._new_connection()
            c.set_session(isolation_level=ext.ISOLATION_LEVEL_READ_COMMITTED, readonly=True, autocommit=False)
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
            raise SourceError(f"PostgreSQL rejected a statement: {_pg_message(exc)}\nSQL: {sql}") from exc

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

    # --- prerequisites ----------------------------------------------------------------
    def read_settings(self) -> PgSettings:
        row = self._query(
            "SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int, "
            "current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_replication_slots), "
            "EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s), current_user, "
            "r.rolreplication, r.rolsuper, current_setting('server_version_num')::int, "
            "EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s) "
            "FROM pg_roles r WHERE r.rolname = current_user",
            (self.slot_name, self.publication_name),
        )[0]
        return PgSettings(*row, all_tables=self.all_tables and not self.tables)

    def check_prerequisites(self) -> None:
        settings = self.read_settings()
        problems = prerequisite_problems(settings, self.slot_name)
        problems += self.privilege_problems(settings)
        if problems:
            where = f"{self.params.host}:{self.params.port}/{self.params.database}"
            raise SourceError(
                f"PostgreSQL at {where} is not ready for CDC:\n" + "\n".join(f"- {p}" for p in problems)
            )

    def privilege_problems(self, s: PgSettings | None = None) -> list[str]:
        """Every grant the configured set-up lacks, each as the statement that gives it (README
        "Security" lists both set-ups: the provider creates publication and watermark table, or
        an administrator did, and the provider then needs no ownership and runs no DDL)."""
        s = s or self.read_settings()
        if s.superuser:
            return []
        role = self.quote_ident(s.user)
        problems = []
        db_create = self._query("SELECT has_database_privilege(current_database(), 'CREATE')")[0][0]
        wm = self.watermark_table
        wm_row = self._query(
            "SELECT has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'UPDATE'), "
            "has_schema_privilege(n.oid, 'USAGE') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (wm.schema, wm.name),
        )
        if wm_row:
            if not wm_row[0][2]:
                problems.append(f"GRANT USAGE ON SCHEMA {self.quote_ident(wm.schema)} TO {role} (the watermark table's schema)")
            if not (wm_row[0][0] and wm_row[0][1]):
                problems.append(f"GRANT SELECT, UPDATE ON {self.quote_table(wm)} TO {role} (the watermark table: "
                                "DBLog's watermarks are UPDATEs of its one row)")
        else:
            nsp = self._query("SELECT has_schema_privilege(n.oid, 'CREATE') FROM pg_namespace n WHERE n.nspname = %s",
                              (wm.schema,))
            if (nsp and not nsp[0][0]) or (not nsp and not db_create):
                what = f"SCHEMA {self.quote_ident(wm.schema)}" if nsp else "DATABASE " + self.quote_ident(
                    self.params.database or "postgres")
                problems.append(f"GRANT CREATE ON {what} TO {role}, so the provider can create the watermark table "
                                f"{wm}, or have an administrator create it (README 'Security')")
        scope = list(self.tables or [])
        rows = {
            TableName(sch, name): (sel, usage, owner)
            for sch, name, sel, usage, owner in self._query(
                "SELECT n.nspname, c.relname, has_table_privilege(c.oid, 'SELECT'), "
                "has_schema_privilege(n.oid, 'USAGE'), pg_has_role(c.relowner, 'USAGE') "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
                ([t.schema for t in scope] or [""], [t.name for t in scope] or [""]),
            )
        }
        for t in scope:
            sel, usage, _owner = rows.get(t, (True, True, True))  # a missing table is named by describe_table
            if not usage:
                problems.append(f"GRANT USAGE ON SCHEMA {self.quote_ident(t.schema)} TO {role}")
            if not sel:
                problems.append(f"GRANT SELECT ON {self.quote_table(t)} TO {role}")
        pub = self._query(
            "SELECT p.puballtables, pg_has_role(p.pubowner, 'USAGE') FROM pg_publication p WHERE p.pubname = %s",
            (self.publication_name,),
        )
        if pub and not pub[0][0] and scope:
            published = {
                TableName(a, b) for a, b in self._query(
                    "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (self.publication_name,))
            }
            missing = [t for t in [*scope, wm] if t not in published and (t in rows or t == wm)]
            not_owned = [t for t in missing if t != wm and not rows[t][2]]
            if missing and (not pub[0][1] or not_owned):
                problems.append(
                    f"publication {self.publication_name!r} lacks {', '.join(map(str, missing))} and role {s.user!r} "
                    "may not add them (PostgreSQL demands ownership of the publication and of each table): have an "
                    f"administrator run ALTER PUBLICATION {self.quote_ident(self.publication_name)} ADD TABLE "
                    f"{self._qlist(missing)}"
                )
        elif not pub and scope:
            not_owned = [t for t in scope if t in rows and not rows[t][2]]
            if not db_create or not_owned:
                why = [] if db_create else [f"CREATE on database {self.params.database or 'postgres'!r}"]
                if not_owned:
                    why.append(f"ownership of {', '.join(map(str, not_owned))}")
                problems.append(
                    f"publication {self.publication_name!r} does not exist and role {s.user!r} cannot create it (it "
                    f"needs {' and '.join(why)}): have an administrator run CREATE PUBLICATION "
                    f"{self.quote_ident(self.publication_name)} FOR TABLE {self._qlist([*scope, wm])} WITH "
                    "(publish_via_partition_root = true) (README 'Security', set-up 2)"
                )
        return problems

    def check_readable(self, table: TableName) -> None:
        row = self._query(
            "SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT'), current_user "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.name),
        )
        if row and not (row[0][0] and row[0][1]):
            role = self.quote_ident(row[0][2])
            grant = (f"GRANT USAGE ON SCHEMA {self.quote_ident(table.schema)} TO {role}" if not row[0][0]
                     else f"GRANT SELECT ON {self.quote_table(table)} TO {role}")
            raise SourceError(f"role {row[0][2]!r} may not read table {table}: {grant}")

    def check_snapshot_tables(self, tables: Sequence[TableName]) -> None:
        """Also: a table snapshotted while its changes are not published would lose the changes
        inside its chunk windows, so each must be in the publication (added when the role may:
        the scope, not the conf, chose it) before any watermark of the snapshot is written."""
        super().check_snapshot_tables(tables)
        for table in tables:
            if self._relation(table) is not None:
                self._ensure_published(table)

    # --- metadata ---------------------------------------------------------------------
    def _type(self, oid: int) -> PgType:
        t = self._types.get(oid)
        if t is None:
            self._load_types([oid])
            t = self._types.get(oid)
            if t is None:
                raise UnsupportedType(f"oid {oid}")
        return t

    def _load_types(self, oids: Sequence[int]) -> None:
        """Cache pg_type rows for ``oids`` and everything they refer to (elements, base types)."""
        todo = [o for o in set(oids) if o not in self._types]
        while todo:
            rows = self._query(
                "SELECT t.oid, t.typname, n.nspname, t.typtype, t.typelem, t.typbasetype, t.typtypmod, t.typcategory "
                "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = ANY(%s::oid[])",
                (list(todo),),
            )
            for r in rows:
                self._types[r[0]] = PgType(*r)
            todo = [o for r in rows for o in (r[4], r[5]) if o and o not in self._types]

    def _relation(self, table: TableName) -> tuple[int, str] | None:
        rows = self._query(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (table.schema, table.name),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def _primary_key(self, relid: int) -> tuple[str, ...] | None:
        if relid not in self._pk_cache:
            rows = self._query(
                "SELECT a.attname FROM pg_index i "
                "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
                (relid,),
            )
            self._pk_cache[relid] = tuple(r[0] for r in rows) or None
        return self._pk_cache[relid]

    def describe_table(self, table: TableName) -> TableSchema:
        rel = self._relation(table)
        if rel is None:
            kind = self._query(
                "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s",
                (table.schema, table.name),
            )
            if kind:
                what = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}.get(
                    kind[0][0], "not a table"
                )
                raise SourceError(
                    f"{table} is {what}; CDC reads tables (a logical slot only decodes table changes): "
                    "give the underlying table"
                )
            raise TableNotFoundError(
                f"table {table} not found in PostgreSQL database {self.params.database!r} "
                f"(schema {table.schema!r}, table {table.name!r}; names are case-sensitive): check the name "
                "and that the user can see it"
            )
        relid, ident = rel
        cols = self._query(
            "SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod) "
            "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attgenerated = '' ORDER BY a.attnum",
            (relid,),
        )
        self._load_types([c[1] for c in cols])
        columns = []
        for name, oid, typmod, notnull, display in cols:
            try:
                lt = logical_type(oid, typmod, self._type)
            except UnsupportedType as exc:
                raise SourceError(
                    f"table {table}: column {name!r} has type {display} ({exc.type_name}), which CDC does not "
                    f"support; supported: {', '.join(SUPPORTED_TYPES)}. Change the column's type or leave the "
                    "table out of CDC"
                ) from None
            columns.append(Column(name, lt, display, not notnull))
        enums = self._enum_labels({c[0]: c[1] for c in cols})
        pk = self._primary_key(relid)
        if not pk:
            raise SourceError(
                f"table {table} has no primary key. DBLog reads chunks in primary-key order and matches "
                f"changelog events by key, so it needs one. Options: add a primary key "
                f"(ALTER TABLE {self.quote_table(table)} ADD PRIMARY KEY (...)), e.g. on an existing unique "
                "NOT NULL column or a new identity column; or leave the table out of CDC"
            )
        extra = {"replica_identity": _IDENT.get(ident, ident), "connector": "postgresql"}
        if enums:
            extra["enum_labels"] = json.dumps(enums, ensure_ascii=False, sort_keys=True)
        return TableSchema(table, tuple(columns), pk, extra)

    def _enum_labels(self, oids: dict[str, int]) -> dict[str, list[str]]:
        """column -> its enum's labels in sort order, for columns of an enum type, a domain over
        one, or an array of either (Debezium's ``allowed``)."""
        enum_of: dict[str, int] = {}
        for name, oid in oids.items():
            t = self._type(oid)
            for _ in range(8):  # domains over domains, arrays of domains: a few steps at most
                if t.typtype == "d":
                    t = self._type(t.basetype)
                elif t.category == "A" and t.elem:
                    t = self._type(t.elem)
                else:
                    break
            if t.typtype == "e":
                enum_of[name] = t.oid
        if not enum_of:
            return {}
        rows = self._query("SELECT enumtypid, enumlabel FROM pg_enum WHERE enumtypid = ANY(%s::oid[]) "
                           "ORDER BY enumtypid, enumsortorder", (sorted(set(enum_of.values())),))
        labels: dict[int, list[str]] = {}
        for oid, label in rows:
            labels.setdefault(oid, []).append(label)
        return {name: labels.get(oid, []) for name, oid in enum_of.items()}

    def _ensure_published(self, table: TableName) -> None:
        """A table snapshotted while its changes are not published would lose the changes
        inside its chunk windows: when our publication exists and lists tables, add it
        (before any watermark of the snapshot is written)."""
        pub = self._query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        if pub and not pub[0][0]:
            try:
                self._add_to_publication([table])
            except SourceError as exc:
                raise SourceError(
                    f"table {table} is not in publication {self.publication_name!r} and could not be added "
                    f"({exc.__cause__ or exc}): have an administrator run ALTER PUBLICATION "
                    f"{self.quote_ident(self.publication_name)} ADD TABLE {self.quote_table(table)}"
                ) from exc

    # --- watermarks ---------------------------------------------------------------------
    def ensure_watermark_table(self) -> None:
        import psycopg2

        wm = self.watermark_table
        # DDL only when something is missing: CREATE ... IF NOT EXISTS still demands the
        # CREATE privilege, which a least-privilege CDC user may not have once it exists
        for attempt in range(3 if self._relation(wm) is None else 0):
            try:
                if not self._query("SELECT 1 FROM pg_namespace WHERE nspname = %s", (wm.schema,)):
                    self._query(f"CREATE SCHEMA IF NOT EXISTS {self.quote_ident(wm.schema)}")
                self._query(
                    f"CREATE TABLE IF NOT EXISTS {self.quote_table(wm)} (id integer PRIMARY KEY CHECK (id = 1), "
                    "value text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
                )
                break
            except SourceError as exc:  # two sessions creating it at once: the loser retries
                if attempt == 2 or not isinstance(exc.__cause__, psycopg2.IntegrityError):
                    raise
        if not self._query(f"SELECT 1 FROM {self.quote_table(wm)} WHERE id = 1"):  # noqa: S608
            self._query(
                f"INSERT INTO {self.quote_table(wm)} (id, value) VALUES (1, '') ON CONFLICT (id) DO NOTHING"  # noqa: S608
            )
        pub = self._query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        if pub and not pub[0][0]:
            self._add_to_publication([wm])
        self._watermark_ready = True

    def write_watermark(self, watermark_id: str) -> None:
        """DBLog steps 1/3: its own autocommit transaction, so it is in the log before the
        chunk SELECT starts (low) and after it ended (high)."""
        if not self._watermark_ready:
            self.ensure_watermark_table()
        rows = self._query(
            f"UPDATE {self.quote_table(self.watermark_table)} SET value = %s, updated_at = now() WHERE id = 1 RETURNING id",  # noqa: S608
            (watermark_id,),
        )
        if not rows:
            raise WatermarkError(
                f"watermark table {self.watermark_table} has no row with id 1; run ensure_watermark_table() again"
            )

    # --- chunks -----------------------------------------------------------------------
    def stream_query(
        self, sql: str, params: Sequence[Any], batch_size: int = 10_000
    ) -> Iterator[list[tuple]]:
        """A server-side (named) cursor declared after the call: a fresh READ COMMITTED
        snapshot that sees everything committed before it, fetched ``batch_size`` rows
        at a time. Values come back as their text (see module docstring)."""
        import psycopg2

        conn = self._read_conn()
        done = False
        try:
            with conn.cursor(name=f"cdc_{uuid.uuid4().hex}") as cur:
                cur.itersize = batch_size
                try:
                    cur.execute(sql, tuple(params))
                    while True:
                        box = [cur.fetchmany(batch_size)]
                        if not box[0]:
                            break
                        yield box.pop()  # no reference left here: the caller may free the batch
                except psycopg2.Error as exc:
                    raise SourceError(
                        f"PostgreSQL rejected the chunk query: {_pg_message(exc)}\nSQL: {sql}"
                    ) from exc
            done = True
        finally:
            try:
                if done:
                    conn.commit()
                else:
                    conn.rollback()
            except psycopg2.Error:
                conn.close()

    def read_chunk(
        self,
        schema: TableSchema,
        rng: ChunkRange,
        *,
        after_key: Sequence | None,
        limit: int,
        path: str,
        where: str | None = None,
        upper_bound: Sequence | None = None,
    ) -> ChunkReadResult:
        """DBLog step 2 through ``COPY (chunk SELECT) TO STDOUT (FORMAT csv)``, decoded per
        column with Arrow (see :mod:`.pgcopy`; same rows and bytes as the generic path,
        several times faster). Option ``fast_chunks=False`` uses the generic path. The
        COPY is a fresh READ COMMITTED statement, run after the low watermark committed."""
        if not self.fast_chunks:
            return super().read_chunk(
                schema, rng, after_key=after_key, limit=limit, path=path, where=where, upper_bound=upper_bound
            )
        import psycopg2

        from ..storage.staged import ChunkWriter
        from .pgcopy import ChunkAssembler, read_csv_batch

        sql, params = self.chunk_query(
            schema, rng, after_key=after_key, limit=limit, where=where, upper_bound=upper_bound
        )
        asm = ChunkAssembler(
            schema.column_names,
            [c.type for c in schema.columns],
            [decoder(c.type) for c in schema.columns],
            schema.primary_key,
        )
        state = {"rows": 0, "last": None, "pending": 0}
        buf = bytearray()  # COPY rows of the batch being filled (no object per row)
        batch_rows, batch_bytes = max(1, self.copy_batch_rows), self.batch_max_bytes

        with ChunkWriter(schema, path) as writer:

            def flush() -> None:
                if not state["pending"]:
                    return
                cols = read_csv_batch(buf, schema.column_names)
                buf.clear()
                state["pending"] = 0
                key, typed, text, last = asm.build_typed(cols)
                del cols
                writer.add_typed(key, typed, text)
                state["rows"] += len(key)
                state["last"] = last

            class _Sink:  # psycopg2 writes one COPY row per call
                def write(self, data: bytes) -> int:
                    buf.extend(data)
                    state["pending"] += 1
                    if state["pending"] >= batch_rows or len(buf) >= batch_bytes:
                        flush()
                    return len(data)

            conn = self._read_conn()
            try:
                with conn.cursor() as cur:
                    copy_sql = (
                        f"COPY ({cur.mogrify(sql, tuple(params)).decode()}) TO STDOUT WITH (FORMAT csv)"
                    )
                    cur.copy_expert(copy_sql, _Sink())
                conn.commit()
            except psycopg2.Error as exc:
                self._reset_read_conn()
                raise SourceError(
                    f"PostgreSQL rejected the chunk query: {_pg_message(exc)}\nSQL: {sql}"
                ) from exc
            except BaseException:
                self._reset_read_conn()
                raise
            flush()
        return ChunkReadResult(state["rows"], state["last"])

    def _reset_read_conn(self) -> None:
        c, self._rconn = self._rconn, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - discarding a broken connection
                pass

    def _decoders(self, schema: TableSchema) -> tuple:
        if schema is self._last_schema:  # the hot path: rows of one chunk
            return self._last_decoders
        key = (schema.table, schema.columns)
        decs = self._decoders_cache.get(key)
        if decs is None:
            decs = tuple((c.name, decoder(c.type)) for c in schema.columns)
            self._decoders_cache[key] = decs
        self._last_schema, self._last_decoders = schema, decs
        return decs

    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        return {
            name: (v if v is None or dec is _identity else dec(v))
            for (name, dec), v in zip(self._decoders(schema), row, strict=True)
        }

    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        """Canonical -> bound value. Text literals are typed by the column they are compared
        with, so most values bind as strings (floats too: ``1.1`` as a numeric literal
        would not equal the float4 1.1)."""
        if value is None:
            return None
        t = schema.column(column).type
        return _to_db(t, value)

    def max_key(self, schema: TableSchema, where: str | None = None) -> tuple | None:
        pk = [self.quote_ident(k) for k in schema.primary_key]
        sql = f"SELECT {', '.join(pk)} FROM {self.quote_table(schema.table)}"  # noqa: S608
        params: list = []
        if where:
            cond, params = self.render_filter(where, schema)
            sql += f" WHERE {cond}"
        sql += " ORDER BY " + ", ".join(f"{k} DESC" for k in pk) + " LIMIT 1"
        return next(iter(self._key_rows(schema, sql, params)), None)

    def _key_rows(self, schema: TableSchema, sql: str, params: Sequence[Any]) -> list[tuple]:
        decs = [decoder(schema.column(k).type) for k in schema.primary_key]
        out = []
        for batch in self.stream_query(sql, params):
            for row in batch:
                out.append(tuple(None if v is None else d(v) for d, v in zip(decs, row, strict=True)))
        return out

    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        """TABLESAMPLE SYSTEM reads a few random pages (about 4 x ``count`` of them), not the
        table; the sorted sample is then thinned to ``count`` evenly spaced keys."""
        if count <= 0:
            return []
        rel = self._relation(schema.table)
        if rel is None:
            raise SourceError(f"table {schema.table} not found")
        pages = self._query(  # every partition of a partitioned table (or the table itself)
            # pg_partition_tree() has no rows for a plain table: then the table's own size
            "SELECT (greatest(coalesce((SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree(%s::oid)), 0), "
            "pg_relation_size(%s::oid)) / current_setting('block_size')::bigint)::bigint",
            (rel[0], rel[0]),
        )[0][0]
        if not pages:
            return []
        pct = min(100.0, 100.0 * max(4 * count, 8) / pages)
        pk = ", ".join(self.quote_ident(k) for k in schema.primary_key)
        sql = f"SELECT {pk} FROM {self.quote_table(schema.table)} TABLESAMPLE SYSTEM (%s) REPEATABLE (7) ORDER BY {pk}"  # noqa: S608
        keys = self._key_rows(schema, sql, [pct])
        if len(keys) <= count:
            return keys
        step = len(keys) / count
        # in the database's order (Python cannot order NaN, infinities or BC dates like it)
        return [keys[i] for i in sorted({int(i * step + step / 2) for i in range(count)})]

    # --- changelog: slot and publication --------------------------------------------------
    def current_position(self) -> Position:
        return Position.pg(self._query("SELECT pg_current_wal_lsn()::text")[0][0])

    def _publication_tables(self) -> list[TableName]:
        return [*(self.tables or []), self.watermark_table]

    def _add_to_publication(self, tables: Sequence[TableName]) -> None:
        have = {
            TableName(s, n)
            for s, n in self._query(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (self.publication_name,),
            )
        }
        missing = [t for t in tables if t not in have]
        if missing:
            self._query(
                f"ALTER PUBLICATION {self.quote_ident(self.publication_name)} ADD TABLE {self._qlist(missing)}"
            )

    def ensure_publication(self) -> None:
        pub = self._query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        q = self.quote_ident(self.publication_name)
        self.require_capture_scope()
        if not pub:
            if not self.tables:
                self._refuse_unidentified_tables()
                self._query(f"CREATE PUBLICATION {q} FOR ALL TABLES WITH (publish_via_partition_root = true)")
            else:
                for t in self.tables:
                    if self._relation(t) is None:
                        raise SourceError(f"table {t} given in option 'tables' does not exist")
                self._query(
                    f"CREATE PUBLICATION {q} FOR TABLE {self._qlist(self._publication_tables())} "
                    "WITH (publish_via_partition_root = true)"
                )
        elif not pub[0][0]:
            self._add_to_publication(self._publication_tables())

    def _refuse_unidentified_tables(self) -> None:
        """Once a FOR ALL TABLES publication exists, PostgreSQL refuses UPDATE and DELETE on
        tables without a replica identity (no primary key, REPLICA IDENTITY DEFAULT or
        NOTHING): the applications writing them break. While any such table exists the
        publication is not created; the error names them."""
        rows = self._query(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%' "
            "AND (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS "
            "(SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))) ORDER BY 1, 2 LIMIT 50"
        )
        if rows:
            raise ConfigurationError(
                f"source {self.source!r} (CDC_CAPTURE_ALL_TABLES): not creating publication "  # noqa: S608 - a message, not SQL
                f"{self.publication_name!r} FOR ALL TABLES, because PostgreSQL would then refuse UPDATE and DELETE "
                f"on these tables, which have no replica identity, and break the applications that write them: "
                f"{', '.join(f'{a}.{b}' for a, b in rows)}. Set CDC_TABLES to the tables to capture instead, or give "
                "those tables a primary key or REPLICA IDENTITY FULL first"
            )

    def _slot_row(self) -> tuple | None:
        rows = self._query(
            "SELECT confirmed_flush_lsn::text, wal_status, plugin, database, active FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.slot_name,),
        )
        return rows[0] if rows else None

    def _resnapshot_error(self, why: str) -> SourceError:
        return SourceError(
            f"replication slot {self.slot_name!r} {why}: changes since the last capture are lost. "
            "A re-snapshot is needed: drop the slot (drop_slot()) and the staged changelog of source "
            f"{self.source!r}, then start capture again and re-snapshot every captured table"
        )

    def load_offset(self, data_dir: str) -> str:
        """The slot's confirmed position; creates publication and slot on first use. A slot
        that vanished after capture had staged segments means lost changes: error. Every check
        runs before anything is created on the source: a run that fails leaves it unchanged."""
        self.require_capture_scope()
        row = self._slot_row()
        if row is None:
            from ..storage.layout import changelog_dir
            from ..storage.segment_index import changelog_used

            # (segments, or the index that outlives the segments staging retention removed)
            if changelog_used(changelog_dir(data_dir, self.source)):
                raise self._resnapshot_error(
                    "does not exist although changes were captured through it before"
                )
            self.check_prerequisites()
        else:
            self._check_slot(row)
        self.ensure_watermark_table()
        self.ensure_publication()
        if row is None:
            self._query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot_name,))
            row = self._slot_row()
        self._check_slot(row)
        return row[0]

    def _check_slot(self, row: tuple) -> None:
        confirmed, wal_status, plugin, database, _active = row
        if plugin != "pgoutput":
            raise ConfigurationError(
                f"replication slot {self.slot_name!r} uses plugin {plugin!r}, not pgoutput: give another slot_name"
            )
        if database != (self.params.database or "postgres"):
            raise ConfigurationError(
                f"replication slot {self.slot_name!r} belongs to database {database!r}: give another slot_name"
            )
        if wal_status == "lost" or confirmed is None:
            raise self._resnapshot_error(
                "was invalidated (the WAL it needed was removed, see max_slot_wal_keep_size)"
            )

    def log_retention(self, offset: str) -> LogRetention | None:
        """The slot's lag (WAL written past its confirmed position) and, when
        ``max_slot_wal_keep_size`` limits the WAL a slot keeps, how much more may be written
        before the lag reaches it. None when the slot does not exist.

        The headroom is counted from the confirmed position, the part the capture controls,
        not from the server's ``safe_wal_size``: that one counts from the slot's restart point,
        which trails a confirmation until the server decodes its next running-transactions
        record (up to ~15 s of activity later), so it stays near zero for a while after a
        capture that caught up. ``wal_status = lost`` is reported as it is."""
        rows = self._query(
            "SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
            "(SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size') "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot_name,),
        )
        if not rows:
            return None
        wal_status, lag, limit_mb = rows[0]
        lag = max(0, int(lag or 0))
        limit = None if limit_mb is None or int(limit_mb) < 0 else int(limit_mb) * 1024 * 1024
        return LogRetention(
            holder=f"replication slot {self.slot_name!r}", lag_bytes=lag, lost=wal_status == "lost",
            limit_bytes=limit, safe_bytes=None if limit is None else max(0, limit - lag),
            setting="max_slot_wal_keep_size",
            fix="run the capture more often (the changelog DAG's schedule), or raise max_slot_wal_keep_size; "
                "a slot already lost needs drop_slot() and a re-snapshot of the captured tables",
        )

    def drop_slot(self, timeout: float = 10.0) -> bool:
        """Drop the slot (it retains WAL forever otherwise). Waits while a just-closed
        stream still holds it. Returns False when it did not exist."""
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.conn.cursor() as cur:
                    cur.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot_name,),
                    )
                    return bool(cur.fetchall())
            except psycopg2.errors.ObjectInUse as exc:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"replication slot {self.slot_name!r} is in use ({_pg_message(exc)}): stop the capture "
                        "that reads it, then drop it"
                    ) from exc
                time.sleep(0.1)

    def drop_publication(self) -> None:
        self._query(f"DROP PUBLICATION IF EXISTS {self.quote_ident(self.publication_name)}")

    # --- changelog: reading --------------------------------------------------------------
    def _relinfo(self, rel: pgoutput.Relation) -> _RelInfo:
        table = TableName(rel.namespace, rel.name)
        names = tuple(c.name for c in rel.columns)
        if table == self.watermark_table:
            return _RelInfo(table, "watermark", names, value_idx=names.index("value"))
        explicit = bool(self.tables) and table in self.tables
        if self.tables and not explicit:  # a publication wider than the scope: not ours to copy
            return _RelInfo(table, "skip", names, problem=f"table {table} is outside the capture scope")
        try:
            self._load_types([c.type_oid for c in rel.columns])
            logicals = tuple(logical_type(c.type_oid, c.typmod, self._type) for c in rel.columns)
            decs = tuple(decoder(t) for t in logicals)
        except UnsupportedType as exc:
            problem = f"table {table} has a column of type {exc.type_name}, which CDC does not support"
            return _RelInfo(table, "error" if explicit else "skip", names, problem=problem)
        pk = self._primary_key(rel.relid)
        if pk is None and rel.replica_identity == "d":
            pk = tuple(c.name for c in rel.columns if c.is_key) or None
        if not pk or any(k not in names for k in pk):
            problem = f"table {table} has no primary key, so its changes cannot be keyed"
            return _RelInfo(table, "error" if explicit else "skip", names, problem=problem)
        return _RelInfo(
            table,
            "table",
            names,
            decs,
            tuple(names.index(k) for k in pk),
            replica_identity=rel.replica_identity,
            logicals=logicals,
        )

    def _flush_lsn(self) -> int:
        return lsn_to_int(self._query("SELECT pg_current_wal_flush_lsn()::text")[0][0])

    def read_log(
        self,
        offset: str,
        *,
        max_events: int | None = None,
        segment_max_events: int | None = None,
        on_segment: SegmentSink | None = None,
    ) -> LogBatch:
        """Whole transactions from the slot's confirmed position up to the WAL flush position
        when the run's first read started (or fewer: one *step*, see below; or ending at a
        commit once ``max_events`` is reached); segments go to ``on_segment`` at commits (see
        :meth:`Dialect.read_log`), as EventBatches.

        The slot is read as one byte stream: ``COPY (SELECT lsn, data FROM
        pg_logical_slot_peek_binary_changes(...)) TO STDOUT (FORMAT binary)``. The server
        decodes the WAL as fast as its own SQL interface does (the replication protocol flushes
        one network write per message and measured slower than this process), and this process
        handles the stream a block of messages at a time (:class:`_SlotRead`): row messages are
        only kept, and decoded a segment at a time (pgbatch); Begin, Commit, Relation and
        TRUNCATE are handled one at a time. Peeking moves nothing: the slot is confirmed by
        :meth:`commit_offset` (``pg_replication_slot_advance``) after the caller staged the
        batch (I6).

        A read is one step of at most ``capture_step_messages`` messages (the server keeps a
        step's decoded messages in a tuplestore, spilled to its temporary files past
        ``work_mem``; a single transaction larger than that comes whole): when it stops there,
        ``LogBatch.more`` is set and the next call on this dialect (after the caller committed)
        reads on towards the same end.

        A transaction larger than a segment (twice ``segment_max_events`` messages, or
        ``segment_max_bytes`` bytes of them) is staged in parts as it arrives: pgoutput sends a
        transaction only once it committed (never an aborted one, nor a rolled-back
        subtransaction's changes), so its parts are final; the offset still only moves to a
        commit. Positions inside it go on across parts (``Segment.begin(base=...)``)."""
        start = lsn_to_int(offset)
        upto, self._read_upto = (self._flush_lsn() if self._read_upto is None else self._read_upto), None
        if start >= upto:  # the end this run aims at is reached
            return LogBatch([], offset, offset)
        step = self.capture_step_messages if max_events is None else min(self.capture_step_messages, max_events)
        reader = _SlotRead(self, start, max_events, segment_max_events if on_segment is not None else None,
                           on_segment)
        messages = self._peek(upto, step, reader)
        batch = reader.finish(upto, messages >= step)
        self._read_upto = upto if batch.more else None
        return batch

    def _peek(self, upto: int, step: int, reader: _SlotRead) -> int:
        """COPY the slot's decoded messages up to ``upto`` (at most ``step``, rounded up to a
        whole transaction) into ``reader``; the number of messages the server sent."""
        import psycopg2

        sql = (
            "COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', '1', 'publication_names', %s)) TO STDOUT (FORMAT binary)"
        )
        params = (self.slot_name, int_to_lsn(upto), int(step), self.quote_ident(self.publication_name))
        deadline = time.monotonic() + 15
        while True:
            conn = self._new_connection()
            try:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("SET statement_timeout = %s", (max(1, int(self.read_timeout * 1000)),))
                    cur.copy_expert(cur.mogrify(sql, params).decode(), reader)
                reader.flush()
                return reader.messages
            except psycopg2.Error as exc:
                msg = _pg_message(exc)
                if isinstance(exc, psycopg2.errors.QueryCanceled):
                    raise SourceError(
                        f"reading replication slot {self.slot_name!r} took longer than read_timeout "
                        f"({self.read_timeout:.0f} s) for one step of {step} messages: raise the option "
                        "read_timeout, or lower capture_step_messages"
                    ) from exc
                if isinstance(exc, psycopg2.errors.ObjectInUse) and time.monotonic() < deadline and not reader.messages:
                    time.sleep(0.2)  # a reader that just stopped still holds the slot for a moment
                    continue
                if isinstance(exc, psycopg2.errors.UndefinedObject) and "slot" in msg:
                    raise self._resnapshot_error("does not exist") from exc
                if "invalidated" in msg or "can no longer get changes" in msg or "has already been removed" in msg:
                    raise self._resnapshot_error("was invalidated (the WAL it needed was removed)") from exc
                raise SourceError(f"cannot read the changes of replication slot {self.slot_name!r}: {msg}") from exc
            finally:
                conn.close()


    def _toast_error(self, rel: pgbatch.Relation, missing: list[str]) -> SourceError:
        return SourceError(
            f"table {rel.table}: an UPDATE left the large (TOASTed) column(s) {missing} unchanged and, with "
            f"REPLICA IDENTITY {_IDENT.get(rel.replica_identity, rel.replica_identity).upper()}, the "
            "changelog does not carry their values, so the full after-image cannot be built. Run "
            f"ALTER TABLE {self.quote_table(rel.table)} REPLICA IDENTITY FULL; this transaction cannot be "
            "completed: re-snapshot the table and restart capture from a new slot (drop_slot())"
        )

    def _other_change(self, info: _RelInfo, m, pos, txn: list, ts_ms: int, warned: set) -> None:
        if info.kind == "watermark":
            if isinstance(m, pgoutput.Update):
                txn.append(WatermarkEvent(m.new[info.value_idx], pos(), ts_ms))
        elif info.kind == "error":
            raise SourceError(
                f"{info.problem}. It is in the capture scope (CDC_TABLES); remove it there and from publication "
                f"{self.publication_name!r}, or fix the table"
            )
        elif info.table not in warned:
            warned.add(info.table)
            log.warning("capture skips changes of %s: %s", info.table, info.problem)

    def _row_events(self, info: _RelInfo, m, pos: Callable[[], Position], txn: list, ts_ms: int,
                    origin: tuple | None = None) -> None:
        tid, names, decs, key_idx = info.table.id, info.names, info.decoders, info.key_idx

        conversions = info.conversions

        def row(values: list) -> dict:
            vals = list(values)
            for i, d in conversions:
                v = vals[i]
                if v is not None:
                    vals[i] = d(v)
            return dict(zip(names, vals, strict=True))

        def key(values: list) -> list:
            return [values[i] for i in key_idx]

        if isinstance(m, pgoutput.Insert):
            after = row(m.new)
            txn.append(
                ChangeEvent(
                    tid,
                    Op.CREATE.value,
                    encode_key([after[names[i]] for i in key_idx]),
                    pos(),
                    None,
                    after,
                    ts_ms,
                    origin=origin,
                )
            )
            return
        if isinstance(m, pgoutput.Delete):
            if m.old_kind == "O":
                before = row(m.old)
            else:
                before = {names[i]: decs[i](m.old[i]) if m.old[i] is not None else None for i in key_idx}
            txn.append(
                ChangeEvent(
                    tid,
                    Op.DELETE.value,
                    encode_key([before[names[i]] for i in key_idx]),
                    pos(),
                    before,
                    None,
                    ts_ms,
                    origin=origin,
                )
            )
            return
        new = list(m.new)
        if any(v is pgoutput.UNCHANGED for v in new):
            missing = [names[i] for i, v in enumerate(new) if v is pgoutput.UNCHANGED]
            if m.old_kind != "O" or any(
                m.old[i] is pgoutput.UNCHANGED for i, v in enumerate(new) if v is pgoutput.UNCHANGED
            ):
                raise self._toast_error(info.batch, missing)
            new = [m.old[i] if v is pgoutput.UNCHANGED else v for i, v in enumerate(new)]
        after = row(new)
        new_key = key(new)
        before = None
        old_key = new_key
        if m.old is not None:
            if m.old_kind == "O":
                before = row(m.old)
            else:
                before = {names[i]: None if m.old[i] is None else decs[i](m.old[i]) for i in key_idx}
            old_key = key(m.old)
        k_new = encode_key([after[names[i]] for i in key_idx])
        if old_key != new_key:
            k_old = encode_key([before[names[i]] for i in key_idx])
            txn.append(ChangeEvent(tid, Op.DELETE.value, k_old, pos(), before, None, ts_ms, origin=origin))
            txn.append(ChangeEvent(tid, Op.CREATE.value, k_new, pos(), None, after, ts_ms, origin=origin))
        else:
            txn.append(ChangeEvent(tid, Op.UPDATE.value, k_new, pos(), before, after, ts_ms, origin=origin))

    def _truncate(self, m: pgoutput.Truncate, rels: dict[int, _RelInfo], pos, txn: list, ts_ms: int,
                  origin: tuple | None = None) -> None:
        """One Truncate message may name several tables (TRUNCATE a, b; CASCADE): a ``t``
        event for each captured one, at its place in the transaction."""
        hit = [rels[r].table for r in m.relids if r in rels and rels[r].kind in ("table", "error")]
        if not hit:
            return
        if self.on_truncate == "event":
            for table in hit:
                log.info("capture: TRUNCATE of %s staged as a 't' event", table)
                txn.append(ChangeEvent(table.id, Op.TRUNCATE.value, None, pos(), None, None, ts_ms, origin=origin))
            return
        if self.on_truncate == "skip":
            log.warning("capture skips TRUNCATE of %s (on_truncate='skip'): re-snapshot these tables", hit)
            return
        raise SourceError(
            f"TRUNCATE of {', '.join(map(str, hit))} is in the changelog; it removes rows without row events, so "
            "the mirror cannot follow it. Re-snapshot these tables, and set the dialect option on_truncate='skip' "
            "to let capture pass this point"
        )

    def commit_offset(self, offset: str, data_dir: str) -> None:
        """I6: confirm the slot up to ``offset`` only now that the batch is staged
        (``pg_replication_slot_advance``: it reads the WAL without decoding the changes)."""
        import psycopg2

        lsn = lsn_to_int(offset)
        row = self._slot_row()
        if row is None:
            raise self._resnapshot_error("does not exist")
        if row[0] is not None and lsn_to_int(row[0]) >= lsn:
            return
        deadline = time.monotonic() + 15
        while True:
            try:
                with self.conn.cursor() as c:
                    c.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot_name, offset))
                return
            except psycopg2.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_TRAILER = b"\xff\xff"
#: a binary COPY row of (lsn, data): field count (2 bytes), 8 (4), the LSN (8), the data's length (4)
_ROW_HEAD = 18
_BLOCK_BYTES = 8 << 20  # COPY rows kept before they are handled


def _unset() -> Position:  # events made one at a time: their positions are set when the segment is built
    return _UNSET


class _SlotRead:
    """One :meth:`PostgresDialect.read_log`: the binary COPY rows of a peek of the slot ->
    segments. ``write`` is called by psycopg2 once per row (one pgoutput message) and only
    keeps it; every ``_BLOCK_BYTES`` the block is handled: its messages' kinds and LSNs are
    read with numpy, runs of row messages go to the segment as they are (decoded when it is
    built), and the few others (Begin, Commit, Relation, TRUNCATE) are handled one at a time."""

    def __init__(self, dialect: PostgresDialect, start: int, max_events: int | None, seg_max: int | None,
                 on_segment: SegmentSink | None) -> None:
        self.d = dialect
        self.offset = int_to_lsn(start)
        self.max_events = max_events
        self.seg_max = seg_max or None
        self.on_segment = on_segment
        # a cut inside a transaction: past twice the segment's events, or its bytes
        self.cut_messages = 2 * self.seg_max if self.seg_max is not None else None
        self.cut_bytes = dialect.segment_max_bytes if self.seg_max is not None else None
        self.rows: list[bytes] = []
        self.nbytes = 0
        self.messages = 0  # rows the server sent
        self.header = True  # the COPY header is still ahead
        self.done = False  # max_events reached at a commit: the rest of the stream is not read on
        self.rels: dict[int, _RelInfo] = {}
        self.warned: set[TableName] = set()
        self.batched = dialect.capture_decode == "batch"
        self.total = 0  # events of whole transactions read (max_events)
        self.seg_bytes = 0
        self.txn_begin: tuple = ()  # the open transaction's Begin: (commit LSN, time, xid, commit before)
        self.in_txn = False
        self.ts_ms = self.txn_start = 0
        self.last_commit = None  # the commit before the transaction (if this read saw it)
        self.end = start
        self.seg = self._segment()

    # --- psycopg2's side ------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.rows.append(data)
        self.nbytes += len(data)
        if self.nbytes >= _BLOCK_BYTES:
            self.flush()

    def flush(self) -> None:
        rows, self.rows, self.nbytes = self.rows, [], 0
        if self.header and rows:
            first = rows[0]
            if not first.startswith(_COPY_SIGNATURE) or len(first) < 19:
                raise pgoutput.ProtocolError("the slot's COPY stream does not start with a binary COPY header")
            skip = 19 + int.from_bytes(first[15:19], "big")
            rows[0] = first[skip:]
            if not rows[0]:
                rows.pop(0)
            self.header = False
        if rows and rows[-1] == _COPY_TRAILER:
            rows.pop()
        if not rows or self.done:
            return
        self.messages += len(rows)
        self._block(rows)

    # --- a block of messages ---------------------------------------------------------------
    def _segment(self) -> pgbatch.Segment:
        d = self.d

        def other(info: _RelInfo, payload: bytes) -> list[LogEvent]:
            out: list[LogEvent] = []
            d._other_change(info, pgoutput.parse(payload), _unset, out, 0, self.warned)
            return out

        return pgbatch.Segment(d.watermark_table.id, d._toast_error, self.rels, other, header=_ROW_HEAD)

    def _block(self, rows: list[bytes]) -> None:
        n = len(rows)
        sizes = np.fromiter(map(len, rows), dtype=np.int64, count=n)
        if (sizes <= _ROW_HEAD).any():
            raise pgoutput.ProtocolError("a row of the slot's COPY stream is shorter than its header")
        psize = sizes - _ROW_HEAD
        rows_head = rows
        if int(sizes.sum()) > 4096 * n:  # large messages: a copy of their headers only, not of the block
            sizes = np.full(n, _ROW_HEAD + 1, dtype=np.int64)
            rows_head = [r[:_ROW_HEAD + 1] for r in rows]
        base = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=base[1:])
        buf = np.frombuffer(b"".join(rows_head), dtype=np.uint8)
        if (buf[base + 1] != 2).any() or (buf[base] != 0).any():
            raise pgoutput.ProtocolError("a row of the slot's COPY stream does not hold two fields")
        lsn = buf[base[:, None] + np.arange(6, 14)].view(">u8").ravel().astype(np.int64)
        kind = buf[base + _ROW_HEAD]
        ctrl = np.flatnonzero((kind != 0x49) & (kind != 0x55) & (kind != 0x44)).tolist()  # not Insert/Update/Delete
        i = 0
        for c in ctrl + [n]:
            if c > i:
                self._rows(rows, lsn, psize, i, c)
            if c == n or self.done:
                break
            self._control(rows[c][_ROW_HEAD:], int(lsn[c]))
            if self.done:
                break
            i = c + 1

    def _rows(self, rows: list[bytes], lsn: np.ndarray, psize: np.ndarray, i: int, j: int) -> None:
        """Row messages ``i:j`` of the block, in log order."""
        if not self.batched:
            for m in range(i, j):
                self._row_at_a_time(rows[m][_ROW_HEAD:], int(lsn[m]))
            return
        if self.cut_messages is None:
            self.seg.payloads.extend(rows[i:j])
            self.seg.lsns.extend(lsn[i:j].tolist())
            return
        cum = np.cumsum(psize[i:j])  # the run's bytes up to and including each message
        at = 0  # messages of the run kept so far
        kept = 0  # their bytes
        while at < j - i:
            # the first message after which the segment reaches its cut (as a message at a time would)
            by_count = at + max(self.cut_messages - len(self.seg.payloads) - 1, 0)
            by_bytes = max(int(np.searchsorted(cum, self.cut_bytes - self.seg_bytes + kept, side="left")), at)
            k = min(by_count, by_bytes)
            if k >= j - i:
                self.seg.payloads.extend(rows[i + at:j])
                self.seg.lsns.extend(lsn[i + at:j].tolist())
                self.seg_bytes += int(cum[-1]) - kept
                return
            self.seg.payloads.extend(rows[i + at:i + k + 1])
            self.seg.lsns.extend(lsn[i + at:i + k + 1].tolist())
            at, kept = k + 1, int(cum[k])
            self._cut()

    def _row_at_a_time(self, payload: bytes, lsn: int) -> None:
        """The reference decode (``capture_decode="rows"``): one row message's events now."""
        info = self.rels[pgoutput.U32.unpack_from(payload, 1)[0]]
        out: list[LogEvent] = []
        if info.batch is not None:
            self.d._row_events(info, pgoutput.parse(payload), _unset, out, self.ts_ms)
        else:
            self.d._other_change(info, pgoutput.parse(payload), _unset, out, self.ts_ms, self.warned)
        self.seg.events(out, lsn)
        if self.cut_messages is not None:
            self.seg_bytes += len(payload)
            if self.seg_bytes >= self.cut_bytes or len(self.seg.payloads) >= self.cut_messages:
                self._cut()

    def _cut(self) -> None:
        """A transaction too large for one segment: stage what it has so far."""
        self.total += len(self.seg) - self.txn_start
        built = self.seg.build()
        if built is not None:
            self.on_segment(built)
        base = self.seg.open_txn_events  # its events number the next part's
        self.seg = self._segment()
        self.seg.begin(*self.txn_begin, base=base)
        self.txn_start, self.seg_bytes = 0, 0

    def _control(self, payload: bytes, lsn: int) -> None:
        kind = payload[0]
        if kind == 66:  # Begin
            commit_lsn, ts_us, xid = pgoutput.BEGIN.unpack_from(payload, 1)
            self.in_txn, self.ts_ms, self.txn_start = True, ts_us // 1000 + pgoutput.PG_EPOCH_MS, len(self.seg)
            self.txn_begin = (commit_lsn, self.ts_ms, str(xid), self.last_commit)
            self.seg.begin(*self.txn_begin)
        elif kind == 67:  # Commit
            _flags, self.last_commit, end_lsn, _ts = pgoutput.COMMIT.unpack_from(payload, 1)  # Debezium's lastCommitLsn next
            self.in_txn = False
            self.total += len(self.seg) - self.txn_start
            self.end = max(self.end, end_lsn)
            if self.seg_max is not None and len(self.seg) >= self.seg_max:
                built = self.seg.build()  # ends at this commit
                if built is not None:
                    self.on_segment(built)
                self.seg = self._segment()
                self.seg_bytes = 0
            if self.max_events is not None and self.total >= self.max_events:
                self.done = True
        else:
            m = pgoutput.parse(payload)
            if isinstance(m, pgoutput.Relation):
                self.rels[m.relid] = self.d._relinfo(m)
                self.seg.relation(m.relid, self.rels[m.relid])
            elif isinstance(m, pgoutput.Truncate):
                out: list[LogEvent] = []
                self.d._truncate(m, self.rels, _unset, out, self.ts_ms)
                self.seg.events(out, lsn)

    def finish(self, upto: int, limited: bool) -> LogBatch:
        """The batch after the stream ended: ``limited``, the server stopped at the step's
        message bound (so the end it aimed at may not be reached)."""
        if self.in_txn and not self.done:
            raise pgoutput.ProtocolError("the slot's changes ended inside a transaction")
        more = self.done or limited
        if not more:
            self.end = max(self.end, upto)  # every transaction committed before ``upto`` is read
        return LogBatch(self.seg.build() or [], int_to_lsn(self.end), self.offset, more=more)


def _to_db(logical: str, value: Any) -> Any:
    if logical == "binary":
        return base64.b64decode(value)
    if logical.startswith("array<"):
        inner = logical[6:-1]
        return [None if v is None else _to_db(inner, v) for v in value]
    if logical in ("float32", "float64") or logical.startswith("decimal"):
        return str(value)
    if logical in ("date", "timestamp", "timestamptz") and isinstance(value, str):
        return temporal.canonical_to_pg(value)  # BC years back to PostgreSQL's input form
    return value


def _pg_message(exc: Exception) -> str:
    return (getattr(exc, "pgerror", None) or str(exc)).strip()
