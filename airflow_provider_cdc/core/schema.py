"""Table names, column types and the canonical value encoding shared by every dialect and sink.

Canonical values are JSON-safe and identical whichever path read them (chunk SELECT or
changelog): this is what makes a chunk row and a log event for the same row compare
equal, and what sinks decode back into typed columns without loss.

Logical type -> canonical JSON value:

=================  ==========================================================
bool               true / false
int16/int32/int64  JSON integer
uint64             JSON integer (MySQL BIGINT UNSIGNED)
float32/float64    JSON number; NaN / Infinity / -Infinity as those strings
decimal(p,s)       string, the source's exact text (``"12.3400"``); ``decimal`` = unbounded
string             string (also CHAR, TEXT, ENUM, MySQL SET as ``"a,b"``)
binary             base64 string (standard alphabet, padded)
date               ``"YYYY-MM-DD"``
time               ``"HH:MM:SS.ffffff"`` (MySQL TIME may be negative or > 24h: ``"-838:59:59.000000"``)
timestamp          ``"YYYY-MM-DDTHH:MM:SS.ffffff"`` (no zone)
timestamptz        ``"YYYY-MM-DDTHH:MM:SS.ffffffZ"`` (normalised to UTC)
uuid               lowercase string
json               string, the JSON text as the source renders it
array<T>           JSON list of canonical T values (nested lists for multi-dim)
=================  ==========================================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from .errors import ConfigurationError

LOGICAL_TYPES = (
    "bool", "int16", "int32", "int64", "uint64", "float32", "float64", "decimal", "string", "binary",
    "date", "time", "timestamp", "timestamptz", "uuid", "json",
)
_DECIMAL_RE = re.compile(r"^decimal\((\d+),(\d+)\)$")


def validate_logical_type(t: str) -> str:
    if t in LOGICAL_TYPES or _DECIMAL_RE.match(t):
        return t
    if t.startswith("array<") and t.endswith(">"):
        validate_logical_type(t[6:-1])
        return t
    raise ValueError(f"unknown logical type {t!r}; known: {', '.join(LOGICAL_TYPES)}, decimal(p,s), array<T>")


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A source table: ``schema`` is the PostgreSQL schema or the MySQL database."""

    schema: str
    name: str

    def __post_init__(self) -> None:
        if not self.schema or not self.name:
            raise ConfigurationError(f"table name needs a schema and a name, got schema={self.schema!r} name={self.name!r}")
        if "." in self.schema:
            raise ConfigurationError(f"schema {self.schema!r} contains '.', which table ids cannot carry; rename the schema")
        if "\x00" in self.schema or "\x00" in self.name:
            raise ConfigurationError(f"table name {self.schema!r}.{self.name!r} contains a NUL character")

    @property
    def id(self) -> str:
        """``schema.name`` as stored in staged files and events (split on the first dot)."""
        return f"{self.schema}.{self.name}"

    @property
    def path_segment(self) -> str:
        """A file-system-safe, reversible form of :attr:`id` for folder names."""
        return quote(self.id, safe="")

    @classmethod
    def parse(cls, text: str, default_schema: str | None = None) -> TableName:
        if "." in text:
            schema, name = text.split(".", 1)
            return cls(schema, name)
        if default_schema is None:
            raise ConfigurationError(f"table {text!r} needs a schema: write it as 'schema.table'")
        return cls(default_schema, text)

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # logical type, see module docstring
    source_type: str = ""
    nullable: bool = True

    def __post_init__(self) -> None:
        validate_logical_type(self.type)


@dataclass(frozen=True, slots=True)
class TableSchema:
    table: TableName
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    extra: Mapping[str, str] = field(default_factory=dict)  # dialect facts, e.g. replica_identity

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if not self.primary_key:
            raise ConfigurationError(f"table {self.table} has no primary key")
        missing = [k for k in self.primary_key if k not in names]
        if missing:
            raise ConfigurationError(f"table {self.table}: primary key column(s) {missing} not among columns {names}")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise ConfigurationError(f"table {self.table} has no column {name!r}; columns: {list(self.column_names)}")

    def key_values(self, row: Mapping[str, object]) -> tuple:
        return tuple(row[k] for k in self.primary_key)

    def key_of(self, row: Mapping[str, object]) -> str:
        return encode_key(self.key_values(row))

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "schema": self.table.schema,
                "name": self.table.name,
                "columns": [
                    {"name": c.name, "type": c.type, "source_type": c.source_type, "nullable": c.nullable}
                    for c in self.columns
                ],
                "primary_key": list(self.primary_key),
                "extra": dict(self.extra),
            },
            ensure_ascii=False,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> TableSchema:
        d = json.loads(text)
        return cls(
            TableName(d["schema"], d["name"]),
            tuple(Column(c["name"], c["type"], c.get("source_type", ""), c.get("nullable", True)) for c in d["columns"]),
            tuple(d["primary_key"]),
            d.get("extra", {}),
        )


# One encoder, built once: json.dumps() with non-default arguments builds a new encoder
# on every call, which costs more than the encoding of a short row. Same output.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def encode_key(values: Sequence[object]) -> str:
    """Canonical key: compact JSON list of canonical primary-key values, in key order."""
    return _COMPACT_JSON(list(values))


def decode_key(key: str) -> tuple:
    return tuple(json.loads(key))


def encode_row(row: Mapping[str, object]) -> str:
    """A row (column -> canonical value) as compact JSON, columns in the row's order."""
    return _COMPACT_JSON(row)


def decode_row(text: str | None) -> dict | None:
    return None if text is None else json.loads(text)
