"""PostgreSQL types: which a table may hold, and the one decoder per logical type that turns
the text PostgreSQL renders (COPY and pgoutput alike, under SESSION_OPTIONS) into the
canonical value; and back (a canonical value bound as a query parameter).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from ...core import temporal
from ...core.errors import SourceError

#: Session settings that fix how values are rendered as text (both paths use them).
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1 "
    "-c bytea_output=hex -c client_encoding=UTF8"
)

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


def numeric_type(typmod: int) -> str:
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
        return numeric_type(typmod)
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
    return SourceError(
        f"PostgreSQL rendered a {logical} value as {s!r}, which is not a form this package knows; "
        "the session must use DateStyle ISO and TimeZone UTC"
    )


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


def identity(s: str) -> str:
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
    "string": identity,
    "json": identity,
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
        return identity
    return _SCALAR_DECODERS[logical]


REPLICA_IDENTITY = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


def to_db(logical: str, value: Any) -> Any:
    if logical == "binary":
        return base64.b64decode(value)
    if logical.startswith("array<"):
        inner = logical[6:-1]
        return [None if v is None else to_db(inner, v) for v in value]
    if logical in ("float32", "float64") or logical.startswith("decimal"):
        return str(value)
    if logical in ("date", "timestamp", "timestamptz") and isinstance(value, str):
        return temporal.canonical_to_pg(value)  # BC years back to PostgreSQL's input form
    return value


def pg_message(exc: Exception) -> str:
    return (getattr(exc, "pgerror", None) or str(exc)).strip()
