"""Fast PostgreSQL chunk reads: ``COPY (chunk SELECT) TO STDOUT (FORMAT csv)`` into typed
Arrow columns, a column at a time (what a staged chunk holds, storage/staged.py).

Why: the generic chunk read (driver row -> dict of canonical values -> typed columns) costs
microseconds of Python per value. Here the server renders each value with its type's output
function (the same text pgoutput sends and the generic path sees), pyarrow parses the CSV,
and Arrow's kernels type each column at once (:func:`typed_builder`: casts with Arrow's own
number and ISO-8601 parsers, a regex for ``time``, hex for bytea).

Parity with the generic path (and so with the changelog): a column holding anything
unusual (infinite or BC timestamps, 5-digit years, a NaN numeric, arrays) takes the
reference path, each value through the same decoder as the changelog's, then
core/arrow_types.decode_column. The key stays canonical JSON, built from per-column JSON
fragments (:func:`fragment_builder`: integers are the server's text, strings escaped with
Arrow kernels). Unit tests and an integration test compare both with the generic path.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ...core.arrow_types import string_array

_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@cache
def _lit(text: str) -> pa.Scalar:
    """A string scalar for a kernel argument. Plain Python strings given to a kernel go
    through pyarrow's Python conversion, which imports pandas (see
    ``staging_io.string_array``); these scalars are built from buffers once."""
    return string_array([text])[0]


def _join(*parts: pa.Array | str) -> pa.Array:
    """``binary_join_element_wise(*parts, "")`` with the literal parts as scalars."""
    return pc.binary_join_element_wise(*(_lit(p) if isinstance(p, str) else p for p in parts), _lit(""))


def _or_null(arr: pa.Array) -> pa.Array:
    """Nulls -> the JSON ``null`` text (``fill_null`` without a Python scalar)."""
    return pc.coalesce(arr, _lit("null"))


_INTS = frozenset({"int16", "int32", "int64", "uint64"})
_STRINGS = frozenset({"string", "json"})
_CONTROL = r"[\x00-\x1f]"


def _ints(arr: pa.Array) -> pa.Array:
    return _or_null(arr)


def _bools(arr: pa.Array) -> pa.Array:
    return _or_null(pc.if_else(pc.equal(arr, _lit("t")), _lit("true"), _lit("false")))


def json_strings(arr: pa.Array) -> pa.Array:
    """Each string as a JSON string literal exactly as ``json.dumps(..., ensure_ascii=False)``
    writes it (``"`` and ``\\`` escaped; control characters via the encoder); null -> ``null``."""
    if len(arr) and pc.any(pc.match_substring_regex(arr, _CONTROL)).as_py():
        return string_array(["null" if v is None else _ENCODE(v) for v in arr.to_pylist()])
    esc = pc.replace_substring(arr, "\\", "\\\\")
    esc = pc.replace_substring(esc, '"', '\\"')
    return _or_null(_join('"', esc, '"'))


def _per_value(decode: Callable[[str], object]) -> Callable[[pa.Array], pa.Array]:
    def frag(arr: pa.Array) -> pa.Array:
        return string_array(["null" if v is None else _ENCODE(decode(v)) for v in arr.to_pylist()])

    return frag


_FLOAT_SPECIAL = {"NaN": '"NaN"', "Infinity": '"Infinity"', "-Infinity": '"-Infinity"'}


def _floats(arr: pa.Array) -> pa.Array:
    # json encodes a float with float.__repr__; the specials are canonical strings
    special = _FLOAT_SPECIAL.get
    return string_array(["null" if v is None else (special(v) or repr(float(v))) for v in arr.to_pylist()])


def _binary(decode: Callable[[str], object]) -> Callable[[pa.Array], pa.Array]:
    b2a = binascii.b2a_base64  # = base64.b64encode, without the wrapper

    def frag(arr: pa.Array) -> pa.Array:
        out = []
        for v in arr.to_pylist():
            if v is None:
                out.append("null")
            elif v[:2] == "\\x":
                out.append('"' + b2a(bytes.fromhex(v[2:]), newline=False).decode("ascii") + '"')
            else:
                out.append(_ENCODE(decode(v)))  # raises the decoder's error
        return string_array(out)

    return frag


_DATE = r"(?P<d>\d{4}-\d\d-\d\d)"
_TIME = r"(?P<t>\d\d:\d\d:\d\d)(?:\.(?P<f>\d{1,6}))?"
_TEMPORAL = {  # the server's ISO text -> canonical, when every value has the common shape
    "timestamptz": (f"^{_DATE} {_TIME}\\+00$", "T", "Z"),
    "timestamp": (f"^{_DATE} {_TIME}$", "T", ""),
    "time": (f"^(?P<d>){_TIME}$", "", ""),
    "date": (f"^{_DATE}$", "", ""),  # infinity, BC, 5-digit years: the decoder
}


def _temporal(logical: str, fallback: Callable[[pa.Array], pa.Array]) -> Callable[[pa.Array], pa.Array]:
    pattern, sep, suffix = _TEMPORAL[logical]

    def frag(arr: pa.Array) -> pa.Array:
        m = pc.extract_regex(arr, pattern)
        if m.null_count != arr.null_count:  # infinity, BC, 5-digit years...: the decoder handles them
            return fallback(arr)
        if logical == "date":
            return pc.if_else(pc.is_null(arr), _lit("null"), _join('"', m.field("d"), '"'))
        frac = pc.utf8_rpad(m.field("f"), width=6, padding="0")
        out = _join('"', m.field("d"), sep, m.field("t"), ".", frac, suffix + '"')
        return pc.if_else(pc.is_null(arr), _lit("null"), out)

    return frag


def fragment_builder(logical: str, decode: Callable[[str], object]) -> Callable[[pa.Array], pa.Array]:
    """Text column -> JSON fragment column for one logical type."""
    if logical in _INTS:
        return _ints
    if logical == "bool":
        return _bools
    if logical in _STRINGS or logical.startswith("decimal"):
        return json_strings
    if logical == "uuid":
        return lambda arr: json_strings(pc.utf8_lower(arr))
    if logical in ("float32", "float64"):
        return _floats
    if logical == "binary":
        return _binary(decode)
    if logical in _TEMPORAL:
        return _temporal(logical, _per_value(decode))
    return _per_value(decode)


# --- typed columns straight from the server's text (the chunk path: no JSON in between) -----------
def _typed_temporal(logical: str) -> Callable[[pa.Array], pa.Array | None]:
    pattern = _TEMPORAL[logical][0]
    target = {
        "date": pa.date32(),
        "timestamp": pa.timestamp("us"),
        "timestamptz": pa.timestamp("us", tz="UTC"),
    }.get(logical)

    def build(arr: pa.Array) -> pa.Array | None:
        m = pc.extract_regex(arr, pattern)
        if m.null_count != arr.null_count:  # infinity, BC, 5-digit years...: the decoder handles them
            return None
        if logical == "time":  # canonical text, microseconds padded
            frac = pc.utf8_rpad(m.field("f"), width=6, padding="0")
            # a null value's match is a null struct whose fields are not null: keep it null
            return pc.if_else(
                pc.is_null(arr), pa.nulls(len(arr), pa.string()), _join(m.field("t"), ".", frac)
            )
        return arr.cast(target)  # the server's ISO text: Arrow's own parser

    return build


_HEX_VALUE = np.full(256, 255, dtype=np.uint8)  # hex digit -> its value (255: not a hex digit)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_VALUE[_c] = _HEX_VALUE[bytes([_c]).upper()[0]] = _i


#: hex digits decoded at a time by :func:`_typed_binary`: its temporaries (the digits, their
#: values) stay a few MB however large the values are
HEX_BLOCK_BYTES = 8 << 20


def _typed_binary(arr: pa.Array) -> pa.Array | None:
    """bytea's hex output (``\\x0aff``) -> binary, decoded with numpy over runs of values of
    at most :data:`HEX_BLOCK_BYTES` hex digits (a larger value alone, in parts), written into
    one output buffer: memory is the output plus a bounded block, whatever the value sizes;
    None when a value is in the escape format (bytea_output = escape: the decoder)."""
    from ...core.arrow_types import gather_slices, slices_array, validity_mask

    n = len(arr)
    if arr.null_count == n:
        return pa.nulls(n, pa.binary())
    arr = arr.cast(pa.string()) if arr.type != pa.string() else arr
    valid = validity_mask(arr)
    bounds = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data = (
        np.frombuffer(arr.buffers()[2], dtype=np.uint8)
        if arr.buffers()[2] is not None
        else np.zeros(0, np.uint8)
    )
    starts, lengths = bounds[:-1] + 2, np.where(valid, bounds[1:] - bounds[:-1] - 2, 0)
    prefix_at = bounds[:-1][valid]
    if (
        (lengths < 0).any()
        or (lengths % 2).any()
        or not ((data[prefix_at] == 0x5C).all() and (data[prefix_at + 1] == 0x78).all())
    ):  # "\\x"
        return None
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths // 2, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    hex_at = np.zeros(n + 1, dtype=np.int64)  # where each value's digits start in the digit stream
    np.cumsum(lengths, out=hex_at[1:])
    i = 0
    while i < n:
        # values i..j-1: at most HEX_BLOCK_BYTES digits, or value i alone (then in parts)
        j = max(i + 1, int(np.searchsorted(hex_at, hex_at[i] + HEX_BLOCK_BYTES, side="right")) - 1)
        j = min(j, n)
        if j == i + 1 and lengths[i] > HEX_BLOCK_BYTES:
            s, o = int(starts[i]), int(offsets[i])
            for k in range(0, int(lengths[i]), HEX_BLOCK_BYTES):
                m = min(HEX_BLOCK_BYTES, int(lengths[i]) - k)
                if not _unhex_into(data[s + k : s + k + m], out[o + k // 2 : o + (k + m) // 2]):
                    return None
        else:
            digits, _ = gather_slices(data, starts[i:j], lengths[i:j])
            if not _unhex_into(digits, out[int(offsets[i]) : int(offsets[j])]):
                return None
        i = j
    return slices_array(pa.binary(), out, offsets, valid if arr.null_count else None)


def _unhex_into(digits: np.ndarray, out: np.ndarray) -> bool:
    """Hex digits (numpy uint8, an even count) -> their bytes in ``out``; False on a non-hex digit."""
    values = _HEX_VALUE[digits]
    if (values == 255).any():
        return False
    np.left_shift(values[0::2], 4, out=out)
    out |= values[1::2]
    return True


def typed_builder(logical: str) -> Callable[[pa.Array], pa.Array | None]:
    """Text column -> the typed column of ``logical`` (core/arrow_types.arrow_type) by Arrow
    kernels, or None where a value needs the decoder (infinities, BC dates, a NaN numeric...):
    the caller then takes the reference path, canonical values through the decoder."""
    from ...core.arrow_types import arrow_type

    target = arrow_type(logical)
    if logical in _INTS or logical in ("float32", "float64") or pa.types.is_decimal(target):

        def cast(arr: pa.Array) -> pa.Array | None:
            try:
                # float32 rounds from the double, as Python's float() and the JSON path do
                return (
                    arr.cast(pa.float64()).cast(target, safe=False)
                    if logical == "float32"
                    else arr.cast(target)
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None

        return cast
    if logical == "bool":
        return lambda arr: pc.equal(arr, _lit("t"))
    if logical in _STRINGS or (logical.startswith("decimal") and pa.types.is_string(target)):
        return lambda arr: arr
    if logical == "uuid":
        return pc.utf8_lower
    if logical == "binary":
        return _typed_binary
    if logical in _TEMPORAL:
        build = _typed_temporal(logical)

        def temporal(arr: pa.Array) -> pa.Array | None:
            try:
                return build(arr)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None

        return temporal
    return lambda arr: None


def read_csv_batch(data: bytes | bytearray, names: Sequence[str]) -> list[pa.Array]:
    """COPY ... (FORMAT csv) output -> one string array per column (unquoted empty = NULL).
    ``data`` is read in place (no copy); a bytearray may be cleared once this returns."""
    cols = [f"c{i}" for i in range(len(names))]  # column names may repeat or be hostile
    table = pcsv.read_csv(
        pa.BufferReader(pa.py_buffer(data)),
        read_options=pcsv.ReadOptions(
            column_names=cols, block_size=max(len(data) + 1, 1 << 20), use_threads=False
        ),
        parse_options=pcsv.ParseOptions(newlines_in_values=True),
        convert_options=pcsv.ConvertOptions(
            column_types=dict.fromkeys(cols, pa.string()),
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            null_values=[""],
        ),
    )
    return [table.column(c).combine_chunks() for c in cols]


class ChunkAssembler:
    """Builds the key (canonical JSON, from the fragments below) and the typed columns
    (:meth:`build_typed`, what a chunk stages) of rows of one table schema."""

    def __init__(
        self, names: Sequence[str], logical: Sequence[str], decoders: Sequence[Callable], pk: Sequence[str]
    ):
        self.names = list(names)
        self.logical = list(logical)
        self.builders = [fragment_builder(t, d) for t, d in zip(logical, decoders, strict=True)]
        self.typed = [typed_builder(t) for t in logical]
        self.pk_idx = [self.names.index(k) for k in pk]
        self.decoders = list(decoders)

    def build_typed(self, columns: list[pa.Array]) -> tuple[pa.Array, list[pa.Array], list[str], tuple]:
        """(key, one typed array per column, the columns kept as canonical text, last key).
        A column Arrow's kernels cannot type takes the reference path: each value through the
        decoder (as the changelog's), then core/arrow_types.decode_column; a value its type
        cannot hold makes the column canonical text (as the generic chunk read does)."""
        from ...core.arrow_types import decode_column
        from ...core.errors import ConfigurationError

        arrays, text = [], []
        for name, logical, build, decode, col in zip(
            self.names, self.logical, self.typed, self.decoders, columns, strict=True
        ):
            arr = build(col)
            if arr is None:
                vals = [None if v is None else decode(v) for v in col.to_pylist()]
                try:
                    arr = decode_column(vals, logical)
                except ConfigurationError:
                    arr = decode_column(vals, "string")
                    text.append(name)
            arrays.append(arr)
        if not self.pk_idx:  # a whole-table refresh: no key (core/schema.py, WHOLE_TABLE)
            return pa.repeat(pa.scalar("[]"), len(columns[0]) if columns else 0), arrays, text, ()
        kparts: list = ["["]
        for j, i in enumerate(self.pk_idx):
            if j:
                kparts.append(",")
            kparts.append(self.builders[i](columns[i]))
        kparts.append("]")
        last = tuple(self.decoders[i](columns[i][-1].as_py()) for i in self.pk_idx)
        return _join(*kparts), arrays, text, last
