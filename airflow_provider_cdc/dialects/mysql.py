"""MySQL and MariaDB: watermarks, chunk reads and changelog capture from the row binlog.

One dialect serves both servers. What differs between them (status statement, GTID
format, privilege names) sits in :class:`Flavour`, chosen from ``VERSION()``; nothing
else branches on the server.

Tested against MariaDB 10.11 (the server Debian ships). MySQL 8 is covered on paper
through :data:`MYSQL_80` / :data:`MYSQL_84` (see README, "MySQL and MariaDB").

Time zones: every connection runs ``SET time_zone = '+00:00'``, so a TIMESTAMP read by a
chunk SELECT is UTC, exactly like the binlog (which stores TIMESTAMP as epoch seconds).
DATETIME has no zone and is passed through unchanged.

Changelog offsets are ``{"file": <binlog file>, "pos": <byte offset>}`` JSON, always at a
transaction boundary, stored atomically in ``<changelog dir>/_offset.json`` (the server
keeps no per-reader state; ``expire_logs_days`` / ``binlog_expire_logs_seconds`` decide
how long the binlog lives, so a capture that stops too long needs a re-snapshot).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import gzip
import hashlib
import json
import logging
import math
import os
import re
import shutil
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pymysql
import pymysql.cursors

from .. import storage
from ..core.errors import ConfigurationError, SourceError, StateError, TableNotFoundError, WatermarkError
from ..core.events import ChangeEvent, LogEvent, Op, WatermarkEvent
from ..core.position import Position, binlog_file_index
from ..core.ranges import ChunkRange
from ..core.schema import Column, TableName, TableSchema, encode_key, split_table_list
from ..core.sqlnames import quote_mysql
from ..storage.layout import changelog_dir
from .base import ConnectionParams, Dialect, LogBatch, LogRetention, SegmentSink, value_bytes

log = logging.getLogger(__name__)

OFFSET_FILE = "_offset.json"
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
SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
#: table / database / column access denied, command denied: a missing grant
_ER_ACCESS_DENIED = frozenset({1142, 1044, 1143, 1227, 1045})
_ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236  # binlog file purged / position invalid


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


# --------------------------------------------------------------------------- prerequisites

REQUIRED_SETTINGS = {
    "log_bin": ("ON", "start the server with --log-bin (needs a restart)"),
    "binlog_format": ("ROW", "SET GLOBAL binlog_format = 'ROW' and binlog_format=ROW in the server config"),
    "binlog_row_image": (
        "FULL",
        "SET GLOBAL binlog_row_image = 'FULL' and binlog_row_image=FULL in the server config",
    ),
    "binlog_row_metadata": (
        "FULL",
        "SET GLOBAL binlog_row_metadata = 'FULL' and binlog_row_metadata=FULL in the server config "
        "(it applies to events written after it is set; needs MariaDB >= 10.5 or MySQL >= 8.0.14)",
    ),
}
_GRANT_RE = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<on>\S+) TO ", re.IGNORECASE)


def held_privileges(grants: Iterable[str], on: Iterable[str]) -> set[str]:
    """The privileges (upper case, spaces folded) that lines of ``SHOW GRANTS`` give on any of
    ``on`` (``*.*``, ``db.*``; backticks ignored)."""
    targets, held = set(on), set()
    for line in grants:
        m = _GRANT_RE.match(line.strip())
        if m and m.group("on").replace("`", "") in targets:
            held.update(re.sub(r"\s+", " ", p.strip().upper()) for p in m.group("privs").split(","))
    return held


def prerequisite_problems(
    settings: dict[str, str | None], grants: Iterable[str], flavour: Flavour
) -> list[str]:
    """Every unmet CDC prerequisite with its fix. ``settings`` maps variable name (lower
    case) to its value (None = the server does not have it); ``grants`` are the lines of
    ``SHOW GRANTS FOR CURRENT_USER()``. Pure, so every branch is testable with values."""
    problems = []
    for var, (want, fix) in REQUIRED_SETTINGS.items():
        got = settings.get(var)
        if got is None:
            problems.append(f"{var} is not a variable of this server (want {want}): {fix}")
        elif str(got).upper() != want:
            problems.append(f"{var} is {got!r}, must be {want}: {fix}")
    for var, want, fix in flavour.optional_settings:
        got = settings.get(var)
        if got is not None and str(got).upper() != want:
            problems.append(
                f"{var} is {got!r}, must be {want} (compressed binlog events cannot be read): {fix}"
            )
    held = held_privileges(grants, ("*.*",))
    if "ALL PRIVILEGES" not in held and "ALL" not in held:
        missing = [" or ".join(group) for group in flavour.privileges if not held.intersection(group)]
        if missing:
            problems.append(
                f"the connection user lacks privilege(s) {', '.join(missing)} on *.*: {flavour.grant_hint}"
            )
    return problems


# --------------------------------------------------------------------------- canonical values


def _float32(v: float) -> float | str:
    """Shortest decimal that round-trips through float32, so a FLOAT read as the binlog's
    exact binary value and as a SELECT (widened to DOUBLE) give the same number."""
    if math.isnan(v) or math.isinf(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    f32 = struct.unpack("<f", struct.pack("<f", v))[0]
    for digits in range(1, 10):
        cand = float(f"{f32:.{digits}g}")
        try:
            if struct.unpack("<f", struct.pack("<f", cand))[0] == f32:
                return cand
        except OverflowError:  # a rounding of a value near FLOAT's maximum passes it: try more digits
            continue
    return f32


def _float64(v: float) -> float | str:
    v = float(v)
    if math.isnan(v) or math.isinf(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _decimal(v: Any) -> str:
    return format(v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v)), "f")


def _time(td: dt.timedelta) -> str:
    """``[-]HHH:MM:SS.ffffff``: MySQL TIME spans -838:59:59 to 838:59:59."""
    us = td.days * 86_400_000_000 + td.seconds * 1_000_000 + td.microseconds
    sign = "-" if us < 0 else ""
    us = abs(us)
    secs, frac = divmod(us, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}.{frac:06d}"


def _binlog_time(td: dt.timedelta) -> str:
    """mysql-replication (1.0.x) decodes a negative TIME with a fraction as
    ``-(seconds + (1 - fraction))``: it two's-complements the integer part but not the
    stored fraction. Undo that so the binlog agrees with a SELECT (type parity test)."""
    us = td.days * 86_400_000_000 + td.seconds * 1_000_000 + td.microseconds
    if us < 0:
        secs, frac = divmod(-us, 1_000_000)
        if frac:
            us = -(secs * 1_000_000 + (1_000_000 - frac))
    return _time(dt.timedelta(microseconds=us))


def _timestamp(v: dt.datetime) -> str:
    return v.isoformat(timespec="microseconds")  # naive: YYYY-MM-DDTHH:MM:SS.ffffff


def _timestamptz(v: dt.datetime) -> str:
    if v.tzinfo is not None:
        v = v.astimezone(dt.UTC).replace(tzinfo=None)
    return _timestamp(v) + "Z"


def _bytes(v: bytes | str) -> bytes:
    # the binlog reader "decodes" binary columns with encoding "binary", which Python
    # only accepts for b"" (-> ""); every other value stays bytes
    return v.encode("latin-1") if isinstance(v, str) else bytes(v)


def _b64(v: bytes | str) -> str:
    return base64.b64encode(_bytes(v)).decode("ascii")


_ZERO_TEXT_RE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?$")


def _zero_dates_as_text(fn: Callable[[Any], Any], logical: str) -> Callable[[Any], Any]:
    """Zero and partial dates ('0000-00-00', '2020-00-00', '2020-05-00 10:00:00') name no
    day, so no datetime holds them: pymysql returns them as text, and the binlog reader (with
    :class:`_ZeroDateRows`) too. They keep that text in canonical form, so two of
    them stay two keys and a change of one is seen; the mirror stores them losslessly
    (core/temporal.py)."""

    def conv(v: Any) -> Any:
        if not isinstance(v, str | bytes):
            return fn(v)
        text = v.decode("ascii") if isinstance(v, bytes) else v
        m = _ZERO_TEXT_RE.match(text)
        if m is None:
            raise SourceError(f"MySQL returned the {logical} value {text!r}, which is not a date this package knows")
        day = f"{m.group(1)}-{m.group(2)}-{m.group(3)}"
        if logical == "date":
            return day
        clock = f"{m.group(4) or '00'}:{m.group(5) or '00'}:{m.group(6) or '00'}.{(m.group(7) or '').ljust(6, '0')}"
        return f"{day}T{clock}" + ("Z" if logical == "timestamptz" else "")

    return conv


class _ZeroDateRows:
    """mysql-replication decodes zero and partial DATE / DATETIME values to None, which would
    turn '2020-00-00' into NULL on the changelog path only. Rows events of this package's
    streams are of subclasses with this mixin first (:func:`_own_rows`), whose date readers
    decode such values to the server's text (the bits hold year, month and day exactly);
    valid dates are unchanged. The library itself is left as it is for every other user in
    the process. The method names are the ones RowsEvent's row decoder calls (its private,
    name-mangled readers), so a subclass's method is found first."""

    packet: Any

    def _RowsEvent__read_date(self):  # noqa: N802 - the name RowsEvent calls
        time = self.packet.read_uint24()
        year, month, day = (time >> 9) & ((1 << 15) - 1), (time >> 5) & 15, time & 31
        try:
            return dt.date(year, month, day)
        except ValueError:
            return f"{year:04d}-{month:02d}-{day:02d}"

    def _RowsEvent__read_datetime2(self, column):  # noqa: N802
        data = self.packet.read_int_be_by_size(5)
        part = self._RowsEvent__read_binary_slice
        year, month = divmod(part(data, 1, 17, 40), 13)
        day, hour, minute, second = part(data, 18, 5, 40), part(data, 23, 5, 40), part(data, 28, 6, 40), part(data, 34, 6, 40)
        try:
            t = dt.datetime(year, month, day, hour, minute, second)
        except ValueError:
            us = self._RowsEvent__read_fsp(column)
            return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}.{us:06d}"
        return self._RowsEvent__add_fsp_to_time(t, column)

    def _RowsEvent__read_datetime(self):  # noqa: N802
        value = self.packet.read_uint64()
        day_part, clock = divmod(value, 1_000_000)
        year, rest = divmod(day_part, 10_000)
        month, day = divmod(rest, 100)
        hour, rest = divmod(clock, 10_000)
        minute, second = divmod(rest, 100)
        try:
            return dt.datetime(year, month, day, hour, minute, second)
        except ValueError:
            return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"


@functools.cache
def _rows_subclasses() -> dict[type, type]:
    from pymysqlreplication.row_event import DeleteRowsEvent, PartialUpdateRowsEvent, UpdateRowsEvent, WriteRowsEvent

    return {c: type(c.__name__, (_ZeroDateRows, c), {"__module__": __name__})
            for c in (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, PartialUpdateRowsEvent)}


def _own_rows(ev: Any) -> Any:
    """A rows event as the :class:`_ZeroDateRows` subclass of its class, before its rows are
    decoded (the library decodes them at the first read of ``rows``); other events as they are."""
    sub = _rows_subclasses().get(type(ev))
    if sub is not None:
        ev.__class__ = sub
    return ev


def _json_text(v: Any) -> str:
    """MariaDB JSON is LONGTEXT (text both ways). MySQL's binlog JSON is binary and the
    reader decodes it to Python objects: render them the way MySQL renders JSON."""
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8")

    def plain(o: Any) -> Any:
        if isinstance(o, bytes):
            return o.decode("utf-8")
        if isinstance(o, dict):
            return {plain(k): plain(x) for k, x in o.items()}
        if isinstance(o, list | tuple):
            return [plain(x) for x in o]
        return o

    return json.dumps(plain(v), ensure_ascii=False, separators=(", ", ": "))


# information_schema DATA_TYPE -> logical type (signed, unsigned)
_INT_TYPES = {
    "tinyint": ("int16", "int16"),
    "smallint": ("int16", "int32"),
    "mediumint": ("int32", "int32"),
    "int": ("int32", "int64"),
    "integer": ("int32", "int64"),
    "bigint": ("int64", "uint64"),
}
_STRING_TYPES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


def logical_type(data_type: str, column_type: str, precision: int | None, scale: int | None) -> str | None:
    """MySQL column -> logical type of core/schema.py, None when unsupported."""
    t = data_type.lower()
    unsigned = "unsigned" in column_type.lower()
    if t in _INT_TYPES:
        return _INT_TYPES[t][unsigned]
    if t in ("decimal", "numeric"):
        return f"decimal({int(precision or 10)},{int(scale or 0)})"
    if t == "float":
        return "float32"
    if t in ("double", "real", "double precision"):
        return "float64"
    if t == "bit":
        return "uint64" if (precision or 1) == 64 else "int64"
    if t == "year":
        return "int16"
    if t in _STRING_TYPES:
        return "string"
    if t in _BINARY_TYPES:
        return "binary"
    if t == "json":
        return "json"
    if t == "date":
        return "date"
    if t == "time":
        return "time"
    if t == "datetime":
        return "timestamp"
    if t == "timestamp":
        return "timestamptz"
    return None


def _select_converter(col: Column) -> Callable[[Any], Any]:
    """Driver value of a chunk SELECT -> canonical value."""
    t, src = col.type, col.source_type.lower()
    if src.startswith("bit"):
        return lambda v: int.from_bytes(v, "big") if isinstance(v, bytes | bytearray) else int(v)
    if t in ("int16", "int32", "int64", "uint64"):
        return int
    if t.startswith("decimal"):
        return _decimal
    if t == "float32":
        return _float32
    if t == "float64":
        return _float64
    if t == "binary":
        return _b64
    if t == "date":
        return _zero_dates_as_text(lambda v: v.isoformat(), t)
    if t == "time":
        return _time
    if t == "timestamp":
        return _zero_dates_as_text(_timestamp, t)
    if t == "timestamptz":
        return _zero_dates_as_text(_timestamptz, t)
    if t == "json":
        return _json_text
    return lambda v: v if isinstance(v, str) else (v.decode("utf-8") if isinstance(v, bytes) else str(v))


# mysql-replication FIELD_TYPE codes
_FT_DECIMAL, _FT_TINY, _FT_SHORT, _FT_LONG, _FT_FLOAT, _FT_DOUBLE = 0, 1, 2, 3, 4, 5
_FT_TIMESTAMP, _FT_LONGLONG, _FT_INT24, _FT_DATE, _FT_TIME, _FT_DATETIME, _FT_YEAR = 7, 8, 9, 10, 11, 12, 13
_FT_VARCHAR, _FT_BIT, _FT_TIMESTAMP2, _FT_DATETIME2, _FT_TIME2 = 15, 16, 17, 18, 19
_FT_JSON, _FT_NEWDECIMAL, _FT_ENUM, _FT_SET = 245, 246, 247, 248
_FT_TINY_BLOB, _FT_MEDIUM_BLOB, _FT_LONG_BLOB, _FT_BLOB, _FT_VAR_STRING, _FT_STRING, _FT_GEOMETRY = (
    249,
    250,
    251,
    252,
    253,
    254,
    255,
)
_EPOCH = dt.datetime(1970, 1, 1)
_INT_CODES = {_FT_TINY, _FT_SHORT, _FT_LONG, _FT_LONGLONG, _FT_INT24}
_TEXT_CODES = {
    _FT_VARCHAR,
    _FT_VAR_STRING,
    _FT_STRING,
    _FT_ENUM,
    _FT_BLOB,
    _FT_TINY_BLOB,
    _FT_MEDIUM_BLOB,
    _FT_LONG_BLOB,
}


def _binlog_converter(col: Any) -> Callable[[Any], Any]:
    """mysql-replication column (from the table map with FULL row metadata) -> a
    function from its decoded value to the canonical value. Mirrors _select_converter."""
    ft = col.type
    binary = (col.character_set_name or "").lower() == "binary"
    if ft in _INT_CODES:
        return int
    if ft == _FT_YEAR:
        return lambda v: 0 if v == 1900 else int(v)  # YEAR 0000 is stored as 0 (+1900)
    if ft in (_FT_NEWDECIMAL, _FT_DECIMAL):
        return _decimal
    if ft == _FT_FLOAT:
        return _float32
    if ft == _FT_DOUBLE:
        return _float64
    if ft == _FT_BIT:
        return lambda v: int(v, 2) if isinstance(v, str) else int(v)
    if ft in (_FT_STRING, _FT_VAR_STRING, _FT_VARCHAR) and binary:
        width = getattr(col, "max_length", 0) or 0
        if ft == _FT_STRING and width:
            # BINARY(n): the binlog drops the trailing 0x00 padding a SELECT returns
            return lambda v: _b64(_bytes(v).ljust(width, b"\x00"))
        return _b64
    if ft in (_FT_BLOB, _FT_TINY_BLOB, _FT_MEDIUM_BLOB, _FT_LONG_BLOB) and binary:
        return _b64
    if ft == _FT_SET:
        order = {name: i for i, name in enumerate(col.set_values or [])}
        return lambda v: (
            ",".join(sorted(v, key=lambda x: order.get(x, len(order)))) if not isinstance(v, str) else v
        )
    if ft in (_FT_DATE,):
        return _zero_dates_as_text(lambda v: v.isoformat(), "date")
    if ft in (_FT_TIME, _FT_TIME2):
        return _binlog_time
    if ft in (_FT_DATETIME, _FT_DATETIME2):
        return _zero_dates_as_text(_timestamp, "timestamp")
    if ft in (_FT_TIMESTAMP, _FT_TIMESTAMP2):
        # decoded from epoch seconds as naive UTC; epoch 0 is the zero timestamp
        # '0000-00-00 00:00:00' (1970-01-01 00:00:00 UTC is outside TIMESTAMP's range)
        return lambda v: "0000-00-00T00:00:00.000000Z" if v == _EPOCH else _timestamptz(v)
    if ft == _FT_JSON:
        return _json_text
    return _text_or_b64


def _text_or_b64(v: Any) -> Any:
    """Text columns arrive decoded; bytes of a type without a mapping (only reachable when
    capturing every table) stay readable as UTF-8 or become base64."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return _b64(v)
    return v


def _bounded_batches(cur: Any, batch_size: int, max_bytes: int) -> Iterator[list[tuple]]:
    """Rows of an unbuffered cursor in batches of at most ``batch_size`` rows, each ending
    once its values reach ``max_bytes`` (the row that reaches it included)."""
    fetchone = cur.fetchone
    while True:
        rows: list[tuple] = []
        size = 0
        row = None
        while len(rows) < batch_size and size < max_bytes:
            row = fetchone()
            if row is None:
                break
            rows.append(row)
            size += value_bytes(row)
        if rows:
            box = [rows]
            del rows
            yield box.pop()  # no reference left here: the caller may free the batch
        if row is None:
            return


# --------------------------------------------------------------------------- offsets


@dataclass(frozen=True, order=True)
class BinlogOffset:
    """A transaction boundary in the binlog; order = (file index, byte offset)."""

    index: int
    pos: int
    file: str

    @classmethod
    def of(cls, file: str, pos: int) -> BinlogOffset:
        return cls(binlog_file_index(file), int(pos), file)

    def to_json(self, **extra: Any) -> str:
        return json.dumps({"file": self.file, "pos": self.pos, **extra}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BinlogOffset:
        try:
            d = json.loads(text)
            return cls.of(d["file"], d["pos"])
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(
                f'not a MySQL binlog offset: {text!r} (want JSON {{"file": "binlog.000001", "pos": 4}})'
            ) from exc


# --------------------------------------------------------------------------- dialect


class MySqlDialect(Dialect):
    """A replication server id derived from the source name: stable across runs (one
    capture per source at a time) and unlikely to collide with real replicas' small ids."""
    lock_acquire_sql = "SELECT GET_LOCK(%s, 0)"
    lock_release_sql = "SELECT RELEASE_LOCK(%s)"
    """MySQL / MariaDB source. Options: ``server_id`` (replication id of the capture,
    default derived from the source name; must be unique among the server's replicas
    and readers), ``tables`` (``schema.table`` ids to capture; default every table with
    a primary key outside the system schemas and the watermark database), ``connect_timeout``,
    ``on_truncate`` ("event" (default): a TRUNCATE TABLE statement of a captured table is
    staged as an event ``op = "t"`` at its binlog position, and the mirror drops every row of
    the table older than it; "fail": capture stops naming the statement; "skip": a warning)."""

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

    # --- prerequisites and metadata ---------------------------------------------------
    def check_prerequisites(self) -> None:
        names = [*REQUIRED_SETTINGS, *(v for v, _, _ in self.flavour.optional_settings)]
        # SHOW (not information_schema.GLOBAL_VARIABLES, which MySQL 8 removed) works on both
        rows = self._query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names
        )
        settings: dict[str, str | None] = {n: None for n in names}
        settings.update({name.lower(): value for name, value in rows})
        grants = [r[0] for r in self._query("SHOW GRANTS FOR CURRENT_USER()")]
        problems = prerequisite_problems(settings, grants, self.flavour) + self.privilege_problems(grants)
        if problems:
            where = f"{self.params.host}:{self.params.port or 3306}"
            raise SourceError(
                f"{self.flavour.name} server {where} (source {self.source!r}) cannot serve CDC:\n- "
                + "\n- ".join(problems)
            )

    def check_readable(self, table: TableName) -> None:
        try:
            self._query(f"SELECT 1 FROM {self.quote_table(table)} WHERE 1 = 0")  # noqa: S608
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in _ER_ACCESS_DENIED:
                raise SourceError(
                    f"user {self.params.user!r} may not read table {table} ({exc.args[-1]}): GRANT SELECT ON "
                    f"{self.quote_table(table)} TO {self.params.user!r}"
                ) from None
            if exc.args and exc.args[0] in (1049, 1146):  # unknown database / table: describe_table names it
                return
            raise

    def privilege_problems(self, grants: Sequence[str]) -> list[str]:
        """The grants on the captured tables and the watermark table the user lacks, each as the
        statement that gives it; ``grants``: the lines of SHOW GRANTS that check_prerequisites read."""
        problems = []
        for table in sorted(self.tables or (), key=str):
            try:
                self.check_readable(table)
            except SourceError as exc:
                problems.append(str(exc))
        wm, user = self.watermark_table, self.params.user
        try:
            self._query(f"SELECT `value` FROM {self.quote_table(wm)} WHERE 1 = 0")  # noqa: S608
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in _ER_ACCESS_DENIED:
                problems.append(f"GRANT SELECT, UPDATE ON {self.quote_table(wm)} TO {user!r} (the watermark table)")
            elif exc.args and exc.args[0] in (1049, 1146) and not held_privileges(grants, ("*.*", f"{wm.schema}.*")) & {
                    "CREATE", "ALL", "ALL PRIVILEGES"}:
                problems.append(
                    f"the watermark table {wm} does not exist and user {user!r} may not create it: GRANT CREATE ON "
                    f"{self.quote_ident(wm.schema)}.* TO {user!r}, or have an administrator create it (README "
                    "'Security', set-up 2)"
                )
        return problems

    def describe_table(self, table: TableName) -> TableSchema:
        rows = self._query(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE"
            " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
            " ORDER BY ORDINAL_POSITION",
            (table.schema, table.name),
        )
        if not rows:
            if not self._query(
                "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (table.schema,)
            ):
                raise TableNotFoundError(f"table {table}: database {table.schema!r} does not exist on the source")
            raise TableNotFoundError(
                f"table {table} does not exist in database {table.schema!r} (check the name and case)"
            )
        json_cols = self._json_check_columns(table) if self.flavour.is_mariadb else set()
        cols, unsupported = [], []
        for name, data_type, column_type, nullable, precision, scale in rows:
            data_type, column_type = _text(data_type), _text(column_type)
            if data_type == "bit":
                precision = int(re.search(r"\((\d+)\)", column_type).group(1)) if "(" in column_type else 1
            lt = "json" if name in json_cols else logical_type(data_type, column_type, precision, scale)
            if lt is None:
                unsupported.append(f"{name!r} ({column_type})")
                continue
            cols.append(Column(name, lt, column_type, nullable == "YES"))
        if unsupported:
            raise SourceError(
                f"table {table}: column(s) of unsupported type: {', '.join(unsupported)}; "
                f"exclude the table or change the column type"
            )
        pk = [
            r[0]
            for r in self._query(
                "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
                " AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
                (table.schema, table.name),
            )
        ]
        if not pk:
            raise SourceError(
                f"table {table} has no primary key; DBLog chunks and de-duplicates by primary key: add one "
                f"(ALTER TABLE ... ADD PRIMARY KEY) or exclude the table"
            )
        return TableSchema(table, tuple(cols), tuple(pk), {"flavour": self.flavour.name,
                                                           "connector": "mariadb" if self.flavour.is_mariadb else "mysql"})

    def _json_check_columns(self, table: TableName) -> set[str]:
        """MariaDB's JSON is LONGTEXT plus a ``json_valid(`col`)`` CHECK constraint."""
        try:
            rows = self._query(
                "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS"
                " WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s",
                (table.schema, table.name),
            )
        except pymysql.err.MySQLError:
            return set()
        out = set()
        for (clause,) in rows:
            m = re.fullmatch(r"json_valid\(`((?:[^`]|``)+)`\)", _text(clause).strip())
            if m:
                out.add(m.group(1).replace("``", "`"))
        return out

    # --- watermarks -------------------------------------------------------------------
    def ensure_watermark_table(self) -> None:
        """DDL only when something is missing: CREATE ... IF NOT EXISTS still demands the CREATE
        privilege, which a least-privilege user of a pre-created watermark table lacks."""
        wm = self.watermark_table
        try:
            if self._query(f"SELECT 1 FROM {self.quote_table(wm)} WHERE `id` = 1"):  # noqa: S608
                return
        except pymysql.err.MySQLError as exc:
            if not (exc.args and exc.args[0] in (1049, 1146)):
                raise self._grant_error(exc, f"GRANT SELECT, UPDATE ON {self.quote_table(wm)}") from None
        try:
            if not self._query("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (wm.schema,)):
                self._query(f"CREATE DATABASE IF NOT EXISTS {self.quote_ident(wm.schema)}")
            self._query(
                f"CREATE TABLE IF NOT EXISTS {self.quote_table(wm)} ("
                "`id` TINYINT UNSIGNED NOT NULL PRIMARY KEY, `value` VARCHAR(64) NOT NULL"
                ") ENGINE=InnoDB"
            )
            self._query(f"INSERT IGNORE INTO {self.quote_table(wm)} (`id`, `value`) VALUES (1, '')")  # noqa: S608
        except pymysql.err.MySQLError as exc:
            raise self._grant_error(
                exc, f"GRANT CREATE, INSERT, SELECT, UPDATE ON {self.quote_ident(wm.schema)}.*",
                "or have an administrator create the watermark table (README 'Security', set-up 2)") from None

    def _grant_error(self, exc: Exception, grant: str, alternative: str = "") -> Exception:
        """A permission error as a SourceError naming the grant; any other error as it is."""
        if not (getattr(exc, "args", None) and exc.args[0] in _ER_ACCESS_DENIED):
            return exc
        return SourceError(
            f"user {self.params.user!r} lacks a privilege ({exc.args[-1]}): {grant} TO {self.params.user!r}"
            + (f", {alternative}" if alternative else "")
        )

    def write_watermark(self, watermark_id: str) -> None:
        """DBLog steps 1 and 3: autocommit, so the UPDATE is its own committed transaction."""
        with self._lock:
            with self.conn.cursor() as cur:
                try:
                    n = cur.execute(
                        f"UPDATE {self.quote_table(self.watermark_table)} SET `value` = %s WHERE `id` = 1",  # noqa: S608
                        (watermark_id,),
                    )
                except pymysql.err.MySQLError as exc:
                    if exc.args and exc.args[0] in _ER_ACCESS_DENIED:
                        raise self._grant_error(exc, f"GRANT SELECT, UPDATE ON {self.quote_table(self.watermark_table)}") from None
                    if not isinstance(exc, pymysql.err.ProgrammingError):
                        raise
                    raise WatermarkError(
                        f"watermark table {self.watermark_table} is missing ({exc.args[-1]}); run ensure_watermark_table()"
                    ) from exc
        if n != 1:
            raise WatermarkError(
                f"watermark table {self.watermark_table} has no row id=1 (or the value did not change); "
                f"run ensure_watermark_table() and use a fresh watermark id"
            )

    # --- chunks -----------------------------------------------------------------------
    def chunk_query(
        self, schema: TableSchema, rng: ChunkRange, *, after_key, limit, where=None, columns=None, upper_bound=None
    ):
        """The shared keyset SELECT, with FLOAT columns widened to DOUBLE (``+ 0e0``):
        the server prints FLOAT with 6 significant digits, the binlog has all 24 bits."""
        sql, params = super().chunk_query(
            schema,
            rng,
            after_key=after_key,
            limit=limit,
            where=where,
            columns=columns,
            upper_bound=upper_bound,
        )
        names = list(columns or schema.column_names)
        plain = ", ".join(self.quote_ident(c) for c in names)
        widened = ", ".join(
            f"{self.quote_ident(c)} + 0e0 AS {self.quote_ident(c)}"
            if schema.column(c).type == "float32"
            else self.quote_ident(c)
            for c in names
        )
        prefix = f"SELECT {plain} FROM "  # noqa: S608
        if widened != plain and sql.startswith(prefix):
            sql = f"SELECT {widened} FROM " + sql[len(prefix) :]  # noqa: S608
        return sql, params

    stream_max_bytes = True

    def stream_query(
        self, sql: str, params: Sequence[Any], batch_size: int = 10_000, max_bytes: int | None = None
    ) -> Iterator[list[tuple]]:
        """A fresh autocommit statement on its own connection with an unbuffered cursor:
        InnoDB gives it a read view taken when it starts, after the low watermark committed.
        ``max_bytes``: a batch also ends once its rows' values (:func:`value_bytes`) reach it,
        so rows of large values come a few at a time (the cursor reads a row at a time)."""
        conn = self._connect(cursorclass=pymysql.cursors.SSCursor)
        try:
            with conn.cursor() as cur:
                try:
                    cur.execute(sql, list(params))
                except pymysql.err.MySQLError as exc:
                    raise SourceError(f"the source rejected the chunk query ({exc.args[-1]}): {sql}") from exc
                if max_bytes:
                    yield from _bounded_batches(cur, batch_size, max_bytes)
                    return
                while True:
                    box = [list(cur.fetchmany(batch_size))]
                    if not box[0]:
                        break
                    yield box.pop()  # no reference left here: the caller may free the batch
        finally:
            conn.close()

    def _select_converters(self, schema: TableSchema) -> list[tuple[str, Callable[[Any], Any] | None]]:
        """Per-column converters, cached per schema object (looked up once per row)."""
        hit = self._converters.get(id(schema))
        if hit is None or hit[0] is not schema:
            convs = []
            for c in schema.columns:
                conv = _select_converter(c)
                # pymysql already returns canonical ints and text
                passthrough = conv is int or (c.type in ("string", "json") and conv is not _json_text)
                convs.append((c.name, None if passthrough else conv))
            hit = self._converters[id(schema)] = (schema, convs)
        return hit[1]

    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        return {
            name: (v if conv is None or v is None else conv(v))
            for (name, conv), v in zip(self._select_converters(schema), row, strict=True)
        }

    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        if value is None:
            return None
        t = schema.column(column).type
        if t == "binary":
            return base64.b64decode(value)
        if t.startswith("decimal"):
            return decimal.Decimal(value)
        if t in ("timestamptz", "timestamp", "date"):
            text = str(value).removesuffix("Z")  # session time_zone is UTC
            try:
                return dt.date.fromisoformat(text) if t == "date" else dt.datetime.fromisoformat(text)
            except ValueError:
                return text.replace("T", " ")  # a zero or partial date: the server compares its text
        if t in ("float32", "float64") and isinstance(value, str):
            return float(value.replace("Infinity", "inf"))
        if t == "float32":
            # the canonical FLOAT is the shortest decimal that rounds to it; bound as that
            # decimal it may sit below the stored value, and `k <= bound` would lose the row
            return struct.unpack("<f", struct.pack("<f", float(value)))[0]
        return value

    def _key_tuple(self, schema: TableSchema, row: tuple) -> tuple:
        convs = dict(self._select_converters(schema))
        return tuple(
            v if v is None or convs[k] is None else convs[k](v)
            for k, v in zip(schema.primary_key, row, strict=True)
        )

    def _key_columns(self, schema: TableSchema) -> str:
        """The key columns for a SELECT, FLOAT ones widened to DOUBLE as in chunk_query: a
        FLOAT key printed with 6 digits is not the stored value, so a bound taken from it
        would cut off the largest key (or split a range between two keys)."""
        return ", ".join(
            f"{self.quote_ident(k)} + 0e0 AS {self.quote_ident(k)}" if schema.column(k).type == "float32"
            else self.quote_ident(k)
            for k in schema.primary_key
        )

    def max_key(self, schema: TableSchema, where: str | None = None) -> tuple | None:
        pk = self._key_columns(schema)
        desc = ", ".join(f"{self.quote_ident(k)} DESC" for k in schema.primary_key)
        cond, params = self.render_filter(where, schema) if where else ("", [])
        cond = f" WHERE {cond}" if cond else ""
        sql = f"SELECT {pk} FROM {self.quote_table(schema.table)}{cond} ORDER BY {desc} LIMIT 1"  # noqa: S608
        try:
            rows = self._query(sql, tuple(params))
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"table {schema.table}: the source rejected {sql!r} ({exc.args[-1]})") from exc
        return self._key_tuple(schema, rows[0]) if rows else None

    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        """Every n-th key by a window function, n from the optimizer's row estimate, so
        only ~count keys cross the wire."""
        if count <= 0:
            return []
        est = self._query(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (schema.table.schema, schema.table.name),
        )
        n = int(est[0][0] or 0) if est else 0
        if n < 10 * count:
            n = int(self._query(f"SELECT COUNT(*) FROM {self.quote_table(schema.table)}")[0][0])  # noqa: S608
        if n == 0:
            return []
        step = max(1, n // (count + 1))
        pk = ", ".join(self.quote_ident(k) for k in schema.primary_key)
        exact = self._key_columns(schema)  # FLOAT keys as stored (see _key_columns)
        rows = self._query(
            f"SELECT {pk} FROM (SELECT {exact}, ROW_NUMBER() OVER (ORDER BY {pk}) AS `__cdc_rn`"  # noqa: S608
            f" FROM {self.quote_table(schema.table)}) AS `__cdc_s` WHERE MOD(`__cdc_rn`, %s) = 0 ORDER BY {pk} LIMIT %s",
            (step, count),
        )
        return [self._key_tuple(schema, r) for r in rows]

    # --- changelog --------------------------------------------------------------------
    def binlog_end(self) -> BinlogOffset:
        """The current end of the binlog (file and position), always a transaction boundary."""
        rows = self._query(self.flavour.status_sql)
        if not rows or not rows[0][0]:
            raise SourceError(
                f"{self.flavour.status_sql} returned nothing: binary logging is off on the source "
                f"(start the server with --log-bin; see check_prerequisites())"
            )
        return BinlogOffset.of(rows[0][0], rows[0][1])

    def _gtid(self) -> str | None:
        try:
            return str(self._query(self.flavour.gtid_sql)[0][0] or "") or None
        except pymysql.err.MySQLError:
            return None

    def current_position(self) -> Position:
        end = self.binlog_end()
        return Position.binlog(end.index, end.pos, 0)

    def _offset_path(self, data_dir: str) -> str:
        return storage.join(changelog_dir(data_dir, self.source), OFFSET_FILE)

    def load_offset(self, data_dir: str) -> str:
        """The committed offset; when there is none yet, start at the current end of the
        binlog and commit that at once, so a later crash cannot skip what came between."""
        self.require_capture_scope()
        self.__dict__["_data_dir"] = data_dir  # prepared XA transactions wait under its changelog folder
        p = self._offset_path(data_dir)
        if storage.exists(p):
            text = storage.read_text(p)
            BinlogOffset.from_json(text)
            return text
        end = self.binlog_end()
        text = end.to_json(gtid=self._gtid())
        # XA transactions prepared before a fresh start were never read: none may match a later commit
        storage.delete_dir(storage.join(changelog_dir(data_dir, self.source), XA_DIR))
        self.commit_offset(text, data_dir)
        return text

    def commit_offset(self, offset: str, data_dir: str) -> None:
        """Atomic (storage.atomic_output): a reader sees the old or the new offset. Then the
        staged XA transactions committed or rolled back before it are deleted."""
        BinlogOffset.from_json(offset)
        storage.write_text(self._offset_path(data_dir), offset)
        self.__dict__["_data_dir"] = data_dir
        self._xa_cleanup(offset)

    def log_retention(self, offset: str) -> LogRetention | None:
        """Binlog bytes written past ``offset``, and the age after which the server purges a
        binlog file (``binlog_expire_logs_seconds``, else ``expire_logs_days``; None: never).
        The file holding the next change to capture was written to after the newest change
        captured, so the capture's lag in seconds bounds that file's age from above."""
        start = BinlogOffset.from_json(offset)
        files = [(r[0], int(r[1])) for r in self._query("SHOW BINARY LOGS")]
        end = self.binlog_end()
        names = [f for f, _ in files]
        lost = start.file not in names
        lag = 0
        if not lost:
            for name, size in files[names.index(start.file):]:
                if binlog_file_index(name) > end.index:
                    break
                upto = end.pos if name == end.file else size
                lag += max(0, upto - (start.pos if name == start.file else 0))
        expire, setting = None, "binlog_expire_logs_seconds"
        for name, scale in (("binlog_expire_logs_seconds", 1), ("expire_logs_days", 86400)):
            try:
                value = self._query(f"SELECT @@{name}")[0][0]  # a fixed name: no identifier from outside
            except pymysql.err.MySQLError:  # a server without it (expire_logs_days only, or neither)
                continue
            setting = name
            if value is not None and float(value) > 0:
                expire = float(value) * scale
            break
        return LogRetention(
            holder=f"binlog file {start.file!r}", lag_bytes=lag, lost=lost, limit_seconds=expire, setting=setting,
            fix=f"run the capture more often (the changelog DAG's schedule), or raise {setting}; once the file "
                f"is purged the captured tables need a re-snapshot and a new capture offset",
        )

    def _check_not_purged(self, start: BinlogOffset) -> None:
        files = [r[0] for r in self._query("SHOW BINARY LOGS")]
        if start.file not in files:
            oldest = files[0] if files else "none"
            raise SourceError(
                f"source {self.source!r}: binlog file {start.file} of the committed offset (pos {start.pos}) is no "
                f"longer on the server (oldest binlog: {oldest}); the changes since were purged. Re-snapshot the "
                f"captured tables and reset the capture offset (delete {OFFSET_FILE} in the changelog staging dir)."
            )

    def _capture_table(self, schema: str, table: str) -> bool:
        if self.tables:
            return TableName(schema, table) in self.tables
        # the watermark database holds every source's watermark tables: CDC's, not the user's
        return schema not in SYSTEM_SCHEMAS and schema != self.watermark_table.schema

    def read_log(
        self,
        offset: str,
        *,
        max_events: int | None = None,
        segment_max_events: int | None = None,
        on_segment: SegmentSink | None = None,
    ) -> LogBatch:
        """Binlog from ``offset`` to the end read at the start (SHOW MASTER STATUS). The
        returned end offset is always at a group end (after an XID, COMMIT, ROLLBACK, DDL or XA
        PREPARE), never inside a transaction (I6).

        Segments go to ``on_segment`` at a group end once ``segment_max_events`` events or
        ``segment_max_bytes`` bytes of rows events are read, and inside a group at twice the
        events or at the bytes: the binlog holds only committed groups, so a group's parts may
        be staged before it ends, and memory follows the segment, not the transaction (I11).
        The cuts depend only on the events read from ``offset``: a capture killed between parts
        rereads from the same offset and rewrites the same segment names.

        A group that may still drop events at its end is held (:class:`_HeldGroup`: in memory
        up to the same bound, then in part files) instead of streamed: a MariaDB group not
        flagged transactional (it changed a non-transactional table: at ``ROLLBACK`` or
        ``ROLLBACK TO SAVEPOINT`` only those tables' changes stand), every MySQL group (its GTID
        event does not say), and an XA transaction: at ``XA PREPARE`` its events are written
        under ``<changelog dir>/_xa/`` before the offset may pass it, and they are staged at
        its ``XA COMMIT`` with the commit's position, where the change becomes visible (I1), or
        dropped at ``XA ROLLBACK``, in this run or a later one. Events whose changes cannot be
        read are refused (:meth:`_refuse`), never skipped silently."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            ExecuteLoadQueryEvent,
            FormatDescriptionEvent,
            GtidEvent,
            MariadbGtidEvent,
            NotImplementedEvent,
            QueryEvent,
            RotateEvent,
            XAPrepareEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import (
            DeleteRowsEvent,
            PartialUpdateRowsEvent,
            UpdateRowsEvent,
            WriteRowsEvent,
        )

        start = BinlogOffset.from_json(offset)
        end = self.binlog_end()
        if start > end:
            raise StateError(
                f"source {self.source!r}: committed offset {start.file}:{start.pos} is past the end of the binlog "
                f"({end.file}:{end.pos}); the offset belongs to another server or the binlog was reset. "
                f"Re-snapshot and delete {OFFSET_FILE}."
            )
        if start == end:
            return LogBatch([], offset, offset)
        self._check_not_purged(start)
        self._binlog_converters.clear()  # table ids are per binlog session
        self.__dict__["_engines"] = {}  # table -> transactional, looked up when a held group rolls back

        self.require_capture_scope()
        wm = self.watermark_table
        only_schemas = None
        if self.tables:
            only_schemas = sorted({t.schema for t in self.tables} | {wm.schema})
        p = self.params
        stream = BinLogStreamReader(
            connection_settings={
                "host": p.host,
                "port": p.port or 3306,
                "user": p.user or "root",
                "passwd": p.password or "",
                "charset": "utf8mb4",
                **self._driver_settings(),
            },
            server_id=self.server_id,
            blocking=False,
            resume_stream=True,
            log_file=start.file,
            log_pos=start.pos,
            # NotImplementedEvent: every event type the reader does not decode comes here, so
            # the ones that carry changes (compressed, incident, LOAD) are refused, not dropped
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                PartialUpdateRowsEvent,
                XidEvent,
                QueryEvent,
                RotateEvent,
                MariadbGtidEvent,
                GtidEvent,
                FormatDescriptionEvent,
                XAPrepareEvent,
                ExecuteLoadQueryEvent,
                NotImplementedEvent,
            ],
            only_schemas=only_schemas,
            enable_logging=False,
        )
        seg_max = segment_max_events if on_segment is not None and segment_max_events else None
        inside_max = 2 * seg_max if seg_max is not None else None  # a cut inside a group
        max_bytes = self.segment_max_bytes
        hold_max = inside_max or 2 * (self.segment_max_events or 20_000)  # held events in memory
        scratch = _Scratch()
        out: list[LogEvent] = []
        seg_bytes = 0  # rows-event bytes of the events in ``out``
        total = 0  # events of whole groups read (max_events)
        group_count = 0  # events the open group put in ``out``
        group_mark = 0  # where the open group's events start in ``out``
        in_group = False
        held: _HeldGroup | None = None  # the open group is held (None: streamed into ``out``)
        group_start: tuple[int, int] | None = None  # (file index, offset) of its GTID event
        committed = start
        current_file = start.file
        skipped: set[str] = set()
        in_txn = False  # inside BEGIN .. COMMIT/XID: no boundary until it ends
        group_gtid = committed_gtid = None  # GTID of the last whole group (for the record)
        thread = None  # thread id of the transaction's BEGIN (Debezium's source.thread)

        def flush() -> None:
            nonlocal out, seg_bytes, group_mark
            if out:
                on_segment(out)
                out = []
            seg_bytes, group_mark = 0, 0

        def emit(events: list[LogEvent], nbytes: int) -> None:
            nonlocal seg_bytes, group_count
            group_count += len(events)
            if inside_max is None:
                out.extend(events)
                return
            i = 0
            while len(out) + len(events) - i > inside_max:
                # the segment would pass twice its events inside a group: stage it full, go on
                room = inside_max - len(out)
                out.extend(events[i:i + room])
                i += room
                flush()
            out.extend(events[i:] if i else events)
            seg_bytes += nbytes
            if seg_bytes >= max_bytes:
                flush()

        def add(events: list[LogEvent], nbytes: int) -> None:
            if held is None:
                emit(events, nbytes)
            else:
                held.add(events, nbytes)

        def begin_group(where: str, hold: bool, xa: bool = False) -> None:
            nonlocal in_group, held, group_count, group_mark
            if in_group:
                self._unclosed_group(where, group_count + (held.count if held else 0))
                close_open_group()
            in_group, group_count, group_mark = True, 0, len(out)
            held = _HeldGroup(self, hold_max, max_bytes, scratch, group_start) if hold or xa else None
            if xa:
                held.make_xa(self._xa_root())

        def close_open_group() -> None:
            """Forget a group that did not end (its events are not part of the returned batch)."""
            nonlocal in_group, held
            if held is not None:
                held.discard()
            elif group_mark < len(out):
                del out[group_mark:]
            in_group, held = False, None

        def end_group(ev_end: BinlogOffset, how: str = "commit") -> bool:
            """``how``: commit (its events stand), rollback (only non-transactional tables'
            changes stand), prepared (an XA PREPARE: its events were persisted by the caller)."""
            nonlocal in_group, held, total, committed, committed_gtid, in_txn, group_count
            if held is not None:
                if how != "prepared":
                    for events, nbytes in held.drain(rollback=how == "rollback"):
                        emit(events, nbytes)
                    held.discard()
            total += group_count
            in_group, held, in_txn, group_count = False, None, False, 0
            committed, committed_gtid = ev_end, group_gtid
            if seg_max is not None and (len(out) >= seg_max or seg_bytes >= max_bytes):
                flush()  # ends at this group's end
            return max_events is not None and total >= max_events

        try:
            for ev in map(_own_rows, stream):
                # the reader's packet and event point at each other: a cycle per event that only
                # the cyclic GC frees, late in a process of many objects (memory would follow the
                # transaction); cut it so each event is freed when the next one is read
                ev.packet.event = None
                if isinstance(ev, RotateEvent):
                    current_file = ev.next_binlog
                    nxt = BinlogOffset.of(ev.next_binlog, ev.position)
                    if not in_group and committed < nxt <= end:
                        committed = nxt
                    continue
                if isinstance(ev, FormatDescriptionEvent):
                    continue
                ev_end = BinlogOffset.of(current_file, ev.packet.log_pos)
                if ev_end > end:
                    break  # written after this read began: the next capture takes it
                ev_start = ev.packet.log_pos - ev.packet.event_size
                where = f"{current_file}:{ev_start}"
                stop = False
                if isinstance(ev, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                    if isinstance(ev, PartialUpdateRowsEvent):
                        table = TableName(ev.schema, ev.table)
                        self._refuse(
                            f"a partial JSON rows event (binlog_row_value_options = PARTIAL_JSON) of table {table} "
                            f"at {where}: its rows lack the whole after image. Make binlog_row_value_options empty "
                            "and re-snapshot the table"
                        )
                        continue
                    origin = (group_gtid, None, None, ev.packet.server_id, thread, current_file)
                    events = self._row_events(ev, current_file, wm, skipped, origin)
                    if events:
                        add(events, ev.packet.event_size)
                elif isinstance(ev, MariadbGtidEvent):
                    # a MariaDB group starts here. flags2: FL_STANDALONE (1, one statement, no
                    # BEGIN), FL_TRANSACTIONAL (4, InnoDB changes only: it ends with its XID and
                    # nothing in it is rolled back), FL_PREPARED_XA (64, an XA PREPARE group)
                    group_start = (binlog_file_index(current_file), ev_start)
                    standalone, xa = bool(ev.flags & 1), bool(ev.flags & 64)
                    begin_group(where, hold=not (standalone or ev.flags & 4), xa=xa)
                    in_txn, group_gtid, thread = not standalone, ev.gtid, None
                elif isinstance(ev, GtidEvent):
                    group_start = (binlog_file_index(current_file), ev_start)
                    begin_group(where, hold=True)  # MySQL: BEGIN follows unless DDL; whether it may roll back is unknown
                    in_txn, group_gtid, thread = False, ev.gtid, None
                elif isinstance(ev, XidEvent):
                    stop = end_group(ev_end)  # InnoDB commit
                elif isinstance(ev, XAPrepareEvent):
                    if ev.one_phase:  # MySQL's XA COMMIT ... ONE PHASE: the group commits here
                        stop = end_group(ev_end)
                    else:
                        xid = _Xid(ev.xid_format_id, bytes(ev.xid_gtrid), bytes(ev.xid_bqual))
                        if held is None or not held.xa:
                            self._refuse(f"XA PREPARE of {xid} at {where} ends a group this capture did not hold "
                                         "as an XA transaction; its changes would be lost")
                            held = None
                        else:
                            held.persist(self._xa_manifest(xid, held.start), xid, where)
                        stop = end_group(ev_end, "prepared")
                elif isinstance(ev, QueryEvent | ExecuteLoadQueryEvent):
                    # ExecuteLoadQueryEvent (a LOAD DATA logged as a statement) keeps no readable text
                    raw = _query_text(getattr(ev, "query", "LOAD DATA (statement-based)")).strip()
                    text = raw.upper()
                    if text == "BEGIN" or text.startswith("XA START"):
                        in_txn = True
                        thread = ev.slave_proxy_id  # the connection that ran the transaction
                        if text.startswith("XA START") and held is not None:
                            held.make_xa(self._xa_root())  # MySQL logs XA START; MariaDB flags the GTID
                    elif text in ("COMMIT", "ROLLBACK"):
                        # the end of a group with non-transactional changes; after ROLLBACK only
                        # those stand (the server logs the rolled-back ones too)
                        stop = end_group(ev_end, "rollback" if text == "ROLLBACK" else "commit")
                    elif text.startswith("SAVEPOINT"):
                        if held is not None:
                            held.savepoint(_savepoint_name(raw))
                    elif text.startswith("ROLLBACK TO"):
                        if held is not None:
                            held.rollback_to(_savepoint_name(raw))
                        elif group_count:
                            self._refuse(f"{raw!r} at {where} rolls back part of a group already staged as "
                                         "committed (a MariaDB group flagged transactional)")
                    elif text.startswith(("XA COMMIT", "XA ROLLBACK")):
                        commit = text.startswith("XA COMMIT")
                        if held is not None and held.xa and held.count:
                            # XA COMMIT ... ONE PHASE written as a statement of its own group
                            stop = end_group(ev_end, "commit" if commit else "rollback")
                        else:
                            xid = _Xid.parse(raw)
                            if xid is None:
                                self._refuse(f"cannot read the transaction id of {raw!r} at {where}")
                            elif commit:
                                for events, nbytes in self._xa_commit(xid, current_file, ev_start, ev_end, where):
                                    emit(events, nbytes)
                            else:
                                self._xa_forget(xid, current_file, ev_start, ev_end)
                            stop = end_group(ev_end)
                    elif text.startswith("XA "):
                        pass  # XA END (MySQL, MariaDB): inside the XA group
                    elif _STATEMENT_DML_RE.match(raw) or isinstance(ev, ExecuteLoadQueryEvent):
                        if isinstance(ev, ExecuteLoadQueryEvent) or self._may_touch_captured(raw):
                            self._refuse(
                                f"the statement {raw[:200]!r} at {where} was logged as a statement (the writer's "
                                "session had binlog_format STATEMENT or MIXED): the rows it changed are not in the "
                                "binlog. Make every writer use binlog_format=ROW and re-snapshot the tables it changed"
                            )
                        if not in_txn:
                            stop = end_group(ev_end)
                    elif not in_txn:
                        # DDL and other standalone statements are groups of their own;
                        # inside a transaction (SAVEPOINT, ROLLBACK TO ...) they end nothing
                        self._binlog_converters.clear()  # DDL may change a table's columns
                        if text.startswith("TRUNCATE"):
                            origin = (group_gtid, None, None, ev.packet.server_id, ev.slave_proxy_id, current_file)
                            add(self._truncate(ev, current_file, origin), 0)
                        stop = end_group(ev_end)
                elif isinstance(ev, NotImplementedEvent):
                    kind = ev.packet.event_type
                    if kind == _ANONYMOUS_GTID:  # MySQL without GTIDs: a group starts here
                        group_start = (binlog_file_index(current_file), ev_start)
                        begin_group(where, hold=True)
                        in_txn, thread = False, None
                    elif kind in _UNREADABLE_EVENTS:
                        self._refuse(f"{_UNREADABLE_EVENTS[kind]} at {where} (event type {kind}): capture cannot "
                                     "read the changes it carries")
                if stop or ev_end == end:
                    break
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == _ER_MASTER_FATAL_ERROR_READING_BINLOG:
                raise SourceError(
                    f"source {self.source!r}: the server cannot send the binlog from {start.file}:{start.pos} "
                    f"({exc.args[-1]}); if it was purged, re-snapshot the captured tables and delete {OFFSET_FILE}"
                ) from exc
            raise
        finally:
            stream.close()
            if in_group:
                close_open_group()  # the read ended inside a group: the next capture reads it whole
            scratch.close()
        if committed == start:
            return LogBatch(out, offset, offset)
        extra = {"gtid": committed_gtid} if committed_gtid else {}
        return LogBatch(out, committed.to_json(**extra), offset)

    # --- held groups and XA -------------------------------------------------------------
    def _refuse(self, what: str) -> None:
        """A binlog event whose changes capture cannot read: stop (on_unreadable="fail", the
        default) or, once the tables it changed are re-snapshotted, warn and pass it ("skip")."""
        msg = f"source {self.source!r}: {what}"
        if self.on_unreadable == "skip":
            log.warning("%s; passed because on_unreadable='skip': re-snapshot the tables it changed", msg)
            return
        raise SourceError(
            f"{msg}. After re-snapshotting the tables it changed, set the dialect option on_unreadable='skip' "
            "for one capture run to pass this point"
        )

    def _unclosed_group(self, where: str, events: int) -> None:
        """A new group began while one was open: nothing the reader knows ends groups that way."""
        if events:
            self._refuse(f"a binlog group with {events} captured change(s) did not end (no XID, COMMIT, ROLLBACK "
                         f"or XA PREPARE) before the group at {where}")

    def _may_touch_captured(self, sql: str) -> bool:
        """Whether a statement's text names a captured table (every statement when capturing
        every table): a cheap, conservative test for a statement-logged change."""
        if not self.tables:
            return True
        low = sql.lower()
        return any(t.name.lower() in low for t in self.tables)

    def _transactional(self, event: LogEvent) -> bool:
        """Whether the event's table rolls back with its transaction (its engine's
        TRANSACTIONS in information_schema), looked up once per table and run."""
        table = event.table if isinstance(event, ChangeEvent) else self.watermark_table.id
        cache = self.__dict__.setdefault("_engines", {})
        hit = cache.get(table)
        if hit is None:
            name = TableName.parse(table)
            rows = self._query(
                "SELECT e.TRANSACTIONS FROM information_schema.TABLES t JOIN information_schema.ENGINES e "
                "ON e.ENGINE = t.ENGINE WHERE t.TABLE_SCHEMA = %s AND t.TABLE_NAME = %s",
                (name.schema, name.name),
            )
            if not rows:
                raise SourceError(
                    f"source {self.source!r}: a binlog group rolled back changes of table {table}, and whether "
                    "its engine is transactional cannot be read (the table no longer exists), so capture cannot tell "
                    "which of them stand. Re-snapshot the table and reset the capture offset (delete "
                    f"{OFFSET_FILE} in the changelog staging dir)"
                )
            hit = cache[table] = str(rows[0][0]).upper() == "YES"
        return hit

    def _xa_root(self) -> str:
        """Where prepared XA transactions wait for their XA COMMIT: ``<changelog dir>/_xa``
        once load_offset or commit_offset named the data dir, else a folder of this process
        (a prepare and a commit read by this dialect object still meet there)."""
        data_dir = self.__dict__.get("_data_dir")
        if data_dir is not None:
            return storage.join(changelog_dir(data_dir, self.source), XA_DIR)
        tmp = self.__dict__.get("_xa_tmp")
        if tmp is None:
            import tempfile

            tmp = self.__dict__["_xa_tmp"] = tempfile.mkdtemp(prefix="cdc-mysql-xa-")
            log.warning("source %r: read_log without a data dir: prepared XA transactions are kept in %s, "
                        "which does not outlive this process", self.source, tmp)
        return tmp

    def _xa_manifest(self, xid: _Xid, start: tuple[int, int]) -> str:
        return storage.join(self._xa_root(), f"x-{xid.key}.{start[0]:08d}-{start[1]:012d}.json")

    def _xa_prepared(self, xid: _Xid, file_index: int, pos: int) -> list[tuple[tuple[int, int], str]]:
        """The manifests of ``xid`` prepared before (file_index, pos), oldest first."""
        root, prefix = self._xa_root(), f"x-{xid.key}."
        found = []
        for name in storage.list_names(root, suffix=".json"):
            if name.startswith(prefix):
                idx, _, off = name[len(prefix):-len(".json")].partition("-")
                at = (int(idx), int(off))
                if at < (file_index, pos):
                    found.append((at, storage.join(root, name)))
        return sorted(found)

    def _xa_done(self, manifests: list[str], ev_end: BinlogOffset) -> None:
        """Delete these manifests and their parts once the offset passes ``ev_end`` (commit_offset)."""
        self.__dict__.setdefault("_xa_resolved", []).append((ev_end, manifests))

    def _xa_commit(self, xid: _Xid, file: str, pos: int, ev_end: BinlogOffset, where: str
                   ) -> Iterator[tuple[list[LogEvent], int]]:
        """The events of the XA transaction ``xid`` (its latest prepare before this commit),
        placed at the commit's position in their order."""
        prepared = self._xa_prepared(xid, binlog_file_index(file), pos)
        if not prepared:
            self._refuse(
                f"XA COMMIT of {xid} at {where}, but this capture never read its XA PREPARE (it came before the "
                f"capture's first offset, or {self._xa_root()} lost it): its changes are not staged"
            )
            return
        self._xa_done([m for _, m in prepared], ev_end)
        group = _HeldGroup.load(self, prepared[-1][1])
        log.info("source %r: XA transaction %s committed at %s: %d event(s) staged at the commit's position",
                 self.source, xid, where, group.count)
        yield from group.drain(rollback=False, at=(binlog_file_index(file), pos))

    def _xa_forget(self, xid: _Xid, file: str, pos: int, ev_end: BinlogOffset) -> None:
        prepared = self._xa_prepared(xid, binlog_file_index(file), pos)
        if prepared:
            self._xa_done([m for _, m in prepared], ev_end)

    def _xa_cleanup(self, offset: str) -> None:
        """Drop the staged XA transactions resolved before ``offset`` (just committed)."""
        resolved = self.__dict__.get("_xa_resolved")
        if not resolved:
            return
        upto = BinlogOffset.from_json(offset)
        keep = []
        for ev_end, manifests in resolved:
            if ev_end > upto:
                keep.append((ev_end, manifests))
                continue
            for m in manifests:
                try:
                    parts = json.loads(storage.read_text(m)).get("dir")
                except FileNotFoundError:
                    continue
                if parts:
                    storage.delete_dir(storage.join(storage.parent(m), parts))
                storage.delete(m)
        self.__dict__["_xa_resolved"] = keep

    @property
    def _binlog_converters(self) -> dict:
        d = self.__dict__.get("_binlog_conv")
        if d is None:
            d = self.__dict__["_binlog_conv"] = {}
        return d

    def _table_converters(self, ev: Any) -> tuple[dict[str, Callable[[Any], Any]], tuple[str, ...]] | None:
        table = ev.table_map[ev.table_id]
        key = (ev.table_id, ev.schema, ev.table)
        hit = self._binlog_converters.get(key)
        if hit is not None:
            return hit
        pk = table.primary_key
        pk_cols = (pk,) if isinstance(pk, str) and pk else tuple(pk or ())
        convs: dict[str, Callable[[Any], Any] | None] = {}
        for c in table.columns:
            conv = _binlog_converter(c)
            # the reader already gives canonical ints and decoded text: skip the call
            if conv is int or (conv is _text_or_b64 and c.type in _TEXT_CODES):
                conv = None
            convs[c.name] = conv
        hit = self._binlog_converters[key] = (convs, pk_cols)
        return hit

    def _truncate(self, ev: Any, file: str, origin: tuple | None = None) -> list[LogEvent]:
        """A TRUNCATE statement (row-less in the binlog): a ``t`` event for its table when
        captured (on_truncate="event"); "fail" raises, "skip" warns."""
        sql = _query_text(ev.query)
        where = f"{file}:{ev.packet.log_pos}"
        table = parse_truncate(sql, _query_text(ev.schema) if ev.schema else None)
        if table is None:
            raise SourceError(
                f"source {self.source!r}: cannot tell which table the statement {sql!r} at {where} truncates; "
                "re-snapshot the tables it may name, and set the dialect option on_truncate='skip' to let capture "
                "pass this point"
            )
        if table == self.watermark_table or not self._capture_table(table.schema, table.name):
            return []
        if self.on_truncate == "skip":
            log.warning("source %r: TRUNCATE of %s at %s skipped (on_truncate='skip'); re-snapshot it",
                        self.source, table, where)
            return []
        if self.on_truncate == "fail":
            raise SourceError(
                f"source {self.source!r}: TRUNCATE of {table} at {where} is in the binlog and on_truncate='fail'. "
                "Re-snapshot the table, and set on_truncate='event' (the default) or 'skip' to let capture pass"
            )
        start_pos = ev.packet.log_pos - ev.packet.event_size
        log.info("source %r: TRUNCATE of %s at %s staged as a 't' event", self.source, table, where)
        return [ChangeEvent(table.id, Op.TRUNCATE.value, None, Position.binlog(file, start_pos, 0), None, None,
                            int(ev.timestamp) * 1000, origin=origin)]

    def _row_events(self, ev: Any, file: str, wm: TableName, skipped: set[str],
                    origin: tuple | None = None) -> list[LogEvent]:
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        start_pos = ev.packet.log_pos - ev.packet.event_size
        file_index = binlog_file_index(file)
        ts_ms = int(ev.timestamp) * 1000
        if ev.schema == wm.schema and ev.table == wm.name:
            if not isinstance(ev, UpdateRowsEvent):
                return []
            return [
                WatermarkEvent(str(r["after_values"]["value"]), Position.binlog(file, start_pos, i), ts_ms)
                for i, r in enumerate(ev.rows)
            ]
        if not self._capture_table(ev.schema, ev.table):
            return []
        table_id = TableName(ev.schema, ev.table).id
        convs, pk = self._table_converters(ev)
        if not pk:
            if self.tables is not None:
                raise SourceError(
                    f"table {table_id} has no primary key in the binlog's row metadata; add one"
                )
            if table_id not in skipped:
                log.warning("capture skips table %s: it has no primary key", table_id)
                skipped.add(table_id)
            return []

        def canon(values: dict, none_sources: dict | None) -> dict:
            row = {name: v if v is None or (c := convs[name]) is None else c(v) for name, v in values.items()}
            if none_sources:  # an empty SET decodes as None: tell it from NULL
                for name, why in none_sources.items():
                    if why == "empty set":
                        row[name] = ""
            return row

        events: list[LogEvent] = []
        for r in ev.rows:
            # the index is the event's number inside the rows event (one per row, two
            # for a key-changing update), so every staged event has its own position
            if isinstance(ev, WriteRowsEvent):
                after = canon(r["values"], r.get("none_sources"))
                pairs = [(Op.CREATE, None, after)]
            elif isinstance(ev, DeleteRowsEvent):
                pairs = [(Op.DELETE, canon(r["values"], r.get("none_sources")), None)]
            else:
                before = canon(r["before_values"], r.get("before_none_sources"))
                after = canon(r["after_values"], r.get("after_none_sources"))
                if [before[k] for k in pk] == [after[k] for k in pk]:
                    pairs = [(Op.UPDATE, before, after)]
                else:
                    # a key change is a delete of the old key and an insert of the new one,
                    # so the window's per-key de-duplication sees both keys
                    pairs = [(Op.DELETE, before, None), (Op.CREATE, None, after)]
            for op, before, after in pairs:
                keyrow = after if after is not None else before
                pos = Position(file_index, start_pos, len(events))
                events.append(
                    ChangeEvent(table_id, op, encode_key([keyrow[k] for k in pk]), pos, before, after, ts_ms,
                                origin=origin)
                )
        return events


_IDENT = r"(?:`(?:[^`]|``)+`|[0-9A-Za-z_$\u0080-\uffff]+)"
_TRUNCATE_RE = re.compile(
    rf"^\s*TRUNCATE\s+(?:TABLE\s+)?(?P<a>{_IDENT})(?:\s*\.\s*(?P<b>{_IDENT}))?\s*(?:(?:WAIT\s+\d+|NOWAIT)\s*)?;?\s*$",
    re.IGNORECASE | re.DOTALL,
)


def _unquote(ident: str) -> str:
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def parse_truncate(sql: str, default_schema: str | None) -> TableName | None:
    """The table of ``TRUNCATE [TABLE] [db.]t [WAIT n|NOWAIT]`` (backquoted names with
    doubled backticks, or bare ones), or None when the statement is not that shape."""
    m = _TRUNCATE_RE.match(sql)
    if m is None:
        return None
    if m.group("b") is not None:
        return TableName(_unquote(m.group("a")), _unquote(m.group("b")))
    if not default_schema:
        return None
    return TableName(default_schema, _unquote(m.group("a")))



# --------------------------------------------------------------------------- held groups and XA

#: the folder under the changelog staging folder where prepared XA transactions wait
XA_DIR = "_xa"
_ANONYMOUS_GTID = 0x22  # MySQL without GTIDs: the event that starts a group
#: event types the reader does not decode whose changes would be lost if passed over
_UNREADABLE_EVENTS: dict[int, str] = {
    **{t: "a LOAD DATA event of statement-based logging" for t in (0x06, 0x08, 0x09, 0x0A, 0x0B, 0x0C)},
    **{t: "a pre-GA rows event" for t in (0x14, 0x15, 0x16)},
    0x1A: "an INCIDENT event: the server recorded that changes may be missing from the binlog (for "
          "example a non-transactional write that could not be logged)",
    0x28: "a compressed transaction (MySQL binlog_transaction_compression = ON: SET GLOBAL "
          "binlog_transaction_compression = OFF)",
    **{t: "a compressed event (MariaDB log_bin_compress = ON: SET GLOBAL log_bin_compress = OFF)"
       for t in range(0xA5, 0xAC)},
}
#: a change logged as a statement (the writer's session not in binlog_format=ROW)
_STATEMENT_DML_RE = re.compile(r"^(?:/\*.*?\*/\s*)*(?:INSERT|UPDATE|DELETE|REPLACE|LOAD\s+(?:DATA|XML))\b",
                               re.IGNORECASE | re.DOTALL)
_XID_PART = r"\s*(?:X'([0-9A-Fa-f]*)'|'((?:[^']|'')*)')\s*"
_XA_END_RE = re.compile(
    rf"^XA\s+(?:COMMIT|ROLLBACK){_XID_PART}(?:,{_XID_PART}(?:,\s*(\d+)\s*)?)?(?:ONE\s+PHASE\s*)?;?\s*$",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class _Xid:
    """An XA transaction id: formatID, gtrid and bqual (what XA RECOVER shows)."""

    format_id: int
    gtrid: bytes
    bqual: bytes

    @property
    def key(self) -> str:
        """A file-name-safe form, the same for every event naming this id."""
        raw = f"{self.format_id}-{self.gtrid.hex()}-{self.bqual.hex()}"
        return raw if len(raw) <= 120 else "h" + hashlib.sha256(raw.encode()).hexdigest()

    def __str__(self) -> str:
        def lit(b: bytes) -> str:
            try:
                t = b.decode("ascii")
                if t.isprintable():
                    return "'" + t.replace("'", "''") + "'"
            except UnicodeDecodeError:
                pass
            return f"X'{b.hex()}'"

        parts = [lit(self.gtrid)]
        if self.bqual or self.format_id != 1:
            parts.append(lit(self.bqual))
        if self.format_id != 1:
            parts.append(str(self.format_id))
        return "XA transaction " + ",".join(parts)

    @classmethod
    def parse(cls, sql: str) -> _Xid | None:
        """The id of ``XA COMMIT|ROLLBACK X'..',X'..',n`` (the binlog's form) or quoted text."""
        m = _XA_END_RE.match(sql)
        if m is None:
            return None

        def val(hexa: str | None, text: str | None) -> bytes:
            return bytes.fromhex(hexa) if hexa is not None else (text or "").replace("''", "'").encode("utf-8")

        return cls(int(m.group(5) or 1), val(m.group(1), m.group(2)), val(m.group(3), m.group(4)))


def _savepoint_name(sql: str) -> str:
    """``SAVEPOINT `a` `` / ``ROLLBACK TO [SAVEPOINT] `a` `` -> ``a`` (case-insensitive, as the server)."""
    name = re.sub(r"^(?:SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO(?:\s+SAVEPOINT)?)\s+", "", sql.strip(), flags=re.I)
    return _unquote(name.strip().rstrip(";").strip()).lower()


def _event_json(e: LogEvent) -> str:
    if isinstance(e, WatermarkEvent):
        return json.dumps(["w", e.id, e.position.encode(), e.ts_ms])
    return json.dumps(["c", e.table, e.op, e.key, e.position.encode(), e.before, e.after, e.ts_ms, e.origin],
                      ensure_ascii=False)


def _event_from_json(line: str) -> LogEvent:
    r = json.loads(line)
    if r[0] == "w":
        return WatermarkEvent(r[1], Position.decode(r[2]), r[3])
    return ChangeEvent(r[1], r[2], r[3], Position.decode(r[4]), r[5], r[6], r[7],
                       origin=None if r[8] is None else tuple(r[8]))


class _Scratch:
    """A local folder for the parts of held groups of one read, removed when the read ends."""

    def __init__(self) -> None:
        self.path: str | None = None

    def folder(self, name: str) -> str:
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="cdc-mysql-held-")
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class _HeldGroup:
    """The events of a binlog group that may not be staged before the group ends: one that may
    still roll back changes (``ROLLBACK``, ``ROLLBACK TO SAVEPOINT``), or an XA transaction
    until its ``XA COMMIT``. In memory up to ``max_events`` events or ``max_bytes`` bytes of
    rows events, then in gzipped JSON-lines part files (I11): local scratch, or for XA a folder
    under the changelog staging folder, written durably before the offset may pass the
    prepare (I6). Rolled-back ranges are kept as event index ranges and applied when the
    events are read back, so they work on parts already on disk."""

    def __init__(self, dialect: MySqlDialect, max_events: int, max_bytes: int, scratch: _Scratch | None,
                 start: tuple[int, int] | None) -> None:
        self.dialect, self.max_events, self.max_bytes, self.scratch = dialect, max_events, max_bytes, scratch
        self.start = start or (0, 0)  # (file index, offset) of the group's first event: names its folder
        self.events: list[LogEvent] = []
        self.bytes = 0
        self.count = 0  # events added, spilled ones included
        self.parts: list[tuple[str, int]] = []  # part file names in ``dir`` and their rows-event bytes
        self.dir: str | None = None
        self.xa = False
        self.savepoints: dict[str, int] = {}
        self.drops: list[tuple[int, int]] = []  # [start, end) event ranges rolled back to a savepoint

    def _name(self) -> str:
        return f"g-{self.start[0]:08d}-{self.start[1]:012d}"

    def make_xa(self, root: str) -> None:
        """Hold this group as an XA transaction: its parts go to ``root`` (durable)."""
        if self.xa:
            return
        if self.parts:
            raise SourceError(f"source {self.dialect.source!r}: XA START after {self.count} events of its group")
        self.xa, self.dir = True, storage.join(root, self._name())

    def add(self, events: list[LogEvent], nbytes: int) -> None:
        self.events.extend(events)
        self.count += len(events)
        self.bytes += nbytes
        if len(self.events) >= self.max_events or self.bytes >= self.max_bytes:
            self.spill()

    def spill(self) -> None:
        if not self.events:
            return
        if self.dir is None:
            self.dir = self.scratch.folder(self._name())
        name = f"part-{len(self.parts):06d}.jsonl-gz"  # no ".gz": pyarrow streams would (de)compress by name
        payload = "\n".join(map(_event_json, self.events)).encode("utf-8")
        storage.write_bytes(storage.join(self.dir, name), gzip.compress(payload, compresslevel=1))
        self.parts.append((name, self.bytes))
        self.events, self.bytes = [], 0

    def savepoint(self, name: str) -> None:
        self.savepoints[name] = self.count

    def rollback_to(self, name: str) -> None:
        start = self.savepoints.get(name)
        if start is None:
            self.dialect._refuse(f"ROLLBACK TO SAVEPOINT {name} without its SAVEPOINT in the same binlog group "
                                 f"(group at {self._name()})")
            return
        if start < self.count:
            self.drops.append((start, self.count))

    def persist(self, manifest: str, xid: _Xid, where: str) -> None:
        """XA PREPARE: every event in part files, then the manifest naming them (I6)."""
        self.spill()
        meta = {"xid": str(xid), "prepare": where, "dir": storage.basename(self.dir) if self.parts else None,
                "parts": self.parts, "drops": self.drops, "count": self.count}
        storage.write_text(manifest, json.dumps(meta))

    @classmethod
    def load(cls, dialect: MySqlDialect, manifest: str) -> _HeldGroup:
        meta = json.loads(storage.read_text(manifest))
        group = cls(dialect, 0, 0, None, None)
        group.xa = True
        group.dir = storage.join(storage.parent(manifest), meta["dir"]) if meta.get("dir") else None
        group.parts = [(n, int(b)) for n, b in meta["parts"]]
        group.drops = [(int(a), int(b)) for a, b in meta["drops"]]
        group.count = int(meta["count"])
        return group

    def _chunks(self) -> Iterator[tuple[list[LogEvent], int]]:
        for name, nbytes in self.parts:
            data = gzip.decompress(storage.read_bytes(storage.join(self.dir, name))).decode("utf-8")
            yield [_event_from_json(line) for line in data.split("\n") if line], nbytes
        if self.events:
            yield self.events, self.bytes

    def drain(self, *, rollback: bool, at: tuple[int, int] | None = None
              ) -> Iterator[tuple[list[LogEvent], int]]:
        """The events that stand, part by part: all but the transactional tables' changes of
        rolled-back ranges (every change when ``rollback``). ``at``: (file index, offset) of an
        XA COMMIT, which becomes their position, numbered in order."""
        check = rollback or bool(self.drops)
        transactional = self.dialect._transactional
        i = n = 0
        for events, nbytes in self._chunks():
            if check:
                kept = []
                for e in events:
                    if not ((rollback or any(a <= i < b for a, b in self.drops)) and transactional(e)):
                        kept.append(e)
                    i += 1
                events = kept
            if at is not None:
                events = [replace(e, position=Position(at[0], at[1], n + j)) for j, e in enumerate(events)]
            n += len(events)
            if events:
                yield events, nbytes

    def discard(self) -> None:
        if self.parts and self.dir is not None:
            storage.delete_dir(self.dir)
        self.events, self.parts = [], []


def _query_text(q: Any) -> str:
    return q.decode("utf-8", "replace") if isinstance(q, bytes) else str(q)


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def default_server_id(source: str) -> int:
    return 1_000_000 + zlib.crc32(f"airflow-provider-cdc:{source}".encode()) % 3_000_000_000
