"""Row digests (verify's, and the multiset mirror's row identity): the text each value becomes,
built the same way in the source's SQL (the dialects' ``row_digests_query``) and by duckdb over
the mirror's typed Arrow columns (:func:`row_text_sql`).
"""

from __future__ import annotations

import pyarrow as pa

from .schema import TableSchema

#: the digest forms: the text each logical type's value becomes, the
#: same in the source's SQL (the dialects) and over the mirror's typed Arrow columns (duckdb):
#:
#: - int16/32/64, uint64: the integer in decimal; bool: ``t`` / ``f``
#: - float32/float64: the IEEE 754 bits read as a signed 32/64-bit integer, in decimal
#: - decimal(p,s): the number with exactly s fraction digits; decimal: the source's exact text
#: - string, uuid, json: the text (UTF-8); binary: lowercase hex; time: ``[-]HH:MM:SS.ffffff``
#: - date: days since 1970-01-01, timestamp/timestamptz: microseconds since 1970-01-01 UTC,
#:   infinities and zero dates encoded as core/temporal.py encodes them
#:
#: A row's text is its columns' pieces in column order: ``N`` for NULL, else the text and
#: ``,`` (``<byte length>:<text>`` for the SIZED types, whose text may hold anything), so two
#: different rows never make the same text. Its digest: the first 64 bits of md5(row text),
#: big-endian; a key range's digest: the row count and the XOR of its rows' digests. Types
#: without a form (arrays; MariaDB's FLOAT and DOUBLE, whose text the server prints its own
#: way) make verify compare that table's rows in Python.
DIGEST_SIZED = frozenset({"string", "uuid", "json"})
DIGEST_NULL = "N"


def digest_input(batch: pa.RecordBatch | pa.Table, schema: TableSchema) -> pa.Table:
    """The schema's columns of typed mirror rows as the digest forms read them: floats as their
    bits, dates as their days, timestamps as their microseconds (zero-copy views)."""
    cols = []
    for c in schema.columns:
        arr = batch.column(batch.schema.get_field_index(c.name))
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        t = arr.type
        if pa.types.is_float64(t) and c.type == "float64":
            arr = arr.view(pa.int64())
        elif pa.types.is_float32(t) and c.type == "float32":
            arr = arr.view(pa.int32())
        elif pa.types.is_date32(t):
            arr = arr.view(pa.int32())
        elif pa.types.is_timestamp(t):
            arr = arr.view(pa.int64())
        cols.append(arr)
    return pa.table(cols, names=[f"c{i}" for i in range(len(cols))])


def row_text_sql(schema: TableSchema, arrow: pa.Schema) -> str:
    """duckdb SQL of each row's text over :func:`digest_input`'s table ``m``: the same text the
    source's SQL builds (the forms above), vectorised."""
    pieces = []
    for i, c in enumerate(schema.columns):
        ident, t = f"c{i}", arrow.field(i).type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            text = ident  # strings, and values the mirror keeps as their canonical text
        elif pa.types.is_boolean(t):
            text = f"CASE WHEN {ident} THEN 't' WHEN NOT {ident} THEN 'f' END"
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            text = f"lower(hex({ident}))"
        else:  # integers, decimals, and the views of floats, dates and timestamps
            text = f"CAST({ident} AS VARCHAR)"
        # (|| is null when a part is, unlike concat(): a null value gives the null piece)
        value = (
            f"CAST(strlen({text}) AS VARCHAR) || ':' || {text}"
            if c.type in DIGEST_SIZED
            else f"{text} || ','"
        )
        pieces.append(f"coalesce({value}, '{DIGEST_NULL}')")
    return f"concat({', '.join(pieces)})"


def mirror_digest_sql(schema: TableSchema, arrow: pa.Schema) -> str:
    """duckdb SQL of each row's 64-bit digest (``h``) over :func:`digest_input`'s table ``m``: the
    same the source's SQL computes (the dialects' ``row_digests_query``), vectorised."""
    return f"SELECT ('0x' || left(md5({row_text_sql(schema, arrow)}), 16))::UBIGINT AS h FROM m"  # noqa: S608 - our names
