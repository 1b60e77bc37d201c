"""Typed images: the form staging, the engines and the sinks share (a struct per row image, its
schema and text columns in the Parquet metadata)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConfigurationError
from ..schema import Column, TableSchema, follow_log_schema
from .canonical import arrow_canonical
from .decode import _SPECIAL_FLOATS, arrow_type, decode_column, json_rows_to_struct, rows_to_struct

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
