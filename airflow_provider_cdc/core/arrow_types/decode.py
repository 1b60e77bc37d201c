"""Canonical values (core/schema.py) -> typed Arrow columns, without loss: each logical type's Arrow
type, and canonical row texts decoded column by column (vectorised)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from .. import temporal
from ..errors import ConfigurationError
from ..schema import Column, TableSchema, decimal_params
from .arrays import _validity, binary_array, bitmap, index_array, int64_array, spread_index, string_array

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
    ps = decimal_params(logical)
    if ps:
        return pa.decimal128(*ps) if 0 < ps[0] <= 38 else pa.string()
    if logical.startswith("array<"):
        return pa.string()
    raise ConfigurationError(f"no Arrow type for logical type {logical!r}")


def mirror_schema(schema: TableSchema) -> pa.Schema:
    """The mirror's columns: the table's typed columns, then ``__key, __position, __deleted``."""
    names = set(schema.column_names)
    clash = names.intersection(META_COLUMNS)
    if clash:
        raise ConfigurationError(
            f"table {schema.table} has column(s) {sorted(clash)} that the mirror reserves; rename them"
        )
    seen: dict[str, str] = {}
    for c in schema.columns:
        other = seen.setdefault(c.name.lower(), c.name)
        if other != c.name:
            raise ConfigurationError(
                f"table {schema.table} has columns {other!r} and {c.name!r}, whose names differ only "
                "in case: the Delta "
                "mirror compares column names without case (as Spark and most lake readers do) and "
                "cannot hold both. "
                "Rename one at the source, or leave this table out of the mirror (a source with "
                "CDC_SINKS=events)"
            )
    fields = [pa.field(c.name, arrow_type(c.type)) for c in schema.columns]
    fields += [
        pa.field(KEY_COLUMN, pa.string(), False),
        pa.field(POSITION_COLUMN, pa.string(), False),
        pa.field(DELETED_COLUMN, pa.bool_(), False),
    ]
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
            texts = (
                string_array(values)
                if all(v is None or type(v) is str for v in values)
                else pa.array(values, pa.string())
            )
            return texts.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            to_int = temporal.date_to_days if logical == "date" else temporal.ts_to_micros
            try:
                ints = int64_array([None if v is None else to_int(v) for v in values])
                return (ints.cast(pa.int32()) if logical == "date" else ints).view(target)
            except (ValueError, OverflowError) as exc:
                raise ConfigurationError(
                    f"cannot hold a {logical} value in {target} ({exc}; microseconds since 1970 in 64 "
                    "bits end in "
                    "year 294247): re-snapshot after correcting the value, or leave the table out of "
                    "the mirror"
                ) from exc
    if pa.types.is_string(target):
        return string_array([_decode(v, logical, target) for v in values])
    if logical == "binary":
        try:
            return binary_array([_decode(v, logical, target) for v in values])
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"cannot decode canonical {logical} values into {target}: {exc}"
            ) from exc
    try:
        # canonical numbers, booleans and decimal texts need no per-value step (the hot path)
        arr = _from_buffers(values if isinstance(values, list) else list(values), target)
        if arr is not None:
            return arr
        decoded = [_decode(v, logical, target) for v in values]
        arr = _from_buffers(decoded, target)
        return pa.array(decoded, target) if arr is None else arr
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, ArithmeticError) as exc:
        raise ConfigurationError(f"cannot decode canonical {logical} values into {target}: {exc}") from exc


def _from_buffers(values: list, target: pa.DataType) -> pa.Array | None:
    """Plain Python numbers, booleans and decimals -> ``target`` through numpy buffers and
    Arrow casts (safe: a value that does not fit raises), without ``pa.array``'s Python
    conversion, which imports pandas (:func:`string_array`); None when the values are of
    another kind (then ``pa.array`` builds it)."""
    n = len(values)
    present = [v for v in values if v is not None]
    valid, validity, nulls = _validity(values)
    if pa.types.is_integer(target) and all(type(v) is int for v in present):
        if any(v > 2**63 - 1 or v < -(2**63) for v in present):
            return None
        return index_array(np.array([0 if v is None else v for v in values], dtype=np.int64), valid).cast(
            target
        )
    if pa.types.is_floating(target) and all(type(v) in (float, int) for v in present):
        buf = np.array([0.0 if v is None else v for v in values], dtype=np.float64)
        arr = pa.Array.from_buffers(pa.float64(), n, [validity, pa.py_buffer(buf)], nulls)
        return arr.cast(target, safe=False) if target != pa.float64() else arr
    if pa.types.is_boolean(target) and all(type(v) is bool for v in present):
        bits = bitmap(np.array([bool(v) for v in values], dtype=np.bool_))
        return pa.Array.from_buffers(pa.bool_(), n, [validity, bits], nulls)
    if pa.types.is_decimal(target) and all(isinstance(v, (Decimal, str, int)) for v in present):
        return string_array([None if v is None else str(v) for v in values]).cast(target)
    return None


def rows_to_table(schema: TableSchema, rows: Sequence[dict | None]) -> list[pa.Array]:
    """Canonical row dicts (``None`` = all null) -> typed arrays in column order."""
    out = []
    for col in schema.columns:
        vals = [None if r is None else r.get(col.name) for r in rows]
        try:
            out.append(decode_column(vals, col.type))
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"table {schema.table}, column {col.name!r}{_first_bad_key(schema, col, rows)}: {exc}"
            ) from exc
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


def json_rows_to_arrays(
    schema: TableSchema, texts: pa.Array | pa.ChunkedArray, *, all_fields: bool = False
) -> list[pa.Array] | None:
    """Canonical row JSON texts (``after`` of events, no nulls) -> typed arrays in column
    order, parsed by pyarrow's C++ JSON reader instead of ``json.loads`` plus a Python
    conversion per value (the mirror write's bound: ~35 us a row for the demo table).

    Returns None when it cannot give exactly what :func:`rows_to_table` gives: a column
    without a vectorised form, or any value off its canonical JSON type (a ``"NaN"`` float,
    an out-of-range integer, a decimal that does not fit). The caller then takes the
    per-row path, which is the reference and names the table and column of a bad value.
    With ``all_fields``, also None when a row holds a column the schema lacks (a caller that
    must keep every column takes the per-row path, which finds them)."""
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
                explicit_schema=pa.schema(
                    [pa.field(c.name, t) for c, t in zip(schema.columns, read_types, strict=True)]
                ),
                # as rows_to_table: only the schema's columns (all_fields: see them, to refuse)
                unexpected_field_behavior="infer" if all_fields else "ignore",
            ),
        )
        if table.num_rows != len(lines) or (all_fields and table.num_columns > len(schema.columns)):
            return None
        out = []
        for col in schema.columns:
            arr = table.column(col.name).combine_chunks()
            target = arrow_type(col.type)
            if col.type == "binary":
                arr = binary_array([None if v is None else base64.b64decode(v) for v in arr.to_pylist()])
            elif col.type == "float32":
                arr = arr.cast(pa.float32(), safe=False)
            elif arr.type != target:
                arr = arr.cast(target)  # a safe cast: a value that does not fit raises
            out.append(arr)
        return out
    except (pa.ArrowException, ValueError, TypeError):
        return None


def json_rows_to_struct(
    schema: TableSchema, texts: pa.Array | pa.ChunkedArray, *, as_text: Sequence[str] = ()
) -> tuple[pa.StructArray, list[str], list[str]]:
    """Canonical row JSON texts (null = no image) -> one struct array of the table's typed
    columns (:func:`arrow_type`), null where the text is null; a column absent from a row
    reads null. Returns it with the columns kept as canonical text instead: those holding a
    value their logical type cannot (an event from before a column changed type at the
    source), which ``as_text`` names beforehand, and the columns rows hold that the schema
    lacks (appended to the struct as text, in first-seen order: a stale schema loses nothing).
    The event log records which columns are text."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks else string_array([])
    valid = pc.is_valid(texts)
    present = texts.filter(valid) if texts.null_count else texts
    arrays = json_rows_to_arrays(schema, present, all_fields=True) if len(present) and not as_text else None
    names = [c.name for c in schema.columns]
    if arrays is None:
        arrays, as_text, extra = _rows_to_arrays(
            schema, [json.loads(t) for t in present.to_pylist()], as_text
        )
    else:
        as_text, extra = [], []
    ok = None
    if texts.null_count:  # which rows have an image, from the bitmap (no Python conversion)
        ok = np.unpackbits(np.frombuffer(valid.buffers()[1], dtype=np.uint8), bitorder="little")[
            valid.offset : valid.offset + len(valid)
        ].astype(np.bool_)
    return _struct(arrays, [*names, *extra], ok), as_text, extra


def _struct(arrays: list[pa.Array], names: Sequence[str], present: np.ndarray | None) -> pa.StructArray:
    """Arrays of the present images -> a struct with one slot per image, null where
    ``present`` is False (None: every image is present)."""
    mask = None
    if present is not None and not present.all():
        idx = spread_index(present)
        arrays = [a.take(idx) for a in arrays]
        mask = pa.Array.from_buffers(pa.bool_(), len(present), [None, bitmap(~present)])
    fields = [pa.field(nm, a.type) for nm, a in zip(names, arrays, strict=True)]
    return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)


def _rows_to_arrays(
    schema: TableSchema, rows: Sequence[dict], forced: Sequence[str] = ()
) -> tuple[list[pa.Array], list[str], list[str]]:
    """Canonical row dicts (no None) -> typed arrays of the schema's columns then of the
    columns only the rows hold (text), with the text columns and those extra columns (see
    :func:`json_rows_to_struct`)."""
    forced = set(forced)
    known = {c.name for c in schema.columns}
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in known))
    arrays, as_text = [], []
    for col in [*schema.columns, *(Column(n, "string") for n in extra)]:
        vals = [r.get(col.name) for r in rows]
        arr = None
        if col.name not in forced and col.name not in extra:
            try:
                arr = decode_column(vals, col.type)
            except ConfigurationError:
                pass  # a value its type cannot hold: the column is kept as text
        if arr is None:
            arr = decode_column(vals, "string")  # canonical text: strings as they are, others as JSON
            as_text.append(col.name)
        arrays.append(arr)
    return arrays, as_text, extra


def rows_to_struct(
    schema: TableSchema, rows: Sequence[dict | None], *, as_text: Sequence[str] = ()
) -> tuple[pa.StructArray, list[str], list[str]]:
    """:func:`json_rows_to_struct` for canonical row dicts (None = no image), as capture and
    the generic chunk read hold them: typed a column at a time, no JSON text in between."""
    ok, _, nulls = _validity(rows)
    arrays, text, extra = _rows_to_arrays(
        schema, [r for r in rows if r is not None] if nulls else rows, as_text
    )
    return _struct(arrays, [*(c.name for c in schema.columns), *extra], ok), text, extra
