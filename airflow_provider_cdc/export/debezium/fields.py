"""Debezium export: each column's Connect schema and value, per connector."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ...core import temporal
from ...core.schema import Column, decimal_params
from ...dialects.registry import profile_for_debezium
from .options import _PG_TS_INFINITY_US


# --- per-column schema and value ---------------------------------------------------------------
def _node(
    type_: str,
    name: str | None = None,
    version: int | None = None,
    parameters: dict | None = None,
    **extra: Any,
) -> dict:
    """A schema node in JsonConverter's key order (type, fields/items, optional, name, version,
    doc, parameters); field_schema sets ``optional`` in place and appends ``field``."""
    out: dict[str, Any] = {"type": type_}
    out.update(extra)
    out["optional"] = True
    if name:
        out["name"] = name
    if version is not None:
        out["version"] = version
    if parameters:
        out["parameters"] = parameters
    return out


def _precision(source_type: str) -> int | None:
    m = re.search(r"\((\d+)\)", source_type)
    return int(m.group(1)) if m else None


def _decimal_bytes(unscaled: int) -> str:
    n = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode("ascii")


def _decimal(value: str, scale: int) -> str:
    return _decimal_bytes(int(Decimal(value).scaleb(scale).to_integral_value()))


def _variable_decimal(value: str) -> dict | None:
    d = Decimal(value)
    if not d.is_finite():
        return None  # Debezium's precise mode fails the connector on NaN / Infinity
    d = d.normalize()
    scale = max(0, -d.as_tuple().exponent)
    return {"scale": scale, "value": _decimal_bytes(int(d.scaleb(scale)))}


def _time_micros(text: str) -> int:
    neg = text.startswith("-")
    h, m, s = text.lstrip("-").split(":")
    sec, _, frac = s.partition(".")
    us = ((int(h) * 60 + int(m)) * 60 + int(sec)) * 1_000_000 + int((frac + "000000")[:6])
    return -us if neg else us


def _zoned_timestamp(text: str, precision: int | None) -> str:
    """Canonical ``...ffffffZ`` -> Debezium's ZonedTimestamp text."""
    if text in ("infinity", "-infinity"):
        return text
    date_part, _, clock = text[:-1].partition("T")
    neg = date_part.startswith("-")
    y, mo, d = date_part.lstrip("-").split("-")
    year = -int(y) if neg else int(y)
    ytext = f"+{year}" if year > 9999 else (f"-{abs(year):04d}" if year < 0 else f"{year:04d}")
    hms, _, frac = clock.partition(".")
    frac = (frac + "000000")[:6]
    if precision:
        frac = (frac + "000")[: min(precision, 9)]
    else:
        frac = frac.rstrip("0")
    return f"{ytext}-{mo}-{d}T{hms}" + (f".{frac}" if frac else "") + "Z"


def _zoned_time(text: str) -> str:
    """PostgreSQL timetz text (``11:51:30.123789+02``, ``+05:30``) -> UTC, fraction trimmed."""
    m = re.fullmatch(r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([+-])(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?", text)
    if not m:
        return text
    h, mi, s, frac, sign, oh, om, os_ = m.groups()
    off = (int(oh) * 3600 + int(om or 0) * 60 + int(os_ or 0)) * (1 if sign == "+" else -1)
    secs = (int(h) * 3600 + int(mi) * 60 + int(s) - off) % 86400
    frac = (frac or "").rstrip("0")
    return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}" + (f".{frac}" if frac else "") + "Z"


_INTERVAL_RE = re.compile(r"([+-]?\d+) (year|mon|day)s?")


def _interval_micros(text: str) -> int:
    """PostgreSQL interval text (IntervalStyle postgres) -> Debezium's MicroDuration (a month is
    30.4375 days, the same double arithmetic as MicroDuration.durationMicros)."""
    parts = {"year": 0, "mon": 0, "day": 0}
    for n, unit in _INTERVAL_RE.findall(text):
        parts[unit] = int(n)
    h = mi = 0
    sec = 0.0
    m = re.search(r"([+-])?(\d+):(\d{2}):(\d{2}(?:\.\d+)?)", text)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        h, mi, sec = sign * int(m.group(2)), sign * int(m.group(3)), sign * float(m.group(4))
    days = ((parts["year"] * 12) + parts["mon"]) * 30.4375 + parts["day"]
    seconds = (((days * 24 + h) * 60) + mi) * 60 + sec
    return int(seconds * 1e6)


def _bits(value: int, length: int | None, pad: bool) -> str:
    n = (length + 7) // 8 if pad and length else (value.bit_length() + 7) // 8
    return base64.b64encode(value.to_bytes(n, "little")).decode("ascii")


def _mysql_options(source_type: str) -> str:
    """``enum('a','b''c')`` -> ``a,b'c`` (Debezium's allowed parameter)."""
    body = source_type[source_type.index("(") + 1 : source_type.rindex(")")]
    return ",".join(v.replace("''", "'").replace("\\\\", "\\") for v in re.findall(r"'((?:[^']|'')*)'", body))


Conv = Callable[[Any], Any]


def _decimal_field(logical: str) -> tuple[dict, Conv]:
    """``decimal(p,s)``: Kafka Connect's Decimal (both databases, decimal.handling.mode=precise)."""
    prec, scale = decimal_params(logical)
    return (
        _node(
            "bytes",
            "org.apache.kafka.connect.data.Decimal",
            1,
            {"scale": str(scale), "connect.decimal.precision": str(prec)},
        ),
        lambda v: _decimal(v, scale),
    )


def _ident(v: Any) -> Any:
    return v


def _pg_field(col: Column, enum_labels: list[str] | None = None) -> tuple[dict, Conv] | None:
    src = col.source_type.lower()
    lt = col.type
    if src.endswith("[]") or lt.startswith("array<"):
        elem_src = src[:-2] if src.endswith("[]") else ""
        elem_lt = lt[6:-1] if lt.startswith("array<") else "string"
        base = elem_src.split("(")[0].strip()
        if base in ("name", "interval", "bit varying", "varbit", "xml", "money"):
            return None  # Debezium finds no schema for these arrays and leaves the column out
        inner = _pg_field(Column(col.name, elem_lt, elem_src, True), enum_labels)
        if inner is None:
            return None
        node, conv = inner
        if enum_labels is not None:
            node = node | {"optional": False}  # Debezium's enum array elements are required

        def each(v: Any) -> Any:  # multi-dimensional arrays are nested lists: convert the leaves
            return [None if x is None else (each(x) if isinstance(x, list) else conv(x)) for x in v]

        return _node("array", items=node), each
    if enum_labels is not None and lt == "string":
        return _node("string", "io.debezium.data.Enum", 1, {"allowed": ",".join(enum_labels)}), _ident
    p = _precision(src)
    if lt == "bool":
        return _node("boolean"), _ident
    if lt in ("int16", "int32", "int64"):
        return _node(lt), _ident
    if lt in ("float32", "float64"):
        return _node("float" if lt == "float32" else "double"), _ident
    if decimal_params(lt):
        return _decimal_field(lt)
    if lt == "decimal":
        node = _node(
            "struct",
            "io.debezium.data.VariableScaleDecimal",
            1,
            fields=[
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
        )
        node["doc"] = "Variable scaled decimal"
        return node, _variable_decimal
    if lt == "binary":
        return _node("bytes"), _ident
    if lt == "date":
        return _node("int32", "io.debezium.time.Date", 1), _pg_date
    if lt == "time":
        if p is not None and p <= 3:
            return _node("int32", "io.debezium.time.Time", 1), lambda v: _time_micros(v) // 1000
        return _node("int64", "io.debezium.time.MicroTime", 1), _time_micros
    if lt == "timestamp":
        if p is not None and p <= 3:
            return _node("int64", "io.debezium.time.Timestamp", 1), lambda v: _pg_ts(v, 1000)
        return _node("int64", "io.debezium.time.MicroTimestamp", 1), lambda v: _pg_ts(v, 1)
    if lt == "timestamptz":
        return _node("string", "io.debezium.time.ZonedTimestamp", 1), lambda v: _zoned_timestamp(
            v, 6 if p is None else p
        )
    if lt == "uuid":
        return _node("string", "io.debezium.data.Uuid", 1), _ident
    if lt == "json":
        return _node("string", "io.debezium.data.Json", 1), _ident
    if src.startswith("time") and "with time zone" in src:
        return _node("string", "io.debezium.time.ZonedTime", 1), _zoned_time
    if src.startswith("interval"):
        return _node("int64", "io.debezium.time.MicroDuration", 1), _interval_micros
    if src == "xml":
        return _node("string", "io.debezium.data.Xml", 1), _ident
    if src.startswith(("bit(", "bit varying")) or src in ("bit", "varbit"):
        length = p if p is not None else (1 if src == "bit" else 2147483647)
        if length == 1:
            return _node("boolean"), lambda v: v == "1"
        return _node("bytes", "io.debezium.data.Bits", 1, {"length": str(length)}), lambda v: _bits(
            int(v, 2) if v else 0, None, False
        )
    return _node("string"), _ident  # text, varchar, char, name, citext, inet, cidr, macaddr, enums


def _pg_date(v: str) -> int | None:
    if v in ("infinity", "-infinity"):
        return None  # Debezium defines no day number for them
    return temporal.date_to_days(v)


def _pg_ts(v: str, unit: int) -> int:
    if v in ("infinity", "-infinity"):
        return _PG_TS_INFINITY_US[v.startswith("-")] // unit
    return temporal.ts_to_micros(v) // unit


def _zero_date(v: str) -> bool:
    return v[5:7] == "00" or v[8:10] == "00" or v.startswith("0000-")


#: a zero date in a required field (docs: outputs, "Consuming the Debezium JSON"): day numbers from here
#: up, all below any real date (0001-01-01 is day -719,162), one per (year, month, day) and in
#: their order, so distinct zero-date keys stay distinct
ZERO_DATE_DAYS = -5_200_000
_DAY_US = 86_400_000_000


def zero_date_days(v: str) -> int:
    """``YYYY-MM-DD...`` with a zero part -> ``-5,200,000 + Y*416 + M*32 + D`` (M <= 12, D <= 31 <
    32: no two dates share a number; 9999-12-31 gives -1,040,001)."""
    return ZERO_DATE_DAYS + int(v[0:4]) * 416 + int(v[5:7]) * 32 + int(v[8:10])


def _my_date(v: str, required: bool) -> int | None:
    if _zero_date(v):
        return zero_date_days(v) if required else None
    return temporal.date_to_days(v)


def _my_ts(v: str, unit: int, required: bool) -> int | None:
    if _zero_date(v):  # the zero day's number, plus the time of day the value carries
        if not required:
            return None
        clock = v[11:].rstrip("Z") or "00:00:00"  # canonical "YYYY-MM-DDTHH:MM:SS.ffffff"
        return (zero_date_days(v) * _DAY_US + _time_micros(clock)) // unit
    return temporal.ts_to_micros(v) // unit


def _my_field(col: Column, connector: str, enum_labels: list[str] | None = None) -> tuple[dict, Conv]:
    required = not col.nullable  # a zero date there takes its non-null number, not Debezium's null
    src = col.source_type.lower()
    lt = col.type
    base = re.split(r"[(\s]", src, maxsplit=1)[0]
    unsigned = "unsigned" in src
    p = _precision(src)
    ints = {
        "tinyint": ("int8", "int16"),
        "smallint": ("int16", "int32"),
        "mediumint": ("int32", "int32"),
        "int": ("int32", "int64"),
        "integer": ("int32", "int64"),
        "bigint": ("int64", "int64"),
    }
    if base in ints:
        conv = (lambda v: v - (1 << 64) if v >= 1 << 63 else v) if base == "bigint" and unsigned else _ident
        return _node(ints[base][unsigned]), conv
    if base == "bit":
        length = p or 1
        if length == 1:
            return _node("boolean"), lambda v: bool(v)
        return _node("bytes", "io.debezium.data.Bits", 1, {"length": str(length)}), lambda v: _bits(
            int(v), length, True
        )
    if base == "year":
        return _node("int32", "io.debezium.time.Year", 1), _ident
    if lt in ("float32", "float64"):
        return _node("double" if lt == "float64" or "," in src else "float"), _ident
    if decimal_params(lt):
        return _decimal_field(lt)
    if base == "enum":
        return _node("string", "io.debezium.data.Enum", 1, {"allowed": _mysql_options(src)}), _ident
    if base == "set":
        return _node("string", "io.debezium.data.EnumSet", 1, {"allowed": _mysql_options(src)}), _ident
    if lt == "binary":
        return _node("bytes"), _ident
    if lt == "json":
        if connector == "mariadb":  # MariaDB's JSON is LONGTEXT with a CHECK: Debezium sees text
            return _node("string"), _ident
        return _node("string", "io.debezium.data.Json", 1), _ident
    if lt == "date":
        return _node("int32", "io.debezium.time.Date", 1), lambda v: _my_date(v, required)
    if lt == "time":
        return _node("int64", "io.debezium.time.MicroTime", 1), _time_micros
    if lt == "timestamp":
        if p is None or p <= 3:
            return _node("int64", "io.debezium.time.Timestamp", 1), lambda v: _my_ts(v, 1000, required)
        return _node("int64", "io.debezium.time.MicroTimestamp", 1), lambda v: _my_ts(v, 1, required)
    if lt == "timestamptz":
        # the only zero TIMESTAMP is all zeros; required, it is the epoch, which no TIMESTAMP holds
        # (their range starts at 1970-01-01 00:00:01 UTC)
        zero = _zoned_timestamp("1970-01-01T00:00:00Z", p or 0) if required else None
        return (
            _node("string", "io.debezium.time.ZonedTimestamp", 1),
            lambda v: zero if _zero_date(v) else _zoned_timestamp(v, p or 0),
        )
    return _node("string"), _ident


def field_schema(
    col: Column, connector: str, enum_labels: list[str] | None = None
) -> tuple[dict, Conv] | None:
    """A column's JsonConverter schema node (with ``optional`` and ``field``) and the function
    from its canonical value to Debezium's payload value; None when Debezium leaves it out."""
    got = _FIELD_MAPS[profile_for_debezium(connector).name](col, connector, enum_labels)
    if got is None:
        return None
    node, conv = got
    node = dict(node)
    node["optional"] = bool(col.nullable)
    node["field"] = col.name
    return node, (lambda v: None if v is None else conv(v))


_FIELD_MAPS = {
    "postgres": lambda col, connector, enum_labels: _pg_field(col, enum_labels),
    "mysql": _my_field,
}
