"""Table names, column types and the canonical value encoding shared by every dialect and sink.

A value is JSON-safe and identical whichever path read it (chunk SELECT or changelog), so a
chunk row and a log event of the same row compare equal and sinks type it back without loss.
One canonical value per logical type: docs/operations.md (the type table).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .errors import ConfigurationError

LOGICAL_TYPES = (
    "bool",
    "int16",
    "int32",
    "int64",
    "uint64",
    "float32",
    "float64",
    "decimal",
    "string",
    "binary",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "uuid",
    "json",
)
_DECIMAL_RE = re.compile(r"^decimal\((\d+),(\d+)\)$")


def decimal_params(logical: str) -> tuple[int, int] | None:
    """(precision, scale) of a ``decimal(p,s)`` logical type; None for any other type."""
    m = _DECIMAL_RE.match(logical)
    return (int(m.group(1)), int(m.group(2))) if m else None


def validate_logical_type(t: str) -> str:
    if t in LOGICAL_TYPES or _DECIMAL_RE.match(t):
        return t
    if t.startswith("array<") and t.endswith(">"):
        validate_logical_type(t[6:-1])
        return t
    raise ValueError(f"unknown logical type {t!r}; known: {', '.join(LOGICAL_TYPES)}, decimal(p,s), array<T>")


# --- names in paths ---------------------------------------------------------------------
# One encoder for every path segment built from a source name (table folders of the event
# log, the mirror, chunks and schemas; on local disk and object stores alike). Kept: ASCII
# letters, digits, "-", "." and "_"; every other UTF-8 byte becomes "~HH" (upper-case hex).
# "%" never appears, so no layer that treats a path as a URL (delta-rs, Hadoop, Hive
# partition discovery, S3 signing) can decode it into another name, and "~" is unreserved
# in URLs. A leading "." or "_" is encoded too: Spark, pyarrow datasets and Hadoop treat such
# files and folders as hidden. Names whose encoding exceeds SEGMENT_MAX_CHARS (a file name
# holds 255 bytes; PostgreSQL names are 63 bytes each, up to three characters per byte here)
# keep a prefix and end in "~~" + a hash of the whole name: still unique, but decoding needs
# the name stored elsewhere (the mirror keeps it in its Delta metadata).
_SEGMENT_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._")
SEGMENT_MAX_CHARS = 200
_HASHED_MARK = "~~"
_HEX = "0123456789ABCDEF"


def encode_path_segment(text: str, *, leading_dot_ok: bool = False) -> str:
    """``text`` as one file-system- and URL-safe path segment (see the comment above).
    ``leading_dot_ok`` keeps a leading "." or "_" (for names that are not folders, e.g. the
    part of an Airflow Variable key after its prefix)."""
    if not text:
        raise ConfigurationError("an empty name cannot be a path segment")
    out = []
    for i, b in enumerate(text.encode("utf-8")):
        if b in _SEGMENT_SAFE and (leading_dot_ok or not (i == 0 and b in b"._")):
            out.append(chr(b))
        else:
            out.append(f"~{_HEX[b >> 4]}{_HEX[b & 15]}")
    seg = "".join(out)
    if len(seg) <= SEGMENT_MAX_CHARS:
        return seg
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    head = seg[: SEGMENT_MAX_CHARS - len(digest) - len(_HASHED_MARK)]
    head = head[: head.rfind("~")] if "~" in head[-2:] else head  # never cut an escape in two
    return f"{head}{_HASHED_MARK}{digest}"


def decode_path_segment(seg: str) -> str | None:
    """The name :func:`encode_path_segment` encoded, or None for a hashed (too long) name."""
    if _HASHED_MARK in seg:
        return None
    raw, i = bytearray(), 0
    while i < len(seg):
        c = seg[i]
        if c == "~":
            h = seg[i + 1 : i + 3]
            if len(h) != 2 or any(x not in _HEX for x in h):
                raise ValueError(f"not an encoded path segment: {seg!r}")
            raw.append(int(h, 16))
            i += 3
        elif ord(c) in _SEGMENT_SAFE:
            raw.append(ord(c))
            i += 1
        else:
            raise ValueError(f"not an encoded path segment: {seg!r}")
    return raw.decode("utf-8")


def split_table_list(value: object, setting: str) -> list[str]:
    """The table names of a setting: a list, a JSON list (``["s.a,b", "s.c"]``: for names
    holding commas), or a comma-separated string (``s.a,s.b``). Names stay text (a dialect
    parses them with its default schema)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigurationError(
                    f"{setting}: not a JSON list of table names ({e}): {value!r}"
                ) from None
        else:
            value = [t.strip() for t in text.split(",") if t.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ConfigurationError(
            f"{setting} must be a list of 'schema.table' strings (or a comma list, or a JSON list), "
            f"got {value!r}"
        )
    return list(value)


def parse_key_columns(value: object, setting: str) -> dict[str, tuple[str, ...]]:
    """The key of tables without a primary key (Debezium's ``message.key.columns``): a mapping
    table -> columns, given as a JSON object (``{"s.events": ["uid"]}``: any names) or as
    ``s.events:uid;s.lines:order_id,line_no`` (names without ``:``, ``;`` or ``,``). Table
    names stay text, as in :func:`split_table_list`. ``*`` alone (:data:`WHOLE_ROW`) keys a
    table by its whole row: captured as a multiset."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigurationError(
                    f"{setting}: not a JSON object of table -> key columns ({e}): {text!r}"
                ) from None
        else:
            out: dict[str, list[str]] = {}
            for part in (p.strip() for p in text.split(";")):
                if not part:
                    continue
                table, sep, cols = part.rpartition(":")
                if not sep or not table.strip():
                    raise ConfigurationError(
                        f"{setting}: {part!r} is not 'schema.table:column[,column...]'; separate "
                        "tables with ';', "
                        'or give a JSON object such as {"public.events": ["event_uid"]}'
                    )
                out[table.strip()] = [c.strip() for c in cols.split(",")]
            value = out
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{setting} must map tables to their key columns, got {value!r}")
    result: dict[str, tuple[str, ...]] = {}
    for table, cols in value.items():
        if isinstance(cols, str):
            cols = [cols]
        if (
            not isinstance(table, str)
            or not table
            or not isinstance(cols, list | tuple)
            or not cols
            or not all(isinstance(c, str) and c for c in cols)
        ):
            raise ConfigurationError(
                f"{setting}: table {table!r} needs a non-empty list of column names, got {cols!r}"
            )
        if len(set(cols)) != len(cols):
            raise ConfigurationError(f"{setting}: table {table!r} names a key column twice: {list(cols)!r}")
        if "*" in cols and len(cols) > 1:
            raise ConfigurationError(
                f"{setting}: table {table!r} names '*' (the whole row: captured as a multiset) with other "
                f"columns {list(cols)!r}: give '*' alone, or the columns of a unique index"
            )
        result[table] = tuple(cols)
    return result


def multiset_key(
    table: TableName, *, has_key: bool, whole_old_rows: bool
) -> tuple[tuple[str, ...] | None, str]:
    """The key of a table CDC_KEY_COLUMNS names with ``*`` (:data:`WHOLE_ROW`): ``()``, "keyed by
    its whole row", when it has no key of its own and the log carries the whole old row of each
    UPDATE and DELETE (``whole_old_rows``); else None and why not."""
    if has_key:
        return None, (
            "is named in CDC_KEY_COLUMNS with '*' (captured as a multiset), but it has a primary key, "
            "which keys it: remove it from CDC_KEY_COLUMNS"
        )
    if not whole_old_rows:
        return None, (
            "is named in CDC_KEY_COLUMNS with '*' (captured as a multiset: each change is matched to "
            "a copy by its whole row), but the log does not carry the whole old row of its UPDATEs "
            "and DELETEs"
        )
    return (), ""


def _quote_id_part(part: str) -> str:
    return '"' + part.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A source table: ``schema`` is the PostgreSQL schema or the MySQL database. Both are
    data: any characters but NUL (the databases allow no NUL either)."""

    schema: str
    name: str

    def __post_init__(self) -> None:
        if (
            not isinstance(self.schema, str)
            or not isinstance(self.name, str)
            or not self.schema
            or not self.name
        ):
            raise ConfigurationError(
                f"table name needs a schema and a name, got schema={self.schema!r} name={self.name!r}"
            )
        if "\x00" in self.schema or "\x00" in self.name:
            raise ConfigurationError(f"table name {self.schema!r}.{self.name!r} contains a NUL character")
        try:
            self.schema.encode("utf-8"), self.name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"table name {self.schema!r}.{self.name!r} is not valid Unicode (a lone surrogate)"
            ) from None

    @property
    def id(self) -> str:
        """``schema.name`` as stored in staged files, events and settings. The schema is written
        in double quotes (inner quotes doubled) when it holds a dot or starts with a quote, so
        :meth:`parse` can always split it; the name never needs quoting (it is everything
        after the schema's dot)."""
        schema = (
            _quote_id_part(self.schema)
            if ("." in self.schema or self.schema.startswith('"'))
            else self.schema
        )
        return f"{schema}.{self.name}"

    @property
    def path_segment(self) -> str:
        """One path segment for folder names: :func:`encode_path_segment` of :attr:`id`."""
        return encode_path_segment(self.id)

    @classmethod
    def from_path_segment(cls, seg: str) -> TableName | None:
        """The table a folder was named for, or None when the name was too long to keep."""
        text = decode_path_segment(seg)
        return None if text is None else cls.parse(text)

    @classmethod
    def parse(cls, text: str, default_schema: str | None = None) -> TableName:
        """``schema.name`` (split on the first dot), ``"sch.ema".name`` (a quoted schema,
        inner quotes doubled), or a bare name with ``default_schema``."""
        if not isinstance(text, str):
            raise ConfigurationError(
                f"a table must be given as a string 'schema.table', got {type(text).__name__}"
            )
        if text.startswith('"'):
            i, schema = 1, []
            while i < len(text):
                if text[i] == '"':
                    if text[i + 1 : i + 2] == '"':
                        schema.append('"')
                        i += 2
                        continue
                    break
                schema.append(text[i])
                i += 1
            rest = text[i + 1 :]
            if i >= len(text) or not rest.startswith("."):
                raise ConfigurationError(
                    f"table {text!r}: a quoted schema must be closed and followed by '.' and the table name, "
                    'e.g. "my.schema".orders'
                )
            return cls("".join(schema), rest[1:])
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


#: ``TableSchema.extra`` of a table described for a whole-table refresh (no key needed)
WHOLE_TABLE = "whole_table_refresh"
#: ``TableSchema.extra`` of a table without a key captured as a multiset (CDC_KEY_COLUMNS names
#: it with :data:`WHOLE_ROW`): its whole row is its key and duplicate rows are counted
MULTISET = "multiset"
#: the CDC_KEY_COLUMNS value of a table captured as a multiset: ``{"s.t": "*"}`` or ``s.t:*``
WHOLE_ROW = ("*",)


@dataclass(frozen=True, slots=True)
class TableSchema:
    table: TableName
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    extra: Mapping[str, str] = field(default_factory=dict)  # dialect facts, e.g. replica_identity

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if not self.primary_key and not self.whole_table and not self.multiset:
            raise ConfigurationError(f"table {self.table} has no primary key")
        missing = [k for k in self.primary_key if k not in names]
        if missing:
            raise ConfigurationError(
                f"table {self.table}: primary key column(s) {missing} not among columns {names}"
            )

    @property
    def whole_table(self) -> bool:
        """Described for a whole-table refresh (a dialect's ``describe_table(keyed=False)``):
        read in physical order, never by key, so it has none (chunks, windows and the keyed
        mirror never take it)."""
        return self.extra.get(WHOLE_TABLE) == "true"

    @property
    def multiset(self) -> bool:
        """A table without a key captured as a multiset (docs/DESIGN.md, "Tables without a key"):
        never chunked by key; its mirror counts copies of whole rows (sinks/multiset.py)."""
        return self.extra.get(MULTISET) == "true"

    @property
    def connector(self) -> str | None:
        """The kind of database the table is in, as Debezium names its connectors (postgresql,
        mysql, mariadb), from what its dialect recorded; None when nothing says."""
        if self.extra.get("connector"):
            return str(self.extra["connector"])
        if self.extra.get("flavour"):  # schemas staged before "connector" was recorded
            return "mariadb" if "maria" in str(self.extra["flavour"]).lower() else "mysql"
        return "postgresql" if "replica_identity" in self.extra else None

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise ConfigurationError(
            f"table {self.table} has no column {name!r}; columns: {list(self.column_names)}"
        )

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
            tuple(
                Column(c["name"], c["type"], c.get("source_type", ""), c.get("nullable", True))
                for c in d["columns"]
            ),
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


# --- schema changes ------------------------------------------------------------------------
def evolve_schema(staged: TableSchema, current: TableSchema) -> tuple[TableSchema, list[str]]:
    """The schema the sinks keep after the source's table changed from ``staged`` to
    ``current``: new columns appended (null before they existed), dropped columns kept (null
    from then on), every other column as it was. Returns it with the conflicts no sink can
    follow in place, each a sentence naming the column: a changed logical type (int -> text)
    or a changed primary key. With conflicts, the returned schema is ``staged`` unchanged:
    the table waits for a re-snapshot, which starts over from ``current``."""
    conflicts = []
    if tuple(current.primary_key) != tuple(staged.primary_key):
        conflicts.append(
            f"primary key changed from {list(staged.primary_key)} to {list(current.primary_key)}"
        )
    now = {c.name: c for c in current.columns}
    for c in staged.columns:
        if c.name in now and now[c.name].type != c.type:
            conflicts.append(f"column {c.name!r} changed type from {c.type} to {now[c.name].type}")
    if conflicts:
        return staged, conflicts
    known = set(staged.column_names)
    added = tuple(Column(c.name, c.type, c.source_type, True) for c in current.columns if c.name not in known)
    if not added:
        return staged, []
    return TableSchema(staged.table, staged.columns + added, staged.primary_key, dict(staged.extra)), []


def follow_log_schema(previous: TableSchema | None, current: TableSchema) -> TableSchema:
    """The schema the event log types a table's events with, after the source's table became
    ``current``: every column ever seen, in first-seen order (a dropped one stays, nullable:
    events from before the DROP hold its values), each with its newest type and source type,
    new columns appended; the primary key is the current one. Unlike :func:`evolve_schema` it
    never refuses a change: the event log keeps every event whatever the mirror can follow
    (a value its column's newer type cannot hold is kept as text, core/arrow_types/)."""
    if previous is None:
        return current
    now = {c.name: c for c in current.columns}
    cols = [now.get(c.name) or Column(c.name, c.type, c.source_type, True) for c in previous.columns]
    known = set(previous.column_names)
    cols += [c for c in current.columns if c.name not in known]
    return TableSchema(current.table, tuple(cols), current.primary_key, dict(current.extra))


def log_typing_schema(logged: TableSchema | None, staged: TableSchema | None) -> TableSchema | None:
    """The columns a table's changes are typed with in staging and the event log: its log
    schema, plus any column of its staged schema the log schema lacks (a column added while
    no change of the table was captured, which a snapshot's chunks already read); either
    alone when the other is missing."""
    if logged is None or staged is None:
        return logged or staged
    known = set(logged.column_names)
    missing = tuple(c for c in staged.columns if c.name not in known)
    if not missing:
        return logged
    return TableSchema(logged.table, logged.columns + missing, logged.primary_key, dict(logged.extra))
