"""MySQL and MariaDB types: which a table may hold, and one converter per column from what the
driver (SELECT) or the binlog reader decodes to the canonical value, equal on both paths.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any

from ...core.errors import SourceError
from ...core.schema import Column

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
            raise SourceError(
                f"MySQL returned the {logical} value {text!r}, which is not a date this package knows"
            )
        day = f"{m.group(1)}-{m.group(2)}-{m.group(3)}"
        if logical == "date":
            return day
        clock = (
            f"{m.group(4) or '00'}:{m.group(5) or '00'}:{m.group(6) or '00'}."
            f"{(m.group(7) or '').ljust(6, '0')}"
        )
        return f"{day}T{clock}" + ("Z" if logical == "timestamptz" else "")

    return conv


def json_text(v: Any) -> str:
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


def select_converter(col: Column) -> Callable[[Any], Any]:
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
        return json_text
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
TEXT_CODES = {
    _FT_VARCHAR,
    _FT_VAR_STRING,
    _FT_STRING,
    _FT_ENUM,
    _FT_BLOB,
    _FT_TINY_BLOB,
    _FT_MEDIUM_BLOB,
    _FT_LONG_BLOB,
}


def binlog_converter(col: Any) -> Callable[[Any], Any]:
    """mysql-replication column (from the table map with FULL row metadata) -> a
    function from its decoded value to the canonical value. Mirrors select_converter."""
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
        return json_text
    return text_or_b64


def text_or_b64(v: Any) -> Any:
    """Text columns arrive decoded; bytes of a type without a mapping (only reachable when
    capturing every table) stay readable as UTF-8 or become base64."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return _b64(v)
    return v


IDENTIFIER = r"(?:`(?:[^`]|``)+`|[0-9A-Za-z_$\u0080-\uffff]+)"


def unquote(ident: str) -> str:
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def query_text(q: Any) -> str:
    return q.decode("utf-8", "replace") if isinstance(q, bytes) else str(q)


def as_text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)
