"""Canonical values (core/schema.py) -> typed Arrow columns, without loss.

Both mirrors store typed columns, so a consumer gets numbers as numbers and timestamps as
timestamps; where a logical type has no lossless typed form, the canonical text is kept.
The Arrow type of each logical type: docs/operations.md (the type table).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from . import temporal
from .errors import ConfigurationError
from .schema import Column, TableSchema, decimal_params, follow_log_schema

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


def bitmap(mask: np.ndarray) -> pa.Buffer:
    """A numpy bool array -> an Arrow bitmap buffer (validity, a struct's null mask)."""
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _validity(values: Sequence) -> tuple[np.ndarray | None, pa.Buffer | None, int]:
    """(which values are present, their validity bitmap, how many are null); (None, None, 0)
    when none is null."""
    if None not in values:
        return None, None, 0
    valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values))
    return valid, bitmap(valid), len(values) - int(valid.sum())


def string_array(values: Sequence[str | None]) -> pa.Array:
    """Python strings (None = null) -> an Arrow string array, built from buffers.

    Why not ``pa.array(values)``: pyarrow imports pandas at its first conversion of Python
    objects (``pa.array``, ``pa.scalar``, a Python value given to a compute kernel) when
    pandas is installed, as it is next to Airflow: ~60 MB of RSS and seconds of import
    in every chunk and capture task, for nothing. This builds the same array from one
    UTF-8 buffer and its offsets."""
    n = len(values)
    _, validity, nulls = _validity(values)
    if nulls:
        values = ["" if v is None else v for v in values]
    text = "".join(values)
    if text.isascii():  # one byte per character: lengths without encoding each value
        data = text.encode("ascii")
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    else:
        encoded = [v.encode("utf-8") for v in values]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    del text
    if len(data) >= 2**31:  # beyond 32-bit offsets: let pyarrow split it into chunks
        return pa.chunked_array([pa.array(values, pa.string())]).combine_chunks()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), validity, nulls)


def int64_array(values: Sequence[int | None]) -> pa.Array:
    """Python ints (None = null) -> an Arrow int64 array, without pa.array (see string_array)."""
    n = len(values)
    _, validity, nulls = _validity(values)
    if nulls:
        values = [0 if v is None else v for v in values]
    buf = np.array(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(buf)], nulls)


def binary_array(values: Sequence[bytes | None]) -> pa.Array:
    """Python bytes (None = null) -> an Arrow binary array from buffers (see :func:`string_array`)."""
    n = len(values)
    _, validity, nulls = _validity(values)
    if nulls:
        values = [b"" if v is None else v for v in values]
    data = b"".join(values)
    if len(data) >= 2**31:
        return pa.chunked_array([pa.array(values, pa.binary())]).combine_chunks()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=n), out=offsets[1:])
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], nulls
    )


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, dtype=np.uint8), count=offset + n, bitorder="little")[
        offset:
    ].astype(np.bool_)


def validity_mask(arr: pa.Array) -> np.ndarray:
    """Which values of ``arr`` are present, as numpy bools (from the validity bitmap:
    ``to_numpy`` of a boolean array imports pandas, see :func:`string_array`)."""
    n = len(arr)
    if arr.null_count == 0:
        return np.ones(n, dtype=np.bool_)
    if arr.null_count == n or arr.buffers()[0] is None:
        return np.zeros(n, dtype=np.bool_)
    return _bits(arr.buffers()[0], arr.offset, n)


def bools_to_numpy(arr: pa.Array) -> np.ndarray:
    """A boolean array -> numpy bools, null -> False (see :func:`validity_mask`)."""
    n = len(arr)
    if arr.null_count == n:
        return np.zeros(n, dtype=np.bool_)
    values = _bits(arr.buffers()[1], arr.offset, n)
    return values & validity_mask(arr) if arr.null_count else values


#: payload bytes up to which :func:`gather_slices` indexes each byte (16 bytes of index per
#: byte: at most 1 MB of temporaries), faster than Arrow's take for a few values
_SMALL_GATHER = 1 << 16


def gather_slices(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte ranges of ``buf`` (numpy uint8; ``starts``/``lengths``, numpy int64) -> their bytes
    end to end and the int64 offsets (n + 1) of each range in them, with no Python object per
    range and a small constant of memory per range, not per byte (a 64 MB value costs its
    copy, not an index of it).

    Ranges in order that do not overlap (a column's values in a message or COPY buffer): ``buf``
    is seen as a large_binary array whose values alternate range, gap, range, ... and Arrow's
    ``take`` of the even values copies each range once (a memcpy per value). Any other ranges:
    numpy copies of each range into the output (one Python step per range)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if not total:
        return np.zeros(0, dtype=np.uint8), offsets
    if (lengths < 0).any():
        raise ValueError("gather_slices: a negative length")
    if total <= _SMALL_GATHER:  # a few KB: one numpy gather is quicker than Arrow's set-up
        return buf[np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)], offsets
    ends = starts + lengths
    nz = lengths > 0
    if not ((starts[nz] >= 0).all() and (ends[nz] <= len(buf)).all()):
        raise IndexError("gather_slices: a range outside the buffer")
    data = _take_ranges(buf, starts, ends, nz, n, total)
    if data is None:  # unordered or overlapping ranges
        data = np.empty(total, dtype=np.uint8)
        for i in np.flatnonzero(nz).tolist():
            data[offsets[i] : offsets[i + 1]] = buf[starts[i] : ends[i]]
    return data, offsets


def _take_ranges(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, nz: np.ndarray, n: int, total: int
) -> np.ndarray | None:
    """:func:`gather_slices` of ranges in order that do not overlap, by Arrow's take; None when
    the ranges are not so. Empty ranges may start anywhere: they are moved to the end of the
    range before them."""
    if not nz.all():  # an empty range (a null, an empty value) sits where the previous range ends
        first = int(starts[nz][0])
        last_end = np.maximum.accumulate(np.where(nz, ends, first))
        prev = np.empty(n, dtype=np.int64)
        prev[0], prev[1:] = first, last_end[:-1]
        starts = np.where(nz, starts, prev)
        ends = np.where(nz, ends, prev)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    if (np.diff(bounds) < 0).any():
        return None
    buf = np.ascontiguousarray(buf, dtype=np.uint8)
    # 2n - 1 values: range 0, gap 0, range 1, ..., range n-1 (the offsets need not start at 0)
    spans = pa.Array.from_buffers(
        pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buf)]
    )
    picked = pc.take(spans, index_array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    out_offsets = np.frombuffer(picked.buffers()[1], dtype=np.int64, count=n + 1, offset=picked.offset * 8)
    first = int(out_offsets[0])
    return np.frombuffer(picked.buffers()[2], dtype=np.uint8, count=total, offset=first)


def statistics_columns(schema: pa.Schema, keep: Sequence[str] = ()) -> list[str]:
    """The Parquet column paths to write min/max statistics for (``write_statistics=`` of a
    ParquetWriter): every leaf of a fixed-size type (numbers, booleans, dates, decimals),
    inside structs too (``after.id``), and the top-level columns named in ``keep`` (short
    texts: keys, positions); never a string or binary value of a row, nor a list. The
    writer copies a value into its statistics several times (page, chunk, encoded min and
    max): one 64 MB value cost ~380 MB while its row group was written, for statistics
    nothing reads."""
    out: list[str] = []

    def walk(field: pa.Field, path: str, top: bool) -> None:
        t = field.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i), f"{path}.{t.field(i).name}", False)
        elif top and field.name in keep:
            out.append(path)
        elif not (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t)
            or pa.types.is_nested(t)
        ):
            out.append(path)

    for f in schema:
        walk(f, f.name, True)
    return out


def slices_array(
    typ: pa.DataType, data: np.ndarray, offsets: np.ndarray, valid: np.ndarray | None = None
) -> pa.Array:
    """Bytes and int64 offsets (:func:`gather_slices`) -> a string or binary array of ``typ``
    (null where not ``valid``); the large variant and a cast back past 2 GiB."""
    n = len(offsets) - 1
    nulls = 0 if valid is None else n - int(np.count_nonzero(valid))
    large = int(offsets[-1]) >= 2**31
    t = (pa.large_string() if pa.types.is_string(typ) else pa.large_binary()) if large else typ
    arr = pa.Array.from_buffers(
        t,
        n,
        [
            bitmap(valid) if nulls else None,
            pa.py_buffer(offsets if large else offsets.astype(np.int32)),
            pa.py_buffer(data),
        ],
        nulls,
    )
    return arr.cast(typ) if large else arr


def index_array(ints: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy int64 array (``valid``: False = null) -> an Arrow int64 array, without the
    Python conversion that imports pandas (:func:`string_array`)."""
    ints = np.ascontiguousarray(ints, dtype=np.int64)
    n = len(ints)
    if valid is None:
        return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(ints)])
    return pa.Array.from_buffers(pa.int64(), n, [bitmap(valid), pa.py_buffer(ints)], n - int(valid.sum()))


def spread_index(present: np.ndarray) -> pa.Array:
    """The ``take`` indices that spread values of the ``present`` slots back to one slot each:
    slot i takes value number (present slots before i), null where not present."""
    return index_array(np.cumsum(present) - 1, present)


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


# --- canonical values from typed columns (the inverse of the decoding above) ---------------------
def _f32(x: float) -> float:
    """``x`` rounded to float32, as the shortest decimal that reads back as that float32
    (``1.1``, not its widened ``1.100000023841858``): what the source printed, and what
    a float32 column shows to readers (numpy, Java, Debezium's JSON)."""
    return float(str(np.float32(x)))


def _float_canonical(v: Any, logical: str) -> Any:
    if isinstance(v, str):
        return v  # "NaN", "Infinity", "-Infinity"
    f = float(v)
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "Infinity" if f > 0 else "-Infinity"
    return _f32(f) if logical == "float32" else f


def _ts_text(v: Any, tz: bool) -> str:
    if isinstance(v, str):  # canonical text, any year, infinities, zero dates: exact integers
        return temporal.micros_to_text(temporal.ts_to_micros(v), tz)
    if tz:
        v = v.astimezone(dt.UTC).replace(tzinfo=None) if v.tzinfo else v
        return v.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
    return v.replace(tzinfo=None).strftime("%Y-%m-%dT%H:%M:%S.%f")


def normalise_value(v: Any, logical: str) -> Any:
    """One value, canonical or typed (as the mirror stores it) -> the canonical form compared.

    Idempotent on canonical values, so source rows pass through it too: that keeps
    representation details that are equal in value (a float32 widened two ways, a
    timestamp with or without trailing zero microseconds) from counting as mismatches.
    """
    if v is None:
        return None
    if logical in ("float32", "float64"):
        return _float_canonical(v, logical)
    if logical == "uint64" or logical in ("int16", "int32", "int64"):
        return int(v)
    if logical == "bool":
        return bool(v)
    if logical.startswith("decimal"):
        return str(v) if isinstance(v, Decimal) else v
    if logical == "binary":
        return (
            base64.b64encode(bytes(v)).decode("ascii") if isinstance(v, (bytes, bytearray, memoryview)) else v
        )
    if logical == "date":
        return v.isoformat() if isinstance(v, dt.date) else temporal.days_to_text(temporal.date_to_days(v))
    if logical == "timestamp":
        return _ts_text(v, tz=False)
    if logical == "timestamptz":
        return _ts_text(v, tz=True)
    if logical.startswith("array<"):
        return json.loads(v) if isinstance(v, str) else v
    return v  # string, uuid, json, time, unbounded decimal: canonical text already


def _is_canonical_ts(v: Any, tz: bool) -> bool:
    # "YYYY-MM-DDTHH:MM:SS.ffffff" (+ "Z"): already what _ts_text would return
    return (
        isinstance(v, str)
        and len(v) == (27 if tz else 26)
        and v[10] == "T"
        and v[19] == "."
        and (v[-1] == "Z") == tz
    )


def _fast_normaliser(logical: str):
    """The per-column form of :func:`normalise_value` for source rows, or None where canonical
    values need no change (ints, strings, json...); the hot path of a million-row verify."""
    if logical in ("int16", "int32", "int64", "uint64", "string", "uuid", "json", "time", "decimal", "bool"):
        return None
    if logical in ("timestamp", "timestamptz"):
        tz = logical == "timestamptz"
        return lambda v: v if v is None or _is_canonical_ts(v, tz) else _ts_text(v, tz)
    return lambda v: normalise_value(v, logical)


class RowNormaliser:
    """Canonical rows of one schema -> the compared form (columns in schema order)."""

    def __init__(self, schema: TableSchema) -> None:
        self.names = schema.column_names
        self.fns = [(c.name, f) for c in schema.columns if (f := _fast_normaliser(c.type)) is not None]

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        out = {n: row.get(n) for n in self.names}
        for name, fn in self.fns:
            out[name] = fn(out[name])
        return out


def arrow_canonical(arr, logical: str) -> list:
    """A typed mirror column (core/arrow_types.py) -> canonical values, vectorised where
    Arrow can (timestamps, dates, decimals), the inverse of the sink's decoding."""
    t = arr.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        is_ts = pa.types.is_timestamp(t)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        ints = arr.view(pa.int64() if is_ts else pa.int32())
        # years 1..9999 print with strftime; anything else (BC, far years, infinities, zero
        # dates) takes the exact inverse of the sink's encoding (core/temporal.py)
        first, last = (-62135596800000000, 253402300799999999) if is_ts else (-719162, 2932896)
        mm = pc.min_max(ints)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is not None and (lo < first or hi > last):
            if is_ts:
                return [
                    None if v is None else temporal.micros_to_text(v, logical == "timestamptz")
                    for v in ints.to_pylist()
                ]
            return [None if v is None else temporal.days_to_text(v) for v in ints.to_pylist()]
        if not is_ts:
            return pc.strftime(arr, format="%Y-%m-%d").to_pylist()
        vals = pc.strftime(arr, format="%Y-%m-%dT%H:%M:%S").to_pylist()  # %S carries the microseconds
        return [None if v is None else v + "Z" for v in vals] if logical == "timestamptz" else vals
    if pa.types.is_decimal(t):
        vals = pc.cast(arr, pa.string()).to_pylist()
        if logical == "uint64":
            return [None if v is None else int(Decimal(v)) for v in vals]
        # Arrow prints small magnitudes in scientific notation (-1E-10); canonical text is plain
        return [v if v is None or "E" not in v else format(Decimal(v), "f") for v in vals]
    vals = arr.to_pylist()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [None if v is None else base64.b64encode(v).decode("ascii") for v in vals]
    if logical in ("float32", "float64") or logical.startswith("array<"):
        return [normalise_value(v, logical) for v in vals]
    return vals


# --- typed images: the form staging, the engines and the sinks share -----------------------------
#: Parquet metadata of a staged or event-log file whose images are typed: the TableSchema the
#: images were typed with, and the columns kept as canonical text in that file
SCHEMA_META = b"cdc.schema"
TEXT_COLUMNS_META = b"cdc.text_columns"
_JSON_SCALARS = frozenset({"bool", "int16", "int32", "int64", "uint64", "float32", "float64"})


def type_images(
    schema: TableSchema, before, after
) -> tuple[pa.StructArray, pa.StructArray, TableSchema, list[str]]:
    """One table's before- and after-images, as canonical row JSON texts (an Arrow string
    array, null = no image) or canonical row dicts (a list, None = no image) ->
    two struct arrays of the same typed columns, the schema they were typed with and the columns
    kept as canonical text. ``schema`` gives the columns and types; a column the rows hold
    and the schema lacks is appended as ``string`` (a stale schema loses nothing); a column
    holding a value its type cannot (an event from before a column changed type at the
    source) is text in both images. This is the one place images become typed: staging
    writes typed files, so nothing downstream parses JSON."""
    b, text_b, extra_b = _to_struct(schema, before)
    a, text_a, extra_a = _to_struct(schema, after)
    extra = list(dict.fromkeys([*extra_b, *extra_a]))
    schema = _with_text_columns(schema, extra)
    as_text = sorted((set(text_b) | set(text_a)) - set(extra))
    if as_text or extra:
        # the same columns, as text alike, in both images: one file has one type per column
        b, _, _ = _to_struct(schema, before, as_text=as_text)
        a, _, _ = _to_struct(schema, after, as_text=as_text)
    return b, a, schema, as_text


def type_image(schema: TableSchema, images) -> tuple[pa.StructArray, TableSchema, list[str]]:
    """:func:`type_images` for one image (a chunk's after-rows): its struct, the schema it
    was typed with and its text columns."""
    struct, text, extra = _to_struct(schema, images)
    return struct, _with_text_columns(schema, extra), sorted(set(text) - set(extra))


def _with_text_columns(schema: TableSchema, names: Sequence[str]) -> TableSchema:
    """``schema`` with ``names`` appended as ``string`` columns (columns only the rows hold)."""
    if not names:
        return schema
    return TableSchema(
        schema.table,
        schema.columns + tuple(Column(c, "string") for c in names),
        schema.primary_key,
        dict(schema.extra),
    )


def _to_struct(schema: TableSchema, images, *, as_text: Sequence[str] = ()):
    if isinstance(images, (pa.Array, pa.ChunkedArray)):
        return json_rows_to_struct(schema, images, as_text=as_text)
    return rows_to_struct(schema, images, as_text=as_text)


def images_metadata(schema: TableSchema, text_columns: Sequence[str]) -> dict[bytes, bytes]:
    """The Parquet metadata naming what a file's typed images were typed with."""
    return {
        SCHEMA_META: schema.to_json().encode(),
        TEXT_COLUMNS_META: json.dumps(sorted(text_columns)).encode(),
    }


def metadata_schema(meta: dict | None) -> tuple[TableSchema | None, list[str]]:
    """(schema, text columns) from :func:`images_metadata`; (None, []) when absent."""
    meta = meta or {}
    if SCHEMA_META not in meta:
        return None, []
    return TableSchema.from_json(meta[SCHEMA_META].decode()), json.loads(meta.get(TEXT_COLUMNS_META, b"[]"))


def _logicals(schema: TableSchema | None, text_columns: Sequence[str]) -> dict[str, str]:
    text = set(text_columns)
    return {c.name: ("string" if c.name in text else c.type) for c in schema.columns} if schema else {}


def canonical_rows(
    images: pa.StructArray | pa.ChunkedArray,
    schema: TableSchema | None,
    text_columns: Sequence[str] = (),
    *,
    keep_nulls: bool = False,
) -> list[dict | None]:
    """Typed images -> canonical row dicts (core/schema.py), null images -> None; a column
    that is null is left out unless ``keep_nulls`` (the typed struct cannot tell a column the
    event did not carry from a null). Text columns give their canonical text (as the event
    log's readers always have; :func:`text_to_canonical` turns it back into a value)."""
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks() if images.num_chunks else pa.nulls(0, images.type)
    logical = _logicals(schema, text_columns)
    names = [f.name for f in images.type]
    cols = [arrow_canonical(images.field(i), logical.get(n, "string")) for i, n in enumerate(names)]
    valid = images.is_valid().to_pylist()
    if keep_nulls:
        return [
            {n: col[i] for n, col in zip(names, cols, strict=True)} if valid[i] else None
            for i in range(len(images))
        ]
    return [
        {n: col[i] for n, col in zip(names, cols, strict=True) if col[i] is not None} if valid[i] else None
        for i in range(len(images))
    ]


def text_to_canonical(text: str | None, logical: str) -> Any:
    """A value kept as canonical text (:func:`decode_column` with ``"string"``: strings as they
    are, other values as their JSON) -> the canonical value of ``logical``."""
    if text is None:
        return None
    if logical in _JSON_SCALARS or logical.startswith("array<"):
        if text in _SPECIAL_FLOATS:
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def column_as(arr: pa.Array, have: str, want: str, *, name: str = "", table: Any = "") -> pa.Array:
    """One typed column of logical type ``have`` (``"string"``: canonical text) as the typed
    column of logical type ``want``; a value ``want`` cannot hold raises ConfigurationError
    naming the table and column."""
    target = arrow_type(want)
    if have == want and arr.type == target:
        return arr
    if arr.type == target and (have != "string" or want in ("string", "uuid", "json", "time", "decimal")):
        return arr

    def numeric(t: pa.DataType) -> bool:
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)

    if (
        have != "string"
        and numeric(arr.type)
        and numeric(target)
        and not (pa.types.is_floating(arr.type) and not pa.types.is_floating(target))
    ):
        try:  # a widened or narrowed number: Arrow's safe cast (a value that does not fit raises)
            return arr.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # the reference below names the table and column of a value that does not fit
    vals = arrow_canonical(arr, have)
    if have == "string":
        vals = [text_to_canonical(v, want) for v in vals]
    try:
        return decode_column(vals, want)
    except ConfigurationError as exc:
        raise ConfigurationError(f"table {table}, column {name!r}: {exc}") from exc


def struct_columns(
    images: pa.StructArray | pa.ChunkedArray,
    have: TableSchema | None,
    text_columns: Sequence[str],
    want: TableSchema,
) -> list[pa.Array]:
    """Typed images -> one array per column of ``want`` (its types, :func:`arrow_type`): a
    column the images lack reads null, one they hold typed otherwise is converted
    (:func:`column_as`), columns ``want`` lacks are left out."""
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks() if images.num_chunks else pa.nulls(0, images.type)
    logical = _logicals(have, text_columns)
    names = {f.name: i for i, f in enumerate(images.type)}
    # a null image (a delete's after) reads null in every column
    mask = images.is_valid() if images.null_count else None
    out = []
    for col in want.columns:
        i = names.get(col.name)
        if i is None:
            out.append(pa.nulls(len(images), arrow_type(col.type)))
            continue
        arr = images.field(i)
        if mask is not None:
            arr = pc.if_else(mask, arr, pa.nulls(len(arr), arr.type))
        out.append(column_as(arr, logical.get(col.name, "string"), col.type, name=col.name, table=want.table))
    return out


def conform_images(
    images: pa.StructArray | pa.ChunkedArray,
    have: TableSchema | None,
    text_columns: Sequence[str],
    want: TableSchema,
    want_text: Sequence[str] = (),
) -> pa.StructArray:
    """Typed images re-typed to ``want`` (and ``want_text`` as canonical text), the null
    images kept: what joins images of one table typed at different positions into one array."""
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks() if images.num_chunks else pa.nulls(0, images.type)
    text = set(want_text)
    target = TableSchema(
        want.table,
        tuple(
            Column(c.name, "string" if c.name in text else c.type, c.source_type, True) for c in want.columns
        ),
        want.primary_key,
        dict(want.extra),
    )
    have_logical = _logicals(have, text_columns)
    arrays = []
    for col, tcol in zip(want.columns, target.columns, strict=True):
        idx = images.type.get_field_index(col.name)
        if idx < 0:
            arrays.append(pa.nulls(len(images), arrow_type(tcol.type)))
            continue
        arr = images.field(idx)
        h = have_logical.get(col.name, "string")
        if tcol.type == "string" and h != "string":  # typed -> canonical text
            arrays.append(decode_column(arrow_canonical(arr, h), "string"))
        else:
            arrays.append(column_as(arr, h, tcol.type, name=col.name, table=want.table))
    fields = [pa.field(c.name, a.type) for c, a in zip(want.columns, arrays, strict=True)]
    mask = pc.invert(images.is_valid()) if images.null_count else None
    return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)


def conform_parts(
    parts: Sequence[tuple], typing: TableSchema | None
) -> tuple[list[tuple], TableSchema, list[str]]:
    """Parts of one table's images, each ``(before, after, schema, text_columns)`` typed with
    its own schema (the log described the columns anew between them, or a part was typed
    elsewhere) -> each part's ``(before, after)`` under one schema, that schema and its text
    columns. The schema is ``typing`` (the table's log schema; None: the parts' own, joined)
    plus the columns only the parts hold, as text (as :func:`type_images` does for a stale
    schema); a column some part holds with a value the schema's type cannot hold is text."""
    base = typing if typing is not None else unify_schemas([(p[2], p[3]) for p in parts])[0]
    known = set(base.column_names)
    extra = list(dict.fromkeys(c.name for p in parts for c in p[2].columns if c.name not in known))
    want = _with_text_columns(base, extra)
    text = set().union(*(p[3] for p in parts)) - set(extra)
    wl = {c.name: c.type for c in want.columns}
    for before, after, have, have_text in parts:
        for name, h in _logicals(have, have_text).items():
            if name in text or name in extra or h == wl[name]:
                continue
            try:
                for images in (before, after):
                    column_as(images.field(name), h, wl[name], name=name, table=want.table)
            except ConfigurationError:
                text.add(name)  # an older value the newer type cannot hold: the column stays text
    out = [
        (conform_images(b, have, t, want, sorted(text)), conform_images(a, have, t, want, sorted(text)))
        for b, a, have, t in parts
    ]
    return out, want, sorted(text)


def unify_schemas(
    parts: Sequence[tuple[TableSchema | None, Sequence[str]]],
) -> tuple[TableSchema | None, list[str]]:
    """The schema and text columns images of one table typed as ``parts`` (in position order)
    are joined under: every column, newest type (core/schema.py follow_log_schema); a column
    that is text in any part is text (:func:`conform_images` raises where an older part's
    value does not fit the newest type: the caller then keeps that column as text too)."""
    schema: TableSchema | None = None
    text: set[str] = set()
    for s, t in parts:
        if s is None:
            continue
        text.update(t)
        schema = follow_log_schema(schema, s)
    return schema, sorted(text)


def inferred_schema(table, events: pa.Table) -> TableSchema:
    """Text columns named by the rows themselves (``before``/``after`` canonical JSON and
    ``key`` of ``events``), for a table whose columns were never described (see
    :func:`text_schema`)."""
    names: dict[str, None] = {}
    for col in ("after", "before"):
        for text in events[col].drop_null().to_pylist():
            names.update(dict.fromkeys(json.loads(text)))
    first_key = next(iter(events["key"].drop_null().to_pylist()), None)
    return text_schema(table, names, len(json.loads(first_key)) if first_key else 0)


def text_schema(table, names, key_width: int) -> TableSchema:
    """A schema of ``string`` columns ``names`` (canonical values kept as their text), the
    first ``key_width`` (at least one) making the primary key; ``key0``... when no row named
    a column."""
    cols = tuple(Column(n, "string") for n in names) or tuple(
        Column(f"key{i}", "string") for i in range(max(1, key_width))
    )
    return TableSchema(table, cols, tuple(c.name for c in cols[: max(1, key_width)]))
