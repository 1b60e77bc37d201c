"""Canonical values (core/schema.py) -> typed Arrow columns, without loss.

Both mirrors store typed columns, so a consumer reading the Delta table with pyarrow,
pandas, duckdb or Spark gets numbers as numbers and timestamps as timestamps. Where a
logical type has no lossless typed form in Delta Lake, the canonical text is kept:

=================  ============================================================
logical type       Arrow / Delta type
=================  ============================================================
bool               bool
int16/32/64        int16 / int32 / int64
uint64             decimal(20, 0)  (Delta has no unsigned integers)
float32/float64    float32 / float64 (NaN and infinities restored)
decimal(p,s)       decimal128(p, s) for p <= 38, else string (exact text)
decimal            string (unbounded precision: the source's exact text)
string, uuid       string
json               string (the JSON text as the source rendered it)
binary             binary (base64 decoded)
date               date32 (infinity, BC, far years, zero dates: core/temporal.py)
time               string (MySQL TIME may be negative or beyond 24 h)
timestamp          timestamp[us] without zone (Delta timestamp_ntz), as date
timestamptz        timestamp[us, tz=UTC], as date
array<T>           string (canonical JSON list; keeps multi-dimensional arrays)
=================  ============================================================
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ..core import temporal
from ..core.errors import ConfigurationError
from ..core.schema import TableSchema

_DECIMAL_RE = re.compile(r"^decimal\((\d+),(\d+)\)$")
_SIMPLE = {
    "bool": pa.bool_(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint64": pa.decimal128(20, 0),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "decimal": pa.string(),
    "string": pa.string(),
    "uuid": pa.string(),
    "json": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "time": pa.string(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
}
_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

KEY_COLUMN = "__key"
POSITION_COLUMN = "__position"
DELETED_COLUMN = "__deleted"
META_COLUMNS = (KEY_COLUMN, POSITION_COLUMN, DELETED_COLUMN)


def arrow_type(logical: str) -> pa.DataType:
    if logical in _SIMPLE:
        return _SIMPLE[logical]
    m = _DECIMAL_RE.match(logical)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        return pa.decimal128(p, s) if 0 < p <= 38 else pa.string()
    if logical.startswith("array<"):
        return pa.string()
    raise ConfigurationError(f"no Arrow type for logical type {logical!r}")


def mirror_schema(schema: TableSchema) -> pa.Schema:
    """The mirror's columns: the table's typed columns, then ``__key, __position, __deleted``."""
    names = set(schema.column_names)
    clash = names.intersection(META_COLUMNS)
    if clash:
        raise ConfigurationError(f"table {schema.table} has column(s) {sorted(clash)} that the mirror reserves; rename them")
    seen: dict[str, str] = {}
    for c in schema.columns:
        other = seen.setdefault(c.name.lower(), c.name)
        if other != c.name:
            raise ConfigurationError(
                f"table {schema.table} has columns {other!r} and {c.name!r}, whose names differ only in case: the Delta "
                "mirror compares column names without case (as Spark and most lake readers do) and cannot hold both. "
                "Rename one at the source, or leave this table out of the mirror (a source with CDC_SINKS=events)"
            )
    fields = [pa.field(c.name, arrow_type(c.type)) for c in schema.columns]
    fields += [pa.field(KEY_COLUMN, pa.string(), False), pa.field(POSITION_COLUMN, pa.string(), False),
               pa.field(DELETED_COLUMN, pa.bool_(), False)]
    return pa.schema(fields)


def _decode(value, logical: str, target: pa.DataType):
    """One canonical value -> the Python value pyarrow builds ``target`` from."""
    if value is None:
        return None
    if pa.types.is_string(target):
        if isinstance(value, str):
            return value
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)  # arrays, numbers kept as text
    if logical in ("float32", "float64"):
        return _SPECIAL_FLOATS.get(value, value) if isinstance(value, str) else float(value)
    if pa.types.is_decimal(target):
        return Decimal(str(value))
    if logical == "binary":
        return base64.b64decode(value)
    return value  # bool, ints; dates and timestamps are cast from text below


def decode_column(values: Sequence, logical: str) -> pa.Array:
    """A column of canonical values -> a typed Arrow array (see the module table)."""
    target = arrow_type(logical)
    if logical in ("date", "timestamp", "timestamptz"):
        # ISO text -> typed by Arrow's own parser ("Z" suffix understood for timestamptz);
        # what it cannot parse (infinity, BC, 5-digit years, zero dates) as exact integers
        try:
            return pa.array(values, pa.string()).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            to_int = temporal.date_to_days if logical == "date" else temporal.ts_to_micros
            try:
                ints = [None if v is None else to_int(v) for v in values]
                return pa.array(ints, pa.int32() if logical == "date" else pa.int64()).view(target)
            except (ValueError, OverflowError) as exc:
                raise ConfigurationError(
                    f"cannot hold a {logical} value in {target} ({exc}; microseconds since 1970 in 64 bits end in "
                    "year 294247): re-snapshot after correcting the value, or leave the table out of the mirror"
                ) from exc
    try:
        return pa.array([_decode(v, logical, target) for v in values], target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, ArithmeticError) as exc:
        raise ConfigurationError(f"cannot decode canonical {logical} values into {target}: {exc}") from exc


def rows_to_table(schema: TableSchema, rows: Sequence[dict | None]) -> list[pa.Array]:
    """Canonical row dicts (``None`` = all null) -> typed arrays in column order."""
    out = []
    for col in schema.columns:
        vals = [None if r is None else r.get(col.name) for r in rows]
        try:
            out.append(decode_column(vals, col.type))
        except ConfigurationError as exc:
            raise ConfigurationError(f"table {schema.table}, column {col.name!r}{_first_bad_key(schema, col, rows)}: {exc}") from exc
    return out


def _first_bad_key(schema: TableSchema, col, rows: Sequence[dict | None]) -> str:
    """`, key [..]` of the first row whose value cannot be decoded (the error path only)."""
    for r in rows:
        if r is None:
            continue
        try:
            decode_column([r.get(col.name)], col.type)
        except ConfigurationError:
            try:
                return f", key {json.dumps(list(schema.key_values(r)), ensure_ascii=False)}"
            except Exception:  # noqa: BLE001 - a row without its key columns: name none
                return ""
    return ""


# --- vectorised decoding of canonical row texts ---------------------------------------------------
def _json_read_type(logical: str) -> pa.DataType | None:
    """The type pyarrow's JSON reader parses a canonical ``logical`` value into before the
    cast to :func:`arrow_type`; None where no vectorised form reproduces :func:`decode_column`
    (``array<T>``: the mirror keeps re-encoded JSON text)."""
    if logical in ("bool", "int16", "int32", "int64"):
        return _SIMPLE[logical]
    if logical == "uint64":
        return pa.uint64()
    if logical in ("float32", "float64"):
        return pa.float64()  # float32 rounds from the double, as Python's float() does
    if logical.startswith("array<"):
        return None
    return pa.string()  # decimals, text, uuid, json, base64 binary, ISO dates, times and timestamps


def json_rows_to_arrays(schema: TableSchema, texts: pa.Array | pa.ChunkedArray) -> list[pa.Array] | None:
    """Canonical row JSON texts (``after`` of events, no nulls) -> typed arrays in column
    order, parsed by pyarrow's C++ JSON reader instead of ``json.loads`` plus a Python
    conversion per value (the mirror write's bound: ~35 us a row for the demo table).

    Returns None when it cannot give exactly what :func:`rows_to_table` gives: a column
    without a vectorised form, or any value off its canonical JSON type (a ``"NaN"`` float,
    an out-of-range integer, a decimal that does not fit). The caller then takes the
    per-row path, which is the reference and names the table and column of a bad value."""
    read_types = [_json_read_type(c.type) for c in schema.columns]
    if not len(texts) or texts.null_count or any(t is None for t in read_types):
        return None
    lines = texts.to_pylist()
    # Newline-delimited: canonical JSON escapes every control character, so a row is one line.
    data = "\n".join(lines).encode()
    longest = pc.max(pc.binary_length(texts)).as_py() + 1  # a block must hold the longest row
    try:
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(block_size=max(1 << 20, longest)),
            parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema([pa.field(c.name, t) for c, t in zip(schema.columns, read_types, strict=True)]),
                unexpected_field_behavior="ignore",  # as rows_to_table: only the schema's columns
            ),
        )
        if table.num_rows != len(lines):
            return None
        out = []
        for col in schema.columns:
            arr = table.column(col.name).combine_chunks()
            target = arrow_type(col.type)
            if col.type == "binary":
                arr = pa.array([None if v is None else base64.b64decode(v) for v in arr.to_pylist()], pa.binary())
            elif col.type == "float32":
                arr = arr.cast(pa.float32(), safe=False)
            elif arr.type != target:
                arr = arr.cast(target)  # a safe cast: a value that does not fit raises
            out.append(arr)
        return out
    except (pa.ArrowException, ValueError, TypeError):
        return None
