"""Canonical values from typed columns: the inverse of decode.py, for compares and exports."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import temporal
from ..schema import TableSchema


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
    """A typed mirror column (core/arrow_types/) -> canonical values, vectorised where
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
