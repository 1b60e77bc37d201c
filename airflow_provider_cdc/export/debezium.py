"""The event log as Debezium's JSON: the records Debezium's PostgreSQL or MySQL/MariaDB connector
would publish for the same changes, serialised by Kafka Connect's JsonConverter, so consumers
written for Debezium read the export unchanged. The settings it matches, what it writes where
the event log lacks Debezium's input, and why every document validates against its own schema:
docs/outputs.md, "Debezium JSON".
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ..core import temporal
from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.schema import Column, TableName, TableSchema, decimal_params
from ..dialects.registry import debezium_connectors, profile_for_debezium

#: the Debezium release whose format this is, written to ``source.version``
DEBEZIUM_VERSION = "3.6.1.Final"
#: Debezium's connectors, each of the database whose profile names it (dialects/registry.py)
CONNECTORS = debezium_connectors()
FORMS = ("keyvalue", "value")
_SNAPSHOT_ENUM = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
#: pgjdbc's ±infinity for timestamps, as Debezium emits them (microseconds)
_PG_TS_INFINITY_US = (9223372036825200000, -9223372036832400000)


@dataclass(frozen=True)
class DebeziumOptions:
    topic_prefix: str  # Debezium's topic.prefix: source.name and the first part of schema names
    connector: str | None = None  # postgresql | mysql | mariadb (default: from the table's schema)
    version: str = DEBEZIUM_VERSION
    tombstones: bool = True  # a null-value record after each delete (tombstones.on.delete)
    truncates: bool = False  # TRUNCATE records (Debezium skips them by default: skipped.operations=t)
    # "keyvalue": {"key": ..., "value": ...} per line (Kafka records); "value": the value document
    # alone per line (what Flink's debezium-json and most file readers take; no tombstones)
    form: str = "keyvalue"
    # source.db: PostgreSQL's database name (default: the event log's, which capture takes from the
    # connection); MySQL/MariaDB: always the table's database, as Debezium writes it
    database: str | None = None

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ConfigurationError(f"Debezium export form {self.form!r}: one of {', '.join(FORMS)}")
        if not self.topic_prefix or not re.fullmatch(r"[A-Za-z0-9._-]+", self.topic_prefix):
            raise ConfigurationError(
                f"Debezium topic prefix {self.topic_prefix!r}: use letters, digits, '.', '_' and '-' "
                "(Debezium's "
                "topic.prefix)"
            )
        if self.connector is not None and self.connector not in CONNECTORS:
            raise ConfigurationError(f"Debezium connector {self.connector!r}: one of {', '.join(CONNECTORS)}")


def connector_of(schema: TableSchema, opts: DebeziumOptions) -> str:
    connector = opts.connector or schema.connector
    if connector is None:
        raise ConfigurationError(
            f"table {schema.table}: the event log does not say which database it came from; give the "
            "connector "
            f"({', '.join(CONNECTORS)})"
        )
    return connector


def _sanitise(name: str) -> str:
    """Debezium's topic/schema name sanitising: each Java char (UTF-16 unit) outside
    [A-Za-z0-9._-] -> '_', cut at 249."""
    return re.sub(r"[^A-Za-z0-9._-]", lambda m: "__" if ord(m.group()) > 0xFFFF else "_", name)[:249]


def schema_prefix(table: TableName, opts: DebeziumOptions) -> str:
    return _sanitise(f"{opts.topic_prefix}.{table.schema}.{table.name}")


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


# --- envelope -----------------------------------------------------------------------------------
def _source_schema(connector: str) -> dict:
    def f(type_: str, name: str, optional: bool) -> dict:
        return {"type": type_, "optional": optional, "field": name}

    common = [
        f("string", "version", False),
        f("string", "connector", False),
        f("string", "name", False),
        f("int64", "ts_ms", False),
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": _SNAPSHOT_ENUM},
            "default": "false",
            "field": "snapshot",
        },
        f("string", "db", False),
        f("string", "sequence", True),
        f("int64", "ts_us", True),
        f("int64", "ts_ns", True),
    ]
    tail = [
        f(type_, name, optional)
        for type_, name, optional in profile_for_debezium(connector).debezium_source_fields
    ]
    return {
        "type": "struct",
        "fields": common + tail,
        "optional": False,
        "name": f"io.debezium.connector.{connector}.Source",
        "version": 1,
        "field": "source",
    }


def _pg_source(t: TableName, meta: dict, pos: Position, snapshot: str) -> dict:
    """The PostgreSQL connector's part of ``source`` (its fields: the profile's debezium_source_fields)."""
    lsn, commit, tx = meta.get("lsn"), meta.get("last_commit_lsn"), meta.get("tx")
    seq = (
        None
        if lsn is None
        else json.dumps([None if commit is None else str(commit), str(lsn)], separators=(",", ":"))
    )
    return {
        "sequence": seq,
        "schema": t.schema,
        "table": t.name,
        "txId": None if tx is None else int(tx),
        "lsn": lsn,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
    }


def _my_source(t: TableName, meta: dict, pos: Position, snapshot: str) -> dict:
    """The MySQL and MariaDB connectors' part of ``source``: the binlog coordinates of a streamed
    change (0 for a snapshot read, as Debezium writes them)."""
    streamed = snapshot == "false"
    return {
        "table": t.name,
        "server_id": int(meta.get("server_id") or 0),
        "gtid": meta.get("tx"),
        "file": meta.get("file") or "",
        "pos": pos.minor if streamed else 0,
        "row": pos.index if streamed else 0,
        "thread": meta.get("thread"),
        "query": None,
    }


#: Debezium's type mapping and ``source`` values of each database (by its profile's name): format
#: rules of this module, built on its value helpers, so they live here and not in the dialect
_FIELD_MAPS = {
    "postgres": lambda col, connector, enum_labels: _pg_field(col, enum_labels),
    "mysql": _my_field,
}
_SOURCE_VALUES = {"postgres": _pg_source, "mysql": _my_source}


_TRANSACTION = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


@dataclass
class TableExport:
    """One table's schemas and value converters, built once per schema."""

    schema: TableSchema
    opts: DebeziumOptions

    def __post_init__(self) -> None:
        self.connector = connector_of(self.schema, self.opts)
        self.profile = profile_for_debezium(self.connector)
        self.prefix = schema_prefix(self.schema.table, self.opts)
        fields = []
        self.columns: list[tuple[str, Conv]] = []
        enums = json.loads(self.schema.extra.get("enum_labels") or "{}")
        for col in self.schema.columns:
            got = field_schema(col, self.connector, enums.get(col.name))
            if got is not None:
                fields.append(got[0])
                self.columns.append((col.name, got[1]))
        value = {"type": "struct", "fields": fields, "optional": True, "name": f"{self.prefix}.Value"}
        self.envelope_schema = {
            "type": "struct",
            "fields": [
                value | {"field": "before"},
                value | {"field": "after"},
                _source_schema(self.connector),
                _TRANSACTION,
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
            ],
            "optional": False,
            "name": f"{self.prefix}.Envelope",
            "version": 2,
        }
        by_name = {f["field"]: (f, conv) for f, (_, conv) in zip(fields, self.columns, strict=True)}
        keys = [by_name[k] for k in self.schema.primary_key if k in by_name]  # in primary-key order
        self.key_schema = {
            "type": "struct",
            "fields": [f | {"optional": False} for f, _ in keys],
            "optional": False,
            "name": f"{self.prefix}.Key",
        }
        self._key_convs = [(f["field"], conv) for f, conv in keys]

    def image(self, row: dict | None) -> dict | None:
        return None if row is None else {n: conv(row.get(n)) for n, conv in self.columns}

    def key(self, key_values: list) -> dict:
        return {
            "schema": self.key_schema,
            "payload": {n: conv(v) for (n, conv), v in zip(self._key_convs, key_values, strict=True)},
        }

    def source(self, event: dict, database: str) -> dict:
        ts_ms = int(event["ts_ms"] or 0)
        snapshot = "incremental" if event["op"] == "r" else "false"
        meta = event.get("meta") or {}
        t = self.schema.table
        if self.profile.schema_is_database:
            database = t.schema  # MySQL's db is the table's database
        elif self.opts.database:
            database = self.opts.database
        common = {
            "version": self.opts.version,
            "connector": self.connector,
            "name": self.opts.topic_prefix,
            "ts_ms": ts_ms,
            "snapshot": snapshot,
            "db": database,
            "sequence": None,
            "ts_us": ts_ms * 1000,
            "ts_ns": ts_ms * 1_000_000,
        }
        return common | _SOURCE_VALUES[self.profile.name](
            t, meta, Position.decode(event["position"]), snapshot
        )

    def records(self, event: dict, database: str) -> list[dict]:
        """The Kafka records (key document, value document or None) of one event; in the
        "value" form each is the value document alone (no tombstones)."""
        op = event["op"]
        if (op == "t" and not self.opts.truncates) or op == "g":  # (Debezium has no gap record)
            return []
        ts_ms = int(event["ts_ms"] or 0)
        value = {
            "schema": self.envelope_schema,
            "payload": {
                "before": self.image(event["before"]),
                "after": self.image(event["after"]),
                "source": self.source(event, database),
                "transaction": None,
                "op": op,
                "ts_ms": ts_ms,
                "ts_us": ts_ms * 1000,
                "ts_ns": ts_ms * 1_000_000,
            },
        }
        if self.opts.form == "value":
            return [value]
        key = None if op == "t" else self.key(json.loads(event["key"]))
        out = [{"key": key, "value": value}]
        if op == "d" and self.opts.tombstones:
            out.append({"key": key, "value": None})
        return out


def file_records(
    t: pa.Table, opts: DebeziumOptions, *, exports: dict | None = None, skipped: list | None = None
) -> Iterator[tuple[str, str, list]]:
    """The records of one event-log file (sinks/event_log.py), in its order, as (position, key,
    the event's records). ``skipped`` collects the positions of TRUNCATEs left out."""
    from ..sinks.event_log import canonical_images, file_schema

    schema, _ = file_schema(t)
    if schema is None:
        raise ConfigurationError(
            "an event log file without its cdc.schema metadata (written before typed events): "
            "re-run the apply or snapshot that wrote it to export it"
        )
    cache = exports if exports is not None else {}
    exp = cache.get(schema.to_json())
    if exp is None:
        exp = cache[schema.to_json()] = TableExport(schema, opts)
    before = canonical_images(t, "before", keep_nulls=True)
    after = canonical_images(t, "after", keep_nulls=True)
    src = t["source"].to_pylist()
    for i, (op, key, ts) in enumerate(
        zip(t["op"].to_pylist(), t["key"].to_pylist(), t["ts_ms"].to_pylist(), strict=True)
    ):
        event = {
            "op": op,
            "key": key,
            "ts_ms": ts,
            "before": before[i],
            "after": after[i],
            "position": src[i]["position"],
            "meta": src[i],
        }
        if op == "t" and not opts.truncates and skipped is not None:
            skipped.append(src[i]["position"])
        yield src[i]["position"], key or "", exp.records(event, src[i]["db"])


def _first_position(name: str) -> str:
    """The first position of an event-log file from its name (``c-{first}-{last}``, ``r-{hw}-{id}``);
    "" (open it first) for a name of another form."""
    from ..core.position import ENCODED_LENGTH

    parts = name.split("-")
    first = parts[1] if len(parts) >= 3 else ""
    return first if len(first) == ENCODED_LENGTH else ""


def export_table(
    data_dir: str,
    source: str,
    table: TableName,
    out: str,
    opts: DebeziumOptions,
    *,
    batch_rows: int = 4096,
    skipped_truncates: list | None = None,
    replace: bool = True,
) -> int:
    """Every event of ``table`` in the event log, in (position, key) order, as Debezium JSON
    lines at ``out`` (a location: local path or URI; written whole or not at all). Returns the
    number of records; ``skipped_truncates`` collects the positions of TRUNCATEs left out
    (without ``opts.truncates``), which a consumer rebuilding the table never learns of.

    Streaming: files are read ``batch_rows`` rows at a time and merged by position, a file
    opened only once the merge reaches its first position (files cover ranges that barely
    overlap: a chunk's rows sit at its high watermark, inside one changelog batch), so memory
    stays at a few batches whatever the table's size."""
    import heapq
    import itertools

    import pyarrow.parquet as pq

    from .. import storage
    from ..sinks.event_log import event_files, table_dir

    d = table_dir(data_dir, source, table)
    exports: dict = {}

    def events(name: str) -> Iterator[tuple[str, str, list]]:
        fs, path = storage.filesystem(storage.join(d, name))
        with fs.open_input_file(path) as fh:
            pf = pq.ParquetFile(fh)
            meta = pf.schema_arrow.metadata
            for batch in pf.iter_batches(batch_size=batch_rows):
                yield from file_records(
                    pa.Table.from_batches([batch]).replace_schema_metadata(meta),
                    opts,
                    exports=exports,
                    skipped=skipped_truncates,
                )

    # the files of the table's Delta log (never a compaction's inputs beside its output)
    names = sorted(event_files(d), key=lambda n: (_first_position(n), n))
    if not names:
        raise ConfigurationError(
            f"no event log for table {table} of source {source!r} at {d}: check the table name "
            "(schema.table), "
            "the source and the data location; nothing was written"
        )
    waiting = iter(names)
    pending = next(waiting, None)
    heap: list = []
    order = itertools.count()

    def push(gen: Iterator) -> None:
        head = next(gen, None)
        if head is not None:
            heapq.heappush(heap, (head[0], head[1], next(order), head[2], gen))

    n = 0
    # ``replace`` False: an existing file at ``out`` is never replaced (airflow-cdc export-debezium
    # without --force); a local file is its owner's alone (0600): it holds row values
    with storage.atomic_output(out, replace=replace) as (fs, tmp), fs.open_output_stream(tmp) as f:
        while heap or pending is not None:
            while pending is not None and (not heap or _first_position(pending) <= heap[0][0]):
                push(events(pending))
                pending = next(waiting, None)
            if not heap:
                continue
            _, _, _, records, gen = heapq.heappop(heap)
            for rec in records:
                f.write(json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
                n += 1
            push(gen)
    return n
